// qwen3moe — Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B: Qwen3's attention (q/k RMS norms per
// head, NeoX RoPE) with a mixture of experts for every FFN: the router's softmax over all experts, the
// k highest (expert_used_count, 8 of 128) renormalised to sum 1, SwiGLU experts of
// expert_feed_forward_length; no shared expert.
#include "../family.hpp"

namespace loom {

namespace qwen3moe_family {

void configure(ModelConfig& c, const GgufFile& f, const std::string& a) {
  c.qk_norm = true;
  c.rope.neox = true;
  if (c.moe.n_expert == 0)
    keys::bad(f, "metadata '" + a + "expert_count' is missing: a qwen3moe file has experts in every layer");
  c.moe.gating = MoeGating::softmax; // (as llama.cpp, whatever the file says)
  c.moe.norm = true;
}

} // namespace qwen3moe_family

extern const Family family_qwen3moe{"qwen3moe", qwen3moe_family::configure, moe_layer};

} // namespace loom
