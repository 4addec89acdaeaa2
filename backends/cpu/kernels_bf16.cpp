// backends/cpu/kernels_bf16.cpp — BF16 (and, opt-in, F16 rounded to BF16) matrices repacked 64 rows at a
// time for AVX512-BF16's vdpbf16ps: one token (decode) or a few against the repacked weights, the
// activations rounded to bf16 — as llama.cpp computes every BF16 product.
//
// Layout "bf16x64": N / 64 groups of 64 rows, 128·K bytes each. Inside a group, for each column pair
// c < K / 2, 256 bytes: row i's (w[i][2c], w[i][2c + 1]) at bytes 4i .. 4i + 3. Each 64 bytes (16 rows)
// is one vdpbf16ps operand against the broadcast pair (x[2c], x[2c + 1]): every 32-bit lane accumulates
// its own row, and a group's 64 outputs come out of four registers with no horizontal sum. In decode a
// thread reads four groups far apart at once, each group one sequential stream (groups_x64_t1): on the AMD
// EPYC of docs/benchmarks.md this GEMV read ≈ 95 GB/s on two cores, one group at a time, where the exact f32
// loop on GGUF rows reached ≈ 80. And it is oneDNN's own blocked layout for a bf16 matmul's weights,
// BA16a64b2a (K in blocks of 16, N in blocks of 64, pairs of K innermost) when K % 16 == 0: the prefill
// GEMM reads the copy in place, without oneDNN's per-call packing of plain weights.
#include "avx512_gcc_warnings.hpp"
#include "kernels_internal.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>
#include <omp.h>
#include <type_traits>
#include <vector>

namespace loom::cpu {

bool bf16x64_repackable(DType type, int64_t K, int64_t N) noexcept {
  return (type == DType::bf16 || type == DType::f16) && K >= 16 && K % 16 == 0 && N % 64 == 0;
}

size_t bf16x64_bytes(int64_t K, int64_t N) {
  return static_cast<size_t>(N) * static_cast<size_t>(K) * 2;
}

namespace {
// 64-row groups of column pairs (the layout above), the values as they are (F16 or BF16) or F16 rounded
// to BF16.
void repack_x64(const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, bool f16_to_bf16, uint16_t* out) {
  const int64_t P = K / 2;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < N / 64; ++g) {
    auto* dst = reinterpret_cast<uint32_t*>(out + static_cast<size_t>(g) * 64 * static_cast<size_t>(K));
    for (int i = 0; i < 64; ++i) {
      const uint8_t* row = w + static_cast<size_t>(64 * g + i) * row_bytes;
      for (int64_t c = 0; c < P; ++c) {
        uint16_t h[2];
        std::memcpy(h, row + 4 * c, 4);
        if (f16_to_bf16) // round to nearest even (F16's values are normal numbers in bf16's range)
          for (auto& v : h)
            v = fp32_to_bf16(fp16_to_fp32(v));
        std::memcpy(dst + 64 * c + i, h, 4);
      }
    }
  }
}
} // namespace

void repack_bf16x64(DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, uint16_t* out) {
  repack_x64(w, row_bytes, K, N, type == DType::f16, out);
}

void repack_f16x64(const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, uint16_t* out) {
  repack_x64(w, row_bytes, K, N, false, out);
}

void dequantize_bf16x64(const uint16_t* wp, int64_t K, int64_t row, float* y) {
  const uint16_t* g = wp + static_cast<size_t>(row / 64) * 64 * static_cast<size_t>(K);
  const int i = static_cast<int>(row % 64);
  for (int64_t c = 0; c < K / 2; ++c) {
    y[2 * c] = bf16_to_fp32(g[128 * c + 2 * i]);
    y[2 * c + 1] = bf16_to_fp32(g[128 * c + 2 * i + 1]);
  }
}

namespace {

// Column pairs ahead (256 bytes each) that one token's kernels prefetch in each group they read: the
// hardware prefetchers of a Xeon (Sapphire Rapids class) alone do not keep a stream fed — SmolLM2 BF16
// decode 67 → 80 tok/s, F16 71 → 74 at 16 pairs ahead (8 to 64 alike) when a thread read one group at a
// time; reading four groups far apart at once (groups_x64_t1) took BF16 to 98–104.
constexpr int64_t k_prefetch_pairs = 16;

// The 256 bytes of the column pair k_prefetch_pairs after gc's, into L1.
inline void prefetch_pair_ahead(const uint16_t* gc) {
  for (int l = 0; l < 4; ++l)
    _mm_prefetch(reinterpret_cast<const char*>(gc + 128 * k_prefetch_pairs + 32 * l), _MM_HINT_T0);
}

#define LOOM_AVX512BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

LOOM_AVX512BF16 inline __m512 dp(__m512 acc, __m512i w, uint32_t xpair) {
  const __m512i xv = _mm512_set1_epi32(static_cast<int>(xpair));
  return _mm512_dpbf16_ps(acc, reinterpret_cast<const __m512bh&>(w), reinterpret_cast<const __m512bh&>(xv));
}

// TT tokens (1..4) against one 64-row group: out[t·ldo + i] for row i < 64. xp[t]: token t's bf16 pairs
// as 32-bit words (K / 2 of them). One accumulator per 16 rows and token: a row's products summed over the
// column pairs in order, as group_bf16x64_t1 sums them (a token's outputs do not depend on its batch).
template <int TT>
LOOM_AVX512BF16 void group_bf16x64(const uint16_t* g, const uint32_t* const* xp, int64_t K, float* out,
                                   int64_t ldo) {
  __m512 acc[TT][4];
  for (auto& a : acc)
    for (auto& v : a)
      v = _mm512_setzero_ps();
  for (int64_t c = 0; c < K / 2; ++c) { // (K % 16 == 0)
    const uint16_t* gc = g + 128 * c;
    const __m512i w0 = _mm512_loadu_si512(gc), w1 = _mm512_loadu_si512(gc + 32),
                  w2 = _mm512_loadu_si512(gc + 64), w3 = _mm512_loadu_si512(gc + 96);
    for (int t = 0; t < TT; ++t) {
      const uint32_t xw = xp[t][c];
      acc[t][0] = dp(acc[t][0], w0, xw);
      acc[t][1] = dp(acc[t][1], w1, xw);
      acc[t][2] = dp(acc[t][2], w2, xw);
      acc[t][3] = dp(acc[t][3], w3, xw);
    }
  }
  for (int t = 0; t < TT; ++t)
    for (int q = 0; q < 4; ++q)
      _mm512_storeu_ps(out + t * ldo + 16 * q, acc[t][q]);
}

// One token against NG groups at once (gs[n]: group n's weights, outs[n]: its 64 outputs), each prefetched
// k_prefetch_pairs ahead; a row's sum is group_bf16x64's.
template <int NG>
LOOM_AVX512BF16 void group_bf16x64_t1(const uint16_t* const* gs, const uint32_t* xp, int64_t K,
                                      float* const* outs) {
  __m512 acc[NG][4];
  for (auto& a : acc)
    for (auto& v : a)
      v = _mm512_setzero_ps();
  for (int64_t c = 0; c < K / 2; ++c)
    for (int n = 0; n < NG; ++n) {
      const uint16_t* gc = gs[n] + 128 * c;
      prefetch_pair_ahead(gc);
      for (int q = 0; q < 4; ++q)
        acc[n][q] = dp(acc[n][q], _mm512_loadu_si512(gc + 32 * q), xp[c]);
    }
  for (int n = 0; n < NG; ++n)
    for (int q = 0; q < 4; ++q)
      _mm512_storeu_ps(outs[n] + 16 * q, acc[n][q]);
}

// f(integral_constant<int, tt>) for a run-time tt in 1..TT.
template <int TT, class F> void with_tile(int64_t tt, F&& f) {
  if (tt == TT)
    f(std::integral_constant<int, TT>{});
  else if constexpr (TT > 1)
    with_tile<TT - 1>(tt, f);
}

// Groups [g0, g1) of a 64-row copy against T tokens in tiles of at most TT: group(tile, gw, t0, out) for
// the group's weights gw, the tile's first token t0 and its outputs (y[t][j] rows N apart).
template <int TT, class Group>
void for_groups(const uint16_t* wp, int64_t K, int64_t N, int64_t T, int64_t g0, int64_t g1, float* y,
                Group&& group) {
  for (int64_t g = g0; g < g1; ++g) {
    const uint16_t* gw = wp + static_cast<size_t>(g) * 64 * static_cast<size_t>(K);
    for (int64_t t0 = 0; t0 < T; t0 += TT)
      with_tile<TT>(std::min<int64_t>(TT, T - t0),
                    [&](auto tile) { group(tile, gw, t0, y + t0 * N + 64 * g); });
  }
}

// One token against groups [g0, g1) of a 64-row copy (outputs y[64·g ..]): four runs side by side
// (runs_side_by_side), then the last (g1 - g0) % 4 one at a time — kernel(ng, gs, outs) for ng = 4 or 1. A
// thread that read one group at a time (prefetching) kept two cores' reads at ≈ 23 GB/s on SmolLM2's
// matrices; four at once: BF16 decode 85 → 98–100 tok/s, F16 80 → 97 (two or three at once: 95; the F16
// kernel's 32 accumulators of four groups spill a few, still the fastest).
template <class Kernel>
void groups_x64_t1(const uint16_t* wp, int64_t K, int64_t g0, int64_t g1, float* y, Kernel&& kernel) {
  const auto at = [&](int64_t g) { return wp + static_cast<size_t>(g) * 64 * static_cast<size_t>(K); };
  const int64_t rest = runs_side_by_side<4>(g0, g1, [&](const int64_t(&g)[4]) {
    const uint16_t* gs[4] = {at(g[0]), at(g[1]), at(g[2]), at(g[3])};
    float* outs[4] = {y + 64 * g[0], y + 64 * g[1], y + 64 * g[2], y + 64 * g[3]};
    kernel(std::integral_constant<int, 4>{}, gs, outs);
  });
  for (int64_t g = rest; g < g1; ++g) {
    const uint16_t* gs[1] = {at(g)};
    float* outs[1] = {y + 64 * g};
    kernel(std::integral_constant<int, 1>{}, gs, outs);
  }
}

// fn(g0, g1) with this thread's share of the N / 64 groups, inside a parallel region.
template <class Fn> void my_groups(int64_t N, Fn&& fn) {
  const int nt = omp_get_num_threads(), id = omp_get_thread_num();
  const int64_t G = N / 64;
  fn(G * id / nt, G * (id + 1) / nt);
}

// The same over a team of n_threads (≤ 0: the OpenMP default; one thread for a small product).
template <class Fn> void team_groups(int64_t K, int64_t N, int64_t T, int n_threads, Fn&& fn) {
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
#pragma omp parallel num_threads(threads) if (N * K * T > 32768)
  my_groups(N, fn);
}

// Groups [g0, g1) against T bf16 tokens (tiles of 4, 3, 2, 1).
void groups_bf16x64(const uint16_t* wp, int64_t K, int64_t N, const uint16_t* xb, int64_t T, int64_t g0,
                    int64_t g1, float* y) {
  if (T == 1)
    return groups_x64_t1(wp, K, g0, g1, y, [&](auto ng, const uint16_t* const* gs, float* const* outs) {
      group_bf16x64_t1<decltype(ng)::value>(gs, reinterpret_cast<const uint32_t*>(xb), K, outs);
    });
  for_groups<4>(wp, K, N, T, g0, g1, y, [&](auto tile, const uint16_t* gw, int64_t t0, float* out) {
    constexpr int tt = decltype(tile)::value;
    const uint32_t* xp[tt];
    for (int t = 0; t < tt; ++t)
      xp[t] = reinterpret_cast<const uint32_t*>(xb + (t0 + t) * K);
    group_bf16x64<tt>(gw, xp, K, out, N);
  });
}

// ---- f16x64: exact F16 in the same 64-row layout, for CPUs without a half-precision product ----
// vcvtph2ps widens 32 bytes (8 rows × one column pair) to 16 floats, one FMA per 8 rows and token against
// the broadcast pair (x[2c], x[2c + 1]): lane 2i + e of accumulator q sums row 8q + i's products over
// columns of parity e, in f32, the weights exact; the two parities are added at the end. Per token 8
// accumulators (TT ≤ 3: 24 registers).
#define LOOM_AVX512F_X64 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))

// The pair (x[2c], x[2c + 1]) in every 64-bit lane.
LOOM_AVX512F_X64 inline __m512 x_pair(const float* x, int64_t c) {
  double pair;
  std::memcpy(&pair, x + 2 * c, sizeof pair);
  return _mm512_castpd_ps(_mm512_set1_pd(pair));
}

// A group's 64 outputs from its 8 accumulators (lane 2i + e of acc[q]: row 8q + i, columns of parity e).
LOOM_AVX512F_X64 inline void store_f16x64(const __m512* acc, float* out) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int q = 0; q < 8; q += 2) // rows 8q .. 8q + 15
    _mm512_storeu_ps(out + 8 * q, _mm512_add_ps(_mm512_permutex2var_ps(acc[q], even, acc[q + 1]),
                                                _mm512_permutex2var_ps(acc[q], odd, acc[q + 1])));
}

// One accumulator per 8 rows and token, the column pairs in order (as group_f16x64_t1 sums them).
template <int TT>
LOOM_AVX512F_X64 void group_f16x64(const uint16_t* g, const float* const* xt, int64_t K, float* out,
                                   int64_t ldo) {
  __m512 acc[TT][8];
  for (auto& a : acc)
    for (auto& v : a)
      v = _mm512_setzero_ps();
  for (int64_t c = 0; c < K / 2; ++c) {
    const uint16_t* gc = g + 128 * c;
    __m512 xv[TT];
    for (int t = 0; t < TT; ++t)
      xv[t] = x_pair(xt[t], c);
#pragma GCC unroll 8
    for (int q = 0; q < 8; ++q) {
      const __m512 w = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gc + 16 * q)));
      for (int t = 0; t < TT; ++t)
        acc[t][q] = _mm512_fmadd_ps(w, xv[t], acc[t][q]);
    }
  }
  for (int t = 0; t < TT; ++t)
    store_f16x64(acc[t], out + t * ldo);
}

// One token against NG groups at once, each prefetched k_prefetch_pairs ahead (group_bf16x64_t1's shape).
template <int NG>
LOOM_AVX512F_X64 void group_f16x64_t1(const uint16_t* const* gs, const float* x, int64_t K,
                                      float* const* outs) {
  __m512 acc[NG][8];
  for (auto& a : acc)
    for (auto& v : a)
      v = _mm512_setzero_ps();
  for (int64_t c = 0; c < K / 2; ++c) {
    const __m512 xv = x_pair(x, c);
    for (int n = 0; n < NG; ++n) {
      const uint16_t* gc = gs[n] + 128 * c;
      prefetch_pair_ahead(gc);
#pragma GCC unroll 8
      for (int q = 0; q < 8; ++q)
        acc[n][q] = _mm512_fmadd_ps(
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gc + 16 * q))), xv,
            acc[n][q]);
    }
  }
  for (int n = 0; n < NG; ++n)
    store_f16x64(acc[n], outs[n]);
}

// Groups [g0, g1) against T f32 tokens (tiles of 3, 2, 1).
void groups_f16x64(const uint16_t* wp, int64_t K, int64_t N, const float* x, int64_t T, int64_t g0,
                   int64_t g1, float* y) {
  if (T == 1)
    return groups_x64_t1(wp, K, g0, g1, y, [&](auto ng, const uint16_t* const* gs, float* const* outs) {
      group_f16x64_t1<decltype(ng)::value>(gs, x, K, outs);
    });
  for_groups<3>(wp, K, N, T, g0, g1, y, [&](auto tile, const uint16_t* gw, int64_t t0, float* out) {
    constexpr int tt = decltype(tile)::value;
    const float* xt[tt];
    for (int t = 0; t < tt; ++t)
      xt[t] = x + (t0 + t) * K;
    group_f16x64<tt>(gw, xt, K, out, N);
  });
}

// Row `row` of an f16x64 copy: 16 column pairs per gather (their dwords are 256 bytes apart).
LOOM_AVX512F_X64 void dequantize_f16x64_avx512(const uint16_t* wp, int64_t K, int64_t row, float* y) {
  const auto* g =
      reinterpret_cast<const int32_t*>(wp + static_cast<size_t>(row / 64) * 64 * static_cast<size_t>(K));
  const __m512i idx = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(64));
  const int i = static_cast<int>(row % 64);
  for (int64_t c = 0; c < K / 2; c += 16) { // K % 32 == 0 or the last 8 pairs apart
    if (c + 16 > K / 2) {
      for (int64_t cc = c; cc < K / 2; ++cc) {
        uint16_t h[2];
        std::memcpy(h, g + 64 * cc + i, 4);
        y[2 * cc] = fp16_to_fp32(h[0]);
        y[2 * cc + 1] = fp16_to_fp32(h[1]);
      }
      break;
    }
    const __m512i v = _mm512_i32gather_epi32(idx, g + 64 * c + i, 4);
    _mm512_storeu_ps(y + 2 * c, _mm512_cvtph_ps(_mm512_castsi512_si256(v)));
    _mm512_storeu_ps(y + 2 * c + 16, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1)));
  }
}

// The 64 rows of group `gw` to f32 (rows K apart in y): per 8 column pairs and 8 rows, eight vcvtph2ps
// give 8 vectors of (row, pair) values that an 8 × 8 transpose of 64-bit elements turns into the 8 rows'
// 16 columns.
LOOM_AVX512F_X64 void dequantize_group_f16x64(const uint16_t* gw, int64_t K, float* y) {
  for (int q = 0; q < 8; ++q) // 8 rows at a time: 8 write streams (64 rows K apart alias in L1)
    for (int64_t cb = 0; cb < K / 2; cb += 8) {
      __m512d v[8], t[8], u[8];
      for (int j = 0; j < 8; ++j)
        v[j] = _mm512_castps_pd(_mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gw + 128 * (cb + j) + 16 * q))));
      for (int j = 0; j < 8; j += 2) {
        t[j] = _mm512_unpacklo_pd(v[j], v[j + 1]);     // (v_j, v_j+1) elements 0, 2, 4, 6
        t[j + 1] = _mm512_unpackhi_pd(v[j], v[j + 1]); // elements 1, 3, 5, 7
      }
      for (int j = 0; j < 8; j += 4)
        for (int h = 0; h < 2; ++h) {
          u[j + h] = _mm512_shuffle_f64x2(t[j + h], t[j + 2 + h], 0x88);     // elements h, 4 + h
          u[j + 2 + h] = _mm512_shuffle_f64x2(t[j + h], t[j + 2 + h], 0xDD); // elements 2 + h, 6 + h
        }
      // u[0]: element 0 | 4 of v0..v3; u[1]: 1 | 5; u[2]: 2 | 6; u[3]: 3 | 7; u[4..7]: the same of v4..v7
      for (int e = 0; e < 4; ++e) {
        float* r0 = y + static_cast<size_t>(8 * q + e) * static_cast<size_t>(K) + 2 * cb;
        float* r1 = y + static_cast<size_t>(8 * q + e + 4) * static_cast<size_t>(K) + 2 * cb;
        _mm512_storeu_pd(reinterpret_cast<double*>(r0), _mm512_shuffle_f64x2(u[e], u[4 + e], 0x88));
        _mm512_storeu_pd(reinterpret_cast<double*>(r1), _mm512_shuffle_f64x2(u[e], u[4 + e], 0xDD));
      }
    }
}

} // namespace

void gemv_share_bf16x64(const uint16_t* wp, int64_t K, int64_t N, const uint16_t* xb, float* y) {
  my_groups(N, [&](int64_t g0, int64_t g1) { groups_bf16x64(wp, K, N, xb, 1, g0, g1, y); });
}

void matmul_bf16x64(Isa isa, const uint16_t* wp, int64_t K, int64_t N, const float* x, int64_t T, float* y,
                    int n_threads) {
  if (!at_least(isa, Isa::avx512_bf16)) std::abort(); // a caller's bug: the route exists at that level only
  std::vector<uint16_t> xb(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t)
    to_bf16(isa, x + t * K, xb.data() + t * K, K);
  team_groups(K, N, T, n_threads,
              [&](int64_t g0, int64_t g1) { groups_bf16x64(wp, K, N, xb.data(), T, g0, g1, y); });
}

void dequantize_f16x64(Isa isa, const uint16_t* wp, int64_t K, int64_t row, float* y) {
  if (!at_least(isa, Isa::avx512)) std::abort(); // a caller's bug: the route exists from that level on
  dequantize_f16x64_avx512(wp, K, row, y);
}

void dequantize_f16x64_rows(Isa isa, const uint16_t* wp, int64_t K, int64_t row, int64_t n, float* y) {
  if (!at_least(isa, Isa::avx512)) std::abort(); // a caller's bug: the route exists from that level on
  int64_t r = 0;
  for (; r < n; ++r) {
    if ((row + r) % 64 == 0 && r + 64 <= n) break;
    dequantize_f16x64_avx512(wp, K, row + r, y + r * K);
  }
  for (; r + 64 <= n; r += 64)
    dequantize_group_f16x64(wp + static_cast<size_t>(row + r) * static_cast<size_t>(K), K, y + r * K);
  for (; r < n; ++r)
    dequantize_f16x64_avx512(wp, K, row + r, y + r * K);
}

void gemv_share_f16x64(const uint16_t* wp, int64_t K, int64_t N, const float* x, float* y) {
  my_groups(N, [&](int64_t g0, int64_t g1) { groups_f16x64(wp, K, N, x, 1, g0, g1, y); });
}

void matmul_f16x64(Isa isa, const uint16_t* wp, int64_t K, int64_t N, const float* x, int64_t T, float* y,
                   int n_threads) {
  if (!at_least(isa, Isa::avx512)) std::abort(); // a caller's bug: the route exists from that level on
  team_groups(K, N, T, n_threads, [&](int64_t g0, int64_t g1) { groups_f16x64(wp, K, N, x, T, g0, g1, y); });
}

} // namespace loom::cpu
