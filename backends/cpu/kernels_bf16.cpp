// backends/cpu/kernels_bf16.cpp — BF16 (and, opt-in, F16 rounded to BF16) matrices repacked 64 rows at a
// time for AVX512-BF16's vdpbf16ps: one token (decode) or a few against the repacked weights, the
// activations rounded to bf16 — as llama.cpp computes every BF16 product.
//
// Layout "bf16x64": N / 64 groups of 64 rows, 128·K bytes each. Inside a group, for each column pair
// c < K / 2, 256 bytes: row i's (w[i][2c], w[i][2c + 1]) at bytes 4i .. 4i + 3. Each 64 bytes (16 rows)
// is one vdpbf16ps operand against the broadcast pair (x[2c], x[2c + 1]): every 32-bit lane accumulates
// its own row, and a group's 64 outputs come out of four registers with no horizontal sum. The weights
// are read as one sequential stream per thread (the row-major F16/BF16 loops read four rows side by side):
// on the AMD EPYC of docs/benchmarks.md this GEMV reads ≈ 95 GB/s on two cores where the exact f32 loop
// on GGUF rows reaches ≈ 80. And it is oneDNN's own blocked layout for a bf16 matmul's weights,
// BA16a64b2a (K in blocks of 16, N in blocks of 64, pairs of K innermost) when K % 16 == 0: the prefill
// GEMM reads the copy in place, without oneDNN's per-call packing of plain weights.
#include "kernels.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>
#include <omp.h>
#include <vector>

namespace loom::cpu {

bool bf16x64_repackable(DType type, int64_t K, int64_t N) noexcept {
  return (type == DType::bf16 || type == DType::f16) && K >= 16 && K % 16 == 0 && N % 64 == 0;
}

size_t bf16x64_bytes(int64_t K, int64_t N) {
  return static_cast<size_t>(N) * static_cast<size_t>(K) * 2;
}

void repack_bf16x64(DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, uint16_t* out) {
  const int64_t P = K / 2;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < N / 64; ++g) {
    auto* dst = reinterpret_cast<uint32_t*>(out + static_cast<size_t>(g) * 64 * static_cast<size_t>(K));
    for (int i = 0; i < 64; ++i) {
      const uint8_t* row = w + static_cast<size_t>(64 * g + i) * row_bytes;
      for (int64_t c = 0; c < P; ++c) {
        uint16_t h[2];
        std::memcpy(h, row + 4 * c, 4);
        if (type == DType::f16) // round to nearest even (F16's values are normal numbers in bf16's range)
          for (auto& v : h)
            v = fp32_to_bf16(fp16_to_fp32(v));
        std::memcpy(dst + 64 * c + i, h, 4);
      }
    }
  }
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

#define LOOM_AVX512BF16 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

LOOM_AVX512BF16 inline __m512 dp(__m512 acc, __m512i w, uint32_t xpair) {
  const __m512i xv = _mm512_set1_epi32(static_cast<int>(xpair));
  return _mm512_dpbf16_ps(acc, reinterpret_cast<const __m512bh&>(w), reinterpret_cast<const __m512bh&>(xv));
}

// TT tokens (1..4) against one 64-row group: out[t·ldo + i] for row i < 64. xp[t]: token t's bf16 pairs
// as 32-bit words (K / 2 of them). Accumulators: one per 16 rows and token, and for one token two sets
// (column pairs even / odd) so that the chains of dependent vdpbf16ps stay short; summed at the end.
template <int TT>
LOOM_AVX512BF16 void group_bf16x64(const uint16_t* g, const uint32_t* const* xp, int64_t K, float* out,
                                   int64_t ldo) {
  constexpr int S = TT == 1 ? 2 : 1;
  __m512 acc[S][TT][4];
  for (auto& a : acc)
    for (auto& b : a)
      for (auto& v : b)
        v = _mm512_setzero_ps();
  const int64_t P = K / 2; // even: K % 16 == 0
  for (int64_t c = 0; c < P; c += S)
    for (int s = 0; s < S; ++s) {
      const uint16_t* gc = g + 128 * (c + s);
      const __m512i w0 = _mm512_loadu_si512(gc), w1 = _mm512_loadu_si512(gc + 32),
                    w2 = _mm512_loadu_si512(gc + 64), w3 = _mm512_loadu_si512(gc + 96);
      for (int t = 0; t < TT; ++t) {
        const uint32_t xw = xp[t][c + s];
        acc[s][t][0] = dp(acc[s][t][0], w0, xw);
        acc[s][t][1] = dp(acc[s][t][1], w1, xw);
        acc[s][t][2] = dp(acc[s][t][2], w2, xw);
        acc[s][t][3] = dp(acc[s][t][3], w3, xw);
      }
    }
  for (int t = 0; t < TT; ++t)
    for (int q = 0; q < 4; ++q) {
      __m512 v = acc[0][t][q];
      if constexpr (S == 2) v = _mm512_add_ps(v, acc[1][t][q]);
      _mm512_storeu_ps(out + t * ldo + 16 * q, v);
    }
}

// Groups [g0, g1) against T tokens (tiles of 4, 3, 2, 1), y[t][j] rows N apart.
void groups_bf16x64(const uint16_t* wp, int64_t K, int64_t N, const uint16_t* xb, int64_t T, int64_t g0,
                    int64_t g1, float* y) {
  for (int64_t g = g0; g < g1; ++g) {
    const uint16_t* gw = wp + static_cast<size_t>(g) * 64 * static_cast<size_t>(K);
    for (int64_t t0 = 0; t0 < T; t0 += 4) {
      const uint32_t* xp[4];
      const int64_t tt = std::min<int64_t>(4, T - t0);
      for (int64_t t = 0; t < tt; ++t)
        xp[t] = reinterpret_cast<const uint32_t*>(xb + (t0 + t) * K);
      float* out = y + t0 * N + 64 * g;
      if (tt == 4)
        group_bf16x64<4>(gw, xp, K, out, N);
      else if (tt == 3)
        group_bf16x64<3>(gw, xp, K, out, N);
      else if (tt == 2)
        group_bf16x64<2>(gw, xp, K, out, N);
      else
        group_bf16x64<1>(gw, xp, K, out, N);
    }
  }
}

} // namespace

void gemv_share_bf16x64(const uint16_t* wp, int64_t K, int64_t N, const uint16_t* xb, float* y) {
  const int nt = omp_get_num_threads(), id = omp_get_thread_num();
  const int64_t G = N / 64;
  groups_bf16x64(wp, K, N, xb, 1, G * id / nt, G * (id + 1) / nt, y);
}

void matmul_bf16x64(Isa isa, const uint16_t* wp, int64_t K, int64_t N, const float* x, int64_t T, float* y,
                    int n_threads) {
  if (!at_least(isa, Isa::avx512_bf16)) std::abort(); // a caller's bug: the route exists at that level only
  std::vector<uint16_t> xb(static_cast<size_t>(T * K));
  for (int64_t t = 0; t < T; ++t)
    to_bf16(isa, x + t * K, xb.data() + t * K, K);
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
#pragma omp parallel num_threads(threads) if (N * K * T > 32768)
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t G = N / 64;
    groups_bf16x64(wp, K, N, xb.data(), T, G * id / nt, G * (id + 1) / nt, y);
  }
}

} // namespace loom::cpu
