// `sliding_window`: each query attends the last `window` positions (itself included) and, with
// `sinks`, the sequence's first positions besides (StreamingLLM's attention sinks) — on the layers
// the model marks as sliding (gemma-style patterns) or on all. When every layer slides, a sequence
// needs only sinks + window positions at once: the KV store releases the blocks between them.
#include "loom/attention.hpp"
#include "loom/error.hpp"

#include <utility>

namespace loom {

namespace {
class SlidingWindowAttention final : public AttentionVariant {
public:
  SlidingWindowAttention(int32_t n_layer, int32_t window, int32_t sinks, std::vector<bool> sliding,
                         float softcap, AttnKernel k)
      : AttentionVariant(k), n_layer_(n_layer), window_(window), sinks_(sinks), sliding_(std::move(sliding)),
        softcap_(softcap) {}
  std::string_view name() const noexcept override { return "sliding_window"; }
  int32_t n_layer() const noexcept override { return n_layer_; }
  LayerAttention layer(int32_t il) const noexcept override {
    const bool slides = sliding_.empty() || (il >= 0 && static_cast<size_t>(il) < sliding_.size() &&
                                             sliding_[static_cast<size_t>(il)]);
    return slides ? LayerAttention{window_, sinks_, softcap_} : LayerAttention{0, 0, softcap_};
  }

private:
  int32_t n_layer_, window_, sinks_;
  std::vector<bool> sliding_;
  float softcap_;
};
} // namespace

std::unique_ptr<AttentionVariant> make_sliding_window_attention(int32_t n_layer, int32_t window,
                                                                int32_t sinks, std::vector<bool> sliding,
                                                                float softcap, AttnKernel k) {
  if (window <= 0 || sinks < 0)
    fail(Errc::invalid_argument, "attention",
         "a sliding window needs window > 0 and sinks ≥ 0, found window " + std::to_string(window) +
             ", sinks " + std::to_string(sinks));
  if (!sliding.empty() && sliding.size() != static_cast<size_t>(n_layer))
    fail(Errc::invalid_argument, "attention", "the sliding-layer pattern must have one entry per layer");
  return std::make_unique<SlidingWindowAttention>(n_layer, window, sinks, std::move(sliding), softcap, k);
}

} // namespace loom
