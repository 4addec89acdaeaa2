// qwen2 — Qwen2, Qwen2.5: Llama's graph with biases on q, k and v (attn_{q,k,v}.bias) and RoPE rotating
// halves (NeoX).
#include "../family.hpp"

namespace loom {

namespace qwen2_family {

void configure(ModelConfig& c, const GgufFile&, const std::string&) {
  c.qkv_bias = true;
  c.rope.neox = true;
}

int32_t layer(GraphBuilder& b, int32_t l, int32_t x) { return b.ffn_block(l, b.attention_block(l, x)); }

} // namespace qwen2_family

extern const Family family_qwen2{"qwen2", qwen2_family::configure, qwen2_family::layer};

} // namespace loom
