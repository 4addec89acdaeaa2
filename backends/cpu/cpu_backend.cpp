// The cpu backend's executor. Every op runs on the process's one OpenMP pool (the one oneDNN uses),
// so nothing oversubscribes the cores. Loops are written plainly and compiled twice — generic and
// AVX2/FMA (GCC vectorizes them there; `omp simd` lets it reorder the sums) — and the path is the
// one detect_isa() chose. Tested op by op against the reference backend (tests/backends/).
#include "cpu_backend.hpp"

#include "loom/sdk/error.hpp"
#include "loom/sdk/reference.hpp"
#include "loom/sdk/rope.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <immintrin.h>
#include <map>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <sys/mman.h>
#include <tuple>
#include <unistd.h>
#include <vector>

// GCC 12 warns inside its own AVX-512 headers (the _mm512_undefined_* pass-through operands of the
// unmasked intrinsics): a known false positive, silenced for this file's AVX-512 code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace loom::cpu {

namespace {

// Whether [p, p + n) lies in a read-only private file mapping (a model file mapped by the GGUF
// loader): its pages are clean page-cache pages, so dropping them loses nothing — a later read
// simply faults them back in. Anything else (heap, writable mappings) must not be dropped.
bool in_readonly_file_mapping(const void* p, size_t n) {
  const auto lo = reinterpret_cast<uintptr_t>(p), hi = lo + n;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long a = 0, b = 0, inode = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %*s %*s %lu", &a, &b, perms, &inode) != 4) continue;
    if (a <= lo && hi <= b) return inode != 0 && std::string(perms) == "r--p";
  }
  return false;
}

// Drops this process's pages lying wholly inside [p, p + n) (from such a mapping).
void drop_pages(const void* p, size_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto lo = reinterpret_cast<uintptr_t>(p);
  const uintptr_t a = (lo + page - 1) / page * page, b = (lo + n) / page * page;
  if (a < b) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

struct FreeDeleter {
  void operator()(uint8_t* p) const noexcept { std::free(p); }
};

#define LOOM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LOOM_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define LOOM_INLINE inline __attribute__((always_inline))

// ---- small vector helpers (inlined into a generic and an AVX2 copy of each caller) ----

LOOM_INLINE float vdot(const float* a, const float* b, int32_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int32_t i = 0; i < n; ++i)
    s += a[i] * b[i];
  return s;
}

LOOM_INLINE void vaxpy(float* y, float a, const float* x, int32_t n) {
#pragma omp simd
  for (int32_t i = 0; i < n; ++i)
    y[i] += a * x[i];
}

LOOM_INLINE void vscale(float* y, float a, int32_t n) {
#pragma omp simd
  for (int32_t i = 0; i < n; ++i)
    y[i] *= a;
}

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
  bool f16c = false; // F16 / BF16 cache rows convert with AVX2 + F16C (exact either way)
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

// One (token, kv head) item: the n_gqa query heads that share kv head hk, over keys ks (compact).
LOOM_INLINE void attn_item(const AttentionParams& p, const float* q, float* out, const SeqRows& rows,
                           const KeySegs& ks, int32_t hk, AttnScratch& w) {
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
  for (int32_t g = 0; g < G; ++g) {
    const float* acc = w.acc.data() + static_cast<size_t>(g) * static_cast<size_t>(D);
    float* o = out + static_cast<size_t>(hk * G + g) * static_cast<size_t>(D);
    const float inv = 1.0f / w.l[static_cast<size_t>(g)];
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
    const float inv = 1.0f / w.l[static_cast<size_t>(r)];
    for (int32_t d = 0; d < D; ++d)
      o[d] = acc[d] * inv;
  }
}

constexpr int32_t k_qblock = 16; // query tokens per prefill block

LOOM_AVX2 void attn_item_avx2(const AttentionParams& p, const float* q, float* out, const SeqRows& rows,
                              const KeySegs& ks, int32_t hk, AttnScratch& w) {
  attn_item(p, q, out, rows, ks, hk, w);
}
void attn_item_generic(const AttentionParams& p, const float* q, float* out, const SeqRows& rows,
                       const KeySegs& ks, int32_t hk, AttnScratch& w) {
  attn_item(p, q, out, rows, ks, hk, w);
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

// e^x for x ≤ 0 (scores minus their running max), ≈ 1 ulp: x = n·ln 2 + r (Cody–Waite, |r| ≤ ln 2 / 2),
// e^r by the minimax polynomial of Cephes' expf, times 2^n by vscalefps. Below −87.3 (where e^x leaves
// the normal floats) it returns e^−87.3; the callers zero their masked (−∞) lanes themselves; NaN → NaN.
LOOM_AVX512 inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-87.3f), x); // (max returns its second operand for NaN: kept)
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

// attn_block for head dims 16·NV with AVX-512: the same tiles and online softmax, but a query row's
// output accumulator stays in NV registers across a tile's keys (attn_block loads and stores it per
// key), the exps are vectorized (exp512), and the scores of two rows share each key-tile load.
template <int NV>
LOOM_AVX512 void attn_block_avx512_d(const AttentionParams& p, const float* q, float* out, size_t tok,
                                     const SeqRows& rows, const Pos* pos, int32_t nq, int32_t hk,
                                     AttnScratch& w) {
  constexpr int32_t D = 16 * NV;
  const int32_t G = p.n_head / p.n_head_kv, R = nq * G;
  float* const kt = block_setup(D, R, w); // [D][k_tile]
  const KeySegs ks = block_keys(p, rows, pos, nq);
  const size_t koff = static_cast<size_t>(hk) * static_cast<size_t>(D);
  constexpr int NT = k_tile / 16; // score vectors per row
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  for (int seg = 0; seg < 2; ++seg) {
    const Pos sa = seg == 0 ? 0 : ks.b0, e = seg == 0 ? ks.a_end - 1 : ks.b1;
    for (Pos j0 = sa; j0 <= e; j0 += k_tile) {
      const int32_t n = std::min<int32_t>(k_tile, e - j0 + 1);
      const float* const* ktr = tile_rows(rows.k, rows.dt, j0, n, koff, D, w.ks, w.kp, w.f16c);
      const float* const* vtr = tile_rows(rows.v, rows.dt, j0, n, koff, D, w.vs, w.vp, w.f16c);
      transpose_tile(ktr, n, D, kt, true); // lanes past the tile: finite, then masked
      const Pos p0 = rows.pos_of(j0), p1 = rows.pos_of(j0 + n - 1); // the tile's positions (ascending)
      // whether lane jj of the tile holds a key (a position every row then checks against its span)
      alignas(64) int32_t kpos[k_tile];
      for (int32_t jj = 0; jj < k_tile; ++jj)
        kpos[jj] = jj < n ? static_cast<int32_t>(rows.pos_of(j0 + jj)) : -1;
      const auto row_live = [&](int32_t r) {
        const KeySpan sp = key_span(p, pos[r / G]);
        return !(p0 > sp.last || (p1 < sp.first && p0 >= sp.sink_end));
      };
      const auto qrow = [&](int32_t r) {
        return q + static_cast<size_t>(r / G) * tok +
               static_cast<size_t>(hk * G + r % G) * static_cast<size_t>(D);
      };
      // scores: four rows at a time, each key-tile vector loaded once for all four (rows past R repeat
      // the last one and are not stored)
      for (int32_t r = 0; r < R; r += 4) {
        const float* qr[4];
        for (int u = 0; u < 4; ++u)
          qr[u] = qrow(std::min(r + u, R - 1));
        __m512 a[4][NT];
        for (auto& au : a)
          for (auto& v : au)
            v = _mm512_setzero_ps();
        for (int32_t d = 0; d < D; ++d) {
          __m512 x[4];
          for (int u = 0; u < 4; ++u)
            x[u] = _mm512_set1_ps(qr[u][d]);
          const float* ktd = kt + static_cast<size_t>(d) * k_tile;
#pragma GCC unroll 4
          for (int i = 0; i < NT; ++i) {
            const __m512 kv = _mm512_loadu_ps(ktd + 16 * i); // (the scratch is only 16-byte aligned)
            for (int u = 0; u < 4; ++u)
              a[u][i] = _mm512_fmadd_ps(x[u], kv, a[u][i]);
          }
        }
        for (int u = 0; u < 4 && r + u < R; ++u)
          for (int i = 0; i < NT; ++i)
            _mm512_storeu_ps(w.s.data() + static_cast<size_t>(r + u) * k_tile + 16 * i, a[u][i]);
      }
      // Rows two at a time: first each one's masked scores, running max (its output rescaled in scratch)
      // and exps; then the weighted sum of V for both together, each V vector loaded once for the two and
      // their accumulators two independent chains (one row's NV chains alone wait on the FMA latency at
      // every key). Per row the same operations in the same order as one row at a time.
      for (int32_t r0 = 0; r0 < R; r0 += 2) {
        bool live[2] = {false, false};
        for (int32_t u = 0; u < 2 && r0 + u < R; ++u) {
          const int32_t r = r0 + u;
          if (!row_live(r)) continue; // the whole tile is masked
          const KeySpan sp = key_span(p, pos[r / G]);
          float* s = w.s.data() + static_cast<size_t>(r) * k_tile;
          // scale, soft-cap, mask; the tile's max
          __m512 vmax = neg_inf;
          for (int i = 0; i < NT; ++i) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s + 16 * i), _mm512_set1_ps(p.scale));
            if (p.softcap > 0.0f) {
              alignas(64) float t[16];
              _mm512_store_ps(t, v);
              for (float& x : t)
                x = p.softcap * std::tanh(x / p.softcap);
              v = _mm512_load_ps(t);
            }
            const __m512i kp = _mm512_load_si512(kpos + 16 * i);
            // in span: first ≤ pos ≤ last, or pos < sink_end (a sink); lanes past the tile hold −1
            const __mmask16 valid = _mm512_cmpge_epi32_mask(kp, _mm512_setzero_si512());
            const __mmask16 in_win =
                _mm512_cmpge_epi32_mask(kp, _mm512_set1_epi32(static_cast<int32_t>(sp.first))) &
                _mm512_cmple_epi32_mask(kp, _mm512_set1_epi32(static_cast<int32_t>(sp.last)));
            const __mmask16 sink =
                _mm512_cmplt_epi32_mask(kp, _mm512_set1_epi32(static_cast<int32_t>(sp.sink_end)));
            v = _mm512_mask_blend_ps(valid & (in_win | sink), neg_inf, v);
            _mm512_storeu_ps(s + 16 * i, v);
            vmax = _mm512_max_ps(vmax, v);
          }
          const float tmax = _mm512_reduce_max_ps(vmax);
          if (tmax == -INFINITY) continue;
          float& m = w.m[static_cast<size_t>(r)];
          float& l = w.l[static_cast<size_t>(r)];
          if (tmax > m) {
            const float c = m == -INFINITY ? 0.0f : std::exp(m - tmax);
            l *= c;
            float* acc = w.acc.data() + static_cast<size_t>(r) * static_cast<size_t>(D);
            for (int i = 0; i < NV; ++i)
              _mm512_storeu_ps(acc + 16 * i, _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * i), _mm512_set1_ps(c)));
            m = tmax;
          }
          __m512 lsum = _mm512_setzero_ps();
          for (int i = 0; i < NT; ++i) {
            const __m512 v = _mm512_loadu_ps(s + 16 * i);
            // masked lanes give 0; a NaN score stays NaN and spreads to the output, as in attn_block
            const __mmask16 lv = _mm512_cmp_ps_mask(v, neg_inf, _CMP_NEQ_UQ);
            const __m512 ex = _mm512_maskz_mov_ps(lv, exp512(_mm512_sub_ps(v, _mm512_set1_ps(m))));
            _mm512_storeu_ps(s + 16 * i, ex);
            lsum = _mm512_add_ps(lsum, ex);
          }
          l += _mm512_reduce_add_ps(lsum);
          live[u] = true;
        }
        if (!live[0] && !live[1]) continue;
        // one live row: its own loop; two: both at once, a row whose weight is 0 left unchanged (masked)
        const int32_t ra = live[0] ? r0 : r0 + 1, rb = live[0] && live[1] ? r0 + 1 : ra;
        const float* wa = w.s.data() + static_cast<size_t>(ra) * k_tile;
        const float* wb = w.s.data() + static_cast<size_t>(rb) * k_tile;
        float* acca = w.acc.data() + static_cast<size_t>(ra) * static_cast<size_t>(D);
        float* accb = w.acc.data() + static_cast<size_t>(rb) * static_cast<size_t>(D);
        __m512 av[NV], bv[NV];
        for (int i = 0; i < NV; ++i)
          av[i] = _mm512_loadu_ps(acca + 16 * i);
        if (rb == ra) {
          for (int32_t jj = 0; jj < n; ++jj) {
            if (wa[jj] == 0.0f) continue;
            const __m512 ev = _mm512_set1_ps(wa[jj]);
            const float* vv = vtr[jj];
            for (int i = 0; i < NV; ++i)
              av[i] = _mm512_fmadd_ps(ev, _mm512_loadu_ps(vv + 16 * i), av[i]);
          }
        } else {
          for (int i = 0; i < NV; ++i)
            bv[i] = _mm512_loadu_ps(accb + 16 * i);
          for (int32_t jj = 0; jj < n; ++jj) {
            const bool za = wa[jj] == 0.0f, zb = wb[jj] == 0.0f;
            if (za && zb) continue;
            const __mmask16 ka = za ? 0 : 0xFFFF, kb = zb ? 0 : 0xFFFF;
            const __m512 ea = _mm512_set1_ps(wa[jj]), eb = _mm512_set1_ps(wb[jj]);
            const float* vv = vtr[jj];
            for (int i = 0; i < NV; ++i) {
              const __m512 v = _mm512_loadu_ps(vv + 16 * i);
              av[i] = _mm512_mask3_fmadd_ps(ea, v, av[i], ka);
              bv[i] = _mm512_mask3_fmadd_ps(eb, v, bv[i], kb);
            }
          }
          for (int i = 0; i < NV; ++i)
            _mm512_storeu_ps(accb + 16 * i, bv[i]);
        }
        for (int i = 0; i < NV; ++i)
          _mm512_storeu_ps(acca + 16 * i, av[i]);
      }
    }
  }
  for (int32_t r = 0; r < R; ++r) {
    const float* acc = w.acc.data() + static_cast<size_t>(r) * static_cast<size_t>(D);
    float* o =
        out + static_cast<size_t>(r / G) * tok + static_cast<size_t>(hk * G + r % G) * static_cast<size_t>(D);
    const __m512 inv = _mm512_set1_ps(1.0f / w.l[static_cast<size_t>(r)]);
    for (int i = 0; i < NV; ++i)
      _mm512_storeu_ps(o + 16 * i, _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * i), inv));
  }
}

// Decode attention with AVX2 intrinsics for head dims 8·NV: q and the output accumulator live in
// registers, eight keys' scores are reduced together (one transpose of eight partial sums instead of
// eight horizontal sums).
// Eight values of a KV row from element `at` on: f32 (KT 0), f16 (1, F16C) or bf16 (2) storage.
template <int KT> LOOM_AVX2 inline __m256 load8(const uint8_t* row, size_t at) {
  if constexpr (KT == 0) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + at);
  } else if constexpr (KT == 1) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * at)));
  } else {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * at)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
}

// e^x for x ≤ 0 with AVX2, as exp512 computes it (Cody–Waite reduction, Cephes' expf polynomial), 2^n
// built in the exponent bits (n ≥ −126 after the clamp at −87.3, so a normal float); NaN → NaN.
LOOM_AVX2 inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x); // (max returns its second operand for NaN: kept)
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

template <int NV, int KT>
LOOM_AVX2 void attn_item_avx2_d(const AttentionParams& p, const float* q, float* out, const SeqRows& rows,
                                const KeySegs& ks, int32_t hk, AttnScratch& w) {
  constexpr int32_t D = NV * 8;
  constexpr size_t esize = KT == 0 ? 4 : 2;
  const int32_t G = p.n_head / p.n_head_kv;
  const size_t koff = static_cast<size_t>(hk) * D;
  w.s.resize(k_tile);
  float* s = w.s.data();
  // The G query heads take each tile of keys in turn (as attn_item_avx512_d: at depth, one head at a time
  // over all keys reads the KV head's rows G times from L3).
  w.acc.assign(static_cast<size_t>(G) * D, 0.0f);
  w.m.assign(static_cast<size_t>(G), -INFINITY);
  w.l.assign(static_cast<size_t>(G), 0.0f);
  for (int seg = 0; seg < 2; ++seg) {
    const Pos sa = seg == 0 ? 0 : ks.b0, e = seg == 0 ? ks.a_end - 1 : ks.b1;
    for (Pos j0 = sa; j0 <= e; j0 += k_tile) {
      const int32_t n = std::min<int32_t>(k_tile, e - j0 + 1);
      const uint8_t* const* kr = rows.k.data() + j0;
      const uint8_t* const* vr = rows.v.data() + j0;
      for (int32_t g = 0; g < G; ++g) {
        const float* qh = q + static_cast<size_t>(hk * G + g) * D;
        float* ga = w.acc.data() + static_cast<size_t>(g) * D;
        __m256 qv[NV], acc[NV];
        for (int i = 0; i < NV; ++i) {
          qv[i] = _mm256_loadu_ps(qh + 8 * i);
          acc[i] = _mm256_loadu_ps(ga + 8 * i);
        }
        float m = w.m[static_cast<size_t>(g)], l = w.l[static_cast<size_t>(g)];
        int32_t jj = 0;
        for (; jj + 8 <= n; jj += 8) {
          __m256 d[8];
          if (g == 0 && jj + 16 <= n) // the first head brings the tile in
            for (int k = 8; k < 16; ++k)
              _mm_prefetch(reinterpret_cast<const char*>(kr[jj + k] + koff * esize), _MM_HINT_T0);
          for (int k = 0; k < 8; ++k) {
            const uint8_t* kk = kr[jj + k];
            d[k] = _mm256_mul_ps(qv[0], load8<KT>(kk, koff));
            for (int i = 1; i < NV; ++i)
              d[k] = _mm256_fmadd_ps(qv[i], load8<KT>(kk, koff + 8 * static_cast<size_t>(i)), d[k]);
          }
          const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(d[0], d[1]), _mm256_hadd_ps(d[2], d[3]));
          const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(d[4], d[5]), _mm256_hadd_ps(d[6], d[7]));
          const __m256 r =
              _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
          _mm256_storeu_ps(s + jj, _mm256_mul_ps(r, _mm256_set1_ps(p.scale)));
        }
        for (; jj < n; ++jj) {
          const uint8_t* kk = kr[jj];
          __m256 d = _mm256_mul_ps(qv[0], load8<KT>(kk, koff));
          for (int i = 1; i < NV; ++i)
            d = _mm256_fmadd_ps(qv[i], load8<KT>(kk, koff + 8 * static_cast<size_t>(i)), d);
          __m128 h = _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
          h = _mm_add_ps(h, _mm_movehl_ps(h, h));
          h = _mm_add_ss(h, _mm_movehdup_ps(h));
          s[jj] = _mm_cvtss_f32(h) * p.scale;
        }
        float tmax = -INFINITY;
        for (jj = 0; jj < n; ++jj) {
          if (p.softcap > 0.0f) s[jj] = p.softcap * std::tanh(s[jj] / p.softcap);
          tmax = std::max(tmax, s[jj]);
        }
        if (tmax > m) {
          const float c = m == -INFINITY ? 0.0f : std::exp(m - tmax);
          l *= c;
          for (int i = 0; i < NV; ++i)
            acc[i] = _mm256_mul_ps(acc[i], _mm256_set1_ps(c));
          m = tmax;
        }
        { // the exps first, 8 at a time (a call in the loop below would spill acc)
          const __m256 mv = _mm256_set1_ps(m);
          __m256 lv = _mm256_setzero_ps();
          for (jj = 0; jj + 8 <= n; jj += 8) {
            const __m256 ev = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + jj), mv));
            _mm256_storeu_ps(s + jj, ev);
            lv = _mm256_add_ps(lv, ev);
          }
          __m128 h = _mm_add_ps(_mm256_castps256_ps128(lv), _mm256_extractf128_ps(lv, 1));
          h = _mm_add_ps(h, _mm_movehl_ps(h, h));
          h = _mm_add_ss(h, _mm_movehdup_ps(h));
          l += _mm_cvtss_f32(h);
          for (; jj < n; ++jj) {
            s[jj] = std::exp(s[jj] - m);
            l += s[jj];
          }
        }
        for (jj = 0; jj < n; ++jj) {
          if (g == 0 && jj + 4 < n)
            _mm_prefetch(reinterpret_cast<const char*>(vr[jj + 4] + koff * esize), _MM_HINT_T0);
          const __m256 ev = _mm256_set1_ps(s[jj]);
          const uint8_t* vv = vr[jj];
          for (int i = 0; i < NV; ++i)
            acc[i] = _mm256_fmadd_ps(ev, load8<KT>(vv, koff + 8 * static_cast<size_t>(i)), acc[i]);
        }
        for (int i = 0; i < NV; ++i)
          _mm256_storeu_ps(ga + 8 * i, acc[i]);
        w.m[static_cast<size_t>(g)] = m;
        w.l[static_cast<size_t>(g)] = l;
      }
    }
  }
  for (int32_t g = 0; g < G; ++g) {
    float* o = out + static_cast<size_t>(hk * G + g) * D;
    const float* ga = w.acc.data() + static_cast<size_t>(g) * D;
    const __m256 inv = _mm256_set1_ps(1.0f / w.l[static_cast<size_t>(g)]);
    for (int i = 0; i < NV; ++i)
      _mm256_storeu_ps(o + 8 * i, _mm256_mul_ps(_mm256_loadu_ps(ga + 8 * i), inv));
  }
}

// attn_item_avx2_d with AVX-512 (D = 16·NW): a key row is NW vectors; sixteen keys' dot products are
// summed into one vector of sixteen scores by a transpose-and-add tree (45 operations for 16 keys, where
// the AVX2 kernel spends 10 per 8); the softmax update and the weighted sum of V as there — half the
// instructions per key, the exps 16 at a time (exp512).
template <int KT> LOOM_AVX512 inline __m512 load16(const uint8_t* row, size_t at) {
  if constexpr (KT == 0) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + at);
  } else if constexpr (KT == 1) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * at)));
  } else {
    const __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * at)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}

// Lane k = the sum of d[k]'s sixteen lanes.
LOOM_AVX512 inline __m512 sum16x16(const __m512 (&d)[16]) {
  __m512 t[8], u[4];
  for (int k = 0; k < 8; ++k) // per 128-bit lane: d[2k]'s pair sums at 0, 2; d[2k + 1]'s at 1, 3
    t[k] =
        _mm512_add_ps(_mm512_unpacklo_ps(d[2 * k], d[2 * k + 1]), _mm512_unpackhi_ps(d[2 * k], d[2 * k + 1]));
  for (int k = 0; k < 4; ++k) { // per 128-bit lane L: the lane sums of d[4k .. 4k + 3]
    const __m512d a = _mm512_castps_pd(t[2 * k]), b = _mm512_castps_pd(t[2 * k + 1]);
    u[k] =
        _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 x0 =
      _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
  const __m512 x1 =
      _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x88), _mm512_shuffle_f32x4(x0, x1, 0xDD));
}

template <int NW, int KT>
LOOM_AVX512 void attn_item_avx512_d(const AttentionParams& p, const float* q, float* out, const SeqRows& rows,
                                    const KeySegs& ks, int32_t hk, AttnScratch& w) {
  constexpr int32_t D = NW * 16;
  constexpr size_t esize = KT == 0 ? 4 : 2;
  const int32_t G = p.n_head / p.n_head_kv;
  const size_t koff = static_cast<size_t>(hk) * D;
  w.s.resize(k_tile);
  float* s = w.s.data();
  // The G query heads of this KV head take each tile of keys in turn while it is in L1/L2 (one head at a
  // time over all keys would read the head's whole K and V G times: from L3 once they outgrow L2, the
  // limit at depth), each head's running max, sum and output kept in scratch between tiles — per head the
  // same operations in the same order as over all keys at once.
  w.acc.assign(static_cast<size_t>(G) * D, 0.0f);
  w.m.assign(static_cast<size_t>(G), -INFINITY);
  w.l.assign(static_cast<size_t>(G), 0.0f);
  for (int seg = 0; seg < 2; ++seg) {
    const Pos sa = seg == 0 ? 0 : ks.b0, e = seg == 0 ? ks.a_end - 1 : ks.b1;
    for (Pos j0 = sa; j0 <= e; j0 += k_tile) {
      const int32_t n = std::min<int32_t>(k_tile, e - j0 + 1);
      const uint8_t* const* kr = rows.k.data() + j0;
      const uint8_t* const* vr = rows.v.data() + j0;
      for (int32_t g = 0; g < G; ++g) {
        const float* qh = q + static_cast<size_t>(hk * G + g) * D;
        float* ga = w.acc.data() + static_cast<size_t>(g) * D;
        __m512 qv[NW], acc[NW];
        for (int i = 0; i < NW; ++i) {
          qv[i] = _mm512_loadu_ps(qh + 16 * i);
          acc[i] = _mm512_loadu_ps(ga + 16 * i);
        }
        float m = w.m[static_cast<size_t>(g)], l = w.l[static_cast<size_t>(g)];
        int32_t jj = 0;
        for (; jj + 16 <= n; jj += 16) {
          __m512 d[16];
          if (g == 0 && jj + 32 <= n) // the first head brings the tile in
            for (int k = 16; k < 32; ++k)
              _mm_prefetch(reinterpret_cast<const char*>(kr[jj + k] + koff * esize), _MM_HINT_T0);
          for (int k = 0; k < 16; ++k) {
            const uint8_t* kk = kr[jj + k];
            d[k] = _mm512_mul_ps(qv[0], load16<KT>(kk, koff));
            for (int i = 1; i < NW; ++i)
              d[k] = _mm512_fmadd_ps(qv[i], load16<KT>(kk, koff + 16 * static_cast<size_t>(i)), d[k]);
          }
          _mm512_storeu_ps(s + jj, _mm512_mul_ps(sum16x16(d), _mm512_set1_ps(p.scale)));
        }
        for (; jj < n; ++jj) {
          const uint8_t* kk = kr[jj];
          __m512 d = _mm512_mul_ps(qv[0], load16<KT>(kk, koff));
          for (int i = 1; i < NW; ++i)
            d = _mm512_fmadd_ps(qv[i], load16<KT>(kk, koff + 16 * static_cast<size_t>(i)), d);
          s[jj] = _mm512_reduce_add_ps(d) * p.scale;
        }
        float tmax = -INFINITY;
        for (jj = 0; jj < n; ++jj) {
          if (p.softcap > 0.0f) s[jj] = p.softcap * std::tanh(s[jj] / p.softcap);
          tmax = std::max(tmax, s[jj]);
        }
        if (tmax > m) {
          const float c = m == -INFINITY ? 0.0f : std::exp(m - tmax);
          l *= c;
          for (int i = 0; i < NW; ++i)
            acc[i] = _mm512_mul_ps(acc[i], _mm512_set1_ps(c));
          m = tmax;
        }
        { // the exps first, 16 at a time (a call in the loop below would spill acc)
          const __m512 mv = _mm512_set1_ps(m);
          __m512 lv = _mm512_setzero_ps();
          for (jj = 0; jj + 16 <= n; jj += 16) {
            const __m512 ev = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + jj), mv));
            _mm512_storeu_ps(s + jj, ev);
            lv = _mm512_add_ps(lv, ev);
          }
          l += _mm512_reduce_add_ps(lv);
          for (; jj < n; ++jj) {
            s[jj] = std::exp(s[jj] - m);
            l += s[jj];
          }
        }
        for (jj = 0; jj < n; ++jj) {
          if (g == 0 && jj + 4 < n)
            _mm_prefetch(reinterpret_cast<const char*>(vr[jj + 4] + koff * esize), _MM_HINT_T0);
          const __m512 ev = _mm512_set1_ps(s[jj]);
          const uint8_t* vv = vr[jj];
          for (int i = 0; i < NW; ++i)
            acc[i] = _mm512_fmadd_ps(ev, load16<KT>(vv, koff + 16 * static_cast<size_t>(i)), acc[i]);
        }
        for (int i = 0; i < NW; ++i)
          _mm512_storeu_ps(ga + 16 * i, acc[i]);
        w.m[static_cast<size_t>(g)] = m;
        w.l[static_cast<size_t>(g)] = l;
      }
    }
  }
  for (int32_t g = 0; g < G; ++g) {
    float* o = out + static_cast<size_t>(hk * G + g) * D;
    const float* ga = w.acc.data() + static_cast<size_t>(g) * D;
    const __m512 inv = _mm512_set1_ps(1.0f / w.l[static_cast<size_t>(g)]);
    for (int i = 0; i < NW; ++i)
      _mm512_storeu_ps(o + 16 * i, _mm512_mul_ps(_mm512_loadu_ps(ga + 16 * i), inv));
  }
}

using AttnItemFn = void (*)(const AttentionParams&, const float*, float*, const SeqRows&, const KeySegs&,
                            int32_t, AttnScratch&);

template <int KT> AttnItemFn pick_item_typed(int32_t D) {
  switch (D) {
  case 8:
    return attn_item_avx2_d<1, KT>;
  case 16:
    return attn_item_avx2_d<2, KT>;
  case 32:
    return attn_item_avx2_d<4, KT>;
  case 64:
    return attn_item_avx2_d<8, KT>;
  case 128:
    return attn_item_avx2_d<16, KT>;
  default:
    return attn_item_avx2;
  }
}

template <int KT> AttnItemFn pick_item_avx512(int32_t D) {
  switch (D) {
  case 32:
    return attn_item_avx512_d<2, KT>;
  case 64:
    return attn_item_avx512_d<4, KT>;
  case 128:
    return attn_item_avx512_d<8, KT>;
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

void attn_all(const AttentionParams& p, const float* q, int32_t T, const Pos* pos,
              const std::vector<SeqRows>& rows, const std::vector<int32_t>& row_of, float* out, Isa isa) {
  const int32_t Hkv = p.n_head_kv;
  const size_t tok = static_cast<size_t>(p.n_head) * static_cast<size_t>(p.head_dim);
  const bool avx2 = at_least(isa, Isa::avx2);
  const AttnItemFn item = pick_item(isa, p.head_dim, rows.empty() ? DType::f32 : rows.front().dt);
  auto block = at_least(isa, Isa::avx512) ? attn_block_avx512 : avx2 ? attn_block_avx2 : attn_block_generic;
  if (at_least(isa, Isa::avx512)) switch (p.head_dim) {
    case 16:
      block = attn_block_avx512_d<1>;
      break;
    case 32:
      block = attn_block_avx512_d<2>;
      break;
    case 64:
      block = attn_block_avx512_d<4>;
      break;
    case 128:
      block = attn_block_avx512_d<8>;
      break;
    default:
      break;
    }
  // Blocks of up to k_qblock consecutive tokens of the same sequence.
  std::vector<std::pair<int32_t, int32_t>> blocks; // (first token, count)
  for (int32_t t = 0; t < T;) {
    int32_t e = t + 1;
    while (e < T && e - t < k_qblock && row_of[static_cast<size_t>(e)] == row_of[static_cast<size_t>(t)])
      ++e;
    blocks.emplace_back(t, e - t);
    t = e;
  }
  const int64_t items = static_cast<int64_t>(blocks.size()) * Hkv;
#pragma omp parallel if (items > 1)
  {
    AttnScratch w;
    w.f16c = avx2;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const auto [t, nq] = blocks[static_cast<size_t>(it / Hkv)];
      const auto hk = static_cast<int32_t>(it % Hkv);
      const SeqRows& sr = rows[static_cast<size_t>(row_of[static_cast<size_t>(t)])];
      if (nq == 1) { // decode: one token, no transpose worth its cost
        const KeySpan sp = key_span(p, pos[t]);
        item(p, q + static_cast<size_t>(t) * tok, out + static_cast<size_t>(t) * tok, sr,
             key_segs(sr, sp.sink_end, sp.first, sp.last), hk, w);
      } else {
        block(p, q + static_cast<size_t>(t) * tok, out + static_cast<size_t>(t) * tok, tok, sr, pos + t, nq,
              hk, w);
      }
    }
  }
}

// ---- element-wise and row ops ----

// One row: y = x / rms(x) · w.
LOOM_INLINE void rms_norm_row(const float* xr, const float* w, float* yr, int64_t n, float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < n; ++i)
    ss += xr[i] * xr[i];
  const float sc = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  if (w) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      yr[i] = w[i] * (sc * xr[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      yr[i] = sc * xr[i];
  }
}
// OpenMP outlines parallel regions into functions of their own, which do not inherit a target
// attribute: so the regions stay in generic code and call these per-ISA bodies.
LOOM_AVX2 void rms_norm_row_avx2(const float* x, const float* w, float* y, int64_t n, float eps) {
  rms_norm_row(x, w, y, n, eps);
}
void rms_norm_row_generic(const float* x, const float* w, float* y, int64_t n, float eps) {
  rms_norm_row(x, w, y, n, eps);
}

enum class Ew { add, add_row, mul, mul_row, scale, swiglu, geglu, softcap };

// dst[i0, i1) = a (op) b; add_row / mul_row broadcast b (length `row`) along rows.
LOOM_INLINE void elementwise(Ew op, const float* a, const float* b, float s, float* dst, int64_t i0,
                             int64_t i1, int64_t row) {
  switch (op) {
  case Ew::add:
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i)
      dst[i] = a[i] + b[i];
    break;
  case Ew::mul:
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i)
      dst[i] = a[i] * b[i];
    break;
  case Ew::mul_row:
    for (int64_t i = i0; i < i1; ++i)
      dst[i] = a[i] * b[i % row];
    break;
  case Ew::add_row:
    for (int64_t i = i0; i < i1; ++i)
      dst[i] = a[i] + b[i % row];
    break;
  case Ew::geglu:
    for (int64_t i = i0; i < i1; ++i)
      dst[i] = gelu_tanh(a[i]) * b[i];
    break;
  case Ew::softcap:
    for (int64_t i = i0; i < i1; ++i)
      dst[i] = s * std::tanh(a[i] / s);
    break;
  case Ew::scale:
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i)
      dst[i] = a[i] * s;
    break;
  case Ew::swiglu:
    for (int64_t i = i0; i < i1; ++i) {
      const float v = a[i];
      dst[i] = v * (1.0f / (1.0f + std::exp(-v))) * b[i];
    }
    break;
  }
}
// SwiGLU's sigmoid from e^−|v| (never above 0, so no overflow): σ(v) = 1 / (1 + e^−v) for v ≥ 0, e^v /
// (1 + e^v) below — within an ulp or two of std::exp's (AVX2: exp256; AVX-512 below: exp512).
LOOM_AVX2 void elementwise_avx2(Ew op, const float* a, const float* b, float s, float* dst, int64_t i0,
                                int64_t i1, int64_t row) {
  int64_t i = i0;
  if (op == Ew::swiglu) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; i + 8 <= i1; i += 8) {
      const __m256 v = _mm256_loadu_ps(a + i);
      const __m256 t = exp256(_mm256_sub_ps(zero, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v))); // e^−|v|
      const __m256 num = _mm256_blendv_ps(one, t, _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
      const __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, t));
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_mul_ps(v, sig), _mm256_loadu_ps(b + i)));
    }
  }
  elementwise(op, a, b, s, dst, i, i1, row);
}
void elementwise_generic(Ew op, const float* a, const float* b, float s, float* dst, int64_t i0, int64_t i1,
                         int64_t row) {
  elementwise(op, a, b, s, dst, i0, i1, row);
}
// AVX-512: SwiGLU as elementwise_avx2's, 16 at a time; the other ops as elementwise_avx2.
LOOM_AVX512 void elementwise_avx512(Ew op, const float* a, const float* b, float s, float* dst, int64_t i0,
                                    int64_t i1, int64_t row) {
  if (op != Ew::swiglu) {
    elementwise(op, a, b, s, dst, i0, i1, row);
    return;
  }
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    const __m512 v = _mm512_loadu_ps(a + i);
    const __m512 t = exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(v))); // e^−|v|
    const __m512 den = _mm512_add_ps(one, t);
    const __mmask16 neg = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sig = _mm512_div_ps(_mm512_mask_blend_ps(neg, one, t), den);
    _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_mul_ps(v, sig), _mm512_loadu_ps(b + i)));
  }
  elementwise(op, a, b, s, dst, i, i1, row);
}

// ---- the executor ----

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(const CpuOptions& o)
      : opt_(o), threads_(o.threads > 0 ? o.threads : omp_get_num_procs()), avx2_(at_least(o.isa, Isa::avx2)),
        description_(std::string("isa ") + isa_name(o.isa) + " (CPU: " + isa_name(cpu_isa()) + "), " +
                     std::to_string(threads_) + " threads") {
    if (o.bf16_gemm && at_least(o.isa, Isa::avx512_bf16)) { // oneDNN's own choice of kernel, if native
      try {
        const std::string impl = bf16_matmul(16, 64, 64, 64).impl_info_str();
        if (impl.rfind("ref", 0) != 0) {
          bf16_impl_ = impl;
          description_ += ", bf16 GEMM " + impl;
        }
      } catch (const dnnl::error&) {
        // no bf16 matmul in this oneDNN: the f32 route
      }
    }
    if (o.repack && at_least(o.isa, Isa::avx512_bf16) && (o.bf16_gemv || o.f16_as_bf16))
      description_ += std::string(", bf16x64 GEMV for ") + (o.bf16_gemv ? "BF16" : "") +
                      (o.bf16_gemv && o.f16_as_bf16 ? "/" : "") + (o.f16_as_bf16 ? "F16 (rounded)" : "");
    if (o.repack && at_least(o.isa, Isa::avx512) && o.f16_gemv &&
        !(o.f16_as_bf16 && at_least(o.isa, Isa::avx512_bf16)))
      description_ += ", f16x64 GEMV for F16 (exact)";
    // Which route each block type takes (loom run's backend line).
    if (o.exact_matmul)
      description_ +=
          at_least(o.isa, Isa::avx2)
              ? "; exact f32 products for every block type (exact_matmul): weights unpacked in registers"
              : "; every block type: rows dequantized to f32, then dotted (exact_matmul)";
    else
      description_ +=
          std::string("; int8 products (activations rounded to 8 bits per block): q8_0 q4_0 q4_k q6_k") +
          (o.repack ? " (repacked)" : "") +
          (at_least(o.isa, Isa::avx2) ? ", q4_1 q5_0 q5_1 iq4_nl (batches under gemm_min_rows)" : "");
    if (o.exact_matmul) {
    } else if (at_least(o.isa, Isa::avx2))
      description_ += std::string("; exact f32 products on weights unpacked in registers: q2_k q3_k q5_k "
                                  "iq4_xs (and q4_1 q5_0 q5_1 iq4_nl in longer batches)") +
                      (o.exact_logits ? " and the output head" : "");
    else
      description_ += std::string("; other block types: rows dequantized to f32, then dotted") +
                      (o.exact_logits ? " (the output head too)" : "");
  }

  std::string_view name() const noexcept override { return "cpu"; }
  std::string_view describe() const noexcept override { return description_; }
  bool supports_kv_dtype(DType t) const noexcept override { return kv_dtype_valid(t); }
  // Every variant; flash (tiled online softmax, the default) or naive (the reference kernel); both read
  // only each query's span (attn_span_only).
  bool supports_attention(AttnKernel, uint32_t) const noexcept override { return true; }

  bool supports(const Graph& g, const Node& n) const noexcept override { return weights_dequantizable(g, n); }

  void compute(const Graph& g, const BatchView& batch, const KVRows& kv, std::span<float> logits) override {
    check_batch(g, batch);
    omp_set_num_threads(threads_); // this thread's team size, for our loops and oneDNN's
    const size_t total = plan(g);
    logits_ = logits_matmul_dst(g);
    if (arena_.size() < total) arena_.resize(total);
    for (size_t i = 0; i < g.nodes.size();) {
      const size_t fused = fused_gemv(g, i);
      if (fused == 0) run(g, g.nodes[i], batch, kv);
      i += std::max<size_t>(fused, 1);
    }
    if (redrop_) { // reads of other tensors map whole page-cache folios, repacked neighbours included
      for (const auto& [p, n] : dropped_)
        drop_pages(p, n);
      redrop_ = false;
    }
    const TensorDesc& out = g.tensors[static_cast<size_t>(g.out_logits)];
    const auto n_out = static_cast<size_t>(out.n_elements());
    LOOM_ASSERT(logits.size() >= n_out, "logits buffer too small");
    if (n_out > 0) std::memcpy(logits.data(), f32(g.out_logits), n_out * sizeof(float));
    workspace_ = arena_.size() * sizeof(float) + panel_.size() * sizeof(float) + copies_extra_;
  }

  // The model's weights, once: the matrices that run repacked are repacked here (the file's pages
  // dropped behind, as a first matmul would), vector operands copied; the rest is read in place.
  void load(std::span<const WeightDesc> weights) override {
    omp_set_num_threads(threads_);
    for (const WeightDesc& w : weights) {
      const TensorDesc& t = w.tensor;
      if (t.data == nullptr) continue;
      if (w.uses & weight_use_vector) (void)vec_of(t);
      if (w.uses & weight_use_matmul) prepare_matmul(t, opt_.exact_matmul);
      if (w.uses & weight_use_logits) prepare_matmul(t, opt_.exact_matmul || opt_.exact_logits);
    }
    if (redrop_) {
      for (const auto& [p, n] : dropped_)
        drop_pages(p, n);
      redrop_ = false;
    }
    workspace_ = arena_.size() * sizeof(float) + panel_.size() * sizeof(float) + copies_extra_;
  }

  size_t workspace_bytes() const noexcept override { return workspace_; }
  size_t activation_bytes() const noexcept override { return arena_.size() * sizeof(float); }

private:
  float* f32(int32_t id) { return arena_.data() + offsets_[static_cast<size_t>(id)]; }

  // The output of the matmul that makes the logits (the graph's output, or what Gemma 2's final soft-cap
  // reads); -1 when the last node is something else.
  static int32_t logits_matmul_dst(const Graph& g) noexcept {
    int32_t out = g.out_logits;
    for (auto it = g.nodes.rbegin(); it != g.nodes.rend(); ++it) {
      if (it->dst != out) continue;
      if (it->op == OpKind::matmul) return out;
      if (it->op != OpKind::softcap) return -1;
      out = it->src[0];
    }
    return -1;
  }

  // Places every activation in one arena, reusing the room of tensors no later node reads (first
  // fit over a free list, neighbours merged); returns the arena's size in floats. An element-wise
  // op writes in place over an operand it reads for the last time; any other node's output never
  // overlaps its inputs; the logits are never freed.
  size_t plan(const Graph& g) {
    const size_t nt = g.tensors.size();
    std::vector<int64_t> last(nt, -1);
    for (size_t i = 0; i < g.nodes.size(); ++i)
      for (int32_t s : g.nodes[i].src)
        if (s >= 0) last[static_cast<size_t>(s)] = static_cast<int64_t>(i);
    if (g.out_logits >= 0) last[static_cast<size_t>(g.out_logits)] = INT64_MAX;
    offsets_.assign(nt, SIZE_MAX);
    std::vector<std::pair<size_t, size_t>> free_list; // (offset, size), sorted by offset
    size_t top = 0;
    const auto size_of = [&](int32_t id) {
      return (static_cast<size_t>(g.tensors[static_cast<size_t>(id)].n_elements()) + 15) & ~size_t{15};
    };
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      const bool elementwise = n.op == OpKind::add || n.op == OpKind::mul || n.op == OpKind::scale ||
                               n.op == OpKind::swiglu || n.op == OpKind::geglu || n.op == OpKind::softcap;
      if (elementwise && offsets_[static_cast<size_t>(n.dst)] == SIZE_MAX)
        for (int32_t s : {n.src[0], n.src[1]}) { // in place over an operand read for the last time
          if (s < 0 || g.tensors[static_cast<size_t>(s)].kind != TensorKind::activation) continue;
          if (last[static_cast<size_t>(s)] != static_cast<int64_t>(i) || size_of(s) != size_of(n.dst) ||
              offsets_[static_cast<size_t>(s)] == SIZE_MAX)
            continue;
          offsets_[static_cast<size_t>(n.dst)] = offsets_[static_cast<size_t>(s)];
          last[static_cast<size_t>(s)] = -1; // its room is dst's now: not freed below
          break;
        }
      if (offsets_[static_cast<size_t>(n.dst)] == SIZE_MAX) {
        const size_t need = size_of(n.dst);
        auto it =
            std::find_if(free_list.begin(), free_list.end(), [&](const auto& b) { return b.second >= need; });
        if (it != free_list.end()) {
          offsets_[static_cast<size_t>(n.dst)] = it->first;
          it->first += need;
          it->second -= need;
          if (it->second == 0) free_list.erase(it);
        } else {
          offsets_[static_cast<size_t>(n.dst)] = top;
          top += need;
        }
      }
      for (int32_t s : n.src) {
        if (s < 0 || g.tensors[static_cast<size_t>(s)].kind != TensorKind::activation) continue;
        if (last[static_cast<size_t>(s)] != static_cast<int64_t>(i) ||
            offsets_[static_cast<size_t>(s)] == SIZE_MAX)
          continue;
        last[static_cast<size_t>(s)] = -1; // freed once even when a node reads it twice
        const size_t off = offsets_[static_cast<size_t>(s)], sz = size_of(s);
        auto it = std::lower_bound(free_list.begin(), free_list.end(), std::make_pair(off, size_t{0}));
        it = free_list.insert(it, {off, sz});
        if (std::next(it) != free_list.end() && it->first + it->second == std::next(it)->first) {
          it->second += std::next(it)->second;
          free_list.erase(std::next(it));
        }
        if (it != free_list.begin() && std::prev(it)->first + std::prev(it)->second == it->first) {
          std::prev(it)->second += it->second;
          free_list.erase(it);
        }
      }
    }
    for (size_t i = 0; i < nt; ++i) // activations no node writes (none in a well-formed graph)
      if (g.tensors[i].kind == TensorKind::activation && offsets_[i] == SIZE_MAX) {
        offsets_[i] = top;
        top += size_of(static_cast<int32_t>(i));
      }
    return top;
  }

  std::span<const int32_t> ints(const Graph& g, int32_t id, const BatchView& b) const {
    if (id == g.in_tokens) return b.tokens;
    if (id == g.in_positions) return b.positions;
    if (id == g.in_out_ids) return b.output_rows;
    LOOM_ASSERT(false, "integer tensor that is not a graph input");
    return {};
  }

  // An operand as f32 (norm weights, biases): a weight is copied (dequantized) once into memory of
  // the backend and its file pages dropped, so reading it never maps the file again — a page-cache
  // folio can be larger than the norm and would bring back pages of repacked neighbours.
  // Without repacking (nothing to protect) an f32 weight is read in place, as before.
  const float* vec(const Graph& g, int32_t id) {
    const TensorDesc& t = g.tensors[static_cast<size_t>(id)];
    if (t.kind != TensorKind::weight) return f32(id);
    return vec_of(t);
  }
  const float* vec_of(const TensorDesc& t) {
    if (!opt_.repack && t.dtype == DType::f32) return static_cast<const float*>(t.data);
    const auto key = std::pair{t.data, t.n_elements()};
    auto it = vectors_.find(key);
    if (it != vectors_.end()) return it->second.data();
    std::vector<float> v(static_cast<size_t>(t.n_elements()));
    const size_t rb = row_bytes(t.dtype, t.ne[0]);
    for (int64_t r = 0; r < t.n_rows(); ++r)
      dequantize_row(t.dtype, static_cast<const uint8_t*>(t.data) + static_cast<size_t>(r) * rb,
                     v.data() + r * t.ne[0], t.ne[0]);
    const size_t bytes = rb * static_cast<size_t>(t.n_rows());
    if (opt_.repack && in_readonly_file_mapping(t.data, bytes)) {
      dropped_.emplace_back(t.data, bytes);
      redrop_ = true;
    } else {
      copies_extra_ += v.size() * sizeof(float);
    }
    return vectors_.emplace(key, std::move(v)).first->second.data();
  }

  void ew(Ew op, const float* a, const float* b, float s, float* dst, int64_t n, int64_t row = 1) {
    const auto f = at_least(opt_.isa, Isa::avx512) ? elementwise_avx512
                   : avx2_                         ? elementwise_avx2
                                                   : elementwise_generic;
    constexpr int64_t chunk = 4096;
    const int64_t nc = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t c = 0; c < nc; ++c)
      f(op, a, b, s, dst, c * chunk, std::min(n, (c + 1) * chunk), row);
  }

  void run(const Graph& g, const Node& n, const BatchView& b, const KVRows& kv) {
    const TensorDesc& d = g.tensors[static_cast<size_t>(n.dst)];
    float* dst = f32(n.dst);
    switch (n.op) {
    case OpKind::get_rows: {
      const auto idx = ints(g, n.src[1], b);
      const TensorDesc& s = g.tensors[static_cast<size_t>(n.src[0])];
      const int64_t len = s.ne[0];
      for (const int32_t r : idx)
        LOOM_ASSERT(r >= 0 && r < s.n_rows(), "get_rows index out of range");
      const auto nr = static_cast<int64_t>(idx.size());
      if (s.kind == TensorKind::weight) {
        const auto* base = static_cast<const uint8_t*>(s.data);
        const size_t rb = row_bytes(s.dtype, len);
#pragma omp parallel for schedule(static) if (nr * len > 65536)
        for (int64_t r = 0; r < nr; ++r)
          dequantize(opt_.isa, s.dtype, base + static_cast<size_t>(idx[static_cast<size_t>(r)]) * rb,
                     dst + r * len, len);
      } else {
        const float* src = f32(n.src[0]);
        for (int64_t r = 0; r < nr; ++r)
          std::memcpy(dst + r * len, src + idx[static_cast<size_t>(r)] * len, static_cast<size_t>(len) * 4);
      }
      return;
    }
    case OpKind::rms_norm: {
      const TensorDesc& s = g.tensors[static_cast<size_t>(n.src[0])];
      const float* w = n.src[1] >= 0 ? vec(g, n.src[1]) : nullptr;
      const auto f = avx2_ ? rms_norm_row_avx2 : rms_norm_row_generic;
      const float* x = f32(n.src[0]);
      const int64_t len = s.ne[0];
#pragma omp parallel for schedule(static) if (s.n_rows() * len > 32768)
      for (int64_t r = 0; r < s.n_rows(); ++r)
        f(x + r * len, w, dst + r * len, len, n.eps);
      return;
    }
    case OpKind::matmul: {
      const TensorDesc& w = g.tensors[static_cast<size_t>(n.src[0])];
      const TensorDesc& x = g.tensors[static_cast<size_t>(n.src[1])];
      LOOM_ASSERT(x.ne[0] == w.ne[0], "matmul inner dimensions differ");
      matmul(w, f32(n.src[1]), x.n_rows(), dst, opt_.exact_matmul || (opt_.exact_logits && n.dst == logits_));
      return;
    }
    case OpKind::rope: {
      const TensorDesc& s = g.tensors[static_cast<size_t>(n.src[0])];
      const auto pos = ints(g, n.src[1], b);
      const int64_t D = s.ne[0], H = s.ne[1], T = s.ne[2];
      const float* x = f32(n.src[0]);
      const float* ff = n.src[2] >= 0 ? vec(g, n.src[2]) : nullptr; // frequency divisors (Llama 3.1)
#pragma omp parallel if (T > 1)
      {
        std::vector<float> cs(static_cast<size_t>(n.rope.n_dims / 2)), sn(cs.size());
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; ++t) { // the angles once per token, for all its heads
          rope_table(n.rope, pos[static_cast<size_t>(t)], cs.data(), sn.data(), ff);
          std::memcpy(dst + t * H * D, x + t * H * D, static_cast<size_t>(H * D) * sizeof(float));
          for (int64_t h = 0; h < H; ++h)
            rope_rotate(n.rope, cs.data(), sn.data(), dst + (t * H + h) * D);
        }
      }
      return;
    }
    case OpKind::attention: {
      const TensorDesc& q = g.tensors[static_cast<size_t>(n.src[0])];
      const AttentionParams& p = n.attn;
      const auto T = static_cast<int32_t>(q.ne[2]);
      const auto row_elems = static_cast<size_t>(p.n_head_kv) * static_cast<size_t>(p.head_dim);
      const float* k = f32(n.src[1]);
      const float* v = f32(n.src[2]);
      for (int32_t t = 0; t < T; ++t) { // this batch's K/V rows at their slots first
        kv_store(kv.kv_dtype(), k + static_cast<size_t>(t) * row_elems,
                 kv.k_new(p.layer, static_cast<size_t>(t)), static_cast<int64_t>(row_elems));
        kv_store(kv.kv_dtype(), v + static_cast<size_t>(t) * row_elems,
                 kv.v_new(p.layer, static_cast<size_t>(t)), static_cast<int64_t>(row_elems));
      }
      if (p.kernel == AttnKernel::naive) // asked for: the materialized-scores reference kernel
        attention::reference_attention(p, f32(n.src[0]), T, b.positions.data(), kv, dst);
      else
        flash_attention(p, f32(n.src[0]), T, b.positions.data(), kv, dst, opt_.isa);
      return;
    }
    case OpKind::swiglu:
      ew(Ew::swiglu, f32(n.src[0]), f32(n.src[1]), 0.0f, dst, d.n_elements());
      return;
    case OpKind::add: {
      const TensorDesc& c = g.tensors[static_cast<size_t>(n.src[1])];
      if (c.n_elements() < d.n_elements()) // a bias: src1 repeats
        ew(Ew::add_row, f32(n.src[0]), vec(g, n.src[1]), 0.0f, dst, d.n_elements(), c.n_elements());
      else
        ew(Ew::add, f32(n.src[0]), c.kind == TensorKind::weight ? vec(g, n.src[1]) : f32(n.src[1]), 0.0f, dst,
           d.n_elements());
      return;
    }
    case OpKind::geglu:
      ew(Ew::geglu, f32(n.src[0]), f32(n.src[1]), 0.0f, dst, d.n_elements());
      return;
    case OpKind::softcap:
      ew(Ew::softcap, f32(n.src[0]), nullptr, n.scale, dst, d.n_elements());
      return;
    case OpKind::mul: {
      const TensorDesc& c = g.tensors[static_cast<size_t>(n.src[1])];
      const float* cv = vec(g, n.src[1]);
      if (c.n_rows() == 1)
        ew(Ew::mul_row, f32(n.src[0]), cv, 0.0f, dst, d.n_elements(), d.ne[0]);
      else
        ew(Ew::mul, f32(n.src[0]), cv, 0.0f, dst, d.n_elements());
      return;
    }
    case OpKind::scale:
      ew(Ew::scale, f32(n.src[0]), nullptr, n.scale, dst, d.n_elements());
      return;
    case OpKind::softmax: {
      const float* a = f32(n.src[0]);
      const int64_t len = d.ne[0];
#pragma omp parallel for schedule(static) if (d.n_elements() > 65536)
      for (int64_t r = 0; r < d.n_rows(); ++r) {
        const float* x = a + r * len;
        float* y = dst + r * len;
        const float m = *std::max_element(x, x + len);
        float sum = 0.0f;
        for (int64_t i = 0; i < len; ++i)
          sum += (y[i] = std::exp(x[i] - m));
        for (int64_t i = 0; i < len; ++i)
          y[i] /= sum;
      }
      return;
    }
    case OpKind::copy: {
      const TensorDesc& s = g.tensors[static_cast<size_t>(n.src[0])];
      if (s.kind == TensorKind::weight) {
        const auto* base = static_cast<const uint8_t*>(s.data);
        const size_t rb = row_bytes(s.dtype, s.ne[0]);
#pragma omp parallel for schedule(static) if (d.n_elements() > 65536)
        for (int64_t r = 0; r < d.n_rows(); ++r)
          dequantize_row(s.dtype, base + static_cast<size_t>(r) * rb, dst + r * d.ne[0], d.ne[0]);
      } else {
        std::memcpy(dst, f32(n.src[0]), static_cast<size_t>(d.n_elements()) * sizeof(float));
      }
      return;
    }
    }
    fail(Errc::unsupported, "cpu", std::string("op ") + op_name(n.op) + " is not implemented");
  }

  // Room for a repacked copy. A large one starts on a 2 MiB boundary and asks for transparent huge pages
  // over its whole 2 MiB blocks (the tail keeps small pages, so no page holds bytes past the copy): a
  // fault per 2 MiB instead of per 4 KiB when the copy is first written, and fewer TLB misses for
  // decode's sequential streams. nullptr when out of memory.
  static uint8_t* alloc_copy(size_t bytes) {
    constexpr size_t huge = size_t{2} << 20;
    void* p = nullptr;
    if (posix_memalign(&p, bytes >= 2 * huge ? huge : 64, std::max<size_t>(bytes, 64)) != 0) return nullptr;
#ifdef MADV_HUGEPAGE
    if (bytes >= 2 * huge) madvise(p, bytes / huge * huge, MADV_HUGEPAGE); // advice only: errors ignored
#endif
    // Faulted in by every thread at once (the kernel zeroes each page on its first touch; a thread
    // repacking into a page another one is faulting would wait for it).
    auto* b = static_cast<uint8_t*>(p);
    if (bytes >= 2 * huge) { // (a small copy: its repack faults it in, one thread per group anyway)
      const int64_t pages = static_cast<int64_t>((bytes + 4095) / 4096);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < pages; ++i)
        b[static_cast<size_t>(i) * 4096] = 0;
    }
    return b;
  }

  // The 8-row repacked copy of a Q8_0, Q4_0, Q4_K or Q6_K matrix (made on first use; the file's pages then
  // dropped).
  const uint8_t* repacked(const TensorDesc& w) {
    const int64_t K = w.ne[0], N = w.ne[1];
    const auto key = std::tuple{w.data, K, N};
    auto it = repacked_.find(key);
    if (it != repacked_.end()) return it->second.get();
    const bool b16 = bf16_route(w), f16 = f16_route(w);
    const size_t bytes = b16 || f16 ? bf16x64_bytes(K, N) : repacked_bytes(w.dtype, K, N);
    std::unique_ptr<uint8_t, FreeDeleter> buf(alloc_copy(bytes));
    if (!buf)
      fail(Errc::out_of_memory, "cpu",
           "cannot allocate " + std::to_string(bytes) + " bytes to repack '" + w.name + "'");
    // 512 rows at a time, dropping the file's pages behind us: the peak is the model plus one chunk
    const auto* src = static_cast<const uint8_t*>(w.data);
    const size_t rb = row_bytes(w.dtype, K);
    const bool drop = in_readonly_file_mapping(src, rb * static_cast<size_t>(N));
    for (int64_t j0 = 0; j0 < N; j0 += 512) {
      const int64_t nr = std::min<int64_t>(512, N - j0);
      if (b16 || f16)
        (b16 ? repack_bf16x64
             : [](DType, const uint8_t* w16, size_t r, int64_t k, int64_t n,
                  uint16_t* o16) { repack_f16x64(w16, r, k, n, o16); })(
            w.dtype, src + static_cast<size_t>(j0) * rb, rb, K, nr,
            reinterpret_cast<uint16_t*>(buf.get()) + static_cast<size_t>(j0) * static_cast<size_t>(K));
      else
        repack(w.dtype, src + static_cast<size_t>(j0) * rb, rb, K, nr,
               buf.get() + repacked_bytes(w.dtype, K, j0));
      if (drop) drop_pages(src, rb * static_cast<size_t>(j0 + nr));
    }
    if (drop) {
      dropped_.emplace_back(src, rb * static_cast<size_t>(N));
      redrop_ = true;
    } else {
      copies_extra_ += bytes;
    }
    return repacked_.emplace(key, std::move(buf)).first->second.get();
  }

  // Whether w is a BF16 (or, with f16_as_bf16, F16) matrix that runs repacked 16 rows at a time on
  // vdpbf16ps (bf16_gemv, at avx512_bf16).
  bool bf16_route(const TensorDesc& w) const noexcept {
    return opt_.repack && at_least(opt_.isa, Isa::avx512_bf16) && w.ne[2] == 1 && w.ne[3] == 1 &&
           ((w.dtype == DType::bf16 && opt_.bf16_gemv) || (w.dtype == DType::f16 && opt_.f16_as_bf16)) &&
           bf16x64_repackable(w.dtype, w.ne[0], w.ne[1]);
  }

  // Whether w is an F16 matrix that decode and small batches read exactly from its f16x64 copy (f16_gemv,
  // at avx512, when it does not take the bf16 route).
  bool f16_route(const TensorDesc& w) const noexcept {
    return opt_.repack && opt_.f16_gemv && at_least(opt_.isa, Isa::avx512) && w.dtype == DType::f16 &&
           w.ne[2] == 1 && w.ne[3] == 1 && !bf16_route(w) && bf16x64_repackable(w.dtype, w.ne[0], w.ne[1]);
  }

  // How matmul() multiplies one token by w, when that is one of gemv_multi's routes: the repacked int8
  // or bf16 kernels, or our F32 / F16 / BF16 kernels (oneDNN not asked for at one row). False otherwise.
  bool gemv_route(const TensorDesc& w, Gemv& m) {
    const int64_t K = w.ne[0], N = w.ne[1];
    if (w.ne[2] != 1 || w.ne[3] != 1) return false;
    if (bf16_route(w)) {
      if (opt_.gemm_min_rows == 1) return false;
      m = Gemv{DType::bf16, repacked(w), 0, N, nullptr};
      return true;
    }
    if (f16_route(w)) {
      if (opt_.gemm_min_rows == 1) return false;
      m = Gemv{DType::f16, repacked(w), 0, N, nullptr};
      return true;
    }
    if (opt_.exact_matmul && dtype_traits(w.dtype).block_size > 1) { // every block type exact
      if (opt_.gemm_min_rows == 1 || !dq_route(w, true)) return false;
      m = Gemv{w.dtype, static_cast<const uint8_t*>(w.data), row_bytes(w.dtype, K), N, nullptr};
      return true;
    }
    if (opt_.repack && repackable(w.dtype, K, N)) {
      if (opt_.gemm_min_rows_quant == 1 && !int8_gemm(opt_.isa, w.dtype)) return false;
      m = Gemv{w.dtype, repacked(w), 0, N, nullptr};
      return true;
    }
    if (i8dq_route(w, false)) {
      if (opt_.gemm_min_rows == 1) return false;
      m = Gemv{w.dtype, static_cast<const uint8_t*>(w.data), row_bytes(w.dtype, K), N, nullptr, true};
      return true;
    }
    const bool plain = w.dtype == DType::f32 || w.dtype == DType::f16 || w.dtype == DType::bf16;
    if (opt_.gemm_min_rows == 1 || !(dq_route(w) || (plain && gemv_multi_supports(opt_.isa, w.dtype, false))))
      return false;
    m = Gemv{w.dtype, static_cast<const uint8_t*>(w.data), row_bytes(w.dtype, K), N, nullptr};
    return true;
  }

  // A run of matmuls of one token by the same activation starting at node i (q, k, v; gate, up) in one
  // parallel region, the threads going from one matrix to the next without waiting (gemv_multi): the
  // same kernels as one at a time, so the same floats. Returns the nodes it ran; 0: none (not such a run).
  size_t fused_gemv(const Graph& g, size_t i) {
    if (!opt_.fused_decode || g.nodes[i].op != OpKind::matmul) return 0;
    gemvs_.clear();
    int32_t xid = -1;
    for (size_t j = i; j < g.nodes.size(); ++j) {
      const Node& n = g.nodes[j];
      if (n.op != OpKind::matmul || (j > i && n.src[1] != xid)) break;
      const TensorDesc& w = g.tensors[static_cast<size_t>(n.src[0])];
      const TensorDesc& x = g.tensors[static_cast<size_t>(n.src[1])];
      Gemv m{};
      if (x.n_rows() != 1 || x.ne[0] != w.ne[0] || !gemv_route(w, m)) break;
      m.y = f32(n.dst);
      xid = n.src[1];
      gemvs_.push_back(m);
    }
    if (gemvs_.size() < 2) return 0;
    const TensorDesc& x = g.tensors[static_cast<size_t>(xid)];
    gemv_multi(opt_.isa, gemvs_.data(), static_cast<int>(gemvs_.size()), x.ne[0], f32(xid), threads_);
    return gemvs_.size();
  }

  // Whether w is multiplied exactly from its own rows in place (kernels_dq.cpp): the block types without an
  // int8 kernel of their own (Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS), and with `exact` (the
  // logits' matmul under exact_logits) every block type.
  bool dq_route(const TensorDesc& w, bool exact = false) const noexcept {
    return dq_supports(opt_.isa, w.dtype) && (exact || !has_kernel(w.dtype)) && w.ne[2] == 1 &&
           w.ne[3] == 1 && w.ne[0] % dtype_traits(w.dtype).block_size == 0;
  }

  // Whether w (Q4_1, Q5_0, Q5_1, IQ4_NL) takes the int8 route on its GGUF rows for decode and batches under
  // gemm_min_rows (longer batches: the exact GEMM on dequantized panels); not under exact_matmul, nor for
  // the logits' matmul under exact_logits (`exact`).
  bool i8dq_route(const TensorDesc& w, bool exact) const noexcept {
    return !exact && !opt_.exact_matmul && i8dq_supports(opt_.isa, w.dtype) && w.ne[2] == 1 && w.ne[3] == 1 &&
           w.ne[0] % 32 == 0;
  }

  // What matmul(w, …, exact) and gemv_route(w) repack, repacked now (load time).
  void prepare_matmul(const TensorDesc& w, bool exact) {
    const int64_t K = w.ne[0], N = w.ne[1];
    if (i8dq_route(w, exact) || dq_route(w, exact) || (exact && dtype_traits(w.dtype).block_size > 1)) return;
    if (bf16_route(w) || f16_route(w) ||
        (opt_.repack && repackable(w.dtype, K, N) && w.ne[2] == 1 && w.ne[3] == 1 &&
         !(opt_.exact_matmul && dtype_traits(w.dtype).block_size > 1)))
      (void)repacked(w);
  }

  // y[T][N] = x[T][K] · Wᵀ; exact: the logits' matmul under exact_logits (no activation rounded).
  void matmul(const TensorDesc& w, const float* x, int64_t T, float* y, bool exact = false) {
    const int64_t K = w.ne[0], N = w.ne[1];
    const auto* base = static_cast<const uint8_t*>(w.data);
    const size_t rb = row_bytes(w.dtype, K);
    if (i8dq_route(w, exact) && !(opt_.gemm_min_rows > 0 && T >= opt_.gemm_min_rows)) {
      matmul_i8dq(opt_.isa, w.dtype, base, rb, K, N, x, T, y, threads_);
      return;
    }
    if (dq_route(w, exact)) { // exact products: a GEMM on dequantized panels, or our FMA kernels
      if (opt_.gemm_min_rows > 0 && T >= opt_.gemm_min_rows)
        gemm_panels(x, T, N, K, y, [&](int64_t j, float* row) {
          dequantize_dq(w.dtype, base + static_cast<size_t>(j) * rb, row, K);
        });
      else
        matmul_dq(w.dtype, base, rb, K, N, x, T, y, threads_);
      return;
    }
    if (exact && dtype_traits(w.dtype).block_size > 1) {
      rows_dequantized(w, x, T, y); // below avx2: the exact head without the dq kernels
      return;
    }
    if (bf16_route(w)) {
      const auto* wp = reinterpret_cast<const uint16_t*>(repacked(w));
      if (opt_.gemm_min_rows > 0 && T >= opt_.gemm_min_rows) {
        if (!bf16_impl_.empty()) { // the copy is oneDNN's blocked layout: read in place
          round_to_bf16(x, T, K);
          gemm_bf16_rounded(reinterpret_cast<const uint8_t*>(wp), T, N, K, y, N, true);
        } else
          gemm_panels(x, T, N, K, y, [&](int64_t j, float* row) { dequantize_bf16x64(wp, K, j, row); });
      } else {
        matmul_bf16x64(opt_.isa, wp, K, N, x, T, y, threads_);
      }
      return;
    }
    if (f16_route(w)) {
      const auto* wp = reinterpret_cast<const uint16_t*>(repacked(w));
      if (opt_.gemm_min_rows > 0 && T >= opt_.gemm_min_rows)
        gemm_panels_of(x, T, N, K, y, 64, [&](int64_t j, int64_t n, float* rows) {
          dequantize_f16x64_rows(opt_.isa, wp, K, j, n, rows);
        });
      else
        matmul_f16x64(opt_.isa, wp, K, N, x, T, y, threads_);
      return;
    }
    if (opt_.repack && repackable(w.dtype, K, N) && w.ne[2] == 1 && w.ne[3] == 1) {
      const uint8_t* wp = repacked(w);
      if (opt_.gemm_min_rows_quant > 0 && T >= opt_.gemm_min_rows_quant && !int8_gemm(opt_.isa, w.dtype))
        gemm_panels(x, T, N, K, y,
                    [&](int64_t j, float* row) { dequantize_repacked(opt_.isa, w.dtype, wp, K, N, j, row); });
      else
        matmul_repacked(opt_.isa, w.dtype, wp, K, N, x, T, y, threads_);
      return;
    }
    if (opt_.gemm_min_rows > 0 && T >= opt_.gemm_min_rows) {
      if (w.dtype == DType::bf16 && !bf16_impl_.empty() && w.ne[2] == 1 && w.ne[3] == 1) {
        gemm_bf16(x, base, T, N, K, y);
        return;
      }
      if (w.dtype == DType::f32) { // straight from the model file
        gemm(x, reinterpret_cast<const float*>(base), static_cast<int64_t>(rb / sizeof(float)), T, N, K, y,
             N);
        return;
      }
      gemm_panels(x, T, N, K, y, [&](int64_t j, float* row) {
        dequantize(opt_.isa, w.dtype, base + static_cast<size_t>(j) * rb, row, K);
      });
      return;
    }
    if (has_kernel(w.dtype)) {
      cpu::matmul(opt_.isa, w.dtype, base, rb, K, N, x, T, y, threads_);
      return;
    }
    rows_dequantized(w, x, T, y);
  }

  // y = x · Wᵀ with each row of W dequantized to f32 (the SDK's values), then dotted: exact, and the route of
  // the block types below avx2 (and of the logits' matmul there under exact_logits).
  void rows_dequantized(const TensorDesc& w, const float* x, int64_t T, float* y) {
    const int64_t K = w.ne[0], N = w.ne[1];
    const auto* base = static_cast<const uint8_t*>(w.data);
    const size_t rb = row_bytes(w.dtype, K);
#pragma omp parallel if (N * K * T > 32768)
    {
      std::vector<float> row(static_cast<size_t>(K));
#pragma omp for schedule(static)
      for (int64_t j = 0; j < N; ++j) {
        dequantize_row(w.dtype, base + static_cast<size_t>(j) * rb, row.data(), K);
        for (int64_t t = 0; t < T; ++t)
          y[t * N + j] = vdot(row.data(), x + t * K, static_cast<int32_t>(K));
      }
    }
  }

  // y[T][N] = x[T][K] · Wᵀ on oneDNN's sgemm, W's rows dequantized by row(j, out) a panel at a time
  // (≈ 8 MiB, cache-sized, a multiple of 8 rows): the conversion costs O(N·K) against the GEMM's
  // O(T·N·K), and no second copy of the weights is kept.
  template <class RowFn>
  void gemm_panels(const float* x, int64_t T, int64_t N, int64_t K, float* y, RowFn row) {
    gemm_panels_of(x, T, N, K, y, 1, [&](int64_t j, int64_t, float* out) { row(j, out); });
  }

  // The same with rows(j, n, out) dequantizing n ≤ unit consecutive rows (K apart) at a time: panels a
  // multiple of `unit` rows (the f16x64 copy converts whole 64-row groups).
  template <class RowsFn>
  void gemm_panels_of(const float* x, int64_t T, int64_t N, int64_t K, float* y, int64_t unit,
                      RowsFn rows_fn) {
    const int64_t m = std::max<int64_t>(8, unit);
    const int64_t rows = std::min<int64_t>(std::max<int64_t>((int64_t{8} << 20) / (K * 4), 2 * m) / m * m, N);
    panel_.resize(static_cast<size_t>(rows * K));
    for (int64_t j0 = 0; j0 < N; j0 += rows) {
      const int64_t nr = std::min(rows, N - j0);
      float* pw = panel_.data();
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < nr; r += unit)
        rows_fn(j0 + r, std::min(unit, nr - r), pw + r * K);
      gemm(x, pw, K, T, nr, K, y + j0, N);
    }
  }

  // oneDNN's matmul of bf16 activations [T][K] by bf16 weights [N][K] (as the K×N matrix in "ba" layout,
  // i.e. the weight rows in place) into f32 [T][N]; one primitive per shape, kept.
  dnnl::matmul::primitive_desc bf16_matmul(int64_t T, int64_t N, int64_t K, int64_t ldy,
                                           bool blocked = false) const {
    using md = dnnl::memory::desc;
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    return {dnnl::matmul::desc(md({T, K}, dt::bf16, tag::ab),
                               md({K, N}, dt::bf16, blocked ? tag::BA16a64b2a : tag::ba),
                               md({T, N}, dt::f32, dnnl::memory::dims{ldy, 1})),
            engine_};
  }

  // y[T][N] = bf16(x)[T][K] · Wᵀ for BF16 weights w (N rows of K, in place).
  void gemm_bf16(const float* x, const uint8_t* w, int64_t T, int64_t N, int64_t K, float* y) {
    round_to_bf16(x, T, K);
    gemm_bf16_rounded(w, T, N, K, y, N);
  }

  void round_to_bf16(const float* x, int64_t T, int64_t K) {
    xbf16_.resize(static_cast<size_t>(T * K));
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t)
      to_bf16(opt_.isa, x + t * K, xbf16_.data() + t * K, K);
  }

  // y[T][N] (rows ldy apart) = xbf16_[T][K] · Wᵀ, W: N bf16 rows of K, or (blocked) a bf16x64 copy.
  void gemm_bf16_rounded(const uint8_t* w, int64_t T, int64_t N, int64_t K, float* y, int64_t ldy,
                         bool blocked = false) {
    try {
      const auto key = std::tuple{T, N, K, ldy, blocked};
      auto it = bf16_prims_.find(key);
      if (it == bf16_prims_.end()) {
        if (bf16_prims_.size() >= 256) bf16_prims_.clear(); // many batch sizes: start over
        it = bf16_prims_.emplace(key, dnnl::matmul(bf16_matmul(T, N, K, ldy, blocked))).first;
      }
      using md = dnnl::memory::desc;
      using dt = dnnl::memory::data_type;
      using tag = dnnl::memory::format_tag;
      dnnl::memory src(md({T, K}, dt::bf16, tag::ab), engine_, xbf16_.data());
      dnnl::memory wts(md({K, N}, dt::bf16, blocked ? tag::BA16a64b2a : tag::ba), engine_,
                       const_cast<uint8_t*>(w));
      dnnl::memory dst(md({T, N}, dt::f32, dnnl::memory::dims{ldy, 1}), engine_, y);
      it->second.execute(stream_, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}});
      stream_.wait();
    } catch (const dnnl::error& e) {
      fail(Errc::internal, "cpu", std::string("oneDNN bf16 matmul failed: ") + e.what());
    }
  }

  // C[T][n] (ldc) = A[T][K] · B[n][K]ᵀ (ldb) on oneDNN's f32 matmul primitive (one per shape, kept; the
  // weight rows in place as the K×n matrix "ba" with stride ldb): its brgemm kernel measured 470–480
  // GFLOP/s on two Zen 5 cores where dnnl_sgemm gave 360–380 (T = 512, K = 2048, n = 2048 / 5632).
  // dnnl_sgemm when no primitive can be made. A C with rows ldc > n apart (a panel's columns of the
  // output) goes through a contiguous buffer: with a strided destination oneDNN 2.6 leaves brgemm for
  // its gemm:jit kernel (360 GFLOP/s against 465).
  void gemm(const float* a, const float* b, int64_t ldb, int64_t T, int64_t n, int64_t K, float* c,
            int64_t ldc) {
    if (ldc != n) {
      gemm_out_.resize(static_cast<size_t>(T * n));
      gemm(a, b, ldb, T, n, K, gemm_out_.data(), n);
      const float* src = gemm_out_.data();
#pragma omp parallel for schedule(static) if (T * n > 65536)
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(c + t * ldc, src + t * n, static_cast<size_t>(n) * sizeof(float));
      return;
    }
    using md = dnnl::memory::desc;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const md src_md({T, K}, dt::f32, dims{K, 1}), wts_md({K, n}, dt::f32, dims{1, ldb}),
        dst_md({T, n}, dt::f32, dims{ldc, 1});
    dnnl::matmul* prim = nullptr;
    try {
      const auto key = std::tuple{T, n, K, ldb, ldc};
      auto it = f32_prims_.find(key);
      if (it == f32_prims_.end()) {
        if (f32_prims_.size() >= 256) f32_prims_.clear(); // many batch sizes: start over
        it = f32_prims_
                 .emplace(key, dnnl::matmul(dnnl::matmul::primitive_desc(
                                   dnnl::matmul::desc(src_md, wts_md, dst_md), engine_)))
                 .first;
      }
      prim = &it->second;
    } catch (const dnnl::error&) {
      prim = nullptr; // this oneDNN has no matmul for the shape: its sgemm below
    }
    if (prim != nullptr) {
      try {
        dnnl::memory src(src_md, engine_, const_cast<float*>(a));
        dnnl::memory wts(wts_md, engine_, const_cast<float*>(b));
        dnnl::memory dst(dst_md, engine_, c);
        prim->execute(stream_, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}});
        stream_.wait();
        return;
      } catch (const dnnl::error& e) {
        fail(Errc::internal, "cpu", std::string("oneDNN f32 matmul failed: ") + e.what());
      }
    }
    const dnnl_status_t st = dnnl_sgemm('N', 'T', T, n, K, 1.0f, a, K, b, ldb, 0.0f, c, ldc);
    if (st != dnnl_success)
      fail(Errc::internal, "cpu",
           "oneDNN sgemm failed (status " + std::to_string(static_cast<int>(st)) + ")");
  }

  CpuOptions opt_;
  int threads_;
  bool avx2_;
  std::string description_;
  int32_t logits_ = -1;      // the logits' matmul output in the graph being computed
  std::vector<float> arena_; // every activation of the graph, one slab
  std::vector<size_t> offsets_;
  std::vector<float> panel_; // dequantized weight rows for the GEMM
  std::vector<Gemv> gemvs_;  // fused_gemv's run
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::string bf16_impl_;       // oneDNN's bf16 matmul kernel when BF16 weights take that route, else empty
  std::vector<uint16_t> xbf16_; // activations rounded to bf16
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>, dnnl::matmul>
      bf16_prims_; // by T, N, K, ldy, layout
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, dnnl::matmul>
      f32_prims_;               // T, n, K, ldb, ldc
  std::vector<float> gemm_out_; // a panel's GEMM output before it goes to its columns
  std::map<std::tuple<const void*, int64_t, int64_t>, std::unique_ptr<uint8_t, FreeDeleter>>
      repacked_;                                                          // by data, K, N
  std::map<std::pair<const void*, int64_t>, std::vector<float>> vectors_; // vector weights, copied once
  std::vector<std::pair<const void*, size_t>> dropped_; // file ranges whose pages were dropped
  bool redrop_ = false; // a compute repacked something: drop those ranges again at its end
  // bytes of weight copies (repacked matrices, vectors) whose originals stay resident (heap weights,
  // writable mappings): a second copy, so counted as workspace
  size_t copies_extra_ = 0;
  size_t workspace_ = 0;
};

} // namespace

void flash_attention(const AttentionParams& p, const float* q, int32_t n_tokens, const Pos* pos,
                     const KVRows& kv, float* out, Isa isa) {
  LOOM_ASSERT(p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0, "bad head grouping");
  // The K/V row addresses of every sequence in the batch that some token attends (sinks, then the
  // window rows from the earliest token's first key), fetched once for all heads and tokens.
  std::vector<SeqRows> rows;
  std::vector<Pos> sink_end; // per sequence: the most sink rows any of its tokens reads
  std::vector<int32_t> row_of(static_cast<size_t>(n_tokens));
  for (int32_t t = 0; t < n_tokens; ++t) {
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
  attn_all(p, q, n_tokens, pos, rows, row_of, out, isa);
}

std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& opt) {
  return std::make_unique<CpuBackend>(opt);
}

} // namespace loom::cpu
