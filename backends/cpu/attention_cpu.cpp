// The cpu backend's attention: tiled online softmax over the KV cache, generic, AVX2 and AVX-512 kernels.
#include "attention_cpu.hpp"

#include "avx512_gcc_warnings.hpp"
#include "loom/sdk/error.hpp"
#include "simd_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <immintrin.h>
#include <utility>
#include <vector>

namespace loom::cpu {

namespace {

// ---- attention: tiled online softmax (one pass over the keys, scores of one tile at a time) ----

constexpr int32_t k_tile = 64;

// A sequence's K/V rows in the cache's stored type dt (f32, f16, bf16, q8_0), read in place: the
// f32/f16/bf16 decode kernels load them directly; the other paths convert one tile of one head at a
// time into scratch (tile_rows), never the whole cache.
// Only the rows some query of the batch attends are fetched: the sinks [0, n_sink) and the window
// rows [lo, n_pos), stored one after the other. Kernels index them by that compact index c; the
// position of c is pos_of(c). (Causal attention: n_sink 0, lo 0 — every row, c = position.)
struct SeqRows {
  int32_t seq;    // the sequence's index among the batch's (KVRows::seq_of)
  Pos n_pos = 0;  // rows [0, n_pos) exist
  Pos n_sink = 0; // rows [0, n_sink) at c = position
  Pos lo = 0;     // rows [lo, n_pos) at c = n_sink + position − lo
  std::vector<const uint8_t*> k, v;
  DType dt = DType::f32;
  Pos at(Pos j) const noexcept { return j < n_sink ? j : n_sink + (j - lo); }
  Pos pos_of(Pos c) const noexcept { return c < n_sink ? c : c - n_sink + lo; }
};

// The keys of one query (or of a block of queries) in compact indices: [0, a_end) and [b0, b1].
struct KeySegs {
  Pos a_end = 0, b0 = 0, b1 = -1;
};
// Segments covering the spans of queries whose sinks end by sink_end (max) and whose windows cover
// [first, last] (min first, max last), without counting a row twice.
inline KeySegs key_segs(const SeqRows& r, Pos sink_end, Pos first, Pos last) noexcept {
  KeySegs k;
  k.b0 = r.at(first);
  k.b1 = r.at(last);
  k.a_end = sink_end > 0 ? std::min(r.at(sink_end - 1) + 1, k.b0) : 0;
  return k;
}

struct AttnScratch {
  bool f16c = false;                  // F16 / BF16 cache rows convert with AVX2 + F16C (exact either way)
  const float* sink_logits = nullptr; // the node's learned sink logits (n_head), or none: attn_denominator
  std::vector<float> s, acc, m, l;
  std::vector<float> ks, vs;        // a tile of K / V rows of one head, as f32 (non-f32 caches)
  std::vector<const float*> kp, vp; // the tile's rows of that head
};

// n (a multiple of 8) F16 or BF16 values to f32, 8 at a time: exactly kv_load's values.
LOOM_AVX2 void kv_half_avx2(DType dt, const uint8_t* row, int32_t n, float* out) {
  for (int32_t i = 0; i < n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i));
    _mm256_storeu_ps(out + i, dt == DType::f16
                                  ? _mm256_cvtph_ps(h)
                                  : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
}

// Rows j0 .. j0+n-1 of kv head hk (values [koff, koff + D)) as f32 pointers: into the cache itself for
// f32, else into `stage` after conversion (vectorized for F16 / BF16 when `f16c`).
LOOM_INLINE const float* const* tile_rows(const std::vector<const uint8_t*>& src, DType dt, Pos j0, int32_t n,
                                          size_t koff, int32_t D, std::vector<float>& stage,
                                          std::vector<const float*>& ptrs, bool f16c) {
  ptrs.resize(static_cast<size_t>(n));
  if (dt == DType::f32) {
    for (int32_t jj = 0; jj < n; ++jj)
      ptrs[static_cast<size_t>(jj)] =
          reinterpret_cast<const float*>(src[static_cast<size_t>(j0 + jj)]) + koff;
  } else {
    stage.resize(static_cast<size_t>(n) * static_cast<size_t>(D));
    for (int32_t jj = 0; jj < n; ++jj) {
      float* dst = stage.data() + static_cast<size_t>(jj) * static_cast<size_t>(D);
      if (f16c && (dt == DType::f16 || dt == DType::bf16) && D % 8 == 0)
        kv_half_avx2(dt, src[static_cast<size_t>(j0 + jj)] + 2 * koff, D, dst);
      else
        kv_load(dt, src[static_cast<size_t>(j0 + jj)], static_cast<int64_t>(koff), D, dst);
      ptrs[static_cast<size_t>(jj)] = dst;
    }
  }
  return ptrs.data();
}

// A chunk of an item's keys (split_decode): each head's unnormalized output sums, then its running max and
// sum — G rows of D + 2 floats at `part`.
LOOM_INLINE void store_partial(const AttnScratch& w, int32_t G, int32_t D, float* part) {
  for (int32_t g = 0; g < G; ++g) {
    float* pg = part + static_cast<size_t>(g) * static_cast<size_t>(D + 2);
    std::copy_n(w.acc.data() + static_cast<size_t>(g) * static_cast<size_t>(D), D, pg);
    pg[D] = w.m[static_cast<size_t>(g)];
    pg[D + 1] = w.l[static_cast<size_t>(g)];
  }
}

// One (token, kv head) item: the n_gqa query heads that share kv head hk, over keys ks (compact); with
// `part`, a chunk of the item's keys (store_partial).
LOOM_INLINE void attn_item(const AttentionParams& p, const float* q, float* out, const SeqRows& rows,
                           const KeySegs& ks, int32_t hk, AttnScratch& w, float* part) {
  const int32_t D = p.head_dim, G = p.n_head / p.n_head_kv;
  w.s.resize(static_cast<size_t>(G) * k_tile);
  w.acc.assign(static_cast<size_t>(G) * static_cast<size_t>(D), 0.0f);
  w.m.assign(static_cast<size_t>(G), -INFINITY);
  w.l.assign(static_cast<size_t>(G), 0.0f);
  const size_t koff = static_cast<size_t>(hk) * static_cast<size_t>(D);
  for (int seg = 0; seg < 2; ++seg) {
    const Pos sa = seg == 0 ? 0 : ks.b0, e = seg == 0 ? ks.a_end - 1 : ks.b1;
    for (Pos j0 = sa; j0 <= e; j0 += k_tile) {
      const int32_t n = std::min<int32_t>(k_tile, e - j0 + 1);
      const float* const* kt = tile_rows(rows.k, rows.dt, j0, n, koff, D, w.ks, w.kp, w.f16c);
      const float* const* vt = tile_rows(rows.v, rows.dt, j0, n, koff, D, w.vs, w.vp, w.f16c);
      for (int32_t g = 0; g < G; ++g) {
        const float* qh = q + static_cast<size_t>(hk * G + g) * static_cast<size_t>(D);
        float* s = w.s.data() + static_cast<size_t>(g) * k_tile;
        float tmax = -INFINITY;
        for (int32_t jj = 0; jj < n; ++jj) {
          float v = vdot(qh, kt[jj], D) * p.scale;
          if (p.softcap > 0.0f) v = p.softcap * std::tanh(v / p.softcap);
          s[jj] = v;
          tmax = std::max(tmax, v);
        }
        float& m = w.m[static_cast<size_t>(g)];
        float& l = w.l[static_cast<size_t>(g)];
        float* acc = w.acc.data() + static_cast<size_t>(g) * static_cast<size_t>(D);
        if (tmax > m) { // rescale what was summed under the old maximum
          const float c = m == -INFINITY ? 0.0f : std::exp(m - tmax);
          l *= c;
          vscale(acc, c, D);
          m = tmax;
        }
        for (int32_t jj = 0; jj < n; ++jj) {
          const float ex = std::exp(s[jj] - m);
          l += ex;
          vaxpy(acc, ex, vt[jj], D);
        }
      }
    }
  }
  if (part) {
    store_partial(w, G, D, part);
    return;
  }
  for (int32_t g = 0; g < G; ++g) {
    const float* acc = w.acc.data() + static_cast<size_t>(g) * static_cast<size_t>(D);
    float* o = out + static_cast<size_t>(hk * G + g) * static_cast<size_t>(D);
    const float inv = 1.0f / attn_denominator(w.sink_logits, hk * G + g, w.m[static_cast<size_t>(g)],
                                              w.l[static_cast<size_t>(g)]);
    for (int32_t d = 0; d < D; ++d)
      o[d] = acc[d] * inv;
  }
}

// A prefill block's scratch: R rows of k_tile scores, then the [D][k_tile] transposed key tile (returned);
// R accumulators of D, running maxima and sums.
LOOM_INLINE float* block_setup(int32_t D, int32_t R, AttnScratch& w) {
  w.s.resize(static_cast<size_t>(R) * k_tile + static_cast<size_t>(D) * k_tile);
  w.acc.assign(static_cast<size_t>(R) * static_cast<size_t>(D), 0.0f);
  w.m.assign(static_cast<size_t>(R), -INFINITY);
  w.l.assign(static_cast<size_t>(R), 0.0f);
  return w.s.data() + static_cast<size_t>(R) * k_tile;
}

// The keys any query of the block attends: the union of their spans as (at most) two segments.
LOOM_INLINE KeySegs block_keys(const AttentionParams& p, const SeqRows& rows, const Pos* pos, int32_t nq) {
  Pos lo = pos[0], hi = pos[0], sink_end = 0;
  for (int32_t i = 0; i < nq; ++i) {
    const KeySpan sp = key_span(p, pos[i]);
    lo = std::min(lo, sp.first);
    hi = std::max(hi, pos[i]);
    sink_end = std::max(sink_end, sp.sink_end);
  }
  return key_segs(rows, sink_end, lo, hi);
}

// Rows ktr[0..n) of a key tile (D values each) transposed into kt [D][k_tile]; lanes n..k_tile zeroed
// when `pad` (kernels that read whole vectors of the tile).
LOOM_INLINE void transpose_tile(const float* const* ktr, int32_t n, int32_t D, float* kt, bool pad) {
  for (int32_t jj = 0; jj < n; ++jj) {
    const float* kr = ktr[jj];
    for (int32_t d = 0; d < D; ++d)
      kt[static_cast<size_t>(d) * k_tile + static_cast<size_t>(jj)] = kr[d];
  }
  if (pad)
    for (int32_t jj = n; jj < k_tile; ++jj)
      for (int32_t d = 0; d < D; ++d)
        kt[static_cast<size_t>(d) * k_tile + static_cast<size_t>(jj)] = 0.0f;
}

// A block of nq consecutive tokens of one sequence (prefill) against kv head hk: the K tile is
// transposed once and shared by all nq·G query rows, so the scores are FMAs along the keys (no
// horizontal sums); each query row keeps its own causal / window range (masked lanes get −∞).
LOOM_INLINE void attn_block(const AttentionParams& p, const float* q, float* out, size_t tok,
                            const SeqRows& rows, const Pos* pos, int32_t nq, int32_t hk, AttnScratch& w) {
  const int32_t D = p.head_dim, G = p.n_head / p.n_head_kv, R = nq * G;
  float* const kt = block_setup(D, R, w); // [D][k_tile]
  const KeySegs ks = block_keys(p, rows, pos, nq);
  const size_t koff = static_cast<size_t>(hk) * static_cast<size_t>(D);
  for (int seg = 0; seg < 2; ++seg) {
    const Pos sa = seg == 0 ? 0 : ks.b0, e = seg == 0 ? ks.a_end - 1 : ks.b1;
    for (Pos j0 = sa; j0 <= e; j0 += k_tile) {
      const int32_t n = std::min<int32_t>(k_tile, e - j0 + 1);
      const float* const* ktr = tile_rows(rows.k, rows.dt, j0, n, koff, D, w.ks, w.kp, w.f16c);
      const float* const* vtr = tile_rows(rows.v, rows.dt, j0, n, koff, D, w.vs, w.vp, w.f16c);
      transpose_tile(ktr, n, D, kt, false);
      const Pos p0 = rows.pos_of(j0), p1 = rows.pos_of(j0 + n - 1); // the tile's positions (ascending)
      for (int32_t r = 0; r < R; ++r) {
        const int32_t qi = r / G, g = r % G;
        const KeySpan sp = key_span(p, pos[qi]);
        if (p0 > sp.last || (p1 < sp.first && p0 >= sp.sink_end)) continue; // the whole tile is masked
        const float* qh =
            q + static_cast<size_t>(qi) * tok + static_cast<size_t>(hk * G + g) * static_cast<size_t>(D);
        float* s = w.s.data() + static_cast<size_t>(r) * k_tile;
        { // all k_tile scores in flight at once (independent FMA chains; lanes ≥ n are discarded)
          float a[k_tile] = {};
          for (int32_t d = 0; d < D; ++d) {
            const float qd = qh[d];
            const float* ktd = kt + static_cast<size_t>(d) * k_tile;
#pragma omp simd
            for (int32_t l = 0; l < k_tile; ++l)
              a[l] += qd * ktd[l];
          }
          std::copy(a, a + n, s);
        }
        float tmax = -INFINITY;
        for (int32_t jj = 0; jj < n; ++jj) {
          float v = s[jj] * p.scale;
          if (p.softcap > 0.0f) v = p.softcap * std::tanh(v / p.softcap);
          if (!sp.contains(rows.pos_of(j0 + jj))) v = -INFINITY;
          s[jj] = v;
          tmax = std::max(tmax, v);
        }
        float& m = w.m[static_cast<size_t>(r)];
        float& l = w.l[static_cast<size_t>(r)];
        float* acc = w.acc.data() + static_cast<size_t>(r) * static_cast<size_t>(D);
        if (tmax > m) {
          const float c = m == -INFINITY ? 0.0f : std::exp(m - tmax);
          l *= c;
          vscale(acc, c, D);
          m = tmax;
        }
        for (int32_t jj = 0; jj < n; ++jj) {
          if (s[jj] == -INFINITY) continue;
          const float ex = std::exp(s[jj] - m);
          l += ex;
          vaxpy(acc, ex, vtr[jj], D);
        }
      }
    }
  }
  for (int32_t r = 0; r < R; ++r) {
    const int32_t qi = r / G, g = r % G;
    const float* acc = w.acc.data() + static_cast<size_t>(r) * static_cast<size_t>(D);
    float* o = out + static_cast<size_t>(qi) * tok + static_cast<size_t>(hk * G + g) * static_cast<size_t>(D);
    const float inv = 1.0f / attn_denominator(w.sink_logits, hk * G + g, w.m[static_cast<size_t>(r)],
                                              w.l[static_cast<size_t>(r)]);
    for (int32_t d = 0; d < D; ++d)
      o[d] = acc[d] * inv;
  }
}

// Query tokens per prefill block: each K tile is transposed and loaded once for all of a block's rows, so
// longer blocks amortize it (16 → 64, interleaved A/B on a Xeon of the Sapphire Rapids class, pp512 tok/s:
// SmolLM2 ≈ 1 114 → 1 137, Gemma 3 ≈ 1 416 → 1 532; at depth 4096 SmolLM2 ≈ 348 → 413, Gemma 3 ≈ 736 → 910).
constexpr int32_t k_qblock = 64;
// A decode row's keys split into chunks of about this many when its span is longer (at most k_split_max
// chunks), the chunks on any thread, then combined: one row of a model with one or two KV heads (Gemma 3)
// kept one thread busy and the other idle.
constexpr int32_t k_split_keys = 256, k_split_max = 32;

LOOM_AVX2 void attn_item_avx2(const AttentionParams& p, const float* q, float* out, const SeqRows& rows,
                              const KeySegs& ks, int32_t hk, AttnScratch& w, float* part) {
  attn_item(p, q, out, rows, ks, hk, w, part);
}
void attn_item_generic(const AttentionParams& p, const float* q, float* out, const SeqRows& rows,
                       const KeySegs& ks, int32_t hk, AttnScratch& w, float* part) {
  attn_item(p, q, out, rows, ks, hk, w, part);
}
LOOM_AVX2 void attn_block_avx2(const AttentionParams& p, const float* q, float* out, size_t tok,
                               const SeqRows& rows, const Pos* pos, int32_t nq, int32_t hk, AttnScratch& w) {
  attn_block(p, q, out, tok, rows, pos, nq, hk, w);
}
// The same prefill block compiled for AVX-512 (a key tile's 64 scores in four 16-lane FMA chains).
LOOM_AVX512 void attn_block_avx512(const AttentionParams& p, const float* q, float* out, size_t tok,
                                   const SeqRows& rows, const Pos* pos, int32_t nq, int32_t hk,
                                   AttnScratch& w) {
  attn_block(p, q, out, tok, rows, pos, nq, hk, w);
}
void attn_block_generic(const AttentionParams& p, const float* q, float* out, size_t tok, const SeqRows& rows,
                        const Pos* pos, int32_t nq, int32_t hk, AttnScratch& w) {
  attn_block(p, q, out, tok, rows, pos, nq, hk, w);
}

// The decode and prefill kernels for head dims W·NV, written once (attention_item.inc,
// attention_block.inc) and compiled per level.
namespace avx2 {
using V = VecAvx2;
#define LOOM_ITEM_TARGET LOOM_AVX2
#include "attention_block.inc"
#include "attention_item.inc"
#undef LOOM_ITEM_TARGET
} // namespace avx2
namespace avx512 {
using V = VecAvx512;
#define LOOM_ITEM_TARGET LOOM_AVX512
#include "attention_block.inc"
#include "attention_item.inc"
#undef LOOM_ITEM_TARGET
} // namespace avx512

using AttnItemFn = void (*)(const AttentionParams&, const float*, float*, const SeqRows&, const KeySegs&,
                            int32_t, AttnScratch&, float*);

template <int KT> AttnItemFn pick_item_typed(int32_t D) {
  switch (D) {
  case 8:
    return avx2::attn_item_d<1, KT>;
  case 16:
    return avx2::attn_item_d<2, KT>;
  case 32:
    return avx2::attn_item_d<4, KT>;
  case 64:
    return avx2::attn_item_d<8, KT>;
  case 128:
    return avx2::attn_item_d<16, KT>;
  case 256:
    return avx2::attn_item_d<32, KT>;
  default:
    return attn_item_avx2;
  }
}

template <int KT> AttnItemFn pick_item_avx512(int32_t D) {
  switch (D) {
  case 32:
    return avx512::attn_item_d<2, KT>;
  case 64:
    return avx512::attn_item_d<4, KT>;
  case 128:
    return avx512::attn_item_d<8, KT>;
  case 256: // Gemma 3
    return avx512::attn_item_d<16, KT>;
  default:
    return pick_item_typed<KT>(D);
  }
}

AttnItemFn pick_item(Isa isa, int32_t D, DType dt) {
  if (!at_least(isa, Isa::avx2)) return attn_item_generic;
  if (at_least(isa, Isa::avx512)) switch (dt) {
    case DType::f32:
      return pick_item_avx512<0>(D);
    case DType::f16:
      return pick_item_avx512<1>(D);
    case DType::bf16:
      return pick_item_avx512<2>(D);
    default:
      break;
    }
  switch (dt) {
  case DType::f32:
    return pick_item_typed<0>(D);
  case DType::f16:
    return pick_item_typed<1>(D);
  case DType::bf16:
    return pick_item_typed<2>(D);
  default: // q8_0: converted a tile at a time
    return attn_item_avx2;
  }
}

using AttnBlockFn = void (*)(const AttentionParams&, const float*, float*, size_t, const SeqRows&, const Pos*,
                             int32_t, int32_t, AttnScratch&);

// The prefill block kernel for head dim D at `isa`: register-resident for 8 … 256 with AVX2 and 16 … 256
// with AVX-512 (attention_block.inc), else attn_block compiled for the level.
AttnBlockFn pick_block_avx2(int32_t D) {
  switch (D) {
  case 8:
    return avx2::attn_block_d<1>;
  case 16:
    return avx2::attn_block_d<2>;
  case 32:
    return avx2::attn_block_d<4>;
  case 64:
    return avx2::attn_block_d<8>;
  case 128:
    return avx2::attn_block_d<16>;
  case 256:
    return avx2::attn_block_d<32>;
  default:
    return attn_block_avx2;
  }
}

AttnBlockFn pick_block(Isa isa, int32_t D) {
  if (!at_least(isa, Isa::avx2)) return attn_block_generic;
  if (!at_least(isa, Isa::avx512)) return pick_block_avx2(D);
  switch (D) {
  case 16:
    return avx512::attn_block_d<1>;
  case 32:
    return avx512::attn_block_d<2>;
  case 64:
    return avx512::attn_block_d<4>;
  case 128:
    return avx512::attn_block_d<8>;
  case 256: // Gemma 3
    return avx512::attn_block_d<16>;
  default:
    return D == 8 ? avx2::attn_block_d<1> : attn_block_avx512;
  }
}

// What attn_all runs: prefill blocks (up to k_qblock consecutive tokens of one sequence) and decode rows per
// kv head, a decode row over a long span split into chunks of its keys (k_split_keys), and the token-tree
// rows. A split depends on the row's own span alone, so a sequence's floats do not depend on what else is
// in the batch.
struct AttnPlan {
  struct Work {
    int32_t block = -1; // index into blocks, or -1: tree row `tree_at`
    int32_t tree_at = -1, hk = 0;
    KeySegs ks;
    int64_t part = -1; // a chunk: its partial sums' slot (G rows of D + 2)
  };
  struct Split { // a decode row's chunks, parts [part0, part0 + n)
    int32_t t, hk;
    int64_t part0;
    int32_t n;
  };
  std::vector<std::pair<int32_t, int32_t>> blocks; // (first token, count)
  std::vector<Work> work;
  std::vector<Split> splits;
  int64_t n_parts = 0;
};

AttnPlan plan_attention(const AttentionParams& p, int32_t T, const Pos* pos, const std::vector<SeqRows>& rows,
                        const std::vector<int32_t>& row_of, size_t n_tree) {
  AttnPlan a;
  for (int32_t t = 0; t < T;) {
    if (row_of[static_cast<size_t>(t)] < 0) { // a tree row: its own item below
      ++t;
      continue;
    }
    int32_t e = t + 1;
    while (e < T && e - t < k_qblock && row_of[static_cast<size_t>(e)] == row_of[static_cast<size_t>(t)])
      ++e;
    a.blocks.emplace_back(t, e - t);
    t = e;
  }
  for (size_t b = 0; b < a.blocks.size(); ++b)
    for (int32_t hk = 0; hk < p.n_head_kv; ++hk) {
      const auto [t, nq] = a.blocks[b];
      if (nq > 1) {
        a.work.push_back({static_cast<int32_t>(b), -1, hk, {}, -1});
        continue;
      }
      const SeqRows& sr = rows[static_cast<size_t>(row_of[static_cast<size_t>(t)])];
      const KeySpan sp = key_span(p, pos[t]);
      const KeySegs ks = key_segs(sr, sp.sink_end, sp.first, sp.last);
      const auto nb = static_cast<int32_t>(std::max<Pos>(0, ks.b1 - ks.b0 + 1));
      const int32_t n = std::clamp(nb / k_split_keys, 1, k_split_max);
      if (n == 1) {
        a.work.push_back({static_cast<int32_t>(b), -1, hk, ks, -1});
        continue;
      }
      a.splits.push_back({t, hk, a.n_parts, n});
      for (int32_t c = 0; c < n; ++c) { // the sinks go with the first chunk
        const Pos c0 = ks.b0 + static_cast<Pos>(static_cast<int64_t>(nb) * c / n);
        const Pos c1 = ks.b0 + static_cast<Pos>(static_cast<int64_t>(nb) * (c + 1) / n) - 1;
        a.work.push_back(
            {static_cast<int32_t>(b), -1, hk, KeySegs{c == 0 ? ks.a_end : 0, c0, c1}, a.n_parts++});
      }
    }
  for (size_t i = 0; i < n_tree; ++i)
    for (int32_t hk = 0; hk < p.n_head_kv; ++hk)
      a.work.push_back({-1, static_cast<int32_t>(i), hk, {}, -1});
  return a;
}

// A split decode row's output: each head's chunk sums rescaled to the largest running max, over their sum.
void combine_split(const AttentionParams& p, const AttnPlan::Split& sp, const float* parts, float* out,
                   const float* sink_logits) {
  const int32_t G = p.n_head / p.n_head_kv, D = p.head_dim;
  const size_t part_floats = static_cast<size_t>(G) * static_cast<size_t>(D + 2);
  for (int32_t g = 0; g < G; ++g) {
    const auto at = [&](int32_t c) {
      return parts + static_cast<size_t>(sp.part0 + c) * part_floats + static_cast<size_t>(g) * (D + 2);
    };
    float m = -INFINITY;
    for (int32_t c = 0; c < sp.n; ++c)
      m = std::max(m, at(c)[D]);
    float* o = out + static_cast<size_t>(sp.hk * G + g) * D;
    std::fill_n(o, D, 0.0f);
    float l = 0.0f;
    for (int32_t c = 0; c < sp.n; ++c) {
      const float* pc = at(c);
      const float f = pc[D] == -INFINITY ? 0.0f : std::exp(pc[D] - m);
      l += f * pc[D + 1];
      vaxpy(o, f, pc, D);
    }
    vscale(o, 1.0f / attn_denominator(sink_logits, sp.hk * G + g, m, l), D);
  }
}

// rows[row_of[t]]: the keys of token t's sequence (row_of[t] < 0: a tree row, in `tree` instead);
// tree: (token, the list of exactly its keys) for each token-tree row.
void attn_all(const AttentionParams& p, const float* q, int32_t T, const Pos* pos,
              const std::vector<SeqRows>& rows, const std::vector<int32_t>& row_of, float* out, Isa isa,
              const std::vector<std::pair<int32_t, SeqRows>>& tree, const float* sink_logits) {
  const size_t tok = static_cast<size_t>(p.n_head) * static_cast<size_t>(p.head_dim);
  const AttnItemFn item = pick_item(isa, p.head_dim,
                                    !rows.empty()   ? rows.front().dt
                                    : !tree.empty() ? tree.front().second.dt
                                                    : DType::f32);
  const AttnBlockFn block = pick_block(isa, p.head_dim);
  const AttnPlan plan = plan_attention(p, T, pos, rows, row_of, tree.size());
  const size_t part_floats =
      static_cast<size_t>(p.n_head / p.n_head_kv) * static_cast<size_t>(p.head_dim + 2);
  std::vector<float> parts(static_cast<size_t>(plan.n_parts) * part_floats);
  const auto items = static_cast<int64_t>(plan.work.size());
#pragma omp parallel if (items > 1)
  {
    AttnScratch w;
    w.f16c = at_least(isa, Isa::avx2);
    w.sink_logits = sink_logits;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const AttnPlan::Work& k = plan.work[static_cast<size_t>(it)];
      if (k.block < 0) { // a tree row: a decode row over its own key list
        const auto& [t, tr] = tree[static_cast<size_t>(k.tree_at)];
        item(p, q + static_cast<size_t>(t) * tok, out + static_cast<size_t>(t) * tok, tr,
             KeySegs{0, 0, static_cast<Pos>(tr.k.size()) - 1}, k.hk, w, nullptr);
        continue;
      }
      const auto [t, nq] = plan.blocks[static_cast<size_t>(k.block)];
      const SeqRows& sr = rows[static_cast<size_t>(row_of[static_cast<size_t>(t)])];
      if (nq == 1) // decode: one token, no transpose worth its cost
        item(p, q + static_cast<size_t>(t) * tok, out + static_cast<size_t>(t) * tok, sr, k.ks, k.hk, w,
             k.part < 0 ? nullptr : parts.data() + static_cast<size_t>(k.part) * part_floats);
      else
        block(p, q + static_cast<size_t>(t) * tok, out + static_cast<size_t>(t) * tok, tok, sr, pos + t, nq,
              k.hk, w);
    }
#pragma omp for schedule(static)
    for (size_t i = 0; i < plan.splits.size(); ++i)
      combine_split(p, plan.splits[i], parts.data(), out + static_cast<size_t>(plan.splits[i].t) * tok,
                    sink_logits);
  }
}

} // namespace

void flash_attention(const AttentionParams& p, const float* q, int32_t n_tokens, const Pos* pos,
                     const KVRows& kv, float* out, Isa isa, const Pos* rope, const Pos* tree_base,
                     const uint64_t* tree_mask, const float* sink_logits) {
  LOOM_ASSERT(p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0, "bad head grouping");
  // The K/V row addresses of every sequence in the batch that some token attends (sinks, then the
  // window rows from the earliest token's first key), fetched once for all heads and tokens.
  std::vector<SeqRows> rows;
  std::vector<Pos> sink_end; // per sequence: the most sink rows any of its tokens reads
  std::vector<int32_t> row_of(static_cast<size_t>(n_tokens));
  const auto in_tree = [&](int32_t t) { return tree_base && tree_base[t] <= pos[t]; };
  for (int32_t t = 0; t < n_tokens; ++t) {
    if (in_tree(t)) {
      row_of[static_cast<size_t>(t)] = -1;
      continue;
    }
    size_t i = 0;
    const int32_t sq = kv.seq_of(static_cast<size_t>(t));
    while (i < rows.size() && rows[i].seq != sq)
      ++i;
    const KeySpan sp = key_span(p, pos[t]);
    if (i == rows.size()) {
      SeqRows r;
      r.seq = sq;
      r.lo = sp.first;
      r.dt = kv.kv_dtype();
      rows.push_back(std::move(r));
      sink_end.push_back(0);
    }
    rows[i].n_pos = std::max(rows[i].n_pos, pos[t] + 1);
    rows[i].lo = std::min(rows[i].lo, sp.first);
    sink_end[i] = std::max(sink_end[i], sp.sink_end);
    row_of[static_cast<size_t>(t)] = static_cast<int32_t>(i);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    SeqRows& r = rows[i];
    r.n_sink = std::min(sink_end[i], r.lo);
    const auto n = static_cast<size_t>(r.n_sink + (r.n_pos - r.lo));
    r.k.resize(n);
    r.v.resize(n);
    for (size_t c = 0; c < n; ++c) {
      const Pos j = r.pos_of(static_cast<Pos>(c));
      r.k[c] = kv.k_at(p.layer, r.seq, j);
      r.v[c] = kv.v_at(p.layer, r.seq, j);
    }
  }
  // Token-tree rows: each one's keys listed (the slots below its tree that the window at its rope position
  // allows, then its ancestors and itself), the addresses of a sequence's slots fetched once.
  std::vector<std::pair<int32_t, SeqRows>> tree;
  if (tree_base) {
    std::vector<std::pair<int32_t, std::vector<const uint8_t*>>> kall, vall; // per sequence: slot → row
    for (int32_t t = 0; t < n_tokens; ++t) {
      if (!in_tree(t)) continue;
      const int32_t sq = kv.seq_of(static_cast<size_t>(t));
      size_t i = 0;
      while (i < kall.size() && kall[i].first != sq)
        ++i;
      if (i == kall.size()) {
        kall.emplace_back(sq, std::vector<const uint8_t*>{});
        vall.emplace_back(sq, std::vector<const uint8_t*>{});
      }
      auto& ka = kall[i].second;
      auto& va = vall[i].second;
      const KeySpan span = key_span(p, rope[t]);
      SeqRows r;
      r.seq = sq;
      r.dt = kv.kv_dtype();
      const auto add = [&](Pos j) {
        const auto u = static_cast<size_t>(j);
        if (u >= ka.size()) {
          ka.resize(u + 1, nullptr);
          va.resize(u + 1, nullptr);
        }
        if (!ka[u]) {
          ka[u] = kv.k_at(p.layer, sq, j);
          va[u] = kv.v_at(p.layer, sq, j);
        }
        r.k.push_back(ka[u]);
        r.v.push_back(va[u]);
      };
      const Pos base = tree_base[t];
      r.k.reserve(static_cast<size_t>(pos[t]) + 1);
      r.v.reserve(static_cast<size_t>(pos[t]) + 1);
      for (Pos j = 0; j < std::min(span.sink_end, base); ++j) // [0, sink_end) ∪ [first, last] below the tree
        add(j);
      for (Pos j = std::max(span.first, span.sink_end); j <= std::min(span.last, base - 1); ++j)
        add(j);
      for (Pos a = 0; a < k_max_tree_nodes && base + a <= pos[t]; ++a) // its ancestors and itself
        if ((tree_mask[t] >> a) & 1u) add(base + a);
      r.n_pos = static_cast<Pos>(r.k.size());
      tree.emplace_back(t, std::move(r));
    }
  }
  attn_all(p, q, n_tokens, pos, rows, row_of, out, isa, tree, sink_logits);
}

} // namespace loom::cpu
