#include "loom/attention/reference.hpp"

#include "loom/error.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace loom::attention {

void reference_attention(const AttentionParams& p, const float* q, int32_t n_tokens, const Pos* pos,
                         const SeqId* seq, KVCacheStore& kv, float* out) {
  LOOM_ASSERT(p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0, "bad head grouping");
  const int32_t D = p.head_dim;
  const int32_t n_gqa = p.n_head / p.n_head_kv;
  std::vector<float> scores;
  for (int32_t t = 0; t < n_tokens; ++t) {
    const Pos last = pos[t];
    const Pos first = p.window > 0 ? std::max<Pos>(0, last - p.window + 1) : 0;
    const auto n_keys = static_cast<size_t>(last - first + 1);
    scores.resize(n_keys);
    for (int32_t h = 0; h < p.n_head; ++h) {
      const int32_t hk = h / n_gqa;
      const float* qh =
          q + (static_cast<size_t>(t) * static_cast<size_t>(p.n_head) + static_cast<size_t>(h)) *
                  static_cast<size_t>(D);
      float max_s = -INFINITY;
      for (Pos j = first; j <= last; ++j) {
        const float* k = kv.k_row(p.layer, seq[t], j) + static_cast<size_t>(hk) * static_cast<size_t>(D);
        float s = 0.0f;
        for (int32_t d = 0; d < D; ++d)
          s += qh[d] * k[d];
        s *= p.scale;
        if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
        scores[static_cast<size_t>(j - first)] = s;
        max_s = std::max(max_s, s);
      }
      float sum = 0.0f;
      for (auto& s : scores) {
        s = std::exp(s - max_s);
        sum += s;
      }
      float* o = out + (static_cast<size_t>(t) * static_cast<size_t>(p.n_head) + static_cast<size_t>(h)) *
                           static_cast<size_t>(D);
      std::fill(o, o + D, 0.0f);
      for (Pos j = first; j <= last; ++j) {
        const float w = scores[static_cast<size_t>(j - first)] / sum;
        const float* v = kv.v_row(p.layer, seq[t], j) + static_cast<size_t>(hk) * static_cast<size_t>(D);
        for (int32_t d = 0; d < D; ++d)
          o[d] += w * v[d];
      }
    }
  }
}

} // namespace loom::attention
