// Private to the cpu backend's kernels*.cpp: target macros, shared types and helpers, per-ISA kernels.
#pragma once

#include "kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

// The instruction-set levels' target attributes (simd_cpu.hpp defines LOOM_AVX2 with the same text). A
// declaration carries its definition's attribute: GCC takes a different target for another version.
#ifndef LOOM_AVX2
#define LOOM_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif
#ifndef LOOM_AVX512F
#define LOOM_AVX512F __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#endif
#ifndef LOOM_AVX512VNNI
#define LOOM_AVX512VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#endif
#ifndef LOOM_AMX
#define LOOM_AMX                                                                                             \
  __attribute__((target(                                                                                     \
      "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,amx-tile,amx-int8,amx-bf16")))
#endif

namespace loom::cpu {

// Items [i0, i1) as P runs read side by side (P sequential weight streams instead of one): fn(idx) for
// every i < run = (i1 − i0) / P, with idx[h] = i0 + h·run + i. Returns i0 + P·run: the items from there to
// i1 (fewer than P) are the caller's. Decode's kernels read a thread's share of a matrix this way — four
// streams keep more misses in flight than one (docs/benchmarks.md: F32 rows 27–28 → 30 GB/s on two cores).
template <int P, class Fn> int64_t runs_side_by_side(int64_t i0, int64_t i1, Fn&& fn) {
  const int64_t run = (i1 - i0) / P;
  for (int64_t i = 0; i < run; ++i) {
    int64_t idx[P];
    for (int h = 0; h < P; ++h)
      idx[h] = i0 + h * run + i;
    fn(idx);
  }
  return i0 + P * run;
}

// Activations quantized per block of 32 for the integer dot products (a float scale keeps the
// error at the int8 rounding only).
struct BlockQ8 {
  float d;
  float s8;    // 8 · d · Σ qs: the q4_0 kernels multiply unsigned nibbles and subtract this
  int32_t sum; // Σ qs (the int8 GEMM's offsets)
  int8_t qs[32];
};

// std::lround(v) for |v| ≤ 127 (v clamped there first; NaN gives −127), written so that the
// quantizers' loops vectorize instead of calling libm per element: truncate, then step away from
// zero when the exact remainder is at least one half.
inline __attribute__((always_inline)) int32_t round_q8(float v) {
  v = v >= -127.0f ? v : -127.0f; // NaN too
  v = v <= 127.0f ? v : 127.0f;
  const auto t = static_cast<int32_t>(v);
  const float rem = v - static_cast<float>(t);
  return t + (rem >= 0.5f ? 1 : 0) - (rem <= -0.5f ? 1 : 0);
}

// n values to int8 with the scale d = amax / 127, which it returns.
inline __attribute__((always_inline)) float quantize_block(const float* v, int n, int8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i)
    amax = std::max(amax, std::fabs(v[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i)
    q[i] = static_cast<int8_t>(round_q8(v[i] * id));
  return d;
}

inline __attribute__((always_inline)) void quantize_x(const float* x, int64_t K, BlockQ8* out) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const float d = quantize_block(x + b * 32, 32, out[b].qs);
    out[b].d = d;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i)
      sum += out[b].qs[i];
    out[b].s8 = 8.0f * d * static_cast<float>(sum);
    out[b].sum = sum;
  }
}

// k-quant activations: one scale per 256-element super-block (as the weights' own scales are
// integers within a super-block, the whole super-block's dot product stays in integers), and the
// sums of each 16 quantized values for the weights' offsets (Q4_K mins, Q6_K's −32).
struct BlockQ8K {
  float d;
  int16_t bsums[16];
  int8_t qs[256];
};

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

// The repacked layouts (described in kernels.cpp): blocks of 32 (Q4_0 / IQ4_NL, Q8_0, Q4_1, Q5_0, Q5_1) and
// their offsets, k-quant super-blocks.
constexpr size_t k_q4x8_block = 144, k_q8x8_block = 272, k_q41x8_block = 160, k_q50x8_block = 176,
                 k_q51x8_block = 192;
// A group's bytes before its vectors, per group stored together: the 8 scales (Q4_1, Q5_1: and the 8 mins;
// Q5_0, Q5_1: and the fifth bits as 8 masks of 32 bits, q_hmask_at).
constexpr size_t b32_head(DType type) {
  return type == DType::q4_1 ? 32 : type == DType::q5_0 ? 48 : type == DType::q5_1 ? 64 : 16;
}
constexpr size_t b32_block_bytes(DType type) {
  return type == DType::q4_1   ? k_q41x8_block
         : type == DType::q5_0 ? k_q50x8_block
         : type == DType::q5_1 ? k_q51x8_block
         : type == DType::q8_0 ? k_q8x8_block
                               : k_q4x8_block; // q4_0, iq4_nl
}
// Whether a b32 type has mins (Q4_1, Q5_1) or fifth bits (Q5_0, Q5_1).
constexpr bool b32_mins(DType type) {
  return type == DType::q4_1 || type == DType::q5_1;
}
constexpr bool b32_fifth(DType type) {
  return type == DType::q5_0 || type == DType::q5_1;
}
constexpr size_t q_scale_at(int h) {
  return 16 * static_cast<size_t>(h);
}
constexpr size_t q_min_at(int H, int h) { // Q4_1, Q5_1: the mins after all H groups' scales
  return 16 * static_cast<size_t>(H) + 16 * static_cast<size_t>(h);
}
// Q5_0, Q5_1: group h's fifth bits of vector c's low (half 0: elements 4c..4c+3) or high nibbles (half 1: 16
// + 4c..) as one 32-bit mask, bit 4r + i for row r's element i — the byte of the vector that holds that
// nibble (so a pair's two words are the 64-bit mask of the pair's 64-byte vector); after the scales (Q5_1:
// and the mins).
constexpr size_t q_hmask_at(DType type, int H, int h, int c, int half) {
  return (b32_mins(type) ? 32 : 16) * static_cast<size_t>(H) +
         4 * static_cast<size_t>(H * (2 * c + half) + h);
}
constexpr size_t q_vec_at(int H, int h, int c, size_t head = 16) {
  return head * static_cast<size_t>(H) + 32 * static_cast<size_t>(H * c + h);
}
constexpr size_t k_q4kx8_block = 1152;
constexpr size_t k_q6kx8_block = 1680;
constexpr size_t k_q3kx8_block = 880;
constexpr size_t k_q5kx8_block = 1408;
constexpr size_t k_q2kx8_block = 672;
constexpr size_t k_iq4xsx8_block = 1088;
// Where q3_kx8's low bits of group g and third bits of pair p start, and q2_kx8's values of group g
// (kernels.cpp).
constexpr size_t q3_low_at(int g) {
  return 112 + 32 * static_cast<size_t>(g);
}
constexpr size_t q3_high_at(int p) {
  return 624 + 32 * static_cast<size_t>(p);
}
constexpr size_t q2_vals_at(int g) {
  return 160 + 32 * static_cast<size_t>(g);
}

// One weight of a row (f32, f16 or bf16) as f32 (the AVX2 and AVX-512 loops' tails).
template <DType type> inline float wscalar(const uint8_t* row, int64_t k) {
  if constexpr (type == DType::f32) {
    float f;
    std::memcpy(&f, row + 4 * k, 4);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    return type == DType::f16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
  }
}

// Two 32-byte vectors (one per group of 8 rows) as one 64-byte vector: rows 0..7 low, 8..15 high.
LOOM_AVX512VNNI inline __m512i pair256(const uint8_t* a, const uint8_t* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

// Two groups' 8 f16 values (a k-quant group's d or dmin) as 16 floats: rows 0..7, then 8..15.
LOOM_AVX512VNNI inline __m512 pair_f16(const uint8_t* a, const uint8_t* b) {
  return _mm512_cvtph_ps(
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1));
}

// Block b of a pair of repacked Q4_0 / Q8_0 groups (16 rows): its vector c (rows 0..7 low, 8..15 high) and
// its 16 scales as floats. The vector is read as two 32-byte halves: pair blocks are 288 / 544 bytes, so
// every other block's 64-byte vectors straddle two cache lines, and such loads cost Q4_0 prefill 4 %
// (pp256, interleaved A/B) where two aligned-enough halves cost nothing; decode reads the same either way.
LOOM_AVX512VNNI inline __m512i pair_vec(const uint8_t* a, int c, size_t head = 16) {
  return pair256(a + q_vec_at(2, 0, c, head), a + q_vec_at(2, 1, c, head));
}
LOOM_AVX512VNNI inline __m512 pair_scales(const uint8_t* a) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
}
LOOM_AVX512VNNI inline __mmask64 pair_hmask(DType type, const uint8_t* a, int c, int half) { // Q5_0, Q5_1
  uint64_t m;
  std::memcpy(&m, a + q_hmask_at(type, 2, 0, c, half), 8);
  return m;
}
LOOM_AVX512VNNI inline __m512 pair_mins(const uint8_t* a) { // Q4_1, Q5_1
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + q_min_at(2, 0))));
}

// One block's float step of the repacked b32 kernels (block_step in kernels_vnni.cpp, kernels_avx2.cpp), the
// same in every vector kernel so that their results agree bit for bit: the rows' scales dw (Q4_1: and mins
// mw) with the block's integer sums s of the (Q4_0 / Q4_1: unsigned) weights by the token's int8 values,
//   Q8_0: acc + (dw · d) · s;  Q4_0: acc + dw · (d · s − 8·d·Σq);  Q4_1: (acc + dw · (d · s)) + mw · (d·Σq);
//   Q5_0: acc + dw · (d · s − 16·d·Σq), with d·Σq = s8 / 8 (BlockQ8); Q5_1 as Q4_1, IQ4_NL as Q8_0.

// ---- kernels_avx2.cpp (the i8dq_rows int8 route of Q4_1, Q5_x, IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS included)
// ----

__attribute__((target("avx2,fma,f16c"))) void quantize_x_avx2(const float* x, int64_t K, BlockQ8* out);
LOOM_AVX2 float dot_f32_avx2(const uint8_t* w, const float* x, int64_t K);
LOOM_AVX2 float dot_f16_avx2(const uint8_t* w, const float* x, int64_t K);
LOOM_AVX2 float dot_bf16_avx2(const uint8_t* w, const float* x, int64_t K);
LOOM_AVX2 float dot_q8_0_avx2(const uint8_t* w, const BlockQ8* x, int64_t nb);
LOOM_AVX2 float dot_q4_0_avx2(const uint8_t* w, const BlockQ8* x, int64_t nb);
LOOM_AVX2 float dot_q4_k_avx2(const uint8_t* w, const BlockQ8K* x, int64_t nsb);
LOOM_AVX2 float dot_q6_k_avx2(const uint8_t* w, const BlockQ8K* x, int64_t nsb);
template <DType type> // q4_k or q6_k
LOOM_AVX2 void rows4_k_avx2(const uint8_t* w, size_t rb, const BlockQ8K* x, int64_t nsb, float* out);
LOOM_AVX2 void dot4_f32_avx2(const uint8_t* w, const float* x, int64_t K, float* out);
LOOM_AVX2 void dot4_f16_avx2(const uint8_t* w, const float* x, int64_t K, float* out);
LOOM_AVX2 void dot4_q_avx2(DType type, const uint8_t* w, const BlockQ8* x, int64_t nb, float* out);
LOOM_AVX2 void rows4_f32_avx2(const uint8_t* w, size_t rb, const float* x, int64_t K, float* out);
template <DType type> // f16 or bf16
LOOM_AVX2 void rows4_half_avx2(const uint8_t* w, size_t rb, const float* x, int64_t K, float* out);
template <DType type> // f32, f16 or bf16
LOOM_AVX2 void rows4x2_avx2(const uint8_t* w, size_t rb, const float* x, int64_t K, float* out);
template <DType type> // q8_0 or q4_0
LOOM_AVX2 void rows4_q_avx2(const uint8_t* w, size_t rb, const BlockQ8* x, int64_t nb, float* out);
// Rows [j0, j1) of one token's product on the int8 route; x: the token's BlockQ8 (K / 32 of them), or its
// BlockQ8K (K / 256) for the super-block types (i8dq_superblocks).
LOOM_AVX2 void i8dq_rows(DType type, const uint8_t* w, size_t rb, const void* x, int64_t K, int64_t j0,
                         int64_t j1, float* y);
template <int H> // 1 or 2
LOOM_AVX2 void gemv_q8_0x8_avx2(const uint8_t* g, const BlockQ8* x, int64_t nb, float* out);
template <DType Q, int H> // Q: q4_0, q4_1, q5_0 or iq4_nl; H: 1 or 2
LOOM_AVX2 void gemv_q4x8_avx2(const uint8_t* g, const BlockQ8* x, int64_t nb, float* out);
template <int P, bool Q5> // P: 4; Q5: q5_kx8 (else q4_kx8)
LOOM_AVX2 void gemv_q4_kx8_avx2_p(const uint8_t* const* gs, const BlockQ8K* x, int64_t nsb,
                                  float* const* outs);
LOOM_AVX2 void gemv_q4_kx8_avx2(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out);
LOOM_AVX2 void gemv_q5_kx8_avx2(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out);
template <int P> // 4
LOOM_AVX2 void gemv_q6_kx8_avx2_p(const uint8_t* const* gs, const BlockQ8K* x, int64_t nsb,
                                  float* const* outs);
LOOM_AVX2 void gemv_q6_kx8_avx2(const uint8_t* g8, const BlockQ8K* x, int64_t nsb, float* out);
template <int P> // 4
LOOM_AVX2 void gemv_q2_kx8_avx2_p(const uint8_t* const* gs, const BlockQ8K* x, int64_t nsb,
                                  float* const* outs);
LOOM_AVX2 void gemv_q2_kx8_avx2(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out);
template <int P> // 4
LOOM_AVX2 void gemv_q3_kx8_avx2_p(const uint8_t* const* gs, const BlockQ8K* x, int64_t nsb,
                                  float* const* outs);
LOOM_AVX2 void gemv_q3_kx8_avx2(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out);
template <int P> // 4
LOOM_AVX2 void gemv_iq4_xsx8_avx2_p(const uint8_t* const* gs, const BlockQ8K* x, int64_t nsb,
                                    float* const* outs);
LOOM_AVX2 void gemv_iq4_xsx8_avx2(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out);
LOOM_AVX2 void dequant_f16_avx2(const uint8_t* w, float* y, int64_t n);
LOOM_AVX2 void dequant_q8_0_avx2(const uint8_t* w, float* y, int64_t nb);
LOOM_AVX2 void dequant_q4_0_avx2(const uint8_t* w, float* y, int64_t nb);
// kernels_dq.cpp: row r (0..7) of a repacked Q2_K / Q3_K / Q5_K group g, K values, exactly dequantize_row's.
LOOM_AVX2 void dequantize_kx8_row(DType type, const uint8_t* g, int r, int64_t K, float* y);

// ---- kernels_avx512.cpp ----

__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))) void
quantize_x_avx512(const float* x, int64_t K, BlockQ8* out);
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))) void
quantize_x_k_avx512(const float* x, int64_t K, BlockQ8K* out);
template <DType type> // f32, f16 or bf16
LOOM_AVX512F void rows4_avx512(const uint8_t* w, size_t rb, const float* x, int64_t K, float* out);
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) void
to_bf16_avx512(const float* x, uint16_t* y, int64_t n);

// ---- kernels_vnni.cpp ----

// A b32 type's int8 kernels: one token against P = 1 or 4 pairs of repacked groups (16 rows each, P weight
// streams: gemv_pairs_vnni), and a pair against T tokens (y[t·ldy + r]; tiles of 16, 8, 4, 2, 1).
template <int P>
using GemvPairs = void (*)(const uint8_t* const* p, const BlockQ8* x, int64_t nb, float* const* y);
GemvPairs<4> pairs_kernel4(DType type);
GemvPairs<1> pairs_kernel1(DType type);
using GemmB32 = void (*)(const uint8_t* p, const BlockQ8* x, int64_t nb, int64_t T, float* y, int64_t ldy);
GemmB32 tokens_kernel(DType type);
// A k-quant's int8 GEMM for a pair of repacked groups (g0, g1: 16 rows) against tiles of 16, 8, 4, 2 and 1
// tokens (y[t·ldy + r]), for every repacked k-quant (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS).
using GemmK = void (*)(const uint8_t* g0, const uint8_t* g1, const BlockQ8K* x, int64_t nsb, float* y,
                       int64_t ldy);
struct KTiles {
  GemmK t16, t8, t4, t2, t1;
};
KTiles ktiles(DType type);

// ---- kernels_amx.cpp ----

template <bool Q4>
LOOM_AMX void gemm_x16_amx(const uint8_t* p, const BlockQ8* x, int64_t nb, int tt, float* y, int64_t ldy);

// The exact Q4_1 GEMM on bf16 tiles (matmul_repacked_exact). Token `row` (0..15) of a tile of 16: its K
// activations split into three bf16 parts x = x₁ + x₂ + x₃ (each the previous remainder truncated to bf16:
// exact, 8 + 8 + 8 bits), as rows of the tile's A tiles — per block of 32, parts 0, 1, 2, each 16 rows of 32
// (512 values) — and each block's sum (sums[b]).
LOOM_AMX void split_bf16x3(const float* x, int64_t K, int row, uint16_t* tiles, float* sums);
// A pair's weights as the B tiles of its blocks: per block of 32, 16 k-pairs × 16 rows × 2 nibbles as bf16
// (small integers: exact), 512 values; nb blocks into out.
LOOM_AMX void q4_1_pair_tiles(const uint8_t* p, int64_t nb, uint16_t* out);
// P = 1, 2 or 4 pairs (p: the first one's repacked blocks, the next pair_bytes on; bq: q4_1_pair_tiles of
// them, bq_stride apart) against tt ≤ 16 tokens (xa: their tile's A tiles; sums: their block sums, nb apart):
// y[t·ldy + 16h + r] = Σ_b d_rb·(Σ q·x) + m_rb·Σx.
template <int P>
LOOM_AMX void gemm_q4_1_amx_exact(const uint8_t* p, size_t pair_bytes, const uint16_t* bq, size_t bq_stride,
                                  const uint16_t* xa, const float* sums, int64_t nb, int tt, float* y,
                                  int64_t ldy);

} // namespace loom::cpu
