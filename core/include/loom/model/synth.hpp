// loom/model/synth.hpp — random-weight Llama models of named shapes, for benchmarks (`loom synth`).
// The files carry full llama metadata and a vocabulary, so llama.cpp loads the very same file.
#pragma once

#include "loom/sdk/dtype.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace loom {

struct SynthShape {
  std::string name;
  int32_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
  float rope_theta;
  bool tied_output; // no output.weight: the embedding is the head (Llama 3.2 1B)
  int32_t head_dim; // 0: n_embd / n_head
  int32_t n_expert; // mixture of experts (the MoE families): experts per layer, 0: dense
  int32_t n_used;   // experts a token uses
  int32_t n_ff_exp; // an expert's width
};
// tiny-gqa, tiny-d64, tiny-d64x4, tiny-moe (tests), stories15m, stories110m, tinyllama-1.1b,
// llama-3.2-1b-like, llama-2-7b, llama-3-8b, qwen3-30b-a3b
const std::vector<SynthShape>& synth_shapes();

struct SynthOptions {
  std::string shape;
  DType type = DType::f32; // of the 2-D weights; norms stay f32 (as llama-quantize does)
  std::string vocab_from;  // GGUF whose tokenizer.* keys are copied (its vocab size wins); "" = synthetic
  std::string out;
  uint64_t seed = 1;
  std::string chat_template; // written as tokenizer.chat_template (replacing a copied one); "" = none added
  // The family: llama, llama3 (θ 500000, Llama 3.1's rope_freqs, tied embeddings), mistral (llama with a
  // sliding window), qwen2 (q/k/v biases), qwen3 (q/k norms), gemma2 (GeGLU, post norms, soft-caps,
  // alternating sliding window, tied embeddings), phi3 (fused q/k/v and gate/up), smollm3 (no
  // RoPE on every fourth layer), qwen3moe (qwen3's
  // attention, a mixture of experts in every layer: the shape must have experts).
  std::string arch = "llama";
  std::function<void(double fraction)> progress; // optional
  int32_t layers = 0; // > 0: only the shape's first `layers` layers (a large shape cut to fit memory)
  std::optional<DType> expert_type; // the experts' stacked matrices (default: `type`)
};

// Writes the model; throws loom::Error for an unknown shape, an unsupported type or I/O errors.
void synth_model(const SynthOptions& o);

// `loom quantize`: a copy of a GGUF model with its 2-D weight matrices converted to `type` (any type
// quantize_row writes; 1-D tensors such as norms stay as they are, as llama-quantize does). A matrix
// whose rows do not fit the type's block gets quantize_target's type. Every metadata key is copied;
// general.file_type is updated. Rows are converted on all cores.
struct QuantizeOptions {
  std::string in, out;
  DType type = DType::q8_0;
  std::function<void(double fraction)> progress; // optional
  // optional: called for each matrix written in a type other than `type` (see quantize_target)
  std::function<void(const std::string& tensor, DType used)> on_fallback;
};
void quantize_model(const QuantizeOptions& o);

// The type `loom quantize --type want` writes a matrix with rows of `cols` values in: `want` when its block
// divides cols; else, for the types with blocks of 256, llama-quantize's fallback — q2_k, q3_k, iq4_xs →
// iq4_nl; q4_k → q5_0; q5_k → q5_1; q6_k → q8_0 — or f16 when that block (32) does not divide cols
// either; nullopt for another type whose block does not divide cols (the matrix keeps its type).
std::optional<DType> quantize_target(DType want, int64_t cols);

} // namespace loom
