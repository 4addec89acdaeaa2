// qwen2 — Qwen2, Qwen2.5: Llama's graph with biases on q, k and v (attn_{q,k,v}.bias) and RoPE rotating
// halves (NeoX).
#include "../family.hpp"

namespace loom {

namespace qwen2_family {

void configure(ModelConfig& c, const GgufFile&, const std::string&) {
  c.qkv_bias = true;
  c.rope.neox = true;
}

} // namespace qwen2_family

extern const Family family_qwen2{"qwen2", qwen2_family::configure, dense_layer};

} // namespace loom
