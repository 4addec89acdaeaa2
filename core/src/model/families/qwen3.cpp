// qwen3 — Qwen3 (dense): Llama's graph with each head of q and k RMS-normed before RoPE
// (attn_{q,k}_norm.weight, head_dim long); NeoX RoPE; attention.key_length may exceed n_embd / n_head.
#include "../family.hpp"

namespace loom {

namespace qwen3_family {

void configure(ModelConfig& c, const GgufFile&, const std::string&) {
  c.qk_norm = true;
  c.rope.neox = true;
}

} // namespace qwen3_family

extern const Family family_qwen3{"qwen3", qwen3_family::configure, dense_layer};

} // namespace loom
