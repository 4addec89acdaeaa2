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

#include "loom/kv/kv_retention.hpp"
#include "loom/sdk/graph.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

struct ModelConfig;
struct KVShape;

// What one layer's attention computes beyond its shape.
struct LayerAttention {
  int32_t window = 0;   // tokens attended, the current one included (0 = every earlier position)
  int32_t sinks = 0;    // with a window: the first `sinks` positions are attended as well
  float softcap = 0.0f; // scores s become softcap · tanh(s / softcap) (0 = off)
  bool operator==(const LayerAttention&) const = default;
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
  // What a KV store of shape s keeps of a sequence, for a backend that reads `reads` (AttnFeature bits):
  // with attn_span_only, a window on every layer bounds every layer's rows (s.retention), and a window on
  // some layers puts those in layer groups of their own that keep only it (s.window_layers,
  // s.window_retention) if the backend also reads attn_kv_groups. Otherwise every position stays.
  void set_retention(KVShape& s, uint32_t reads) const;
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
