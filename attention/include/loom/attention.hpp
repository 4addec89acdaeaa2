// loom/attention.hpp — AttentionVariant: what a layer's attention computes, independent of the device.
//
// Head grouping (MHA, MQA, GQA) follows from the model's shape (n_head_kv). A variant decides, per
// layer, the mask (causal; a sliding window; attention sinks — the first positions, attended however
// long the sequence grows), the score soft-cap, and with it the KV access pattern: which positions of
// a sequence a later query can still read, so that a store may release the rest. The kernel strategy
// (naive: materialized scores; flash: tiled online softmax) is chosen with the variant and checked
// against what the backend declares (Backend::supports_attention). Implementations live in attention/;
// the reference kernel every backend kernel is tested against is attention::reference_attention
// (loom/sdk/reference.hpp, header-only so that plugins test against the same code).
#pragma once

#include "loom/sdk/graph.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

struct ModelConfig;

// What one layer's attention computes beyond its shape.
struct LayerAttention {
  int32_t window = 0;   // tokens attended, the current one included (0 = every earlier position)
  int32_t sinks = 0;    // with a window: the first `sinks` positions are attended as well
  float softcap = 0.0f; // scores s become softcap · tanh(s / softcap) (0 = off)
  bool operator==(const LayerAttention&) const = default;
};

// The positions a sequence must keep so that every later query reads what it attends (the KV access
// pattern of all layers together): [0, sinks) and the last `window` before the next query. window 0:
// every position (some layer attends in full).
struct KVRetention {
  int32_t sinks = 0;
  int32_t window = 0;
  // Positions kept before the window besides: a decoder that steps back a little (speculative
  // decoding rejecting drafts, a rollback) finds them still there instead of re-evaluating the past.
  static constexpr int32_t k_slack = 32;
  bool bounded() const noexcept { return window > 0; }
  // The first position (after the sinks) a query at `next` reads.
  Pos first_read(Pos next) const noexcept { return bounded() ? std::max<Pos>(0, next - window + 1) : 0; }
  // For a sequence whose next query is at position `next`: positions [sinks, keep_from(next)) are
  // released (no later query reads them, unless it steps back more than k_slack).
  Pos keep_from(Pos next) const noexcept { return std::max<Pos>(0, first_read(next) - k_slack); }
  // The most positions a sequence then holds at once, in units of `unit` positions: the sinks' units,
  // the window and slack (plus a unit of straddle), and the unit being written.
  int64_t bound_positions(int32_t unit) const noexcept {
    const int64_t u = unit;
    return (sinks + u - 1) / u * u + (window + k_slack + u - 1) / u * u + 2 * u;
  }
};

class AttentionVariant {
public:
  virtual ~AttentionVariant() = default;
  virtual std::string_view name() const noexcept = 0; // "standard", "sliding_window"
  virtual int32_t n_layer() const noexcept = 0;
  virtual LayerAttention layer(int32_t il) const noexcept = 0;

  AttnKernel kernel() const noexcept { return kernel_; }
  // Fills the variant's part of an attention node's parameters for layer p.layer.
  void apply(AttentionParams& p) const noexcept;
  // The AttnFeature bits any layer needs (what the backend must support).
  uint32_t features() const noexcept;
  KVRetention retention() const noexcept;
  // One line: "sliding_window (window 64, sinks 4) on 5 of 6 layers, softcap 50, kernel flash".
  std::string describe() const;

protected:
  explicit AttentionVariant(AttnKernel k) : kernel_(k) {}

private:
  AttnKernel kernel_;
};

// The pipeline's [attention] choice.
struct AttentionChoice {
  std::string variant = "model"; // model (from the GGUF's metadata) | standard | sliding_window
  std::string kernel = "auto";   // auto | naive | flash
  int32_t window = 0;            // sliding_window: tokens attended; model: overrides the file's window
  int32_t sinks = 0;             // with a window: attention-sink positions kept
  std::optional<float> softcap;  // overrides the file's attn_logit_softcapping (0 = off)
};

// causal attention on every layer (soft-cap from `softcap`).
std::unique_ptr<AttentionVariant> make_standard_attention(int32_t n_layer, float softcap, AttnKernel k);
// A window (and sinks) on the layers marked in `sliding` (empty: all), causal on the others.
std::unique_ptr<AttentionVariant> make_sliding_window_attention(int32_t n_layer, int32_t window,
                                                                int32_t sinks, std::vector<bool> sliding,
                                                                float softcap, AttnKernel k);
// The variant a pipeline runs: the model's metadata (sliding window, its layer pattern, soft-cap)
// unless the choice overrides it. Throws loom::Error (invalid_argument) on an unknown name.
std::unique_ptr<AttentionVariant> make_attention_variant(const ModelConfig& mc, const AttentionChoice& c);
std::optional<AttnKernel> attn_kernel_from_name(std::string_view name) noexcept;

} // namespace loom
