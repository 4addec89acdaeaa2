// `standard`: causal attention over every earlier position on every layer (MHA/MQA/GQA from the
// shape), optionally soft-capped. Its KV access pattern is full: nothing is ever released.
#include "loom/attention.hpp"

namespace loom {

namespace {
class StandardAttention final : public AttentionVariant {
public:
  StandardAttention(int32_t n_layer, float softcap, AttnKernel k)
      : AttentionVariant(k), n_layer_(n_layer), softcap_(softcap) {}
  std::string_view name() const noexcept override { return "standard"; }
  int32_t n_layer() const noexcept override { return n_layer_; }
  LayerAttention layer(int32_t) const noexcept override { return {0, 0, softcap_}; }

private:
  int32_t n_layer_;
  float softcap_;
};
} // namespace

std::unique_ptr<AttentionVariant> make_standard_attention(int32_t n_layer, float softcap, AttnKernel k) {
  return std::make_unique<StandardAttention>(n_layer, softcap, k);
}

} // namespace loom
