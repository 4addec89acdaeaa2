// The cpu executor's shared SIMD helpers: target macros, small vector loops, vectorized exps.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <immintrin.h>

#define LOOM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LOOM_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))
#define LOOM_INLINE inline __attribute__((always_inline))

namespace loom::cpu {

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

} // namespace loom::cpu

namespace loom::cpu {

// ---- vector traits: one kernel template written over them, instantiated per ISA level ----
// A kernel body written once against V (V::vec, V::W lanes, the operations below) is included once per
// level with its target (attention_item.inc); each trait's operations carry their own target, so they
// inline only into a kernel of that level.

struct VecAvx2 {
  using vec = __m256;
  static constexpr int W = 8;
  static LOOM_AVX2 LOOM_INLINE vec zero() { return _mm256_setzero_ps(); }
  static LOOM_AVX2 LOOM_INLINE vec set1(float x) { return _mm256_set1_ps(x); }
  static LOOM_AVX2 LOOM_INLINE vec loadu(const float* p) { return _mm256_loadu_ps(p); }
  static LOOM_AVX2 LOOM_INLINE void storeu(float* p, vec v) { _mm256_storeu_ps(p, v); }
  static LOOM_AVX2 LOOM_INLINE vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static LOOM_AVX2 LOOM_INLINE vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
  static LOOM_AVX2 LOOM_INLINE vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
  static LOOM_AVX2 LOOM_INLINE vec fmadd(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static LOOM_AVX2 LOOM_INLINE vec max(vec a, vec b) { return _mm256_max_ps(a, b); }
  static LOOM_AVX2 LOOM_INLINE vec exp(vec x) { return exp256(x); }
  // e^(x − m), 0 where x = −∞ (a masked score); NaN → NaN
  static LOOM_AVX2 LOOM_INLINE vec exp_or_zero(vec x, vec m) {
    return _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_UQ),
                         exp256(_mm256_sub_ps(x, m)));
  }
  // c + a·b, or c unchanged when !keep
  static LOOM_AVX2 LOOM_INLINE vec fmadd_if(bool keep, vec a, vec b, vec c) {
    return _mm256_blendv_ps(c, _mm256_fmadd_ps(a, b, c),
                            _mm256_castsi256_ps(_mm256_set1_epi32(-int32_t{keep})));
  }
  // v where the lane's key position kp is in the span (KeySpan::contains: kp ≤ last, and kp ≥ first or
  // kp < sink_end), −∞ elsewhere
  static LOOM_AVX2 LOOM_INLINE vec mask_span(vec v, const int32_t* kp, int32_t first, int32_t last,
                                             int32_t sink_end) {
    const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kp));
    const __m256i in_window = _mm256_cmpgt_epi32(k, _mm256_set1_epi32(first - 1)); // first ≥ 0
    const __m256i sink = _mm256_cmpgt_epi32(_mm256_set1_epi32(sink_end), k);
    const __m256i in =
        _mm256_andnot_si256(_mm256_cmpgt_epi32(k, _mm256_set1_epi32(last)), _mm256_or_si256(in_window, sink));
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), v, _mm256_castsi256_ps(in));
  }
  // the greatest of the eight lanes
  static LOOM_AVX2 LOOM_INLINE float hmax(vec v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
  }
  // the sum of the eight lanes
  static LOOM_AVX2 LOOM_INLINE float hsum(vec v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
  }
  // lane k = the sum of d[k]'s lanes (one transpose of eight partial sums instead of eight hsums)
  static LOOM_AVX2 LOOM_INLINE vec sum_lanes(const vec (&d)[W]) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(d[0], d[1]), _mm256_hadd_ps(d[2], d[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(d[4], d[5]), _mm256_hadd_ps(d[6], d[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
  }
  // W values of a row from element `at` on, stored as f32 (KT 0), f16 (1, F16C) or bf16 (2)
  template <int KT> static LOOM_AVX2 LOOM_INLINE vec load(const uint8_t* row, size_t at) {
    if constexpr (KT == 0) {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + at);
    } else if constexpr (KT == 1) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * at)));
    } else {
      const __m256i w =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * at)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
  }
};

struct VecAvx512 {
  using vec = __m512;
  static constexpr int W = 16;
  static LOOM_AVX512 LOOM_INLINE vec zero() { return _mm512_setzero_ps(); }
  static LOOM_AVX512 LOOM_INLINE vec set1(float x) { return _mm512_set1_ps(x); }
  static LOOM_AVX512 LOOM_INLINE vec loadu(const float* p) { return _mm512_loadu_ps(p); }
  static LOOM_AVX512 LOOM_INLINE void storeu(float* p, vec v) { _mm512_storeu_ps(p, v); }
  static LOOM_AVX512 LOOM_INLINE vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static LOOM_AVX512 LOOM_INLINE vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
  static LOOM_AVX512 LOOM_INLINE vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
  static LOOM_AVX512 LOOM_INLINE vec fmadd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static LOOM_AVX512 LOOM_INLINE vec max(vec a, vec b) { return _mm512_max_ps(a, b); }
  static LOOM_AVX512 LOOM_INLINE vec exp(vec x) { return exp512(x); }
  static LOOM_AVX512 LOOM_INLINE vec exp_or_zero(vec x, vec m) {
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_UQ);
    return _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(x, m)));
  }
  static LOOM_AVX512 LOOM_INLINE vec fmadd_if(bool keep, vec a, vec b, vec c) {
    return _mm512_mask3_fmadd_ps(a, b, c, keep ? 0xFFFF : 0);
  }
  static LOOM_AVX512 LOOM_INLINE vec mask_span(vec v, const int32_t* kp, int32_t first, int32_t last,
                                               int32_t sink_end) {
    const __m512i k = _mm512_loadu_si512(kp);
    const __mmask16 in = _mm512_cmple_epi32_mask(k, _mm512_set1_epi32(last)) &
                         (_mm512_cmpge_epi32_mask(k, _mm512_set1_epi32(first)) |
                          _mm512_cmplt_epi32_mask(k, _mm512_set1_epi32(sink_end)));
    return _mm512_mask_blend_ps(in, _mm512_set1_ps(-INFINITY), v);
  }
  static LOOM_AVX512 LOOM_INLINE float hmax(vec v) { return _mm512_reduce_max_ps(v); }
  static LOOM_AVX512 LOOM_INLINE float hsum(vec v) { return _mm512_reduce_add_ps(v); }
  // lane k = the sum of d[k]'s sixteen lanes: a transpose-and-add tree (45 operations for 16 rows, where
  // the AVX2 sum_lanes spends 10 per 8)
  static LOOM_AVX512 LOOM_INLINE vec sum_lanes(const vec (&d)[W]) {
    __m512 t[8], u[4];
    for (int k = 0; k < 8; ++k) // per 128-bit lane: d[2k]'s pair sums at 0, 2; d[2k + 1]'s at 1, 3
      t[k] = _mm512_add_ps(_mm512_unpacklo_ps(d[2 * k], d[2 * k + 1]),
                           _mm512_unpackhi_ps(d[2 * k], d[2 * k + 1]));
    for (int k = 0; k < 4; ++k) { // per 128-bit lane L: the lane sums of d[4k .. 4k + 3]
      const __m512d a = _mm512_castps_pd(t[2 * k]), b = _mm512_castps_pd(t[2 * k + 1]);
      u[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    const __m512 x0 =
        _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
    const __m512 x1 =
        _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x88), _mm512_shuffle_f32x4(x0, x1, 0xDD));
  }
  template <int KT> static LOOM_AVX512 LOOM_INLINE vec load(const uint8_t* row, size_t at) {
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
};

} // namespace loom::cpu
