// loom/attention/reference.hpp — the plain C++ attention kernel every backend's kernel is tested
// against. Standard (causal) and sliding-window variants; MHA/MQA/GQA follow from n_head_kv.
#pragma once

#include "loom/graph.hpp"
#include "loom/kv_cache.hpp"

#include <cstdint>

namespace loom::attention {

// For each batch row t (sequence seq[t] at position pos[t]) and head h:
//   out[t][h] = softmax_j( scale · q[t][h] · K[seq, j][h / n_gqa] ) · V[seq, j][h / n_gqa]
// over cached positions j ∈ [max(0, pos − window + 1), pos] (window 0 = all j ≤ pos).
// Scores are materialized per row (the `naive` kernel), in f32 with a max-subtracted softmax.
//   q   [n_tokens][n_head][head_dim]
//   out [n_tokens][n_head][head_dim]
void reference_attention(const AttentionParams& p, const float* q, int32_t n_tokens, const Pos* pos,
                         const SeqId* seq, KVCacheStore& kv, float* out);

} // namespace loom::attention
