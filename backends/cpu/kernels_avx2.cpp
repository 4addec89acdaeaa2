// The cpu backend's AVX2 + FMA + F16C kernels (and the int8 route of Q4_1, Q5_0, Q5_1, IQ4_NL).
#include "kernels_internal.hpp"

#include <cstring>
#include <immintrin.h>

namespace loom::cpu {

// ---- AVX2 + FMA + F16C ----

// The same code compiled for AVX2 and AVX-512 (the compiler vectorizes it; the values are the same).
__attribute__((target("avx2,fma,f16c"))) void quantize_x_avx2(const float* x, int64_t K, BlockQ8* out) {
  quantize_x(x, K, out);
}

namespace {

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

} // namespace

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

namespace {

// Σ a·b over 32 int8 pairs as 8 int32 lanes (|a|, |b| ≤ 128: the i16 pair sums cannot overflow).
LOOM_AVX2 inline __m256i dot_i8(__m256i a, __m256i b) {
  const __m256i ax = _mm256_sign_epi8(a, a);
  const __m256i sb = _mm256_sign_epi8(b, a);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sb), _mm256_set1_epi16(1));
}

} // namespace

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

namespace {

LOOM_AVX2 inline float hsum128(__m128 v) {
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

// Q4_K's and Q5_K's 8 six-bit scales (see q4_k_scale_min) as int16 in both halves of `scales`, and the mins'
// part, dmin · x.d · Σ_j m_j · (bsum_2j + bsum_2j+1), into accm.
LOOM_AVX2 inline void k4_scales_mins(const uint8_t* blk, const BlockQ8K& xs, __m256i& scales, __m128& accm) {
  uint32_t u[3];
  std::memcpy(u, blk + 4, 12);
  const uint32_t sc_lo = u[0] & 0x3f3f3f3fu, m_lo = u[1] & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u);
  const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u);
  const __m128i sm = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(m_hi), static_cast<int>(m_lo)));
  const __m128i sc8 =
      _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(sc_hi), static_cast<int>(sc_lo)));
  scales = _mm256_set_m128i(sc8, sc8);
  // pairs of 16-sums to 32-sums, then madd with the mins
  const __m128i bs0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xs.bsums));
  const __m128i bs1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(xs.bsums + 8));
  const __m128i bs32 =
      _mm_packs_epi32(_mm_madd_epi16(bs0, _mm_set1_epi16(1)), _mm_madd_epi16(bs1, _mm_set1_epi16(1)));
  accm = _mm_fmadd_ps(_mm_set1_ps(f16c(blk + 2) * xs.d), _mm_cvtepi32_ps(_mm_madd_epi16(sm, bs32)), accm);
}

// Q4_K's / Q5_K's sub-blocks 2j (lo) and 2j + 1 (hi) as unsigned bytes against the token's 64 values there,
// each pair sum times its sub-block's int16 scale (`scales`: k4_scales_mins): the int32 sums in 8 lanes.
LOOM_AVX2 inline __m256i k4_pair_sums(__m256i lo, __m256i hi, const BlockQ8K& xs, __m256i scales, int j) {
  const __m256i p0 =
      _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs.qs + 64 * j)));
  const __m256i p1 =
      _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs.qs + 64 * j + 32)));
  // broadcast int16 scales 2j and 2j+1 (bytes 4j..4j+3 of `scales`)
  const __m256i s0 =
      _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<short>((4 * j + 1) << 8 | 4 * j)));
  const __m256i s1 =
      _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<short>((4 * j + 3) << 8 | (4 * j + 2))));
  return _mm256_add_epi32(_mm256_madd_epi16(p0, s0), _mm256_madd_epi16(p1, s1));
}

// One Q4_K super-block (144 bytes) against its BlockQ8K: the scaled nibble sums into acc, the
// mins' part into accm (subtracted at the end). Integers throughout the super-block: the scales are
// 6-bit integers, so each sub-block's maddubs sums are multiplied by its scale in madd, and one
// float conversion per super-block remains.
LOOM_AVX2 inline void q4_k_superblock_avx2(const uint8_t* blk, const BlockQ8K& xs, __m256& acc,
                                           __m128& accm) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  __m256i scales;
  k4_scales_mins(blk, xs, scales, accm);
  const float xd = xs.d;
  __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * j));
    const __m256i lo = _mm256_and_si256(q, mask), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
    sumi = _mm256_add_epi32(sumi, k4_pair_sums(lo, hi, xs, scales, j));
  }
  acc = _mm256_fmadd_ps(_mm256_set1_ps(f16c(blk) * xd), _mm256_cvtepi32_ps(sumi), acc);
}

} // namespace

LOOM_AVX2 float dot_q4_k_avx2(const uint8_t* w, const BlockQ8K* x, int64_t nsb) {
  __m256 acc = _mm256_setzero_ps();
  __m128 accm = _mm_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i, w += 144) {
    _mm_prefetch(reinterpret_cast<const char*>(w + 4 * 144), _MM_HINT_T0);
    q4_k_superblock_avx2(w, x[i], acc, accm);
  }
  return hsum(acc) - hsum128(accm);
}

namespace {

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

} // namespace

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

// Four weight rows, rb bytes apart, against one token (decode): four independent streams from memory and
// four accumulators, so neither the loads nor the FMA latency serialize.
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

namespace {

// Eight 16-bit floats (f16 or bf16) to f32.
template <DType type> LOOM_AVX2 inline __m256 half8(__m128i h) {
  if constexpr (type == DType::f16)
    return _mm256_cvtph_ps(h);
  else
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

} // namespace

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

namespace {

template <DType type> LOOM_AVX2 inline __m256 wload8(const uint8_t* row, int64_t k) {
  if constexpr (type == DType::f32)
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  else
    return half8<type>(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k)));
}

} // namespace

// Four rows against two tokens (x: token 0, then token 1 at x + K): out[r], out[4 + r]. Eight
// independent accumulators and each weight vector loaded (and converted) once for both tokens, so
// a small batch (speculative verification, beams) costs about what one token does.
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

// ---- int8 products for Q4_1, Q5_0, Q5_1, IQ4_NL, and Q2_K, Q3_K, Q5_K, IQ4_XS, on their GGUF rows (the "dq"
// types' fast route) ----
// Blocks of 32 (Q4_1, Q5_0, Q5_1, IQ4_NL): each block's weights unpacked in registers to 32 small integers
// u (Q4_1: the nibbles 0..15; Q5_0 / Q5_1: nibble | high bit << 4, 0..31; IQ4_NL: the signed level
// k_iq4nl_values[nibble]) with w = d·u + c (c: Q4_1 / Q5_1 the block's min m, Q5_0 −16·d, IQ4_NL 0), times
// the token's 8-bit blocks of 32: Σ w·x ≈ d·x.d·Σ u·q + c·x.d·Σ q, the second sum being the activations'
// own (s8 / 8). Super-blocks of 256 (Q2_K, Q3_K, Q5_K, IQ4_XS) against the token's 8-bit blocks of 256
// (BlockQ8K, as Q4_K / Q6_K): the sub-blocks' integer sums times their integer scales, added up in int32,
// one float step per super-block; mins and offsets from the activations' sums of 16 (bsums). maddubs' pair
// sums fit int16 (2 · 31 · 127 < 2^15; the IQ4 levels through dot_i8's sign trick, |u| ≤ 127).

namespace {

template <DType type> constexpr size_t i8dq_block_bytes() {
  return type == DType::q4_1 ? 20 : type == DType::q5_0 ? 22 : type == DType::q5_1 ? 24 : 18;
}

// The IQ4 levels of 16 bytes of nibbles (low: values 0..15, high: 16..31) as 32 signed bytes.
LOOM_AVX2 inline __m256i iq4_levels(const uint8_t* qs) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i lut = _mm_loadu_si128(reinterpret_cast<const __m128i*>(dtype_detail::k_iq4nl_values));
  return _mm256_set_m128i(_mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), mask)),
                          _mm_shuffle_epi8(lut, _mm_and_si128(q, mask)));
}

// Block `blk` against the token's block xq: the int32 sums Σ u·q in 8 lanes; d and c as above.
template <DType type>
LOOM_AVX2 inline __m256i i8dq_block(const uint8_t* blk, __m256i xq, float& d, float& c) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  d = f16c(blk);
  if constexpr (type == DType::iq4_nl) {
    c = 0.0f;
    return dot_i8(iq4_levels(blk + 2), xq);
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

template <DType type> constexpr size_t i8dq_superblock_bytes() {
  return type == DType::q2_k ? 84 : type == DType::q3_k ? 110 : type == DType::q5_k ? 176 : 136;
}

// The int16 scales of groups 2k (low lane) and 2k + 1 (high lane) from `half`: 8 int16 scales in both lanes
// (groups 8n .. 8n + 7, k < 4 within them).
LOOM_AVX2 inline __m256i pair_scales(__m256i half, int k) {
  return _mm256_shuffle_epi8(
      half, _mm256_set_m128i(_mm_set1_epi16(static_cast<short>((4 * k + 3) << 8 | (4 * k + 2))),
                             _mm_set1_epi16(static_cast<short>((4 * k + 1) << 8 | 4 * k))));
}

// Q2_K's and Q3_K's 16 values of 2 (3) bits of sub-block k (32 values: groups 2k, 2k + 1) times the token's
// 32 values there, times each group's int16 scale (sc_half[k / 4]), added to sumi.
template <DType type>
LOOM_AVX2 inline void k2_sub(const uint8_t* qs, const uint8_t* hm, const BlockQ8K& xs, const __m256i* sc_half,
                             int k, __m256i& sumi) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (k / 4)));
  __m256i a = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * (k % 4))), _mm256_set1_epi8(3));
  if constexpr (type == DType::q3_k) { // the hmask bit k of each value, as 4
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hm));
    a = _mm256_or_si256(
        a, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(k)), _mm256_set1_epi8(1)),
                             2));
  }
  const __m256i p =
      _mm256_maddubs_epi16(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs.qs + 32 * k)));
  sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, pair_scales(sc_half[k / 4], k % 4)));
}

// A Q5_K super-block's integer sum against its BlockQ8K (Q4_K's nibbles with a fifth bit from qh); its mins'
// part into accm, its step into d.
LOOM_AVX2 inline __m256i q5_k_sums(const uint8_t* u, const BlockQ8K& xs, __m128& accm, float& d) {
  __m256i scales, sumi = _mm256_setzero_si256();
  k4_scales_mins(u, xs, scales, accm);
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + 16));
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u + 48 + 32 * j));
    const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j)), one);
    const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j + 1)), one);
    const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(h0, 4));
    const __m256i hi =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), _mm256_slli_epi16(h1, 4));
    sumi = _mm256_add_epi32(sumi, k4_pair_sums(lo, hi, xs, scales, j));
  }
  d = f16c(u);
  return sumi;
}

// An IQ4_XS super-block's integer sum: sub-block k's signed levels times its scale ls − 32.
LOOM_AVX2 inline __m256i iq4_xs_sums(const uint8_t* u, const BlockQ8K& xs, float& d) {
  __m256i sumi = _mm256_setzero_si256();
  uint16_t sh;
  std::memcpy(&sh, u + 2, 2);
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    const int ls = ((u[4 + k / 2] >> (4 * (k % 2))) & 0xF) | (((sh >> (2 * k)) & 3) << 4);
    const __m256i a = iq4_levels(u + 8 + 16 * k);
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs.qs + 32 * k));
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(xq, a));
    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(static_cast<short>(ls - 32))));
  }
  d = f16c(u);
  return sumi;
}

// A Q2_K (scale & 15, min >> 4 per group of 16; the mins' part into accm) or Q3_K (scale − 32 per group,
// values − 4) super-block's integer sum.
template <DType type>
LOOM_AVX2 inline __m256i k2_sums(const uint8_t* u, const BlockQ8K& xs, __m128& accm, float& d) {
  __m256i sc16, sumi = _mm256_setzero_si256();
  const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs.bsums));
  if constexpr (type == DType::q2_k) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, _mm_set1_epi8(0x0F)));
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
    const __m256i mins = _mm256_madd_epi16(m16, bsums); // Σ_g m_g · bsum_g in 8 lanes
    accm = _mm_fmadd_ps(
        _mm_set1_ps(f16c(u + 82) * xs.d),
        _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(mins), _mm256_extracti128_si256(mins, 1))),
        accm);
    d = f16c(u + 80);
  } else { // the 16 scales + 32 from their 12 bytes (q3_k_scale's layout), four at a time
    uint32_t a, b, t, sc[4];
    std::memcpy(&a, u + 96, 4);
    std::memcpy(&b, u + 100, 4);
    std::memcpy(&t, u + 104, 4);
    sc[0] = (a & 0x0F0F0F0Fu) | ((t & 0x03030303u) << 4);
    sc[1] = (b & 0x0F0F0F0Fu) | (((t >> 2) & 0x03030303u) << 4);
    sc[2] = ((a >> 4) & 0x0F0F0F0Fu) | (((t >> 4) & 0x03030303u) << 4);
    sc[3] = ((b >> 4) & 0x0F0F0F0Fu) | (((t >> 6) & 0x03030303u) << 4);
    sc16 = _mm256_cvtepi8_epi16(
        _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)), _mm_set1_epi8(32)));
    sumi = _mm256_sub_epi32(sumi,
                            _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 2)); // −4 · Σ_g sc_g · bsum_g
    d = f16c(u + 108);
  }
  const __m256i sc_half[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),  // groups 0..7 in both lanes
                              _mm256_permute2x128_si256(sc16, sc16, 0x11)}; // groups 8..15
  const uint8_t* qs = u + (type == DType::q2_k ? 16 : 32);
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k)
    k2_sub<type>(qs, u, xs, sc_half, k, sumi);
  return sumi;
}

// One super-block against its BlockQ8K: d · x.d · (integer sum) into acc, the mins' part (Q2_K, Q5_K) into
// accm (subtracted at the end).
template <DType type>
LOOM_AVX2 inline void i8dq_superblock(const uint8_t* u, const BlockQ8K& xs, __m256& acc, __m128& accm) {
  float d;
  __m256i sumi;
  if constexpr (type == DType::q5_k)
    sumi = q5_k_sums(u, xs, accm, d);
  else if constexpr (type == DType::iq4_xs)
    sumi = iq4_xs_sums(u, xs, d);
  else
    sumi = k2_sums<type>(u, xs, accm, d);
  acc = _mm256_fmadd_ps(_mm256_set1_ps(d * xs.d), _mm256_cvtepi32_ps(sumi), acc);
}

// R rows of a super-block type against one token (decode), prefetching the next R rows.
template <DType type, int R>
LOOM_AVX2 void rows_i8dq_k_avx2(const uint8_t* w, size_t rb, const BlockQ8K* x, int64_t nsb, float* out) {
  constexpr size_t bs = i8dq_superblock_bytes<type>();
  __m256 acc[R];
  __m128 accm[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    accm[r] = _mm_setzero_ps();
  }
  for (int64_t i = 0; i < nsb; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = w + static_cast<size_t>(r) * rb + static_cast<size_t>(i) * bs;
      for (size_t c = 0; c < bs; c += 64) // the next R rows, same offset
        _mm_prefetch(reinterpret_cast<const char*>(blk + R * rb + c), _MM_HINT_T0);
      i8dq_superblock<type>(blk, x[i], acc[r], accm[r]);
    }
  for (int r = 0; r < R; ++r)
    out[r] = hsum(acc[r]) - hsum128(accm[r]);
}

} // namespace

// Rows [j0, j1) of one token's product (4 rows at a time, then one by one); x: BlockQ8 (blocks of 32) for
// Q4_1 / Q5_0 / Q5_1 / IQ4_NL, BlockQ8K for the super-block types (i8dq_superblocks).
LOOM_AVX2 void i8dq_rows(DType type, const uint8_t* w, size_t rb, const void* x, int64_t K, int64_t j0,
                         int64_t j1, float* y) {
  const auto run = [&](auto four, auto one, const auto* xs, int64_t n) {
    int64_t j = j0;
    for (; j + 4 <= j1; j += 4)
      four(w + static_cast<size_t>(j) * rb, rb, xs, n, y + j);
    for (; j < j1; ++j)
      one(w + static_cast<size_t>(j) * rb, rb, xs, n, y + j);
  };
  const auto* xb = static_cast<const BlockQ8*>(x);
  const auto* xk = static_cast<const BlockQ8K*>(x);
  const int64_t nb = K / 32, nsb = K / 256;
  switch (type) {
  case DType::q4_1:
    return run(rows_i8dq_avx2<DType::q4_1, 4>, rows_i8dq_avx2<DType::q4_1, 1>, xb, nb);
  case DType::q5_0:
    return run(rows_i8dq_avx2<DType::q5_0, 4>, rows_i8dq_avx2<DType::q5_0, 1>, xb, nb);
  case DType::q5_1:
    return run(rows_i8dq_avx2<DType::q5_1, 4>, rows_i8dq_avx2<DType::q5_1, 1>, xb, nb);
  case DType::q2_k:
    return run(rows_i8dq_k_avx2<DType::q2_k, 4>, rows_i8dq_k_avx2<DType::q2_k, 1>, xk, nsb);
  case DType::q3_k:
    return run(rows_i8dq_k_avx2<DType::q3_k, 4>, rows_i8dq_k_avx2<DType::q3_k, 1>, xk, nsb);
  case DType::q5_k:
    return run(rows_i8dq_k_avx2<DType::q5_k, 4>, rows_i8dq_k_avx2<DType::q5_k, 1>, xk, nsb);
  case DType::iq4_xs:
    return run(rows_i8dq_k_avx2<DType::iq4_xs, 4>, rows_i8dq_k_avx2<DType::iq4_xs, 1>, xk, nsb);
  default:
    return run(rows_i8dq_avx2<DType::iq4_nl, 4>, rows_i8dq_avx2<DType::iq4_nl, 1>, xb, nb);
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

namespace {

// A Q5_0 fifth-bit mask (q_hmask_at) as bytes: 16 in byte k where bit k is set.
LOOM_AVX2 inline __m256i bit4_bytes(const uint8_t* at) {
  uint32_t m;
  std::memcpy(&m, at, 4);
  const __m256i spread = _mm256_shuffle_epi8( // byte k gets the mask's byte k / 8
      _mm256_set1_epi32(static_cast<int>(m)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
                       3, 3, 3));
  const __m256i bits = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits), _mm256_set1_epi8(0x10));
}

} // namespace

// Q4_0, Q4_1, Q5_0, IQ4_NL: the nibbles (Q5_0: with their fifth bits, u = q + 16; IQ4_NL: their signed
// levels, looked up by pshufb, through dot_i8's sign trick) by maddubs against the token's bytes, then
// kernels_internal.hpp's float step of the type. Nibbles alone sum in int16 over a block (8 · 2 · 15 · 127 <
// 2¹⁵); Q5_0's u ≤ 31 and IQ4_NL's levels go to int32 a vector at a time.
template <DType Q, int H>
LOOM_AVX2 void gemv_q4x8_avx2(const uint8_t* g, const BlockQ8* x, int64_t nb, float* out) {
  constexpr size_t blk = H * b32_block_bytes(Q), head = b32_head(Q);
  const __m256i mask = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256i lut = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(dtype_detail::k_iq4nl_values)));
  __m256 acc[H];
  for (auto& a : acc)
    a = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b, g += blk) {
    for (size_t c = 0; c < blk; c += 64) // eight blocks ahead, every line
      _mm_prefetch(reinterpret_cast<const char*>(g + 8 * blk + c), _MM_HINT_T0);
    const auto* xw = reinterpret_cast<const int32_t*>(x[b].qs);
    for (int h = 0; h < H; ++h) {
      __m256i s16 = _mm256_setzero_si256(), s32 = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + q_vec_at(H, h, c, head)));
        __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
        if constexpr (Q == DType::q5_0) {
          lo = _mm256_or_si256(lo, bit4_bytes(g + q_hmask_at(Q, H, h, c, 0)));
          hi = _mm256_or_si256(hi, bit4_bytes(g + q_hmask_at(Q, H, h, c, 1)));
        }
        if constexpr (Q == DType::iq4_nl) {
          s32 = _mm256_add_epi32(
              s32, _mm256_add_epi32(dot_i8(_mm256_shuffle_epi8(lut, lo), _mm256_set1_epi32(xw[c])),
                                    dot_i8(_mm256_shuffle_epi8(lut, hi), _mm256_set1_epi32(xw[4 + c]))));
        } else {
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(xw[c])),
                                             _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xw[4 + c])));
          if constexpr (Q == DType::q5_0)
            s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(p, ones));
          else
            s16 = _mm256_add_epi16(s16, p);
        }
      }
      if constexpr (Q == DType::q4_0 || Q == DType::q4_1) s32 = _mm256_madd_epi16(s16, ones);
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + q_scale_at(h))));
      const __m256 d = _mm256_set1_ps(x[b].d), s = _mm256_cvtepi32_ps(s32);
      if constexpr (Q == DType::q4_1) {
        const __m256 mw =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + q_min_at(H, h))));
        acc[h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(0.125f * x[b].s8),
                                 _mm256_fmadd_ps(dw, _mm256_mul_ps(d, s), acc[h]));
      } else if constexpr (Q == DType::iq4_nl) {
        acc[h] = _mm256_fmadd_ps(dw, _mm256_mul_ps(d, s), acc[h]);
      } else {
        const float off = Q == DType::q5_0 ? 2.0f * x[b].s8 : x[b].s8; // 16 or 8 · d · Σq
        acc[h] = _mm256_fmadd_ps(dw, _mm256_fmsub_ps(d, s, _mm256_set1_ps(off)), acc[h]);
      }
    }
  }
  for (int h = 0; h < H; ++h)
    _mm256_storeu_ps(out + 8 * h, acc[h]);
}

namespace {

// pshufb indices putting byte b of each dword, zero-extended, in both int16 halves of that dword.
LOOM_AVX2 inline __m256i pick_byte_pairs(int b) {
  const __m256i base =
      _mm256_setr_epi8(0, -128, 0, -128, 4, -128, 4, -128, 8, -128, 8, -128, 12, -128, 12, -128, 0, -128, 0,
                       -128, 4, -128, 4, -128, 8, -128, 8, -128, 12, -128, 12, -128);
  return _mm256_add_epi8(base, _mm256_set1_epi16(static_cast<short>(b))); // 0x80 + b keeps bit 7: zero
}

} // namespace

namespace {
// Super-block i of a repacked group (`block` bytes each), the lines of the one four ahead prefetched.
LOOM_AVX2 inline const uint8_t* superblock_ahead(const uint8_t* g, int64_t i, size_t block) {
  g += static_cast<size_t>(i) * block;
  for (size_t c = 0; c < block; c += 64)
    _mm_prefetch(reinterpret_cast<const char*>(g + 4 * block + c), _MM_HINT_T0);
  return g;
}
// One 64-column chunk j of a q4_kx8 (Q5: q5_kx8) super-block against the token: q the chunk's 8 nibble
// vectors, f its two fifth-bit vectors (Q5), xw the token's 16 dwords there, sd0 / sd1 the rows' scales of
// its two sub-blocks: the scaled int32 sums of the 8 rows.
template <bool Q5>
LOOM_AVX2 inline __m256i k4x8_chunk(const uint8_t* q, const uint8_t* f, const int32_t* xw, __m256i sd0,
                                    __m256i sd1) {
  const __m256i mask = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
  __m256i f0 = _mm256_setzero_si256(), f1 = _mm256_setzero_si256();
  if constexpr (Q5) {
    f0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(f));
    f1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(f + 32));
  }
  __m256i sumi = _mm256_setzero_si256(), s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * c));
    __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    if constexpr (Q5) { // bit c of each byte to bit 4
      lo = _mm256_or_si256(
          lo, _mm256_and_si256(c < 4 ? _mm256_slli_epi16(f0, 4 - c) : _mm256_srli_epi16(f0, c - 4), b4));
      hi = _mm256_or_si256(
          hi, _mm256_and_si256(c < 4 ? _mm256_slli_epi16(f1, 4 - c) : _mm256_srli_epi16(f1, c - 4), b4));
    }
    s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xw[c])));
    s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xw[8 + c])));
    if (Q5 && c == 3) { // (values ≤ 31: four vectors' sums fill int16)
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(s0, sd0), _mm256_madd_epi16(s1, sd1)));
      s0 = s1 = _mm256_setzero_si256();
    }
  }
  return _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(s0, sd0), _mm256_madd_epi16(s1, sd1)));
}
} // namespace

// q4_kx8: one group of 8 rows against one token. Per 64-column chunk: 8 loads give the 8 rows'
// nibbles of two sub-blocks; broadcast 4-byte activation chunks into maddubs, 8 partial sums per
// sub-block in int16 (8 · 2 · 15 · 127 < 2^15), then one madd by the rows' scales (an int16 pair
// per row) leaves row r's scaled sum in lane r. The mins: one madd per pair of sub-blocks.
// q5_kx8 (Q5): the same with each nibble's fifth bit from the chunk's two fifth-bit vectors (bit c of a
// byte: vector c's), values ≤ 31, so the int16 sums go to int32 every 4 vectors (4 · 2 · 31 · 127 < 2^15).

template <int P, bool Q5>
LOOM_AVX2 void gemv_q4_kx8_avx2_p(const uint8_t* const* gs, const BlockQ8K* x, int64_t nsb,
                                  float* const* outs) {
  constexpr size_t block = Q5 ? k_q5kx8_block : k_q4kx8_block;
  const __m256i m6 = _mm256_set1_epi32(0x3f3f3f3f), m4 = _mm256_set1_epi32(0x0f0f0f0f),
                m2 = _mm256_set1_epi32(0x30303030), lo16 = _mm256_set1_epi32(0x00FF00FF);
  __m256 acc[P], accm[P];
  for (int gi = 0; gi < P; ++gi)
    acc[gi] = accm[gi] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i, ++x)
#pragma GCC unroll 4
    for (int gi = 0; gi < P; ++gi) {
      const uint8_t* g = superblock_ahead(gs[gi], i, block);
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
        // row r's scale of sub-blocks 2j, 2j+1: bytes 2(j % 2) + {0, 1} of dword r of sc[j / 2], in both
        // int16 halves of dword r
        const __m256i& scv = sc[j / 2];
        const __m256i sd0 = _mm256_shuffle_epi8(scv, pick_byte_pairs(2 * (j % 2)));
        const __m256i sd1 = _mm256_shuffle_epi8(scv, pick_byte_pairs(2 * (j % 2) + 1));
        sumi = _mm256_add_epi32(
            sumi, k4x8_chunk<Q5>(q, g + k_q4kx8_block + 64 * static_cast<size_t>(j), xw + 16 * j, sd0, sd1));
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
  gemv_q4_kx8_avx2_p<1, false>(&g, x, nsb, &out);
}
LOOM_AVX2 void gemv_q5_kx8_avx2(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out) {
  gemv_q4_kx8_avx2_p<1, true>(&g, x, nsb, &out);
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
      const uint8_t* g8 = superblock_ahead(gs[gi], i, k_q6kx8_block);
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

// Σ_s m_s · b_s per row over the 16 groups of a super-block, from four vectors mn[h] whose dword r holds row
// r's m_{4h .. 4h+3} as bytes (≤ 63) and the token's 16 group sums b: one madd per pair of groups.
LOOM_AVX2 inline __m256i group_dot(const __m256i (&mn)[4], const int16_t* b) {
  const __m256i lo16 = _mm256_set1_epi32(0x00FF00FF);
  __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int h = 0; h < 4; ++h) { // int16 lanes (m_4h, m_4h+2) and (m_4h+1, m_4h+3)
    const int16_t* bh = b + 4 * h;
    s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_and_si256(mn[h], lo16),
                                              _mm256_set1_epi32((bh[2] << 16) | (bh[0] & 0xFFFF))));
    s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_srli_epi16(mn[h], 8),
                                              _mm256_set1_epi32((bh[3] << 16) | (bh[1] & 0xFFFF))));
  }
  return s;
}

// q2_kx8: one group of 8 rows against one token. Per group of 16 columns one vector gives the 8 rows' 2-bit
// values of four 4-column chunks; broadcast activation chunks into maddubs, the four sums in int16 (4 · 2 · 3
// · 127 < 2^15); madd by the rows' 4-bit scales (an int16 pair per row) leaves row r's scaled sum in lane r.
// The mins' part Σ_s m_s · bsum_s per row: group_dot.
template <int P>
LOOM_AVX2 void gemv_q2_kx8_avx2_p(const uint8_t* const* gs, const BlockQ8K* x, int64_t nsb,
                                  float* const* outs) {
  const __m256i three = _mm256_set1_epi8(3), nib = _mm256_set1_epi8(0x0F), low4 = _mm256_set1_epi16(0x0F);
  __m256 acc[P], accm[P];
  for (int gi = 0; gi < P; ++gi)
    acc[gi] = accm[gi] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i, ++x)
#pragma GCC unroll 4
    for (int gi = 0; gi < P; ++gi) {
      const uint8_t* g = superblock_ahead(gs[gi], i, k_q2kx8_block);
      __m256i u[4], mn[4]; // dword r: row r's scale bytes 4h..4h+3 (scale: low nibble, min: high); its mins
      for (int h = 0; h < 4; ++h) {
        u[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32 + 32 * h));
        mn[h] = _mm256_and_si256(_mm256_srli_epi16(u[h], 4), nib);
      }
      const auto* xw = reinterpret_cast<const int32_t*>(x->qs);
      __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 2
      for (int gr = 0; gr < 16; ++gr) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + q2_vals_at(gr)));
        __m256i s = _mm256_maddubs_epi16(_mm256_and_si256(v, three), _mm256_set1_epi32(xw[4 * gr]));
        for (int k = 1; k < 4; ++k)
          s = _mm256_add_epi16(s, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 2 * k), three),
                                                       _mm256_set1_epi32(xw[4 * gr + k])));
        const __m256i sd = _mm256_and_si256(_mm256_shuffle_epi8(u[gr / 4], pick_byte_pairs(gr % 4)), low4);
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, sd));
      }
      const __m256 xd = _mm256_set1_ps(x->d);
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
      const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 16)));
      acc[gi] = _mm256_fmadd_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(sumi), acc[gi]);
      accm[gi] =
          _mm256_fmadd_ps(_mm256_mul_ps(dmin, xd), _mm256_cvtepi32_ps(group_dot(mn, x->bsums)), accm[gi]);
    }
  for (int gi = 0; gi < P; ++gi)
    _mm256_storeu_ps(outs[gi], _mm256_sub_ps(acc[gi], accm[gi]));
}
LOOM_AVX2 void gemv_q2_kx8_avx2(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out) {
  gemv_q2_kx8_avx2_p<1>(&g, x, nsb, &out);
}

// q3_kx8: one group of 8 rows against one token. Per group of 16 columns one vector of low bits and half a
// vector of third bits give the 8 rows' unsigned values u = 0..7 of four 4-column chunks; maddubs against
// the broadcast activations, the four sums in int16 (4 · 2 · 7 · 127 < 2^15); madd by the rows' scale − 32.
// The u − 4 offset: 4 · Σ_s (scale_s − 32) · bsum_s per row (group_dot over the scales, less 32 · Σ bsum).
template <int P>
LOOM_AVX2 void gemv_q3_kx8_avx2_p(const uint8_t* const* gs, const BlockQ8K* x, int64_t nsb,
                                  float* const* outs) {
  const __m256i m4 = _mm256_set1_epi32(0x0f0f0f0f), m2 = _mm256_set1_epi32(0x03030303),
                three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4), c32 = _mm256_set1_epi16(32);
  __m256 acc[P];
  for (int gi = 0; gi < P; ++gi)
    acc[gi] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i, ++x)
#pragma GCC unroll 4
    for (int gi = 0; gi < P; ++gi) {
      const uint8_t* g = superblock_ahead(gs[gi], i, k_q3kx8_block);
      // the 8 rows' 6-bit scales (q3_k_scale, + 32): dword r of sc[h] holds row r's scales 4h..4h+3 as bytes
      const __m256i u0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 16));
      const __m256i u1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 48));
      const __m256i u2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 80));
      const __m256i sc[4] = {
          _mm256_or_si256(_mm256_and_si256(u0, m4), _mm256_slli_epi32(_mm256_and_si256(u2, m2), 4)),
          _mm256_or_si256(_mm256_and_si256(u1, m4),
                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u2, 2), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u0, 4), m4),
                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u1, 4), m4),
                          _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u2, 6), m2), 4))};
      const auto* xw = reinterpret_cast<const int32_t*>(x->qs);
      __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 1
      for (int p = 0; p < 8; ++p) { // groups 2p, 2p+1
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + q3_high_at(p)));
#pragma GCC unroll 2
        for (int e = 0; e < 2; ++e) {
          const int gr = 2 * p + e;
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + q3_low_at(gr)));
          __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) {
            const int b = 4 * e + k; // the third bit's position, moved to bit 2
            const __m256i third = b > 2   ? _mm256_srli_epi16(h, b - 2)
                                  : b < 2 ? _mm256_slli_epi16(h, 2 - b)
                                          : h;
            const __m256i q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 2 * k), three),
                                              _mm256_and_si256(third, four));
            s = _mm256_add_epi16(s, _mm256_maddubs_epi16(q, _mm256_set1_epi32(xw[4 * gr + k])));
          }
          const __m256i sd = _mm256_sub_epi16(_mm256_shuffle_epi8(sc[gr / 4], pick_byte_pairs(gr % 4)), c32);
          sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, sd));
        }
      }
      int32_t bsum = 0; // 4 · Σ_s (sc_s − 32) · bsum_s = 4 · (Σ_s sc_s · bsum_s − 32 · Σ_s bsum_s)
      for (int16_t b : x->bsums)
        bsum += b;
      const __m256i off = _mm256_sub_epi32(group_dot(sc, x->bsums), _mm256_set1_epi32(32 * bsum));
      sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 2));
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
      acc[gi] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(x->d)), _mm256_cvtepi32_ps(sumi), acc[gi]);
    }
  for (int gi = 0; gi < P; ++gi)
    _mm256_storeu_ps(outs[gi], acc[gi]);
}
LOOM_AVX2 void gemv_q3_kx8_avx2(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out) {
  gemv_q3_kx8_avx2_p<1>(&g, x, nsb, &out);
}

// iq4_xsx8: one group of 8 rows against one token. Per sub-block of 32 columns four vectors of index bytes
// give the 8 rows' levels (pshufb) of 4-column chunks, low nibbles and high; each maddubs through dot_i8's
// sign trick, then madd by the rows' scale ls − 32 (an int16 pair per row) into int32.
template <int P>
LOOM_AVX2 void gemv_iq4_xsx8_avx2_p(const uint8_t* const* gs, const BlockQ8K* x, int64_t nsb,
                                    float* const* outs) {
  const __m256i mask = _mm256_set1_epi8(0x0F), nib = _mm256_set1_epi32(0x0F), three = _mm256_set1_epi32(3),
                c32 = _mm256_set1_epi32(32), lo16 = _mm256_set1_epi32(0xFFFF);
  const __m256i lut = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(dtype_detail::k_iq4nl_values)));
  __m256 acc[P];
  for (int gi = 0; gi < P; ++gi)
    acc[gi] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nsb; ++i, ++x)
#pragma GCC unroll 4
    for (int gi = 0; gi < P; ++gi) {
      const uint8_t* g = superblock_ahead(gs[gi], i, k_iq4xsx8_block);
      const __m256i sl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 16)); // dword r: scales_l
      const __m256i sh = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 48)));
      const auto* xw = reinterpret_cast<const int32_t*>(x->qs);
      __m256i sumi = _mm256_setzero_si256();
#pragma GCC unroll 1
      for (int k = 0; k < 8; ++k) {
        // row r's scale of sub-block k, less 32, in both int16 halves of dword r
        const __m256i ls = _mm256_sub_epi32(
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(sl, 4 * k), nib),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(sh, 2 * k), three), 4)),
            c32);
        const __m256i sc = _mm256_or_si256(_mm256_and_si256(ls, lo16), _mm256_slli_epi32(ls, 16));
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 64 + 128 * k + 32 * c));
          const __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, mask));
          const __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), mask));
          const __m256i xl = _mm256_set1_epi32(xw[8 * k + c]), xh = _mm256_set1_epi32(xw[8 * k + 4 + c]);
          sumi = _mm256_add_epi32(
              sumi, _mm256_madd_epi16(
                        _mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(xl, lo)), sc));
          sumi = _mm256_add_epi32(
              sumi, _mm256_madd_epi16(
                        _mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(xh, hi)), sc));
        }
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g)));
      acc[gi] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(x->d)), _mm256_cvtepi32_ps(sumi), acc[gi]);
    }
  for (int gi = 0; gi < P; ++gi)
    _mm256_storeu_ps(outs[gi], acc[gi]);
}
LOOM_AVX2 void gemv_iq4_xsx8_avx2(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out) {
  gemv_iq4_xsx8_avx2_p<1>(&g, x, nsb, &out);
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

// The specializations that kernels.cpp calls.
template void rows4_k_avx2<DType::q4_k>(const uint8_t*, size_t, const BlockQ8K*, int64_t, float*);
template void rows4_k_avx2<DType::q6_k>(const uint8_t*, size_t, const BlockQ8K*, int64_t, float*);
template void rows4_half_avx2<DType::f16>(const uint8_t*, size_t, const float*, int64_t, float*);
template void rows4_half_avx2<DType::bf16>(const uint8_t*, size_t, const float*, int64_t, float*);
template void rows4x2_avx2<DType::f32>(const uint8_t*, size_t, const float*, int64_t, float*);
template void rows4x2_avx2<DType::f16>(const uint8_t*, size_t, const float*, int64_t, float*);
template void rows4x2_avx2<DType::bf16>(const uint8_t*, size_t, const float*, int64_t, float*);
template void rows4_q_avx2<DType::q8_0>(const uint8_t*, size_t, const BlockQ8*, int64_t, float*);
template void rows4_q_avx2<DType::q4_0>(const uint8_t*, size_t, const BlockQ8*, int64_t, float*);
template void gemv_q8_0x8_avx2<1>(const uint8_t*, const BlockQ8*, int64_t, float*);
template void gemv_q8_0x8_avx2<2>(const uint8_t*, const BlockQ8*, int64_t, float*);
template void gemv_q4x8_avx2<DType::q4_0, 1>(const uint8_t*, const BlockQ8*, int64_t, float*);
template void gemv_q4x8_avx2<DType::q4_0, 2>(const uint8_t*, const BlockQ8*, int64_t, float*);
template void gemv_q4x8_avx2<DType::q4_1, 1>(const uint8_t*, const BlockQ8*, int64_t, float*);
template void gemv_q4x8_avx2<DType::q4_1, 2>(const uint8_t*, const BlockQ8*, int64_t, float*);
template void gemv_q4x8_avx2<DType::q5_0, 1>(const uint8_t*, const BlockQ8*, int64_t, float*);
template void gemv_q4x8_avx2<DType::q5_0, 2>(const uint8_t*, const BlockQ8*, int64_t, float*);
template void gemv_q4x8_avx2<DType::iq4_nl, 1>(const uint8_t*, const BlockQ8*, int64_t, float*);
template void gemv_q4x8_avx2<DType::iq4_nl, 2>(const uint8_t*, const BlockQ8*, int64_t, float*);
template void gemv_q4_kx8_avx2_p<4, false>(const uint8_t* const*, const BlockQ8K*, int64_t, float* const*);
template void gemv_q4_kx8_avx2_p<4, true>(const uint8_t* const*, const BlockQ8K*, int64_t, float* const*);
template void gemv_q6_kx8_avx2_p<4>(const uint8_t* const*, const BlockQ8K*, int64_t, float* const*);
template void gemv_q2_kx8_avx2_p<4>(const uint8_t* const*, const BlockQ8K*, int64_t, float* const*);
template void gemv_q3_kx8_avx2_p<4>(const uint8_t* const*, const BlockQ8K*, int64_t, float* const*);
template void gemv_iq4_xsx8_avx2_p<4>(const uint8_t* const*, const BlockQ8K*, int64_t, float* const*);

} // namespace loom::cpu
