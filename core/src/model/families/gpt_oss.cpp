// gpt-oss — gpt-oss-20b, gpt-oss-120b: q/k/v and output biases, each head's learned sink logit in every
// softmax (attn_sinks.weight), sliding-window (attention.sliding_window, 128) and full layers alternating,
// the sliding one first; NeoX RoPE with YaRN (factor 32 over 4 096 positions); every FFN a mixture of experts
// whose input norm is post_attention_norm: a router with a bias, the k highest logits (4 of 32 or 128)
// weighted by a softmax over those k, experts with biases and gpt-oss's clamped SwiGLU (x·σ(1.702·x) ⊙
// (up + 1), x ≤ 7, |up| ≤ 7); experts in MXFP4 as released.
#include "../family.hpp"

namespace loom {

namespace gpt_oss_family {

void configure(ModelConfig& c, const GgufFile& f, const std::string& a) {
  c.qkv_bias = c.attn_out_bias = c.attn_sink_logits = true;
  c.rope.neox = true;
  c.ffn_norm = "post_attention_norm";
  if (c.moe.n_expert == 0)
    keys::bad(f, "metadata '" + a + "expert_count' is missing: a gpt-oss file has experts in every layer");
  c.moe.gating = MoeGating::softmax_selected; // (as llama.cpp, whatever the file says)
  c.moe.norm = false;
  c.moe.router_bias = c.moe.expert_biases = c.moe.oai_glu = true;
  keys::window_pattern(c, f, a, 2);
}

} // namespace gpt_oss_family

extern const Family family_gpt_oss{"gpt-oss", gpt_oss_family::configure, moe_layer};

} // namespace loom
