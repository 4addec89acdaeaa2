// The cpu executor's shared SIMD helpers: target macros, small vector loops, vectorized exps.
#pragma once

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
