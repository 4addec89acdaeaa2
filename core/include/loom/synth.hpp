// loom/synth.hpp — random-weight Llama models of named shapes, for benchmarks (`loom synth`).
// The files carry full llama metadata and a vocabulary, so llama.cpp loads the very same file.
#pragma once

#include "loom/dtype.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom {

struct SynthShape {
  std::string name;
  int32_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
  float rope_theta;
  bool tied_output; // no output.weight: the embedding is the head (Llama 3.2 1B)
};
const std::vector<SynthShape>&
synth_shapes(); // tiny-gqa (tests), stories15m, stories110m, tinyllama-1.1b, llama-3.2-1b-like, llama-2-7b

struct SynthOptions {
  std::string shape;
  DType type = DType::f32; // of the 2-D weights; norms stay f32 (as llama-quantize does)
  std::string vocab_from;  // GGUF whose tokenizer.* keys are copied (its vocab size wins); "" = synthetic
  std::string out;
  uint64_t seed = 1;
  std::string chat_template; // written as tokenizer.chat_template (replacing a copied one); "" = none added
  // The family: llama, llama3 (θ 500000, Llama 3.1's rope_freqs, tied embeddings), mistral (llama with a
  // sliding window), qwen2 (q/k/v biases), qwen3 (q/k norms), gemma2 (GeGLU, post norms, soft-caps,
  // alternating sliding window, tied embeddings), phi3 (fused q/k/v and gate/up).
  std::string arch = "llama";
  std::function<void(double fraction)> progress; // optional
};

// Writes the model; throws loom::Error for an unknown shape, an unsupported type or I/O errors.
void synth_model(const SynthOptions& o);

// `loom quantize`: a copy of a GGUF model with its 2-D weight matrices converted to `type` (rows whose
// length is not a multiple of the type's block stay as they are; 1-D tensors such as norms stay f32,
// as llama-quantize does). Every metadata key is copied; general.file_type is updated.
struct QuantizeOptions {
  std::string in, out;
  DType type = DType::q8_0;
  std::function<void(double fraction)> progress; // optional
};
void quantize_model(const QuantizeOptions& o);

} // namespace loom
