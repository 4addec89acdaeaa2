// phi3 — Phi-3, Phi-3.5 mini (4k context): Llama's graph with q/k/v in one matrix (attn_qkv.weight: q
// rows, then k, then v) and gate/up in one (ffn_up.weight of 2·n_ff rows, gate first), read as zero-copy
// row views; NeoX RoPE; attention.sliding_window when present. Long-context RoPE (longrope) is refused.
#include "../family.hpp"

namespace loom {

namespace phi3_family {

void configure(ModelConfig& c, const GgufFile&, const std::string&) {
  c.fused_qkv = c.fused_gate_up = true;
  c.rope.neox = true;
}

} // namespace phi3_family

extern const Family family_phi3{"phi3", phi3_family::configure, dense_layer};

} // namespace loom
