// smollm3 — SmolLM3 (3B): Llama's graph (RoPE on adjacent pairs, SwiGLU) whose every fourth layer has no
// RoPE at all (NoPE: layers 3, 7, 11, … attend without positions); tied embeddings when the file has no
// output.weight.
#include "../family.hpp"

namespace loom {

namespace smollm3_family {

void configure(ModelConfig& c, const GgufFile&, const std::string&) {
  c.rope_layers.assign(static_cast<size_t>(c.n_layer), true);
  for (int32_t l = 0; l < c.n_layer; ++l) // (as llama.cpp: n_no_rope_layer_step = 4)
    c.rope_layers[static_cast<size_t>(l)] = (l + 1) % 4 != 0;
}

} // namespace smollm3_family

extern const Family family_smollm3{"smollm3", smollm3_family::configure, dense_layer};

} // namespace loom
