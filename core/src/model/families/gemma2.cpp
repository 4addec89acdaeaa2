// gemma2 — Gemma 2: embeddings × √n_embd; GeGLU; norms after attention and after the FFN too
// (post_attention_norm, post_ffw_norm); attention soft-cap 50 and final logit soft-cap 30 unless the file
// says; local (sliding window, 4096 unless the file says) and global layers alternate, local first; NeoX
// RoPE; tied embeddings.
#include "../family.hpp"

#include <cmath>

namespace loom {

namespace gemma2_family {

// Gemma 2's defaults as its config (and llama.cpp) has them when keys are absent.
void configure(ModelConfig& c, const GgufFile& f, const std::string& a) {
  c.post_norms = c.geglu = true;
  c.rope.neox = true;
  c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  if (!f.find(a + "attn_logit_softcapping")) c.attn_softcap = 50.0f;
  if (!f.find(a + "final_logit_softcapping")) c.final_softcap = 30.0f;
  if (!f.find(a + "attention.sliding_window")) {
    c.sliding_window = 4096;
    c.sliding_layers.assign(static_cast<size_t>(c.n_layer), true);
  }
  keys::window_pattern(c, f, a, 2);
}

} // namespace gemma2_family

extern const Family family_gemma2{"gemma2", gemma2_family::configure, dense_layer};

} // namespace loom
