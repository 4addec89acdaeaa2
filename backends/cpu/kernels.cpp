// Matrix kernels of the cpu backend. One scalar path (any x86-64) and one AVX2/FMA/F16C path chosen
// at run time; both compute the same thing and are tested against the reference backend.
#include "kernels.hpp"

#include "loom/sdk/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>
#include <omp.h>
#include <string>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

// GCC 12 warns inside its own AVX-512 headers (the _mm512_undefined_* pass-through operands of the
// unmasked intrinsics): a known false positive, silenced for this file's AVX-512 code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace loom::cpu {

namespace {

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

// The same code compiled for AVX2 and AVX-512 (the compiler vectorizes it; the values are the same).
__attribute__((target("avx2,fma,f16c"))) void quantize_x_avx2(const float* x, int64_t K, BlockQ8* out) {
  quantize_x(x, K, out);
}
// quantize_x with AVX-512 intrinsics: the same values (the scalar's clamp, NaN → −127, and rounding
// half away from zero), a block of 32 in two vectors.
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))) void
quantize_x_avx512(const float* x, int64_t K, BlockQ8* out) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f), half = _mm512_set1_ps(0.5f),
               mhalf = _mm512_set1_ps(-0.5f), one = _mm512_set1_ps(1.0f);
  for (int64_t b = 0; b < K / 32; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
    // max(|v|, m) returns m for a NaN |v|: NaN is skipped, as the scalar's std::max(amax, |v|) does
    __m512 m = _mm512_max_ps(_mm512_and_ps(v0, abs_mask), _mm512_setzero_ps());
    m = _mm512_max_ps(_mm512_and_ps(v1, abs_mask), m);
    const float amax = _mm512_reduce_max_ps(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    __m512i sum = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      __m512 p = _mm512_mul_ps(h == 0 ? v0 : v1, _mm512_set1_ps(id));
      p = _mm512_min_ps(_mm512_max_ps(p, lo), hi); // max returns its second operand (−127) for NaN
      const __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m512 rem = _mm512_sub_ps(p, t);
      __m512 r = _mm512_mask_add_ps(t, _mm512_cmp_ps_mask(rem, half, _CMP_GE_OQ), t, one);
      r = _mm512_mask_sub_ps(r, _mm512_cmp_ps_mask(rem, mhalf, _CMP_LE_OQ), r, one);
      const __m512i q = _mm512_cvttps_epi32(r);
      sum = _mm512_add_epi32(sum, q);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].qs + 16 * h), _mm512_cvtepi32_epi8(q));
    }
    out[b].d = d;
    const int32_t s32 = _mm512_reduce_add_epi32(sum);
    out[b].sum = s32;
    out[b].s8 = 8.0f * d * static_cast<float>(s32);
  }
}

// Every token's activations, quantized in parallel (one token per iteration).
void quantize_rows(Isa isa, const float* x, int64_t K, int64_t T, BlockQ8* out, int threads) {
  const auto q = at_least(isa, Isa::avx512) ? quantize_x_avx512
                 : at_least(isa, Isa::avx2)
                     ? quantize_x_avx2
                     : [](const float* a, int64_t k, BlockQ8* o) { quantize_x(a, k, o); };
#pragma omp parallel for num_threads(threads) schedule(static) if (T >= 4)
  for (int64_t t = 0; t < T; ++t)
    q(x + t * K, K, out + t * (K / 32));
}

// k-quant activations: one scale per 256-element super-block (as the weights' own scales are
// integers within a super-block, the whole super-block's dot product stays in integers), and the
// sums of each 16 quantized values for the weights' offsets (Q4_K mins, Q6_K's −32).
struct BlockQ8K {
  float d;
  int16_t bsums[16];
  int8_t qs[256];
};

void quantize_x_k(const float* x, int64_t K, BlockQ8K* out) {
  for (int64_t b = 0; b < K / 256; ++b) {
    out[b].d = quantize_block(x + b * 256, 256, out[b].qs);
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i)
        sum += out[b].qs[i];
      out[b].bsums[g] = static_cast<int16_t>(sum);
    }
  }
}

// quantize_x_k with AVX-512 intrinsics: the same values (as quantize_x_avx512 for blocks of 32).
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))) void
quantize_x_k_avx512(const float* x, int64_t K, BlockQ8K* out) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f), half = _mm512_set1_ps(0.5f),
               mhalf = _mm512_set1_ps(-0.5f), one = _mm512_set1_ps(1.0f);
  for (int64_t b = 0; b < K / 256; ++b) {
    const float* v = x + 256 * b;
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i) // NaN skipped, as in quantize_x_avx512
      m = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(v + 16 * i), abs_mask), m);
    const float amax = _mm512_reduce_max_ps(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < 16; ++i) { // one group of 16 (one bsum) per vector
      __m512 p = _mm512_mul_ps(_mm512_loadu_ps(v + 16 * i), _mm512_set1_ps(id));
      p = _mm512_min_ps(_mm512_max_ps(p, lo), hi);
      const __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m512 rem = _mm512_sub_ps(p, t);
      __m512 r = _mm512_mask_add_ps(t, _mm512_cmp_ps_mask(rem, half, _CMP_GE_OQ), t, one);
      r = _mm512_mask_sub_ps(r, _mm512_cmp_ps_mask(rem, mhalf, _CMP_LE_OQ), r, one);
      const __m512i q = _mm512_cvttps_epi32(r);
      out[b].bsums[i] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].qs + 16 * i), _mm512_cvtepi32_epi8(q));
    }
    out[b].d = d;
  }
}

void quantize_rows_k(Isa isa, const float* x, int64_t K, int64_t T, BlockQ8K* out, int threads) {
  const bool avx512 = at_least(isa, Isa::avx512);
#pragma omp parallel for num_threads(threads) schedule(static) if (T >= 4)
  for (int64_t t = 0; t < T; ++t)
    (avx512 ? quantize_x_k_avx512 : quantize_x_k)(x + t * K, K, out + t * (K / 256));
}

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

// ---- scalar ----

float dot_f32_scalar(const uint8_t* w, const float* x, int64_t K) {
  const auto* a = reinterpret_cast<const float*>(w);
  float s = 0.0f;
  for (int64_t k = 0; k < K; ++k)
    s += a[k] * x[k];
  return s;
}
float dot_f16_scalar(const uint8_t* w, const float* x, int64_t K) {
  float s = 0.0f;
  for (int64_t k = 0; k < K; ++k)
    s += f16(w + 2 * k) * x[k];
  return s;
}
float dot_bf16_scalar(const uint8_t* w, const float* x, int64_t K) {
  float s = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    uint16_t h;
    std::memcpy(&h, w + 2 * k, 2);
    s += bf16_to_fp32(h) * x[k];
  }
  return s;
}
float dot_q8_0_scalar(const uint8_t* w, const BlockQ8* x, int64_t nb) {
  float s = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 34) {
    const auto* q = reinterpret_cast<const int8_t*>(w + 2);
    int32_t acc = 0;
    for (int i = 0; i < 32; ++i)
      acc += static_cast<int32_t>(q[i]) * x[b].qs[i];
    s += f16(w) * x[b].d * static_cast<float>(acc);
  }
  return s;
}
float dot_q4_0_scalar(const uint8_t* w, const BlockQ8* x, int64_t nb) {
  float s = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 18) {
    const uint8_t* q = w + 2;
    int32_t acc = 0;
    for (int i = 0; i < 16; ++i) {
      acc += ((q[i] & 0x0F) - 8) * x[b].qs[i];
      acc += ((q[i] >> 4) - 8) * x[b].qs[i + 16];
    }
    s += f16(w) * x[b].d * static_cast<float>(acc);
  }
  return s;
}

// ---- Q4_0 and Q8_0 repacked in groups of 8 rows, two groups side by side ("q4_0x8", "q8_0x8") ----
// Per group of 8 rows and block of 32 columns: the 8 rows' f16 scales (16 bytes), then vectors V0..Vn of
// 32 bytes where dword r of Vc is row r's quantized bytes 4c..4c+3 — Q4_0: four vectors, the low nibbles
// elements 4c..4c+3 and the high ones 16+4c..16+4c+3 (144 bytes a block); Q8_0: eight vectors, columns
// 4c..4c+3 (272 bytes). One vector load then serves 8 rows, the products of a row land in its own dword
// lane, and the 8 scales convert with one instruction.
// Groups 2p and 2p + 1 (rows 16p..16p+15) are stored as one pair, block by block: the 16 rows' scales
// (32 bytes), then per c the two groups' Vc side by side (64 bytes) — so a 512-bit load takes 16 rows'
// bytes at once, and the 16 scales one 256-bit load. An odd last group is stored alone. A pair starts at
// 2p · group_bytes and the odd group at 2·pairs · group_bytes: the matrix keeps the GGUF size.
// H groups stored together (1: alone, 2: a pair): block b at H · blk · b; within it, group h's scales at
// 16h, its Vc at 16H + 32H·c + 32h.
constexpr size_t k_q4x8_block = 144, k_q8x8_block = 272;
constexpr size_t q_scale_at(int h) {
  return 16 * static_cast<size_t>(h);
}
constexpr size_t q_vec_at(int H, int h, int c) {
  return 16 * static_cast<size_t>(H) + 32 * static_cast<size_t>(H * c + h);
}

// Blocks of 32 (Q4_0: 16 quantized bytes, Q8_0: 32) of 8·H rows (rb bytes apart) into the layout above.
void repack_groups_b32(const uint8_t* w, size_t rb, int64_t nb, int qs_bytes, int H, uint8_t* out) {
  const size_t bs = 2 + static_cast<size_t>(qs_bytes), blk = 16 + 8 * static_cast<size_t>(qs_bytes);
  for (int64_t b = 0; b < nb; ++b, out += static_cast<size_t>(H) * blk)
    for (int r = 0; r < 8 * H; ++r) {
      const uint8_t* src = w + static_cast<size_t>(r) * rb + static_cast<size_t>(b) * bs;
      std::memcpy(out + q_scale_at(r / 8) + 2 * (r % 8), src, 2);
      for (int c = 0; c < qs_bytes / 4; ++c)
        std::memcpy(out + q_vec_at(H, r / 8, c) + 4 * (r % 8), src + 2 + 4 * c, 4);
    }
}

// Row r (0..8H−1) of H groups stored together back to its GGUF blocks (nb × (2 + qs_bytes)).
void unpack_row_b32(const uint8_t* g, int64_t nb, int r, int qs_bytes, int H, uint8_t* out) {
  const size_t bs = 2 + static_cast<size_t>(qs_bytes), blk = 16 + 8 * static_cast<size_t>(qs_bytes);
  for (int64_t b = 0; b < nb; ++b, g += static_cast<size_t>(H) * blk, out += bs) {
    std::memcpy(out, g + q_scale_at(r / 8) + 2 * (r % 8), 2);
    for (int c = 0; c < qs_bytes / 4; ++c)
      std::memcpy(out + 2 + 4 * c, g + q_vec_at(H, r / 8, c) + 4 * (r % 8), 4);
  }
}

// H groups stored together (8·H rows) against one token: out[0..8H).
template <int H> void gemv_q8_0x8_scalar(const uint8_t* g, const BlockQ8* x, int64_t nb, float* out) {
  for (int r = 0; r < 8 * H; ++r)
    out[r] = 0.0f;
  for (int64_t b = 0; b < nb; ++b, g += H * k_q8x8_block)
    for (int r = 0; r < 8 * H; ++r) {
      int32_t acc = 0;
      for (int c = 0; c < 8; ++c)
        for (int i = 0; i < 4; ++i)
          acc += static_cast<int8_t>(g[q_vec_at(H, r / 8, c) + 4 * (r % 8) + i]) * x[b].qs[4 * c + i];
      out[r] += f16(g + q_scale_at(r / 8) + 2 * (r % 8)) * x[b].d * static_cast<float>(acc);
    }
}

template <int H> void gemv_q4_0x8_scalar(const uint8_t* g, const BlockQ8* x, int64_t nb, float* out) {
  for (int r = 0; r < 8 * H; ++r)
    out[r] = 0.0f;
  for (int64_t b = 0; b < nb; ++b, g += H * k_q4x8_block)
    for (int r = 0; r < 8 * H; ++r) {
      int32_t acc = 0;
      for (int c = 0; c < 4; ++c)
        for (int i = 0; i < 4; ++i) {
          const uint8_t q = g[q_vec_at(H, r / 8, c) + 4 * (r % 8) + i];
          acc += ((q & 0x0F) - 8) * x[b].qs[4 * c + i] + ((q >> 4) - 8) * x[b].qs[16 + 4 * c + i];
        }
      out[r] += f16(g + q_scale_at(r / 8) + 2 * (r % 8)) * x[b].d * static_cast<float>(acc);
    }
}

// k-quants: 256-element super-blocks against BlockQ8K activations.
void q4_k_scale_min(int j, const uint8_t* q, int& d, int& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K: y = d·sc_j·q − dmin·m_j per sub-block j of 32 →
//   Σ = x.d · (d · Σ_j sc_j · Σ q·xq − dmin · Σ_j m_j · Σ xq), the inner sums in integers.
float dot_q4_k_scalar(const uint8_t* w, const BlockQ8K* x, int64_t nsb) {
  float s = 0.0f;
  for (int64_t i = 0; i < nsb; ++i, w += 144, ++x) {
    const uint8_t* q = w + 16;
    int32_t sumq = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      q4_k_scale_min(j, w + 4, sc, m);
      int32_t acc = 0;
      for (int l = 0; l < 32; ++l)
        acc += ((j & 1) ? q[32 * (j / 2) + l] >> 4 : q[32 * (j / 2) + l] & 0xF) * x->qs[32 * j + l];
      sumq += sc * acc;
      summ += m * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
    }
    s += x->d * (f16(w) * static_cast<float>(sumq) - f16(w + 2) * static_cast<float>(summ));
  }
  return s;
}

// ---- Q4_K repacked in groups of 8 rows ("q4_kx8") ----
// Per group of 8 rows and super-block of 256 columns, 1152 bytes (the GGUF size): d[8] and dmin[8]
// (f16, row r at r); the 12 packed scale bytes of each row as three 32-byte vectors (vector u,
// dword r = row r's bytes 4u..4u+3), so the 6-bit scales and mins of all 8 rows unpack with a few
// vector ops; then per 64-column chunk j the 8 rows' 32 nibble bytes as eight 32-byte vectors whose
// dword r is row r's bytes 4c..4c+3 (low nibbles: sub-block 2j, columns 4c..4c+3; high nibbles:
// sub-block 2j+1).
constexpr size_t k_q4kx8_block = 1152;

void repack_group_q4_kx8(const uint8_t* w, size_t rb, int64_t nsb, uint8_t* out) {
  for (int64_t i = 0; i < nsb; ++i, out += k_q4kx8_block)
    for (int r = 0; r < 8; ++r) {
      const uint8_t* blk = w + static_cast<size_t>(r) * rb + static_cast<size_t>(i) * 144;
      std::memcpy(out + 2 * r, blk, 2);
      std::memcpy(out + 16 + 2 * r, blk + 2, 2);
      for (int u = 0; u < 3; ++u)
        std::memcpy(out + 32 + 32 * u + 4 * r, blk + 4 + 4 * u, 4);
      for (int j = 0; j < 4; ++j)
        for (int c = 0; c < 8; ++c)
          std::memcpy(out + 128 + 256 * j + 32 * c + 4 * r, blk + 16 + 32 * j + 4 * c, 4);
    }
}

// Row r (0..7) of a repacked group back to its GGUF Q4_K super-blocks (nsb × 144 bytes).
void unpack_row_q4_kx8(const uint8_t* g, int64_t nsb, int r, uint8_t* out) {
  for (int64_t i = 0; i < nsb; ++i, g += k_q4kx8_block, out += 144) {
    std::memcpy(out, g + 2 * r, 2);
    std::memcpy(out + 2, g + 16 + 2 * r, 2);
    for (int u = 0; u < 3; ++u)
      std::memcpy(out + 4 + 4 * u, g + 32 + 32 * u + 4 * r, 4);
    for (int j = 0; j < 4; ++j)
      for (int c = 0; c < 8; ++c)
        std::memcpy(out + 16 + 32 * j + 4 * c, g + 128 + 256 * j + 32 * c + 4 * r, 4);
  }
}

void gemv_q4_kx8_scalar(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out) {
  for (int r = 0; r < 8; ++r)
    out[r] = 0.0f;
  for (int64_t i = 0; i < nsb; ++i, g += k_q4kx8_block, ++x)
    for (int r = 0; r < 8; ++r) {
      uint8_t packed[12]; // row r's GGUF scale bytes
      for (int u = 0; u < 3; ++u)
        std::memcpy(packed + 4 * u, g + 32 + 32 * u + 4 * r, 4);
      int32_t sumq = 0, summ = 0;
      for (int s = 0; s < 8; ++s) {
        int sc, m;
        q4_k_scale_min(s, packed, sc, m);
        int32_t acc = 0;
        for (int c = 0; c < 8; ++c)
          for (int b = 0; b < 4; ++b) {
            const uint8_t q = g[128 + 256 * (s / 2) + 32 * c + 4 * r + b];
            acc += ((s & 1) ? q >> 4 : q & 0xF) * x->qs[32 * s + 4 * c + b];
          }
        sumq += sc * acc;
        summ += m * (x->bsums[2 * s] + x->bsums[2 * s + 1]);
      }
      out[r] +=
          x->d * (f16(g + 2 * r) * static_cast<float>(sumq) - f16(g + 16 + 2 * r) * static_cast<float>(summ));
    }
}

// The 6-bit value of Q6_K element e (0..255) of a super-block, minus 32, and its scale index.
inline int q6_k_value(const uint8_t* w, int e, int& scale_idx) {
  const int n = e / 128, r = e % 128, k = r / 32, l = r % 32;
  const uint8_t* ql = w + 64 * n;
  const uint8_t* qh = w + 128 + 32 * n;
  const int lo = (k & 1) ? ql[l + 32] : ql[l];
  const int nib = (k & 2) ? lo >> 4 : lo & 0xF;
  scale_idx = 8 * n + l / 16 + 2 * k;
  return (nib | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
}

// Q6_K: y = d·sc_g·(q − 32) per group g of 16 → Σ = x.d · d · Σ_g sc_g · Σ (q−32)·xq.
float dot_q6_k_scalar(const uint8_t* w, const BlockQ8K* x, int64_t nsb) {
  float s = 0.0f;
  for (int64_t i = 0; i < nsb; ++i, w += 210, ++x) {
    const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
    int32_t sumq = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t acc = 0;
      int si = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e)
        acc += q6_k_value(w, e, si) * x->qs[e];
      sumq += sc[si] * acc;
    }
    s += x->d * f16(w + 208) * static_cast<float>(sumq);
  }
  return s;
}

// ---- Q6_K repacked in groups of 8 rows ("q6_kx8") ----
// Per group of 8 rows and super-block, 1680 bytes (the GGUF size): d[8] (f16); the 16 int8 scales
// as [pair p][row r][group 2p, 2p+1] (128); per group g of 16 columns two 32-byte nibble vectors
// (dword r, byte i of vector h: low nibble = low 4 bits of column 16g + 8h + i, high nibble = of
// column 16g + 8h + 4 + i) (1024); per group one 32-byte vector of high bits (dword r, byte i:
// bits 2k, 2k+1 = the top 2 bits of column 16g + 4k + i) (512).
constexpr size_t k_q6kx8_block = 1680;

void repack_group_q6_kx8(const uint8_t* w, size_t rb, int64_t nsb, uint8_t* out) {
  for (int64_t i = 0; i < nsb; ++i, out += k_q6kx8_block) {
    std::memset(out, 0, k_q6kx8_block);
    for (int r = 0; r < 8; ++r) {
      const uint8_t* blk = w + static_cast<size_t>(r) * rb + static_cast<size_t>(i) * 210;
      std::memcpy(out + 2 * r, blk + 208, 2);
      for (int g = 0; g < 16; ++g)
        out[16 + 16 * (g / 2) + 2 * r + g % 2] = blk[192 + g];
      for (int col = 0; col < 256; ++col) {
        int si = 0;
        const int v = q6_k_value(blk, col, si) + 32; // 0..63
        const int g = col / 16, k = (col % 16) / 4, b = col % 4;
        out[144 + 64 * g + 32 * (k / 2) + 4 * r + b] |= static_cast<uint8_t>((v & 0xF) << (4 * (k % 2)));
        out[1168 + 32 * g + 4 * r + b] |= static_cast<uint8_t>((v >> 4) << (2 * k));
      }
    }
  }
}

// Row r (0..7) of a repacked group back to its GGUF Q6_K super-blocks (nsb × 210 bytes).
void unpack_row_q6_kx8(const uint8_t* g8, int64_t nsb, int r, uint8_t* out) {
  for (int64_t i = 0; i < nsb; ++i, g8 += k_q6kx8_block, out += 210) {
    std::memset(out, 0, 210);
    std::memcpy(out + 208, g8 + 2 * r, 2);
    for (int g = 0; g < 16; ++g)
      out[192 + g] = g8[16 + 16 * (g / 2) + 2 * r + g % 2];
    for (int col = 0; col < 256; ++col) {
      const int g = col / 16, k = (col % 16) / 4, b = col % 4;
      const int lo = (g8[144 + 64 * g + 32 * (k / 2) + 4 * r + b] >> (4 * (k % 2))) & 0xF;
      const int hi = (g8[1168 + 32 * g + 4 * r + b] >> (2 * k)) & 3;
      // the GGUF packing q6_k_value reads
      const int n = col / 128, kk = (col % 128) / 32, l = col % 32;
      out[64 * n + 32 * (kk & 1) + l] |= static_cast<uint8_t>(lo << (4 * (kk >> 1)));
      out[128 + 32 * n + l] |= static_cast<uint8_t>(hi << (2 * kk));
    }
  }
}

void gemv_q6_kx8_scalar(const uint8_t* g8, const BlockQ8K* x, int64_t nsb, float* out) {
  for (int r = 0; r < 8; ++r)
    out[r] = 0.0f;
  for (int64_t i = 0; i < nsb; ++i, g8 += k_q6kx8_block, ++x)
    for (int r = 0; r < 8; ++r) {
      int32_t sumq = 0;
      for (int g = 0; g < 16; ++g) {
        int32_t acc = 0;
        for (int c = 16 * g; c < 16 * g + 16; ++c) {
          const int k = (c % 16) / 4, b = c % 4;
          const int lo = (g8[144 + 64 * g + 32 * (k / 2) + 4 * r + b] >> (4 * (k % 2))) & 0xF;
          const int hi = (g8[1168 + 32 * g + 4 * r + b] >> (2 * k)) & 3;
          acc += ((lo | (hi << 4)) - 32) * x->qs[c];
        }
        sumq += static_cast<int8_t>(g8[16 + 16 * (g / 2) + 2 * r + g % 2]) * acc;
      }
      out[r] += x->d * f16(g8 + 2 * r) * static_cast<float>(sumq);
    }
}

// ---- AVX2 + FMA + F16C ----

#define LOOM_AVX2 __attribute__((target("avx2,fma,f16c")))

LOOM_AVX2 inline float f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

LOOM_AVX2 inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

LOOM_AVX2 float dot_f32_avx2(const uint8_t* w, const float* x, int64_t K) {
  const auto* a = reinterpret_cast<const float*>(w);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
         s3 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(x + k), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(x + k + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 16), _mm256_loadu_ps(x + k + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 24), _mm256_loadu_ps(x + k + 24), s3);
  }
  for (; k + 8 <= K; k += 8)
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(x + k), s0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; k < K; ++k)
    s += a[k] * x[k];
  return s;
}

LOOM_AVX2 float dot_f16_avx2(const uint8_t* w, const float* x, int64_t K) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256 a0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * k)));
    const __m256 a1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * k + 16)));
    s0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(x + k), s0);
    s1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(x + k + 8), s1);
  }
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; k < K; ++k)
    s += f16(w + 2 * k) * x[k];
  return s;
}

LOOM_AVX2 float dot_bf16_avx2(const uint8_t* w, const float* x, int64_t K) {
  __m256 s0 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * k)));
    s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(h, 16)), _mm256_loadu_ps(x + k), s0);
  }
  float s = hsum(s0);
  for (; k < K; ++k) {
    uint16_t h;
    std::memcpy(&h, w + 2 * k, 2);
    s += bf16_to_fp32(h) * x[k];
  }
  return s;
}

// Σ a·b over 32 int8 pairs as 8 int32 lanes (|a|, |b| ≤ 128: the i16 pair sums cannot overflow).
LOOM_AVX2 inline __m256i dot_i8(__m256i a, __m256i b) {
  const __m256i ax = _mm256_sign_epi8(a, a);
  const __m256i sb = _mm256_sign_epi8(b, a);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sb), _mm256_set1_epi16(1));
}

LOOM_AVX2 float dot_q8_0_avx2(const uint8_t* w, const BlockQ8* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, w += 34) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16c(w) * x[b].d), _mm256_cvtepi32_ps(dot_i8(a, q)), acc);
  }
  return hsum(acc);
}

LOOM_AVX2 float dot_q4_0_avx2(const uint8_t* w, const BlockQ8* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m256i eight = _mm256_set1_epi8(8);
  for (int64_t b = 0; b < nb; ++b, w += 18) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    const __m128i lo = _mm_and_si128(q, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    const __m256i a = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), eight);
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16c(w) * x[b].d), _mm256_cvtepi32_ps(dot_i8(a, xq)), acc);
  }
  return hsum(acc);
}

LOOM_AVX2 inline float hsum128(__m128 v) {
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

// One Q4_K super-block (144 bytes) against its BlockQ8K: the scaled nibble sums into acc, the
// mins' part into accm (subtracted at the end). Integers throughout the super-block: the scales are
// 6-bit integers, so each sub-block's maddubs sums are multiplied by its scale in madd, and one
// float conversion per super-block remains.
LOOM_AVX2 inline void q4_k_superblock_avx2(const uint8_t* blk, const BlockQ8K& xs, __m256& acc,
                                           __m128& accm) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  uint32_t u[3];
  std::memcpy(u, blk + 4, 12);
  // the 8 six-bit scales and mins (see q4_k_scale_min), as bytes
  const uint32_t sc_lo = u[0] & 0x3f3f3f3fu, m_lo = u[1] & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u);
  const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u);
  const __m128i sm = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(m_hi), static_cast<int>(m_lo)));
  const __m128i sc8 =
      _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(sc_hi), static_cast<int>(sc_lo)));
  const __m256i scales = _mm256_set_m128i(sc8, sc8); // 8 int16 scales, both halves
  // Σ_j m_j · (bsum_2j + bsum_2j+1): pairs of 16-sums to 32-sums, then madd with the mins
  const __m128i bs0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xs.bsums));
  const __m128i bs1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xs.bsums + 8));
  const __m128i bs32 =
      _mm_packs_epi32(_mm_madd_epi16(bs0, _mm_set1_epi16(1)), _mm_madd_epi16(bs1, _mm_set1_epi16(1)));
  const float xd = xs.d;
  accm = _mm_fmadd_ps(_mm_set1_ps(f16c(blk + 2) * xd), _mm_cvtepi32_ps(_mm_madd_epi16(sm, bs32)), accm);
  __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * j));
    const __m256i lo = _mm256_and_si256(q, mask), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
    const __m256i p0 =
        _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs.qs + 64 * j)));
    const __m256i p1 =
        _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs.qs + 64 * j + 32)));
    // broadcast int16 scales 2j and 2j+1 (bytes 4j..4j+3 of `scales`)
    const __m256i s0 =
        _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<short>((4 * j + 1) << 8 | 4 * j)));
    const __m256i s1 =
        _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<short>((4 * j + 3) << 8 | (4 * j + 2))));
    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(p0, s0), _mm256_madd_epi16(p1, s1)));
  }
  acc = _mm256_fmadd_ps(_mm256_set1_ps(f16c(blk) * xd), _mm256_cvtepi32_ps(sumi), acc);
}

LOOM_AVX2 float dot_q4_k_avx2(const uint8_t* w, const BlockQ8K* x, int64_t nsb) {
  __m256 acc = _mm256_setzero_ps();
  __m128 accm = _mm_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i, w += 144) {
    _mm_prefetch(reinterpret_cast<const char*>(w + 4 * 144), _MM_HINT_T0);
    q4_k_superblock_avx2(w, x[i], acc, accm);
  }
  return hsum(acc) - hsum128(accm);
}

// One Q6_K super-block (210 bytes: ql[128], qh[64], 16 int8 scales, d) against its BlockQ8K: the
// unsigned 6-bit values (0..63) into maddubs, each group of 16 times its scale in madd, and the −32
// offset as 32 · Σ_g sc_g · bsum_g, all in integers until the one conversion per super-block.
LOOM_AVX2 inline void q6_k_superblock_avx2(const uint8_t* w, const BlockQ8K& xs, __m256& acc) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192)));
  const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs.bsums)));
  const __m256i sc_half[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),  // scales 0..7 in both lanes
                              _mm256_permute2x128_si256(sc16, sc16, 0x11)}; // scales 8..15
  __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 2
  for (int n = 0; n < 2; ++n) {
    const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * n));
    const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * n + 32));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 32 * n));
    const __m256i q[4] = {
        _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4)),
        _mm256_or_si256(_mm256_and_si256(ql1, m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4))};
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) { // elements 128n + 32k ..: scale groups 8n + 2k (low lane), + 1 (high lane)
      const __m256i p = _mm256_maddubs_epi16(
          q[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs.qs + 128 * n + 32 * k)));
      const __m256i sel = _mm256_set_m128i(_mm_set1_epi16(static_cast<short>((4 * k + 3) << 8 | (4 * k + 2))),
                                           _mm_set1_epi16(static_cast<short>((4 * k + 1) << 8 | 4 * k)));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc_half[n], sel)));
    }
  }
  sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 5));
  acc = _mm256_fmadd_ps(_mm256_set1_ps(f16c(w + 208) * xs.d), _mm256_cvtepi32_ps(sumi), acc);
}

LOOM_AVX2 float dot_q6_k_avx2(const uint8_t* w, const BlockQ8K* x, int64_t nsb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i, w += 210) {
    _mm_prefetch(reinterpret_cast<const char*>(w + 4 * 210), _MM_HINT_T0);
    q6_k_superblock_avx2(w, x[i], acc);
  }
  return hsum(acc);
}

// k-quants, four rows against one token (decode), prefetching the next four rows like rows4_q_avx2.
template <DType type>
LOOM_AVX2 void rows4_k_avx2(const uint8_t* w, size_t rb, const BlockQ8K* x, int64_t nsb, float* out) {
  constexpr size_t bs = type == DType::q4_k ? 144 : 210;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  __m128 accm[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
  for (int64_t i = 0; i < nsb; ++i)
    for (int r = 0; r < 4; ++r) {
      const uint8_t* blk = w + static_cast<size_t>(r) * rb + static_cast<size_t>(i) * bs;
      for (size_t c = 0; c < bs; c += 64) // the next four rows, same offset
        _mm_prefetch(reinterpret_cast<const char*>(blk + 4 * rb + c), _MM_HINT_T0);
      if constexpr (type == DType::q4_k)
        q4_k_superblock_avx2(blk, x[i], acc[r], accm[r]);
      else
        q6_k_superblock_avx2(blk, x[i], acc[r]);
    }
  for (int r = 0; r < 4; ++r)
    out[r] = hsum(acc[r]) - hsum128(accm[r]);
}
// Four tokens at once (prefill): each weight chunk is loaded (and converted / unpacked) once for
// four dot products, so the loop is bound by FMAs rather than loads.
LOOM_AVX2 void dot4_f32_avx2(const uint8_t* w, const float* x, int64_t K, float* out) {
  const auto* a = reinterpret_cast<const float*>(w);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
         s3 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 wv = _mm256_loadu_ps(a + k);
    s0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + k), s0);
    s1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + K + k), s1);
    s2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 2 * K + k), s2);
    s3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 3 * K + k), s3);
  }
  out[0] = hsum(s0), out[1] = hsum(s1), out[2] = hsum(s2), out[3] = hsum(s3);
  for (; k < K; ++k)
    for (int t = 0; t < 4; ++t)
      out[t] += a[k] * x[t * K + k];
}

LOOM_AVX2 void dot4_f16_avx2(const uint8_t* w, const float* x, int64_t K, float* out) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
         s3 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * k)));
    s0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + k), s0);
    s1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + K + k), s1);
    s2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 2 * K + k), s2);
    s3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + 3 * K + k), s3);
  }
  out[0] = hsum(s0), out[1] = hsum(s1), out[2] = hsum(s2), out[3] = hsum(s3);
  for (; k < K; ++k)
    for (int t = 0; t < 4; ++t)
      out[t] += f16(w + 2 * k) * x[t * K + k];
}

// x: four consecutive tokens' blocks, nb apart.
LOOM_AVX2 void dot4_q_avx2(DType type, const uint8_t* w, const BlockQ8* x, int64_t nb, float* out) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m256i eight = _mm256_set1_epi8(8);
  const size_t stride = type == DType::q8_0 ? 34 : 18;
  for (int64_t b = 0; b < nb; ++b, w += stride) {
    __m256i a;
    if (type == DType::q8_0) {
      a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    } else {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
      a = _mm256_sub_epi8(_mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), mask), _mm_and_si128(q, mask)),
                          eight);
    }
    const float dw = f16c(w);
    for (int t = 0; t < 4; ++t) {
      const BlockQ8& xb = x[t * nb + b];
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * xb.d), _mm256_cvtepi32_ps(dot_i8(a, xq)), acc[t]);
    }
  }
  for (int t = 0; t < 4; ++t)
    out[t] = hsum(acc[t]);
}

// Four weight rows against one token (decode): four independent streams from memory and four
// accumulators, so neither the loads nor the FMA latency serialize.
LOOM_AVX2 void rows4_f32_avx2(const uint8_t* w, size_t rb, const float* x, int64_t K, float* out) {
  const float* a[4];
  for (int r = 0; r < 4; ++r)
    a[r] = reinterpret_cast<const float*>(w + static_cast<size_t>(r) * rb);
  __m256 s[4][2];
  for (auto& v : s)
    v[0] = v[1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
    for (int r = 0; r < 4; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(a[r] + k) + 4 * rb, _MM_HINT_T0); // the next four rows
      s[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + k), x0, s[r][0]);
      s[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(a[r] + k + 8), x1, s[r][1]);
    }
  }
  for (int r = 0; r < 4; ++r) {
    out[r] = hsum(_mm256_add_ps(s[r][0], s[r][1]));
    for (int64_t kk = k; kk < K; ++kk)
      out[r] += a[r][kk] * x[kk];
  }
}

// Eight 16-bit floats (f16 or bf16) to f32.
template <DType type> LOOM_AVX2 inline __m256 half8(__m128i h) {
  if constexpr (type == DType::f16)
    return _mm256_cvtph_ps(h);
  else
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <DType type> // f16 or bf16
LOOM_AVX2 void rows4_half_avx2(const uint8_t* w, size_t rb, const float* x, int64_t K, float* out) {
  const uint8_t* a[4];
  for (int r = 0; r < 4; ++r)
    a[r] = w + static_cast<size_t>(r) * rb;
  __m256 s[4][2];
  for (auto& v : s)
    v[0] = v[1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + k + 8);
    for (int r = 0; r < 4; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(a[r] + 4 * rb + 2 * k), _MM_HINT_T0); // the next four rows
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[r] + 2 * k));
      s[r][0] = _mm256_fmadd_ps(half8<type>(_mm256_castsi256_si128(h)), x0, s[r][0]);
      s[r][1] = _mm256_fmadd_ps(half8<type>(_mm256_extracti128_si256(h, 1)), x1, s[r][1]);
    }
  }
  for (int r = 0; r < 4; ++r) {
    out[r] = hsum(_mm256_add_ps(s[r][0], s[r][1]));
    for (int64_t kk = k; kk < K; ++kk) {
      uint16_t h;
      std::memcpy(&h, a[r] + 2 * kk, 2);
      out[r] += (type == DType::f16 ? _cvtsh_ss(h) : bf16_to_fp32(h)) * x[kk];
    }
  }
}

// rows4_f32_avx2 / rows4_half_avx2 with AVX-512: one cache line of each row per step (16 f32 or 32
// halves), half the instructions per byte — on a core that reads 35 GB/s the AVX2 loop is close to
// its issue limit for 16-bit weights.
#define LOOM_AVX512F __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
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

// Sixteen weights of a row (f32, f16 or bf16) from element k, as f32.
template <DType type> LOOM_AVX512F inline __m512 wload16(const uint8_t* row, int64_t k) {
  if constexpr (type == DType::f32) return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k));
  if constexpr (type == DType::f16)
    return _mm512_cvtph_ps(h);
  else
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <DType type> // f32, f16 or bf16
LOOM_AVX512F void rows4_avx512(const uint8_t* w, size_t rb, const float* x, int64_t K, float* out) {
  constexpr int64_t esize = type == DType::f32 ? 4 : 2;
  const uint8_t* a[4];
  for (int r = 0; r < 4; ++r)
    a[r] = w + static_cast<size_t>(r) * rb;
  __m512 s[4][2];
  for (auto& v : s)
    v[0] = v[1] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
    for (int r = 0; r < 4; ++r) {
      for (int64_t off = 0; off < 32 * esize; off += 64) // the next four rows, a line at a time
        _mm_prefetch(reinterpret_cast<const char*>(a[r] + 4 * rb + k * esize + off), _MM_HINT_T0);
      s[r][0] = _mm512_fmadd_ps(wload16<type>(a[r], k), x0, s[r][0]);
      s[r][1] = _mm512_fmadd_ps(wload16<type>(a[r], k + 16), x1, s[r][1]);
    }
  }
  for (int r = 0; r < 4; ++r) {
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(s[r][0], s[r][1]));
    for (int64_t kk = k; kk < K; ++kk)
      out[r] += wscalar<type>(a[r], kk) * x[kk];
  }
}

// Four f32/f16/bf16 rows against one token: the AVX-512 loop at that level, else AVX2.
void rows4_plain(Isa isa, DType type, const uint8_t* w, size_t rb, const float* x, int64_t K, float* out) {
  const bool wide = at_least(isa, Isa::avx512);
  if (type == DType::f32)
    (wide ? rows4_avx512<DType::f32> : rows4_f32_avx2)(w, rb, x, K, out);
  else if (type == DType::f16)
    (wide ? rows4_avx512<DType::f16> : rows4_half_avx2<DType::f16>)(w, rb, x, K, out);
  else
    (wide ? rows4_avx512<DType::bf16> : rows4_half_avx2<DType::bf16>)(w, rb, x, K, out);
}

// Four rows against two tokens (x: token 0, then token 1 at x + K): out[r], out[4 + r]. Eight
// independent accumulators and each weight vector loaded (and converted) once for both tokens, so
// a small batch (speculative verification, beams) costs about what one token does.
template <DType type> LOOM_AVX2 inline __m256 wload8(const uint8_t* row, int64_t k) {
  if constexpr (type == DType::f32)
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  else
    return half8<type>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
}
template <DType type> // f32, f16 or bf16
LOOM_AVX2 void rows4x2_avx2(const uint8_t* w, size_t rb, const float* x, int64_t K, float* out) {
  const uint8_t* a[4];
  for (int r = 0; r < 4; ++r)
    a[r] = w + static_cast<size_t>(r) * rb;
  __m256 s[4][2];
  for (auto& v : s)
    v[0] = v[1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 x0 = _mm256_loadu_ps(x + k), x1 = _mm256_loadu_ps(x + K + k);
    for (int r = 0; r < 4; ++r) {
      if ((k & 15) == 0) // the next four rows, one cache line per row per 64 bytes of weights
        _mm_prefetch(reinterpret_cast<const char*>(a[r] + 4 * rb) +
                         k * static_cast<int64_t>(sizeof(float)) / (type == DType::f32 ? 1 : 2),
                     _MM_HINT_T0);
      const __m256 wv = wload8<type>(a[r], k);
      s[r][0] = _mm256_fmadd_ps(wv, x0, s[r][0]);
      s[r][1] = _mm256_fmadd_ps(wv, x1, s[r][1]);
    }
  }
  for (int r = 0; r < 4; ++r) {
    out[r] = hsum(s[r][0]);
    out[4 + r] = hsum(s[r][1]);
    for (int64_t kk = k; kk < K; ++kk) {
      const float wf = wscalar<type>(a[r], kk);
      out[r] += wf * x[kk];
      out[4 + r] += wf * x[K + kk];
    }
  }
}

template <DType type>
LOOM_AVX2 void rows4_q_avx2(const uint8_t* w, size_t rb, const BlockQ8* x, int64_t nb, float* out) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  float corr[4] = {0.0f, 0.0f, 0.0f, 0.0f}; // q4_0: Σ_b d_w · s8 (the −8 offset of the nibbles)
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  constexpr size_t bs = type == DType::q8_0 ? 34 : 18;
  const uint8_t* rw[4] = {w, w + rb, w + 2 * rb, w + 3 * rb};
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    const __m256 xd = _mm256_set1_ps(x[b].d);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const uint8_t* blk = rw[r] + static_cast<size_t>(b) * bs;
      _mm_prefetch(reinterpret_cast<const char*>(blk + 4 * rb), _MM_HINT_T0); // the next four rows
      const float dw = f16c(blk);
      __m256i dot;
      if constexpr (type == DType::q8_0) {
        dot = dot_i8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)), xq);
      } else { // nibbles as unsigned bytes (0..15) straight into maddubs; the offset is corrected after
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
        const __m256i a = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), mask), _mm_and_si128(q, mask));
        dot = _mm256_madd_epi16(_mm256_maddubs_epi16(a, xq), ones);
        corr[r] += dw * x[b].s8;
      }
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dw), xd), _mm256_cvtepi32_ps(dot), acc[r]);
    }
  }
  for (int r = 0; r < 4; ++r)
    out[r] = hsum(acc[r]) - corr[r];
}

// ---- int8 products for Q4_1, Q5_0, Q5_1 and IQ4_NL on their GGUF rows (the "dq" types' fast route) ----
// Each block of 32 weights is unpacked in registers to 32 small integers u (Q4_1: the nibbles 0..15; Q5_0 /
// Q5_1: nibble | high bit << 4, 0..31; IQ4_NL: the signed level k_iq4nl_values[nibble]) with
// w = d·u + c (c: Q4_1 / Q5_1 the block's min m, Q5_0 −16·d, IQ4_NL 0), and multiplied by the token's
// 8-bit blocks: Σ w·x ≈ d·x.d·Σ u·q + c·x.d·Σ q, the second sum being the activations' own (s8 / 8).
// maddubs' pair sums fit int16 (2 · 31 · 127 < 2^15; IQ4_NL through dot_i8's sign trick, |u| ≤ 127).
template <DType type> constexpr size_t i8dq_block_bytes() {
  return type == DType::q4_1 ? 20 : type == DType::q5_0 ? 22 : type == DType::q5_1 ? 24 : 18;
}

// Block `blk` against the token's block xq: the int32 sums Σ u·q in 8 lanes; d and c as above.
template <DType type>
LOOM_AVX2 inline __m256i i8dq_block(const uint8_t* blk, __m256i xq, float& d, float& c) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  d = f16c(blk);
  if constexpr (type == DType::iq4_nl) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i lut = _mm_loadu_si128(reinterpret_cast<const __m128i*>(dtype_detail::k_iq4nl_values));
    const __m256i a = _mm256_set_m128i(_mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), mask)),
                                       _mm_shuffle_epi8(lut, _mm_and_si128(q, mask)));
    c = 0.0f;
    return dot_i8(a, xq);
  } else {
    constexpr size_t qs_at = type == DType::q4_1 ? 4 : type == DType::q5_0 ? 6 : 8;
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + qs_at));
    __m256i a = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), mask), _mm_and_si128(q, mask));
    if constexpr (type != DType::q4_1) { // the fifth bits: bit j of qh onto byte j, as 0x10
      uint32_t qh;
      std::memcpy(&qh, blk + (type == DType::q5_0 ? 2 : 4), 4);
      const __m256i spread =
          _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                              _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2,
                                               2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
      const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
      a = _mm256_or_si256(a, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    c = type == DType::q5_0 ? -16.0f * d : f16c(blk + 2);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, xq), ones);
  }
}

// R rows (rb bytes apart) against one token (decode): R streams, R accumulators.
template <DType type, int R>
LOOM_AVX2 void rows_i8dq_avx2(const uint8_t* w, size_t rb, const BlockQ8* x, int64_t nb, float* out) {
  constexpr size_t bs = i8dq_block_bytes<type>();
  __m256 acc[R];
  float corr[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    corr[r] = 0.0f;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    const __m256 xd = _mm256_set1_ps(x[b].d);
    const float xs = 0.125f * x[b].s8; // x.d · Σ q
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + static_cast<size_t>(r) * rb + static_cast<size_t>(b) * bs;
      _mm_prefetch(reinterpret_cast<const char*>(blk + R * rb), _MM_HINT_T0); // the next R rows
      float d, c;
      const __m256i dot = i8dq_block<type>(blk, xq, d, c);
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(d), xd), _mm256_cvtepi32_ps(dot), acc[r]);
      corr[r] += c * xs;
    }
  }
  for (int r = 0; r < R; ++r)
    out[r] = hsum(acc[r]) + corr[r];
}

// Rows [j0, j1) of one token's product (4 rows at a time, then one by one).
LOOM_AVX2 void i8dq_rows(DType type, const uint8_t* w, size_t rb, const BlockQ8* x, int64_t nb, int64_t j0,
                         int64_t j1, float* y) {
  const auto run = [&](auto four, auto one) {
    int64_t j = j0;
    for (; j + 4 <= j1; j += 4)
      four(w + static_cast<size_t>(j) * rb, rb, x, nb, y + j);
    for (; j < j1; ++j)
      one(w + static_cast<size_t>(j) * rb, rb, x, nb, y + j);
  };
  switch (type) {
  case DType::q4_1:
    run(rows_i8dq_avx2<DType::q4_1, 4>, rows_i8dq_avx2<DType::q4_1, 1>);
    break;
  case DType::q5_0:
    run(rows_i8dq_avx2<DType::q5_0, 4>, rows_i8dq_avx2<DType::q5_0, 1>);
    break;
  case DType::q5_1:
    run(rows_i8dq_avx2<DType::q5_1, 4>, rows_i8dq_avx2<DType::q5_1, 1>);
    break;
  default:
    run(rows_i8dq_avx2<DType::iq4_nl, 4>, rows_i8dq_avx2<DType::iq4_nl, 1>);
    break;
  }
}

// H groups of 8 rows stored together (1: alone, 2: a pair; out[0..8H)) against one token, each group
// through the same steps, so a row's float is the same in either storage.
// q4_0x8: one group of 8 rows against one token. Per block: 4 loads give all 8 rows' 32 nibbles; the
// activations' 4-byte chunks are broadcast, so each maddubs works on the same 4 columns of 8 rows;
// 8 maddubs sums fit int16 (8 · 2 · 15 · 127 < 2^15); one madd leaves row r's Σ nibble·x in lane r.
// The −8 offset is subtracted as s8 = 8 · x.d · Σ xq per block.
// q8_0x8: one group of 8 rows against one token. Signed × signed through maddubs with the sign
// moved onto the activations (|w| ≤ 128, so a pair sum fits int16); each vector's products go to
// int32 on their own (two would not fit int16 together).
template <int H> LOOM_AVX2 void gemv_q8_0x8_avx2(const uint8_t* g, const BlockQ8* x, int64_t nb, float* out) {
  constexpr size_t blk = H * k_q8x8_block;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[H];
  for (auto& a : acc)
    a = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, g += blk) {
    for (size_t c = 0; c < blk; c += 64) // four blocks ahead, every line
      _mm_prefetch(reinterpret_cast<const char*>(g + 4 * blk + c), _MM_HINT_T0);
    const auto* xw = reinterpret_cast<const int32_t*>(x[b].qs);
    for (int h = 0; h < H; ++h) {
      __m256i s32 = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + q_vec_at(H, h, c)));
        const __m256i p =
            _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(_mm256_set1_epi32(xw[c]), v));
        s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(p, ones));
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + q_scale_at(h))));
      acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(x[b].d)), _mm256_cvtepi32_ps(s32), acc[h]);
    }
  }
  for (int h = 0; h < H; ++h)
    _mm256_storeu_ps(out + 8 * h, acc[h]);
}

template <int H> LOOM_AVX2 void gemv_q4_0x8_avx2(const uint8_t* g, const BlockQ8* x, int64_t nb, float* out) {
  constexpr size_t blk = H * k_q4x8_block;
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[H];
  for (auto& a : acc)
    a = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, g += blk) {
    for (size_t c = 0; c < blk; c += 64) // eight blocks ahead, every line
      _mm_prefetch(reinterpret_cast<const char*>(g + 8 * blk + c), _MM_HINT_T0);
    const auto* xw = reinterpret_cast<const int32_t*>(x[b].qs);
    for (int h = 0; h < H; ++h) {
      __m256i s16 = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + q_vec_at(H, h, c)));
        const __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xw[c])));
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xw[4 + c])));
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + q_scale_at(h))));
      const __m256 t = _mm256_fmsub_ps(
          _mm256_set1_ps(x[b].d), _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones)), _mm256_set1_ps(x[b].s8));
      acc[h] = _mm256_fmadd_ps(dw, t, acc[h]);
    }
  }
  for (int h = 0; h < H; ++h)
    _mm256_storeu_ps(out + 8 * h, acc[h]);
}

// q4_kx8: one group of 8 rows against one token. Per 64-column chunk: 8 loads give the 8 rows'
// nibbles of two sub-blocks; broadcast 4-byte activation chunks into maddubs, 8 partial sums per
// sub-block in int16 (8 · 2 · 15 · 127 < 2^15), then one madd by the rows' scales (an int16 pair
// per row) leaves row r's scaled sum in lane r. The mins: one madd per pair of sub-blocks.
// pshufb indices putting byte b of each dword, zero-extended, in both int16 halves of that dword.
LOOM_AVX2 inline __m256i pick_byte_pairs(int b) {
  const __m256i base =
      _mm256_setr_epi8(0, -128, 0, -128, 4, -128, 4, -128, 8, -128, 8, -128, 12, -128, 12, -128, 0, -128, 0,
                       -128, 4, -128, 4, -128, 8, -128, 8, -128, 12, -128, 12, -128);
  return _mm256_add_epi8(base, _mm256_set1_epi16(static_cast<short>(b))); // 0x80 + b keeps bit 7: zero
}

template <int P>
LOOM_AVX2 void gemv_q4_kx8_avx2_p(const uint8_t* const* gs, const BlockQ8K* x, int64_t nsb,
                                  float* const* outs) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i m6 = _mm256_set1_epi32(0x3f3f3f3f), m4 = _mm256_set1_epi32(0x0f0f0f0f),
                m2 = _mm256_set1_epi32(0x30303030), lo16 = _mm256_set1_epi32(0x00FF00FF);
  __m256 acc[P], accm[P];
  for (int gi = 0; gi < P; ++gi)
    acc[gi] = accm[gi] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i, ++x)
#pragma GCC unroll 4
    for (int gi = 0; gi < P; ++gi) {
      const uint8_t* g = gs[gi] + static_cast<size_t>(i) * k_q4kx8_block;
      for (size_t c = 0; c < k_q4kx8_block; c += 64) // four super-blocks ahead, every line
        _mm_prefetch(reinterpret_cast<const char*>(g + 4 * k_q4kx8_block + c), _MM_HINT_T0);
      // the 8 rows' 6-bit scales and mins (q4_k_scale_min, on 8 rows at once): dword r of sc[h] holds
      // row r's scales 4h..4h+3 as bytes, of mn[h] its mins
      const __m256i u0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32));
      const __m256i u1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 64));
      const __m256i u2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 96));
      const __m256i sc[2] = {
          _mm256_and_si256(u0, m6),
          _mm256_or_si256(_mm256_and_si256(u2, m4), _mm256_and_si256(_mm256_srli_epi32(u0, 2), m2))};
      const __m256i mn[2] = {_mm256_and_si256(u1, m6),
                             _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m4),
                                             _mm256_and_si256(_mm256_srli_epi32(u1, 2), m2))};
      // Σ_s m_s · (bsum_2s + bsum_2s+1): int16 lanes of mn hold (m0, m1) and (m2, m3) as byte pairs
      int32_t b[8];
      for (int s = 0; s < 8; ++s)
        b[s] = x->bsums[2 * s] + x->bsums[2 * s + 1];
      __m256i summ = _mm256_setzero_si256();
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const int32_t* bh = b + 4 * h;
        summ = _mm256_add_epi32(summ, _mm256_madd_epi16(_mm256_and_si256(mn[h], lo16),
                                                        _mm256_set1_epi32((bh[2] << 16) | (bh[0] & 0xFFFF))));
        summ = _mm256_add_epi32(summ, _mm256_madd_epi16(_mm256_srli_epi16(mn[h], 8),
                                                        _mm256_set1_epi32((bh[3] << 16) | (bh[1] & 0xFFFF))));
      }
      const auto* xw = reinterpret_cast<const int32_t*>(x->qs);
      const uint8_t* q = g + 128;
      __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 1
      for (int j = 0; j < 4; ++j, q += 256) {
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * c));
          s0 = _mm256_add_epi16(
              s0, _mm256_maddubs_epi16(_mm256_and_si256(v, mask), _mm256_set1_epi32(xw[16 * j + c])));
          s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), mask),
                                                         _mm256_set1_epi32(xw[16 * j + 8 + c])));
        }
        // row r's scale of sub-blocks 2j, 2j+1: bytes 2(j % 2) + {0, 1} of dword r of sc[j / 2], in both
        // int16 halves of dword r
        const __m256i& scv = sc[j / 2];
        const __m256i sd0 = _mm256_shuffle_epi8(scv, pick_byte_pairs(2 * (j % 2)));
        const __m256i sd1 = _mm256_shuffle_epi8(scv, pick_byte_pairs(2 * (j % 2) + 1));
        sumi =
            _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(s0, sd0), _mm256_madd_epi16(s1, sd1)));
      }
      const __m256 xd = _mm256_set1_ps(x->d);
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
      const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 16)));
      acc[gi] = _mm256_fmadd_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(sumi), acc[gi]);
      accm[gi] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, xd), _mm256_cvtepi32_ps(summ), accm[gi]);
    }
  for (int gi = 0; gi < P; ++gi)
    _mm256_storeu_ps(outs[gi], _mm256_sub_ps(acc[gi], accm[gi]));
}
LOOM_AVX2 void gemv_q4_kx8_avx2(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out) {
  gemv_q4_kx8_avx2_p<1>(&g, x, nsb, &out);
}

// q6_kx8: one group of 8 rows against one token. Per group of 16 columns: two nibble vectors and
// one high-bit vector give the 8 rows' 6-bit values (0..63) of four 4-column chunks; broadcast
// activation chunks into maddubs; two maddubs sums fit int16 (2 · 2 · 63 · 127 < 2^15); madd by the
// rows' scales (an int16 pair per row). The −32 offset: 32 · Σ_g sc_g · bsum_g, one madd per pair.
template <int P>
LOOM_AVX2 void gemv_q6_kx8_avx2_p(const uint8_t* const* gs, const BlockQ8K* x, int64_t nsb,
                                  float* const* outs) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  // byte indices (within each 128-bit lane) that copy a dword's low / high int16 over both halves
  const __m256i dup_lo = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4,
                                          5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
  const __m256i dup_hi = _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2, 3, 2, 3,
                                          6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
  __m256 acc[P];
  for (int gi = 0; gi < P; ++gi)
    acc[gi] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i, ++x)
#pragma GCC unroll 4
    for (int gi = 0; gi < P; ++gi) {
      const uint8_t* g8 = gs[gi] + static_cast<size_t>(i) * k_q6kx8_block;
      for (size_t c = 0; c < k_q6kx8_block; c += 64) // four super-blocks ahead, every line
        _mm_prefetch(reinterpret_cast<const char*>(g8 + 4 * k_q6kx8_block + c), _MM_HINT_T0);
      const auto* xw = reinterpret_cast<const int32_t*>(x->qs);
      __m256i sumi = _mm256_setzero_si256(), off = _mm256_setzero_si256();
#pragma GCC unroll 1
      for (int p = 0; p < 8; ++p) { // groups 2p, 2p+1
        const __m256i sc =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g8 + 16 + 16 * p)));
        const int32_t b0 = x->bsums[2 * p], b1 = x->bsums[2 * p + 1];
        off = _mm256_add_epi32(off, _mm256_madd_epi16(sc, _mm256_set1_epi32((b1 << 16) | (b0 & 0xFFFF))));
#pragma GCC unroll 2
        for (int e = 0; e < 2; ++e) {
          const int g = 2 * p + e;
          const uint8_t* v = g8 + 144 + 64 * g;
          const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v));
          const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 32));
          const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g8 + 1168 + 32 * g));
          const __m256i q0 =
              _mm256_or_si256(_mm256_and_si256(v0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
          const __m256i q1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), m4),
                                             _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
          const __m256i q2 = _mm256_or_si256(_mm256_and_si256(v1, m4), _mm256_and_si256(h, m30));
          const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), m4),
                                             _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
          const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(q0, _mm256_set1_epi32(xw[4 * g])),
                                               _mm256_maddubs_epi16(q1, _mm256_set1_epi32(xw[4 * g + 1])));
          const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(q2, _mm256_set1_epi32(xw[4 * g + 2])),
                                               _mm256_maddubs_epi16(q3, _mm256_set1_epi32(xw[4 * g + 3])));
          const __m256i sd = _mm256_shuffle_epi8(sc, e ? dup_hi : dup_lo); // row r's scale in both halves
          sumi = _mm256_add_epi32(sumi,
                                  _mm256_add_epi32(_mm256_madd_epi16(p01, sd), _mm256_madd_epi16(p23, sd)));
        }
      }
      sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 5));
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g8)));
      acc[gi] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(x->d)), _mm256_cvtepi32_ps(sumi), acc[gi]);
    }
  for (int gi = 0; gi < P; ++gi)
    _mm256_storeu_ps(outs[gi], acc[gi]);
}
LOOM_AVX2 void gemv_q6_kx8_avx2(const uint8_t* g8, const BlockQ8K* x, int64_t nsb, float* out) {
  gemv_q6_kx8_avx2_p<1>(&g8, x, nsb, &out);
}

// ---- AVX-512 VNNI: the int8 GEMM of repacked Q8_0 / Q4_0 against several tokens ----

#define LOOM_AVX512VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

// Two 32-byte vectors (one per group of 8 rows) as one 64-byte vector: rows 0..7 low, 8..15 high.
LOOM_AVX512VNNI inline __m512i pair256(const uint8_t* a, const uint8_t* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

// Block b of a pair of repacked Q4_0 / Q8_0 groups (16 rows): its vector c (rows 0..7 low, 8..15 high) and
// its 16 scales as floats. The vector is read as two 32-byte halves: pair blocks are 288 / 544 bytes, so
// every other block's 64-byte vectors straddle two cache lines, and such loads cost Q4_0 prefill 4 %
// (pp256, interleaved A/B) where two aligned-enough halves cost nothing; decode reads the same either way.
LOOM_AVX512VNNI inline __m512i pair_vec(const uint8_t* a, int c) {
  return pair256(a + q_vec_at(2, 0, c), a + q_vec_at(2, 1, c));
}
LOOM_AVX512VNNI inline __m512 pair_scales(const uint8_t* a) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
}

// 16 rows (a pair of repacked groups, p) against TT tokens: y[t·ldy + r] = Σ_k W[r][k] · x[t][k].
// x: the tokens' blocks, nb per token (with Σ qs of each). Per block the 16 rows' weights are
// unpacked once, as unsigned bytes u (Q4_0: the nibbles, u = q + 8; Q8_0: u = q + 128, the sign bit
// flipped), into eight 64-byte vectors whose dword lane r holds row r's bytes of 4 columns; each token
// broadcasts its 4 matching activation bytes and one vpdpbusd adds u·x of those 4 columns to lane r.
// Σ u·x − offset · Σ x = Σ q·x exactly, in int32 (|Σ| ≤ 32 · 255 · 128); then the same float steps as
// the AVX2 kernel per block, so the results are those of gemv_q8_0x8_avx2 / gemv_q4_0x8_avx2, bit for bit.
// Token tiles at least this tall run on AMX (smaller ones: the VNNI kernel, whose setup is cheaper).
constexpr int64_t k_amx_min_tokens = 8;

// Blocks ahead that the one- and two-token kernels prefetch.
constexpr size_t k_prefetch_blocks = 8;

template <int TT, bool Q4>
LOOM_AVX512VNNI void gemm_x16_vnni(const uint8_t* p, const BlockQ8* x, int64_t nb, float* y, int64_t ldy) {
  constexpr size_t blk = 2 * (Q4 ? k_q4x8_block : k_q8x8_block);
  __m512 acc[TT];
  for (int t = 0; t < TT; ++t)
    acc[t] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* a = p + static_cast<size_t>(b) * blk;
    if constexpr (TT <= 2) // decode reads the weights once: keep more lines in flight than the prefetchers do
      for (size_t c = 0; c < blk; c += 64)
        _mm_prefetch(reinterpret_cast<const char*>(a + k_prefetch_blocks * blk + c), _MM_HINT_T0);
    __m512i w[8];
    if constexpr (Q4) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) { // low nibbles: columns 4c..4c+3; high: 16 + 4c..
        const __m512i v = pair_vec(a, c);
        w[c] = _mm512_and_si512(v, mask);
        w[4 + c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
      }
    } else {
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c)
        w[c] = _mm512_xor_si512(pair_vec(a, c), flip);
    }
    const __m512 dw = pair_scales(a);
#pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) {
      const BlockQ8& xb = x[static_cast<size_t>(t) * static_cast<size_t>(nb) + static_cast<size_t>(b)];
      const auto* xw = reinterpret_cast<const int32_t*>(xb.qs);
      // Q8_0 starts from −128 · Σ x (exact: Σ q·x then); Q4_0 from 0 (Σ nibble · x), its −8 · Σ x taken
      // off in float as the AVX2 kernel does (xb.s8), so both give that kernel's very floats.
      __m512i s = Q4 ? _mm512_setzero_si512() : _mm512_set1_epi32(-128 * xb.sum);
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c)
        s = _mm512_dpbusd_epi32(s, w[c], _mm512_set1_epi32(xw[c]));
      if constexpr (Q4)
        acc[t] = _mm512_fmadd_ps(
            dw, _mm512_fmsub_ps(_mm512_set1_ps(xb.d), _mm512_cvtepi32_ps(s), _mm512_set1_ps(xb.s8)), acc[t]);
      else
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb.d)), _mm512_cvtepi32_ps(s), acc[t]);
    }
  }
  for (int t = 0; t < TT; ++t)
    _mm512_storeu_ps(y + static_cast<size_t>(t) * static_cast<size_t>(ldy), acc[t]);
}

// One token against P pairs (16·P rows) at once: P sequential weight streams per thread instead of one,
// which is what the machine's read bandwidth needs (`loom bench --bandwidth`: one stream per thread reads
// half of what four do). Each block's integer sum in two chains of vpdpbusd (exact either way); the same
// float steps as gemm_x16_vnni<1, Q4> for each pair, so the same results.
template <bool Q4, int P>
LOOM_AVX512VNNI void gemv_pairs_vnni(const uint8_t* const p[P], const BlockQ8* x, int64_t nb,
                                     float* const y[P]) {
  constexpr size_t blk = 2 * (Q4 ? k_q4x8_block : k_q8x8_block);
  __m512 acc[P];
  for (auto& a : acc)
    a = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8& xb = x[b];
    const auto* xw = reinterpret_cast<const int32_t*>(xb.qs);
#pragma GCC unroll 8
    for (int h = 0; h < P; ++h) {
      const uint8_t* a = p[h] + static_cast<size_t>(b) * blk;
      for (size_t c = 0; c < blk; c += 64)
        _mm_prefetch(reinterpret_cast<const char*>(a + k_prefetch_blocks * blk + c), _MM_HINT_T0);
      __m512i s0 = Q4 ? _mm512_setzero_si512() : _mm512_set1_epi32(-128 * xb.sum),
              s1 = _mm512_setzero_si512();
      if constexpr (Q4) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const __m512i v = pair_vec(a, c);
          s0 = _mm512_dpbusd_epi32(s0, _mm512_and_si512(v, mask), _mm512_set1_epi32(xw[c]));
          s1 = _mm512_dpbusd_epi32(s1, _mm512_and_si512(_mm512_srli_epi16(v, 4), mask),
                                   _mm512_set1_epi32(xw[4 + c]));
        }
      } else {
#pragma GCC unroll 4
        for (int c = 0; c < 8; c += 2) {
          s0 = _mm512_dpbusd_epi32(s0, _mm512_xor_si512(pair_vec(a, c), flip), _mm512_set1_epi32(xw[c]));
          s1 = _mm512_dpbusd_epi32(s1, _mm512_xor_si512(pair_vec(a, c + 1), flip),
                                   _mm512_set1_epi32(xw[c + 1]));
        }
      }
      const __m512i s = _mm512_add_epi32(s0, s1);
      const __m512 dw = pair_scales(a);
      if constexpr (Q4)
        acc[h] = _mm512_fmadd_ps(
            dw, _mm512_fmsub_ps(_mm512_set1_ps(xb.d), _mm512_cvtepi32_ps(s), _mm512_set1_ps(xb.s8)), acc[h]);
      else
        acc[h] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb.d)), _mm512_cvtepi32_ps(s), acc[h]);
    }
  }
  for (int h = 0; h < P; ++h)
    _mm512_storeu_ps(y[h], acc[h]);
}

template <bool Q4>
void gemm_x16_tokens(const uint8_t* p, const BlockQ8* x, int64_t nb, int64_t T, float* y, int64_t ldy) {
  int64_t t = 0;
  const auto at = [&](int64_t u) { return static_cast<size_t>(u) * static_cast<size_t>(nb); };
  for (; t + 16 <= T; t += 16)
    gemm_x16_vnni<16, Q4>(p, x + at(t), nb, y + t * ldy, ldy);
  if (t + 8 <= T) {
    gemm_x16_vnni<8, Q4>(p, x + at(t), nb, y + t * ldy, ldy);
    t += 8;
  }
  if (t + 4 <= T) {
    gemm_x16_vnni<4, Q4>(p, x + at(t), nb, y + t * ldy, ldy);
    t += 4;
  }
  if (t + 2 <= T) {
    gemm_x16_vnni<2, Q4>(p, x + at(t), nb, y + t * ldy, ldy);
    t += 2;
  }
  if (t < T) gemm_x16_vnni<1, Q4>(p, x + at(t), nb, y + t * ldy, ldy);
}

// ---- AVX-512 VNNI: the int8 GEMM of repacked Q4_K / Q6_K against several tokens ----
// The same integer sums as gemv_q4_kx8_avx2 / gemv_q6_kx8_avx2, and their float steps per super-block,
// so the results are theirs bit for bit. 16 rows (two 8-row groups g0, g1) per 64-byte vector; the
// weights of one scale's columns are unpacked once (unsigned: Q4_K's nibbles, Q6_K's 6-bit values
// 0..63) and shared by the TT tokens; vpdpbusd sums 4 columns per lane, vpmulld applies the rows' scale
// (a 6-bit or int8 integer), and the mins (Q4_K) or the −32 offset (Q6_K) come from the tokens' bsums.

// acc/accm (Q4_K) and acc (Q6_K) per token stay in memory: they change once per super-block.
template <int TT>
LOOM_AVX512VNNI void gemm_q4_k_x16_vnni(const uint8_t* g0, const uint8_t* g1, const BlockQ8K* x, int64_t nsb,
                                        float* y, int64_t ldy) {
  __m512 acc[TT], accm[TT];
  for (int t = 0; t < TT; ++t)
    acc[t] = accm[t] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi32(0x3f3f3f3f),
                m4 = _mm512_set1_epi32(0x0f0f0f0f), m2 = _mm512_set1_epi32(0x30303030),
                lo16 = _mm512_set1_epi32(0x00FF00FF), byte = _mm512_set1_epi32(0xFF);
  for (int64_t i = 0; i < nsb; ++i) {
    const uint8_t* a0 = g0 + static_cast<size_t>(i) * k_q4kx8_block;
    const uint8_t* a1 = g1 + static_cast<size_t>(i) * k_q4kx8_block;
    if constexpr (TT <= 2) // two super-blocks ahead (as gemm_x16_vnni)
      for (size_t c = 0; c < k_q4kx8_block; c += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(a0 + 2 * k_q4kx8_block + c), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(a1 + 2 * k_q4kx8_block + c), _MM_HINT_T0);
      }
    // the 16 rows' scales and mins as in gemv_q4_kx8_avx2: dword r of sc[h] holds row r's scales
    // 4h..4h+3 as bytes, of mn[h] its mins
    const __m512i u0 = pair256(a0 + 32, a1 + 32), u1 = pair256(a0 + 64, a1 + 64),
                  u2 = pair256(a0 + 96, a1 + 96);
    const __m512i sc[2] = {
        _mm512_and_si512(u0, m6),
        _mm512_or_si512(_mm512_and_si512(u2, m4), _mm512_and_si512(_mm512_srli_epi32(u0, 2), m2))};
    const __m512i mn[2] = {_mm512_and_si512(u1, m6),
                           _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),
                                           _mm512_and_si512(_mm512_srli_epi32(u1, 2), m2))};
    __m512i sumi[TT];
    for (int t = 0; t < TT; ++t)
      sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int s = 0; s < 8; ++s) { // sub-block s: columns 32s..32s+31, nibbles (s & 1) of chunk s / 2
      const uint8_t* q0 = a0 + 128 + 256 * (s / 2);
      const uint8_t* q1 = a1 + 128 + 256 * (s / 2);
      __m512i w[8];
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i v = pair256(q0 + 32 * c, q1 + 32 * c);
        w[c] = _mm512_and_si512((s & 1) ? _mm512_srli_epi16(v, 4) : v, mask);
      }
      const __m512i scs = _mm512_and_si512(_mm512_srli_epi32(sc[s / 4], 8 * (s % 4)), byte);
#pragma GCC unroll 16
      for (int t = 0; t < TT; ++t) {
        const auto* xw =
            reinterpret_cast<const int32_t*>(
                x[static_cast<size_t>(t) * static_cast<size_t>(nsb) + static_cast<size_t>(i)].qs) +
            8 * s;
        __m512i is = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c)
          is = _mm512_dpbusd_epi32(is, w[c], _mm512_set1_epi32(xw[c]));
        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(is, scs));
      }
    }
    const __m512 d = _mm512_cvtph_ps(
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a0))),
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(a1)), 1));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a0 + 16))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(a1 + 16)), 1));
#pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) {
      const BlockQ8K& xb = x[static_cast<size_t>(t) * static_cast<size_t>(nsb) + static_cast<size_t>(i)];
      int32_t b[8];
      for (int s = 0; s < 8; ++s)
        b[s] = xb.bsums[2 * s] + xb.bsums[2 * s + 1];
      __m512i summ = _mm512_setzero_si512();
      for (int h = 0; h < 2; ++h) {
        const int32_t* bh = b + 4 * h;
        summ = _mm512_add_epi32(summ, _mm512_madd_epi16(_mm512_and_si512(mn[h], lo16),
                                                        _mm512_set1_epi32((bh[2] << 16) | (bh[0] & 0xFFFF))));
        summ = _mm512_add_epi32(summ, _mm512_madd_epi16(_mm512_srli_epi16(mn[h], 8),
                                                        _mm512_set1_epi32((bh[3] << 16) | (bh[1] & 0xFFFF))));
      }
      const __m512 xd = _mm512_set1_ps(xb.d);
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
      accm[t] = _mm512_fmadd_ps(_mm512_mul_ps(dmin, xd), _mm512_cvtepi32_ps(summ), accm[t]);
    }
  }
  for (int t = 0; t < TT; ++t)
    _mm512_storeu_ps(y + static_cast<size_t>(t) * static_cast<size_t>(ldy), _mm512_sub_ps(acc[t], accm[t]));
}

template <int TT>
LOOM_AVX512VNNI void gemm_q6_k_x16_vnni(const uint8_t* g0, const uint8_t* g1, const BlockQ8K* x, int64_t nsb,
                                        float* y, int64_t ldy) {
  __m512 acc[TT];
  for (int t = 0; t < TT; ++t)
    acc[t] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  for (int64_t i = 0; i < nsb; ++i) {
    const uint8_t* a0 = g0 + static_cast<size_t>(i) * k_q6kx8_block;
    const uint8_t* a1 = g1 + static_cast<size_t>(i) * k_q6kx8_block;
    __m512i sumi[TT];
    for (int t = 0; t < TT; ++t)
      sumi[t] = _mm512_setzero_si512();
    __m512i scales[8]; // dword r: row r's scales of groups 2p, 2p+1 as int16
    for (int p = 0; p < 8; ++p)
      scales[p] = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a0 + 16 + 16 * p))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(a1 + 16 + 16 * p)), 1));
#pragma GCC unroll 1
    for (int p = 0; p < 8; ++p) { // groups 2p, 2p+1 of 16 columns
      const __m512i scp = scales[p];
#pragma GCC unroll 1
      for (int e = 0; e < 2; ++e) {
        const int g = 2 * p + e;
        const __m512i v0 = pair256(a0 + 144 + 64 * g, a1 + 144 + 64 * g);
        const __m512i v1 = pair256(a0 + 176 + 64 * g, a1 + 176 + 64 * g);
        const __m512i h = pair256(a0 + 1168 + 32 * g, a1 + 1168 + 32 * g);
        const __m512i q[4] = {
            _mm512_or_si512(_mm512_and_si512(v0, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m30)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v0, 4), m4),
                            _mm512_and_si512(_mm512_slli_epi16(h, 2), m30)),
            _mm512_or_si512(_mm512_and_si512(v1, m4), _mm512_and_si512(h, m30)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v1, 4), m4),
                            _mm512_and_si512(_mm512_srli_epi16(h, 2), m30))};
        const __m512i scs =
            e ? _mm512_srai_epi32(scp, 16) : _mm512_srai_epi32(_mm512_slli_epi32(scp, 16), 16);
#pragma GCC unroll 16
        for (int t = 0; t < TT; ++t) {
          const auto* xw =
              reinterpret_cast<const int32_t*>(
                  x[static_cast<size_t>(t) * static_cast<size_t>(nsb) + static_cast<size_t>(i)].qs) +
              4 * g;
          __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0], _mm512_set1_epi32(xw[0]));
          is = _mm512_dpbusd_epi32(is, q[1], _mm512_set1_epi32(xw[1]));
          is = _mm512_dpbusd_epi32(is, q[2], _mm512_set1_epi32(xw[2]));
          is = _mm512_dpbusd_epi32(is, q[3], _mm512_set1_epi32(xw[3]));
          sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(is, scs));
        }
      }
    }
    const __m512 d = _mm512_cvtph_ps(
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a0))),
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(a1)), 1));
#pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) {
      const BlockQ8K& xb = x[static_cast<size_t>(t) * static_cast<size_t>(nsb) + static_cast<size_t>(i)];
      __m512i off = _mm512_setzero_si512();
      for (int p = 0; p < 8; ++p)
        off = _mm512_add_epi32(off,
                               _mm512_madd_epi16(scales[p], _mm512_set1_epi32((xb.bsums[2 * p + 1] << 16) |
                                                                              (xb.bsums[2 * p] & 0xFFFF))));
      const __m512i si = _mm512_sub_epi32(sumi[t], _mm512_slli_epi32(off, 5));
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xb.d)), _mm512_cvtepi32_ps(si), acc[t]);
    }
  }
  for (int t = 0; t < TT; ++t)
    _mm512_storeu_ps(y + static_cast<size_t>(t) * static_cast<size_t>(ldy), acc[t]);
}

template <class Kernel16, class Kernel8, class Kernel4, class Kernel2, class Kernel1>
void tiles_of_tokens(int64_t T, Kernel16 k16, Kernel8 k8, Kernel4 k4, Kernel2 k2, Kernel1 k1) {
  int64_t t = 0;
  for (; t + 16 <= T; t += 16)
    k16(t);
  if (t + 8 <= T) {
    k8(t);
    t += 8;
  }
  if (t + 4 <= T) {
    k4(t);
    t += 4;
  }
  if (t + 2 <= T) {
    k2(t);
    t += 2;
  }
  if (t < T) k1(t);
}

// ---- AMX: the int8 GEMM of repacked Q8_0 / Q4_0 on tiles ----

#define LOOM_AMX                                                                                             \
  __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")))

// The tile registers' shapes (palette 1): 0, 1 accumulators C (tt tokens × 16 int32, one per row of the
// pair); 2, 3 activations A (tt tokens × 32 int8 of one block); 4, 5 weights B (the block's 32 columns
// as 8 rows of 4 columns × 16 rows, the VNNI layout).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// gemm_x16_amx's steps (lambdas would not inherit the target attributes).
// The B tile of block b: 8 rows (4 columns each) × 16 weight rows as bytes.
template <bool Q4>
LOOM_AMX inline __attribute__((always_inline)) void amx_prep(const uint8_t* p, int64_t b,
                                                             uint8_t (&bb)[8][64]) {
  const uint8_t* a = p + static_cast<size_t>(b) * 2 * (Q4 ? k_q4x8_block : k_q8x8_block);
  if constexpr (Q4) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m512i v = pair_vec(a, c);
      _mm512_store_si512(bb[c], _mm512_and_si512(v, mask));
      _mm512_store_si512(bb[4 + c], _mm512_and_si512(_mm512_srli_epi16(v, 4), mask));
    }
  } else {
    for (int c = 0; c < 8; ++c)
      _mm512_store_si512(bb[c], pair_vec(a, c));
  }
}

// The tile product of block b into accumulator tile b & 1.
template <bool Q4>
LOOM_AMX inline __attribute__((always_inline)) void amx_product(const BlockQ8* x, int64_t b, size_t xstride,
                                                                uint8_t (&bbuf)[2][8][64]) {
  const int8_t* xa = x[b].qs;
  if (b & 1) {
    _tile_zero(1);
    _tile_loadd(3, xa, xstride);
    _tile_loadd(5, bbuf[1], 64);
    if constexpr (Q4)
      _tile_dpbsud(1, 3, 5);
    else
      _tile_dpbssd(1, 3, 5);
  } else {
    _tile_zero(0);
    _tile_loadd(2, xa, xstride);
    _tile_loadd(4, bbuf[0], 64);
    if constexpr (Q4)
      _tile_dpbsud(0, 2, 4);
    else
      _tile_dpbssd(0, 2, 4);
  }
}

// Block b's integer sums (cbuf) scaled into the accumulators: gemm_x16_vnni's float steps.
template <bool Q4>
LOOM_AMX inline __attribute__((always_inline)) void
amx_scale(const uint8_t* p, const BlockQ8* x, int64_t nb, int64_t b, int tt, const int32_t (&cbuf)[16][16],
          __m512 (&acc)[16]) {
  const __m512 dw = pair_scales(p + static_cast<size_t>(b) * 2 * (Q4 ? k_q4x8_block : k_q8x8_block));
  for (int t = 0; t < tt; ++t) {
    const BlockQ8& xb = x[static_cast<size_t>(t) * static_cast<size_t>(nb) + static_cast<size_t>(b)];
    const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(cbuf[t]));
    if constexpr (Q4)
      acc[t] = _mm512_fmadd_ps(dw, _mm512_fmsub_ps(_mm512_set1_ps(xb.d), s, _mm512_set1_ps(xb.s8)), acc[t]);
    else
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb.d)), s, acc[t]);
  }
}

// 16 rows (a pair of groups, p) against tt ≤ 16 tokens, as gemm_x16_vnni<tt, Q4> computes them: per block of
// 32 columns one tile product gives every (token, row) integer sum Σ q·x (Q8_0: signed × signed) or Σ
// nibble·x (Q4_0: signed activations × unsigned nibbles), then the same float steps per block, so the same
// floats. Two blocks in flight (tiles 0/2/4 and 1/3/5): the product of one runs while the other's sums are
// scaled.
template <bool Q4>
LOOM_AMX void gemm_x16_amx(const uint8_t* p, const BlockQ8* x, int64_t nb, int tt, float* y, int64_t ldy) {
  TileConfig cfg;
  for (int i = 0; i < 2; ++i) {
    cfg.rows[i] = static_cast<uint8_t>(tt);
    cfg.colsb[i] = 64;
    cfg.rows[2 + i] = static_cast<uint8_t>(tt);
    cfg.colsb[2 + i] = 32;
    cfg.rows[4 + i] = 8;
    cfg.colsb[4 + i] = 64;
  }
  _tile_loadconfig(&cfg);
  alignas(64) uint8_t bbuf[2][8][64];
  alignas(64) int32_t cbuf[16][16];
  __m512 acc[16];
  for (auto& a : acc)
    a = _mm512_setzero_ps();
  const size_t xstride = static_cast<size_t>(nb) * sizeof(BlockQ8);
  amx_prep<Q4>(p, 0, bbuf[0]);
  amx_product<Q4>(x, 0, xstride, bbuf);
  for (int64_t b = 0; b < nb; ++b) {
    if (b + 1 < nb) { // the next block's product runs while this one's sums are scaled
      amx_prep<Q4>(p, b + 1, bbuf[(b + 1) & 1]);
      amx_product<Q4>(x, b + 1, xstride, bbuf);
    }
    if (b & 1)
      _tile_stored(1, cbuf, 64);
    else
      _tile_stored(0, cbuf, 64);
    amx_scale<Q4>(p, x, nb, b, tt, cbuf, acc);
  }
  _tile_release();
  for (int t = 0; t < tt; ++t)
    _mm512_storeu_ps(y + static_cast<size_t>(t) * static_cast<size_t>(ldy), acc[t]);
}

// Rows to f32 for the GEMM panels (the values dequantize_row gives, faster).
LOOM_AVX2 void dequant_f16_avx2(const uint8_t* w, float* y, int64_t n) {
  int64_t k = 0;
  for (; k + 8 <= n; k += 8)
    _mm256_storeu_ps(y + k, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * k))));
  for (; k < n; ++k)
    y[k] = f16c(w + 2 * k);
}

LOOM_AVX2 void dequant_q8_0_avx2(const uint8_t* w, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, w += 34, y += 32) {
    const __m256 d = _mm256_set1_ps(f16c(w));
    for (int i = 0; i < 32; i += 8) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + 2 + i));
      _mm256_storeu_ps(y + i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
    }
  }
}

LOOM_AVX2 void dequant_q4_0_avx2(const uint8_t* w, float* y, int64_t nb) {
  const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  for (int64_t b = 0; b < nb; ++b, w += 18, y += 32) {
    const __m256 d = _mm256_set1_ps(f16c(w));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, mask), eight);                    // elements 0..15
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), mask), eight); // 16..31
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; ++i)
      _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[i]))));
  }
}

bool cpu_has(Isa level) noexcept {
  __builtin_cpu_init(); // libgcc's cpuid model also checks that the OS saves the YMM / ZMM state (XCR0)
  switch (level) {
  case Isa::scalar:
    return true;
  case Isa::avx2:
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  case Isa::avx512:
    return cpu_has(Isa::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  case Isa::avx512_vnni:
    return cpu_has(Isa::avx512) && __builtin_cpu_supports("avx512vnni");
  case Isa::avx512_bf16:
    return cpu_has(Isa::avx512_vnni) && __builtin_cpu_supports("avx512bf16");
  case Isa::amx: {
    // Linux hands out the AMX tile state only on request (without it the first tile instruction
    // faults); the request holds for the whole process, so once is enough
    static const bool granted =
        __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") &&
        __builtin_cpu_supports("amx-bf16") &&
        syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    return cpu_has(Isa::avx512_bf16) && granted;
  }
  }
  return false;
}

} // namespace

bool isa_supported(Isa level) noexcept {
  return cpu_has(level);
}

Isa cpu_isa() noexcept {
  Isa best = Isa::scalar;
  for (Isa l : k_isa_levels)
    if (cpu_has(l)) best = l;
  return best;
}

Isa detect_isa() {
  const Isa have = cpu_isa();
  const char* e = std::getenv("LOOM_CPU_ISA");
  if (!e || !*e) return have;
  const std::string s(e);
  std::string names;
  for (Isa l : k_isa_levels) {
    if (s == isa_name(l)) {
      if (!cpu_has(l))
        fail(Errc::unsupported, "cpu",
             std::string("LOOM_CPU_ISA=") + s + ": this CPU lacks it (it runs up to " + isa_name(have) +
                 "); unset LOOM_CPU_ISA or name a lower level");
      return l;
    }
    names += (names.empty() ? "" : ", ") + std::string(isa_name(l));
  }
  fail(Errc::invalid_argument, "cpu",
       "LOOM_CPU_ISA=" + s + ": unknown level; expected one of " + names +
           " (or unset: the best this CPU runs)");
}

const char* isa_name(Isa isa) noexcept {
  switch (isa) {
  case Isa::scalar:
    return "scalar";
  case Isa::avx2:
    return "avx2";
  case Isa::avx512:
    return "avx512";
  case Isa::avx512_vnni:
    return "avx512_vnni";
  case Isa::avx512_bf16:
    return "avx512_bf16";
  case Isa::amx:
    return "amx";
  }
  return "?";
}

void dequantize(Isa isa, DType type, const uint8_t* w, float* y, int64_t n) {
  if (at_least(isa, Isa::avx2)) {
    switch (type) {
    case DType::f16:
      return dequant_f16_avx2(w, y, n);
    case DType::q8_0:
      if (n % 32 == 0) return dequant_q8_0_avx2(w, y, n / 32);
      break;
    case DType::q4_0:
      if (n % 32 == 0) return dequant_q4_0_avx2(w, y, n / 32);
      break;
    default:
      if (dq_supports(isa, type) && n % dtype_traits(type).block_size == 0)
        return dequantize_dq(type, w, y, n);
      break;
    }
  }
  dequantize_row(type, w, y, n);
}

bool repackable(DType type, int64_t K, int64_t N) noexcept {
  return ((type == DType::q4_0 || type == DType::q8_0) && K % 32 == 0 && N % 8 == 0) ||
         ((type == DType::q4_k || type == DType::q6_k) && K % 256 == 0 && N % 8 == 0);
}

namespace {
size_t group_bytes(DType type, int64_t K) {
  switch (type) {
  case DType::q4_0:
    return static_cast<size_t>(K / 32) * k_q4x8_block;
  case DType::q8_0:
    return static_cast<size_t>(K / 32) * k_q8x8_block;
  case DType::q4_k:
    return static_cast<size_t>(K / 256) * k_q4kx8_block;
  default:
    return static_cast<size_t>(K / 256) * k_q6kx8_block;
  }
}
} // namespace

size_t repacked_bytes(DType type, int64_t K, int64_t N) {
  return static_cast<size_t>(N / 8) * group_bytes(type, K);
}

void repack(DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, uint8_t* out) {
  const size_t gb = group_bytes(type, K);
  if (type == DType::q4_0 || type == DType::q8_0) { // pairs of groups, an odd last group alone
    const int64_t units = (N / 8 + 1) / 2;
#pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int H = 2 * u + 1 < N / 8 ? 2 : 1;
      repack_groups_b32(w + static_cast<size_t>(16 * u) * row_bytes, row_bytes, K / 32,
                        type == DType::q4_0 ? 16 : 32, H, out + static_cast<size_t>(2 * u) * gb);
    }
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < N / 8; ++g) {
    const uint8_t* src = w + static_cast<size_t>(8 * g) * row_bytes;
    if (type == DType::q4_k)
      repack_group_q4_kx8(src, row_bytes, K / 256, out + static_cast<size_t>(g) * gb);
    else
      repack_group_q6_kx8(src, row_bytes, K / 256, out + static_cast<size_t>(g) * gb);
  }
}

void dequantize_repacked(Isa isa, DType type, const uint8_t* wp, int64_t K, int64_t N, int64_t row,
                         float* y) {
  uint8_t blocks[16 * 210]; // a few GGUF blocks at a time, no allocation
  if (type == DType::q4_0 || type == DType::q8_0) {
    const int64_t u = row / 16; // its pair, or the odd last group
    const int H = 2 * u + 1 < N / 8 ? 2 : 1;
    const int qs = type == DType::q4_0 ? 16 : 32;
    const uint8_t* g = wp + static_cast<size_t>(2 * u) * group_bytes(type, K);
    for (int64_t b0 = 0; b0 < K / 32; b0 += 16) {
      const int64_t n = std::min<int64_t>(16, K / 32 - b0);
      unpack_row_b32(g + static_cast<size_t>(b0 * H) * static_cast<size_t>(16 + 8 * qs), n,
                     static_cast<int>(row % 16), qs, H, blocks);
      dequantize(isa, type, blocks, y + 32 * b0, 32 * n);
    }
  } else {
    const uint8_t* g = wp + static_cast<size_t>(row / 8) * group_bytes(type, K);
    const int r = static_cast<int>(row % 8);
    for (int64_t i0 = 0; i0 < K / 256; i0 += 16) {
      const int64_t n = std::min<int64_t>(16, K / 256 - i0);
      if (type == DType::q4_k)
        unpack_row_q4_kx8(g + static_cast<size_t>(i0) * k_q4kx8_block, n, r, blocks);
      else
        unpack_row_q6_kx8(g + static_cast<size_t>(i0) * k_q6kx8_block, n, r, blocks);
      dequantize(isa, type, blocks, y + 256 * i0, 256 * n);
    }
  }
}

namespace {
// Inside a parallel region: this thread's share [u0, u1) of `units` units of P items each, as P runs
// read side by side (P sequential weight streams instead of one): fn(idx) for every i < u1 − u0, with
// idx[h] = P·u0 + h·(u1 − u0) + i, so the thread covers items [P·u0, P·u1) exactly once.
template <int P, class Fn> void runs_side_by_side(int64_t units, Fn&& fn) {
  const int nt = omp_get_num_threads(), id = omp_get_thread_num();
  const int64_t u0 = units * id / nt, u1 = units * (id + 1) / nt, run = u1 - u0;
  for (int64_t i = 0; i < run; ++i) {
    int64_t idx[P];
    for (int h = 0; h < P; ++h)
      idx[h] = P * u0 + h * run + i;
    fn(idx);
  }
}

// Inside a parallel region: this thread's share of y = W·x for one token and one repacked matrix, with
// no barrier (the matrices of gemv_repacked_multi follow each other without waiting). xq / xqk: the token
// quantized in blocks of 32 (q4_0 / q8_0) or 256 (k-quants).
void gemv_share_repacked(Isa isa, const Gemv& m, int64_t K, const BlockQ8* xq, const BlockQ8K* xqk) {
  const DType type = m.type;
  const bool kquant = type == DType::q4_k || type == DType::q6_k;
  const int64_t nb = kquant ? K / 256 : K / 32, N = m.N;
  const size_t gb = group_bytes(type, K);
  const bool avx2 = at_least(isa, Isa::avx2);
  const int nt = omp_get_num_threads(), id = omp_get_thread_num();
  constexpr int P = 4;
  if (!kquant) { // Q4_0 / Q8_0: pairs of groups (16 rows) and an odd last group
    const int64_t pairs = N / 16;
    int64_t u_from = 0;         // units (pairs, then the odd group) before it are done
    if (int8_gemm(isa, type)) { // P runs of pairs per thread, P streams
      const int64_t units = pairs / P;
      runs_side_by_side<P>(units, [&](const int64_t(&pr)[P]) {
        const uint8_t* g[P];
        float* yo[P];
        for (int h = 0; h < P; ++h) {
          g[h] = m.w + static_cast<size_t>(2 * pr[h]) * gb;
          yo[h] = m.y + 16 * pr[h];
        }
        if (type == DType::q4_0)
          gemv_pairs_vnni<true, P>(g, xq, nb, yo);
        else
          gemv_pairs_vnni<false, P>(g, xq, nb, yo);
      });
      for (int64_t pr = P * units + id; pr < pairs; pr += nt) { // the last pairs, fewer than P per thread
        const uint8_t* g[1] = {m.w + static_cast<size_t>(2 * pr) * gb};
        float* yo[1] = {m.y + 16 * pr};
        if (type == DType::q4_0)
          gemv_pairs_vnni<true, 1>(g, xq, nb, yo);
        else
          gemv_pairs_vnni<false, 1>(g, xq, nb, yo);
      }
      u_from = pairs;
    }
    // The rest a unit at a time, split in contiguous runs (one stream each) over the threads.
    const int64_t n_units = (N / 8 + 1) / 2, rest = n_units - u_from;
    for (int64_t u = u_from + rest * id / nt; u < u_from + rest * (id + 1) / nt; ++u) {
      const uint8_t* wg = m.w + static_cast<size_t>(2 * u) * gb;
      float* out = m.y + 16 * u;
      const bool pair = u < pairs;
      if (type == DType::q4_0)
        (avx2 ? (pair ? gemv_q4_0x8_avx2<2> : gemv_q4_0x8_avx2<1>)
              : (pair ? gemv_q4_0x8_scalar<2> : gemv_q4_0x8_scalar<1>))(wg, xq, nb, out);
      else
        (avx2 ? (pair ? gemv_q8_0x8_avx2<2> : gemv_q8_0x8_avx2<1>)
              : (pair ? gemv_q8_0x8_scalar<2> : gemv_q8_0x8_scalar<1>))(wg, xq, nb, out);
    }
    return;
  }
  int64_t g_from = 0; // groups before it are done
  if (avx2) {         // P runs of 8-row groups per thread, read side by side
    // (the k-quants' VNNI kernel loses to this one for a single token: unpacking and per-sub-block
    // scaling cost more than its shared weight loads save)
    const int64_t groups = N / 8, units = groups / P;
    runs_side_by_side<P>(units, [&](const int64_t(&g)[P]) {
      const uint8_t* gs[P];
      float* outs[P];
      for (int h = 0; h < P; ++h) {
        gs[h] = m.w + static_cast<size_t>(g[h]) * gb;
        outs[h] = m.y + 8 * g[h];
      }
      if (type == DType::q4_k)
        gemv_q4_kx8_avx2_p<P>(gs, xqk, nb, outs);
      else
        gemv_q6_kx8_avx2_p<P>(gs, xqk, nb, outs);
    });
    g_from = P * units;
  }
  // The rest one group at a time: split in contiguous runs (one stream each) over the threads.
  const int64_t rest = N / 8 - g_from;
  for (int64_t g = g_from + rest * id / nt; g < g_from + rest * (id + 1) / nt; ++g) {
    const uint8_t* wg = m.w + static_cast<size_t>(g) * gb;
    float* out = m.y + 8 * g;
    if (type == DType::q4_k)
      (avx2 ? gemv_q4_kx8_avx2 : gemv_q4_kx8_scalar)(wg, xqk, nb, out);
    else
      (avx2 ? gemv_q6_kx8_avx2 : gemv_q6_kx8_scalar)(wg, xqk, nb, out);
  }
}

// Q4_1 / Q5_0 / Q5_1 / IQ4_NL rows on the int8 route: this thread's contiguous run of 4-row blocks, as
// matmul_i8dq() splits them (so the same floats).
void gemv_share_i8dq(const Gemv& m, int64_t K, const BlockQ8* xq) {
  const int nt = omp_get_num_threads(), id = omp_get_thread_num();
  const int64_t n_blk = (m.N + 3) / 4;
  const int64_t j0 = std::min(m.N, 4 * (n_blk * id / nt)), j1 = std::min(m.N, 4 * (n_blk * (id + 1) / nt));
  i8dq_rows(m.type, m.w, m.row_bytes, xq, K / 32, j0, j1, m.y);
}

// The same for F32 / F16 / BF16 rows (AVX2 and up): this thread's contiguous run of 4-row blocks, as
// matmul() computes them for one token.
void gemv_share_plain(Isa isa, const Gemv& m, int64_t K, const float* x) {
  const int nt = omp_get_num_threads(), id = omp_get_thread_num();
  const int64_t n_blk = (m.N + 3) / 4;
  for (int64_t jb = n_blk * id / nt; jb < n_blk * (id + 1) / nt; ++jb) {
    const int64_t j = jb * 4;
    const uint8_t* wr = m.w + static_cast<size_t>(j) * m.row_bytes;
    if (j + 4 > m.N) {
      for (int64_t r = j; r < m.N; ++r) {
        const uint8_t* w1 = m.w + static_cast<size_t>(r) * m.row_bytes;
        m.y[r] = m.type == DType::f32   ? dot_f32_avx2(w1, x, K)
                 : m.type == DType::f16 ? dot_f16_avx2(w1, x, K)
                                        : dot_bf16_avx2(w1, x, K);
      }
      continue;
    }
    rows4_plain(isa, m.type, wr, m.row_bytes, x, K, m.y + j);
  }
}

} // namespace

bool gemv_multi_supports(Isa isa, DType type, bool repacked) noexcept {
  if (repacked && type == DType::bf16) return at_least(isa, Isa::avx512_bf16);
  if (repacked && type == DType::f16) return at_least(isa, Isa::avx512);
  if (repacked)
    return type == DType::q8_0 || type == DType::q4_0 || type == DType::q4_k || type == DType::q6_k;
  return at_least(isa, Isa::avx2) &&
         (type == DType::f32 || type == DType::f16 || type == DType::bf16 || dq_supports(isa, type));
}

void gemv_multi(Isa isa, const Gemv* mats, int n_mats, int64_t K, const float* x, int n_threads) {
  bool blocks32 = false, blocks256 = false, bf16 = false;
  int64_t work = 0;
  for (int i = 0; i < n_mats; ++i) {
    if (mats[i].i8 ? !i8dq_supports(isa, mats[i].type) || K % 32 != 0
                   : !gemv_multi_supports(isa, mats[i].type, mats[i].row_bytes == 0))
      std::abort(); // a caller's bug
    if (mats[i].i8) blocks32 = true;
    const bool kquant = mats[i].type == DType::q4_k || mats[i].type == DType::q6_k;
    if (mats[i].row_bytes == 0 && mats[i].type != DType::f16)
      (mats[i].type == DType::bf16 ? bf16 : kquant ? blocks256 : blocks32) = true;
    work += mats[i].N * K;
  }
  std::vector<uint16_t> xb(bf16 ? static_cast<size_t>(K) : 0);
  if (bf16) to_bf16(isa, x, xb.data(), K);
  // The token quantized on this thread (a few µs at most): a parallel loop over one row has nothing to share.
  std::vector<BlockQ8> xq(blocks32 ? static_cast<size_t>(K / 32) : 0);
  std::vector<BlockQ8K> xqk(blocks256 ? static_cast<size_t>(K / 256) : 0);
  if (blocks32) quantize_rows(isa, x, K, 1, xq.data(), 1);
  if (blocks256) quantize_rows_k(isa, x, K, 1, xqk.data(), 1);
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
#pragma omp parallel num_threads(threads) if (work > 32768)
  for (int i = 0; i < n_mats; ++i) {
    if (mats[i].row_bytes == 0 && mats[i].type == DType::bf16)
      gemv_share_bf16x64(reinterpret_cast<const uint16_t*>(mats[i].w), K, mats[i].N, xb.data(), mats[i].y);
    else if (mats[i].row_bytes == 0 && mats[i].type == DType::f16)
      gemv_share_f16x64(reinterpret_cast<const uint16_t*>(mats[i].w), K, mats[i].N, x, mats[i].y);
    else if (mats[i].row_bytes == 0)
      gemv_share_repacked(isa, mats[i], K, xq.data(), xqk.data());
    else if (mats[i].i8)
      gemv_share_i8dq(mats[i], K, xq.data());
    else if (mats[i].type != DType::f32 && mats[i].type != DType::f16 && mats[i].type != DType::bf16)
      gemv_share_dq(mats[i].type, mats[i].w, mats[i].row_bytes, K, mats[i].N, x, mats[i].y);
    else
      gemv_share_plain(isa, mats[i], K, x);
  }
}

void matmul_repacked(Isa isa, DType type, const uint8_t* wp, int64_t K, int64_t N, const float* x, int64_t T,
                     float* y, int n_threads) {
  if (T == 1) { // decode
    const Gemv m{type, wp, 0, N, y};
    gemv_multi(isa, &m, 1, K, x, n_threads);
    return;
  }
  const size_t gb = group_bytes(type, K);
  const bool kquant = type == DType::q4_k || type == DType::q6_k;
  const int64_t nb = kquant ? K / 256 : K / 32;
  std::vector<BlockQ8> xq;
  std::vector<BlockQ8K> xqk;
  const bool avx2 = at_least(isa, Isa::avx2);
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
  if (!kquant) {
    xq.resize(static_cast<size_t>(T * nb));
    quantize_rows(isa, x, K, T, xq.data(), threads);
  } else {
    xqk.resize(static_cast<size_t>(T * nb));
    quantize_rows_k(isa, x, K, T, xqk.data(), threads);
  }
  int64_t g_from = 0;         // groups before it are done
  if (int8_gemm(isa, type)) { // 16 rows against ≤ 16 tokens
    const int64_t pairs = N / 16;
    const bool amx = at_least(isa, Isa::amx);
    // Blocked for the caches: a chunk of row pairs (≈ 128 KiB of weights, kept in L2) against each tile
    // of 16 tokens in turn (their activations stay in L1 across the chunk's pairs).
    // The chunks are a multiple of the threads in number and equal to a pair, so the threads' shares
    // are too (3 chunks of 7 pairs for 2 threads left one waiting a third of a k/v projection).
    const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>((128u << 10) / (2 * gb)));
    const int64_t per_thread = (pairs + threads - 1) / threads;
    const int64_t n_chunks = std::min<int64_t>(pairs, threads * ((per_thread + chunk - 1) / chunk));
    const auto tb = [&](int64_t t) { return static_cast<size_t>(t) * static_cast<size_t>(nb); };
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K * T > 32768)
    for (int64_t c = 0; c < n_chunks; ++c)
      for (int64_t t0 = 0; t0 < T; t0 += 16)
        for (int64_t gp = pairs * c / n_chunks; gp < pairs * (c + 1) / n_chunks; ++gp) {
          const uint8_t* g0 = wp + static_cast<size_t>(2 * gp) * gb;
          const uint8_t* g1 = g0 + gb; // (the k-quants' groups; Q4_0 / Q8_0 pairs start at g0)
          const int64_t tt = std::min<int64_t>(16, T - t0);
          float* yt = y + t0 * N + 16 * gp;
          if (amx && tt >= k_amx_min_tokens && type == DType::q4_0)
            gemm_x16_amx<true>(g0, xq.data() + tb(t0), nb, static_cast<int>(tt), yt, N);
          else if (amx && tt >= k_amx_min_tokens && type == DType::q8_0)
            gemm_x16_amx<false>(g0, xq.data() + tb(t0), nb, static_cast<int>(tt), yt, N);
          else if (type == DType::q4_0)
            gemm_x16_tokens<true>(g0, xq.data() + tb(t0), nb, tt, yt, N);
          else if (type == DType::q8_0)
            gemm_x16_tokens<false>(g0, xq.data() + tb(t0), nb, tt, yt, N);
          else {
            const BlockQ8K* xk = xqk.data() + tb(t0);
            const auto at = [&](int64_t t) { return xk + tb(t); };
            if (type == DType::q4_k)
              tiles_of_tokens(
                  tt, [&](int64_t t) { gemm_q4_k_x16_vnni<16>(g0, g1, at(t), nb, yt + t * N, N); },
                  [&](int64_t t) { gemm_q4_k_x16_vnni<8>(g0, g1, at(t), nb, yt + t * N, N); },
                  [&](int64_t t) { gemm_q4_k_x16_vnni<4>(g0, g1, at(t), nb, yt + t * N, N); },
                  [&](int64_t t) { gemm_q4_k_x16_vnni<2>(g0, g1, at(t), nb, yt + t * N, N); },
                  [&](int64_t t) { gemm_q4_k_x16_vnni<1>(g0, g1, at(t), nb, yt + t * N, N); });
            else
              tiles_of_tokens(
                  tt, [&](int64_t t) { gemm_q6_k_x16_vnni<16>(g0, g1, at(t), nb, yt + t * N, N); },
                  [&](int64_t t) { gemm_q6_k_x16_vnni<8>(g0, g1, at(t), nb, yt + t * N, N); },
                  [&](int64_t t) { gemm_q6_k_x16_vnni<4>(g0, g1, at(t), nb, yt + t * N, N); },
                  [&](int64_t t) { gemm_q6_k_x16_vnni<2>(g0, g1, at(t), nb, yt + t * N, N); },
                  [&](int64_t t) { gemm_q6_k_x16_vnni<1>(g0, g1, at(t), nb, yt + t * N, N); });
          }
        }
    g_from = 2 * pairs; // an odd last group: the AVX2 kernel below
  }
  if (g_from == N / 8) return;
  if (!kquant) { // pairs (16 rows) and an odd last group, a unit's weights kept in cache across the tokens
    const int64_t pairs = N / 16;
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K * T > 32768)
    for (int64_t u = g_from / 2; u < (N / 8 + 1) / 2; ++u)
      for (int64_t t = 0; t < T; ++t) {
        const uint8_t* wg = wp + static_cast<size_t>(2 * u) * gb;
        const bool pair = u < pairs;
        float out[16];
        if (type == DType::q4_0)
          (avx2 ? (pair ? gemv_q4_0x8_avx2<2> : gemv_q4_0x8_avx2<1>)
                : (pair ? gemv_q4_0x8_scalar<2> : gemv_q4_0x8_scalar<1>))(wg, xq.data() + t * nb, nb, out);
        else
          (avx2 ? (pair ? gemv_q8_0x8_avx2<2> : gemv_q8_0x8_avx2<1>)
                : (pair ? gemv_q8_0x8_scalar<2> : gemv_q8_0x8_scalar<1>))(wg, xq.data() + t * nb, nb, out);
        std::memcpy(y + t * N + 16 * u, out, (pair ? 16 : 8) * sizeof(float));
      }
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K * T > 32768)
  for (int64_t g = g_from; g < N / 8; ++g)
    for (int64_t t = 0; t < T; ++t) { // a group's weights stay in cache across the tokens
      const uint8_t* wg = wp + static_cast<size_t>(g) * gb;
      float out[8];
      if (type == DType::q4_k)
        (avx2 ? gemv_q4_kx8_avx2 : gemv_q4_kx8_scalar)(wg, xqk.data() + t * nb, nb, out);
      else
        (avx2 ? gemv_q6_kx8_avx2 : gemv_q6_kx8_scalar)(wg, xqk.data() + t * nb, nb, out);
      std::memcpy(y + t * N + 8 * g, out, sizeof out);
    }
}

bool int8_gemm(Isa isa, DType type) noexcept {
  return at_least(isa, Isa::avx512_vnni) &&
         (type == DType::q8_0 || type == DType::q4_0 || type == DType::q4_k || type == DType::q6_k);
}

bool i8dq_supports(Isa isa, DType type) noexcept {
  return at_least(isa, Isa::avx2) &&
         (type == DType::q4_1 || type == DType::q5_0 || type == DType::q5_1 || type == DType::iq4_nl);
}

void matmul_i8dq(Isa isa, DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N,
                 const float* x, int64_t T, float* y, int n_threads) {
  if (!i8dq_supports(isa, type) || K % 32 != 0) std::abort(); // callers check; reaching here is a bug
  const int64_t nb = K / 32;
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
  std::vector<BlockQ8> xq(static_cast<size_t>(T * nb));
  quantize_rows(isa, x, K, T, xq.data(), threads);
#pragma omp parallel num_threads(threads) if (N * K * T > 32768)
  {
    // contiguous runs of 4-row blocks per thread, as gemv_share_i8dq splits them
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t n_blk = (N + 3) / 4;
    const int64_t j0 = std::min(N, 4 * (n_blk * id / nt)), j1 = std::min(N, 4 * (n_blk * (id + 1) / nt));
    for (int64_t t = 0; t < T; ++t)
      i8dq_rows(type, w, row_bytes, xq.data() + t * nb, nb, j0, j1, y + t * N);
  }
}

bool has_kernel(DType t) noexcept {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::q8_0 || t == DType::q4_0 ||
         t == DType::q4_k || t == DType::q6_k;
}

void matmul(Isa isa, DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, const float* x,
            int64_t T, float* y, int n_threads) {
  if (!has_kernel(type)) std::abort(); // callers check has_kernel(); reaching here is a bug
  const bool kquant = type == DType::q4_k || type == DType::q6_k;
  const bool integer = type == DType::q8_0 || type == DType::q4_0 || kquant;
  const int64_t nb = K / 32, nsb = K / 256;
  std::vector<BlockQ8> xq;   // q8_0 / q4_0 activations: blocks of 32
  std::vector<BlockQ8K> xqk; // k-quant activations: blocks of 256
  const bool avx2 = at_least(isa, Isa::avx2);
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
  if (kquant) { // activations quantized once per call, shared by every weight row
    xqk.resize(static_cast<size_t>(T * nsb));
    quantize_rows_k(isa, x, K, T, xqk.data(), threads);
  } else if (integer) {
    xq.resize(static_cast<size_t>(T * nb));
    quantize_rows(isa, x, K, T, xq.data(), threads);
  }
  // One row against one token.
  const auto one = [&](const uint8_t* wr, int64_t t) -> float {
    const float* xr = x + t * K;
    const BlockQ8* xb = integer && !kquant ? xq.data() + t * nb : nullptr;
    const BlockQ8K* xk = kquant ? xqk.data() + t * nsb : nullptr;
    switch (type) {
    case DType::f32:
      return avx2 ? dot_f32_avx2(wr, xr, K) : dot_f32_scalar(wr, xr, K);
    case DType::f16:
      return avx2 ? dot_f16_avx2(wr, xr, K) : dot_f16_scalar(wr, xr, K);
    case DType::bf16:
      return avx2 ? dot_bf16_avx2(wr, xr, K) : dot_bf16_scalar(wr, xr, K);
    case DType::q8_0:
      return avx2 ? dot_q8_0_avx2(wr, xb, nb) : dot_q8_0_scalar(wr, xb, nb);
    case DType::q4_0:
      return avx2 ? dot_q4_0_avx2(wr, xb, nb) : dot_q4_0_scalar(wr, xb, nb);
    case DType::q4_k:
      return avx2 ? dot_q4_k_avx2(wr, xk, nsb) : dot_q4_k_scalar(wr, xk, nsb);
    case DType::q6_k:
      return avx2 ? dot_q6_k_avx2(wr, xk, nsb) : dot_q6_k_scalar(wr, xk, nsb);
    default:
      return NAN; // unreachable: matmul() rejects types without a kernel before the loop
    }
  };
  const bool plain = type == DType::f32 || type == DType::f16 || type == DType::bf16;
  if (avx2 && plain && T >= 2) { // a small batch: four rows against two tokens per weight load
    const int64_t n_blk = (N + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K * T > 32768)
    for (int64_t jb = 0; jb < n_blk; ++jb) {
      const int64_t j = jb * 4;
      const uint8_t* wr = w + static_cast<size_t>(j) * row_bytes;
      if (j + 4 > N) {
        for (int64_t r = j; r < N; ++r)
          for (int64_t t = 0; t < T; ++t)
            y[t * N + r] = one(w + static_cast<size_t>(r) * row_bytes, t);
        continue;
      }
      int64_t t = 0;
      for (; t + 2 <= T; t += 2) {
        float out[8];
        if (type == DType::f32)
          rows4x2_avx2<DType::f32>(wr, row_bytes, x + t * K, K, out);
        else if (type == DType::f16)
          rows4x2_avx2<DType::f16>(wr, row_bytes, x + t * K, K, out);
        else
          rows4x2_avx2<DType::bf16>(wr, row_bytes, x + t * K, K, out);
        std::memcpy(y + t * N + j, out, 4 * sizeof(float));
        std::memcpy(y + (t + 1) * N + j, out + 4, 4 * sizeof(float));
      }
      if (t < T) {
        float out[4];
        if (type == DType::f32)
          rows4_f32_avx2(wr, row_bytes, x + t * K, K, out);
        else if (type == DType::f16)
          rows4_half_avx2<DType::f16>(wr, row_bytes, x + t * K, K, out);
        else
          rows4_half_avx2<DType::bf16>(wr, row_bytes, x + t * K, K, out);
        std::memcpy(y + t * N + j, out, sizeof out);
      }
    }
    return;
  }
  if (avx2 && T < 4) { // decode: four rows at a time, one token at a time
    const int64_t n_blk = (N + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K * T > 32768)
    for (int64_t jb = 0; jb < n_blk; ++jb) {
      const int64_t j = jb * 4;
      const uint8_t* wr = w + static_cast<size_t>(j) * row_bytes;
      for (int64_t t = 0; t < T; ++t) {
        if (j + 4 > N) {
          for (int64_t r = j; r < N; ++r)
            y[t * N + r] = one(w + static_cast<size_t>(r) * row_bytes, t);
          continue;
        }
        float out[4];
        if (type == DType::f32 || type == DType::f16 || type == DType::bf16)
          rows4_plain(isa, type, wr, row_bytes, x + t * K, K, out);
        else if (type == DType::q4_k)
          rows4_k_avx2<DType::q4_k>(wr, row_bytes, xqk.data() + t * nsb, nsb, out);
        else if (type == DType::q6_k)
          rows4_k_avx2<DType::q6_k>(wr, row_bytes, xqk.data() + t * nsb, nsb, out);
        else if (type == DType::q8_0)
          rows4_q_avx2<DType::q8_0>(wr, row_bytes, xq.data() + t * nb, nb, out);
        else
          rows4_q_avx2<DType::q4_0>(wr, row_bytes, xq.data() + t * nb, nb, out);
        std::memcpy(y + t * N + j, out, sizeof out);
      }
    }
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K * T > 32768)
  for (int64_t j = 0; j < N; ++j) {
    const uint8_t* wr = w + static_cast<size_t>(j) * row_bytes;
    int64_t t0 = 0;
    if (avx2 && type != DType::bf16 && !kquant)
      for (; t0 + 4 <= T; t0 += 4) { // prefill below the GEMM threshold: four tokens per weight load
        float out[4];
        switch (type) {
        case DType::f32:
          dot4_f32_avx2(wr, x + t0 * K, K, out);
          break;
        case DType::f16:
          dot4_f16_avx2(wr, x + t0 * K, K, out);
          break;
        default:
          dot4_q_avx2(type, wr, xq.data() + t0 * nb, nb, out);
          break;
        }
        for (int u = 0; u < 4; ++u)
          y[(t0 + u) * N + j] = out[u];
      }
    for (int64_t t = t0; t < T; ++t)
      y[t * N + j] = one(wr, t);
  }
}

namespace {
__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16"))) void
to_bf16_avx512(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(y + i, reinterpret_cast<const __m512i&>(h));
  }
  for (; i < n; ++i)
    y[i] = fp32_to_bf16(x[i]);
}
} // namespace

void to_bf16(Isa isa, const float* x, uint16_t* y, int64_t n) {
  if (at_least(isa, Isa::avx512_bf16)) return to_bf16_avx512(x, y, n);
  for (int64_t i = 0; i < n; ++i)
    y[i] = fp32_to_bf16(x[i]);
}

} // namespace loom::cpu
