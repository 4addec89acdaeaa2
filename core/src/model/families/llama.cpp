// llama — Llama 1/2/3/3.1/3.2, Mistral 7B, TinyLlama, Vicuna …: the graph every other family varies.
// Per layer: RMS norm, q/k/v, RoPE on adjacent pairs (GGUF's llama q/k rows are permuted for them),
// causal attention (Mistral: attention.sliding_window), output projection, residual; RMS norm, SwiGLU
// FFN, residual. Llama 3.1/3.2: rope_freqs.weight divides each pair's frequency; no output.weight: the
// embedding is the head.
#include "../family.hpp"

namespace loom {

namespace llama_family {

void configure(ModelConfig&, const GgufFile&, const std::string&) {}

} // namespace llama_family

extern const Family family_llama{"llama", llama_family::configure, dense_layer};

} // namespace loom
