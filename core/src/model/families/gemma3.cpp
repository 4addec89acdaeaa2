// gemma3 — Gemma 3 (text: 270M, 1B; the text stack of the larger ones): Gemma 2's graph without
// soft-caps, plus q/k RMS norms per head; five local (sliding-window) layers then one global unless the
// file gives attention.sliding_window_pattern; local layers rotate with their own base
// (rope.freq_base_swa, default 10 000) and without the global layers' scaling (rope.scaling.* applies to
// the global layers only, as in HF's rope_local_base_freq).
#include "../family.hpp"

#include <cmath>

namespace loom {

namespace gemma3_family {

void configure(ModelConfig& c, const GgufFile& f, const std::string& a) {
  c.post_norms = c.geglu = c.qk_norm = true;
  c.rope.neox = true;
  c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  keys::window_pattern(c, f, a, 6);
  c.rope.theta_swa = keys::rope_base(f, a + "rope.freq_base_swa");
}

} // namespace gemma3_family

extern const Family family_gemma3{"gemma3", gemma3_family::configure, dense_layer};

} // namespace loom
