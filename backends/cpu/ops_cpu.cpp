// The cpu backend's element-wise and row ops (RMS norm, add, mul, scale, SwiGLU, GeGLU, soft-cap), per ISA.
#include "ops_cpu.hpp"

#include "avx512_gcc_warnings.hpp"
#include "loom/sdk/graph.hpp"

#include <cmath>
#include <cstdint>
#include <immintrin.h>

namespace loom::cpu {

// ---- element-wise and row ops ----

namespace {

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

} // namespace

// OpenMP outlines parallel regions into functions of their own, which do not inherit a target
// attribute: so the regions stay in generic code and call these per-ISA bodies.
LOOM_AVX2 void rms_norm_row_avx2(const float* x, const float* w, float* y, int64_t n, float eps) {
  rms_norm_row(x, w, y, n, eps);
}
void rms_norm_row_generic(const float* x, const float* w, float* y, int64_t n, float eps) {
  rms_norm_row(x, w, y, n, eps);
}

namespace {

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

} // namespace

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
  } else if (op == Ew::geglu) { // gelu_tanh with tanh(u) = sign(u)·(1 − e^−2|u|) / (1 + e^−2|u|)
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f), sign = _mm256_set1_ps(-0.0f);
    const __m256 k = _mm256_set1_ps(0.7978845608028654f), c = _mm256_set1_ps(0.044715f);
    for (; i + 8 <= i1; i += 8) {
      const __m256 x = _mm256_loadu_ps(a + i);
      const __m256 u =
          _mm256_mul_ps(_mm256_mul_ps(k, x), _mm256_add_ps(one, _mm256_mul_ps(c, _mm256_mul_ps(x, x))));
      const __m256 t = exp256(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, u))); // e^−2|u|
      const __m256 th =
          _mm256_or_ps(_mm256_div_ps(_mm256_sub_ps(one, t), _mm256_add_ps(one, t)), _mm256_and_ps(sign, u));
      const __m256 g = _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, th));
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(g, _mm256_loadu_ps(b + i)));
    }
  }
  elementwise(op, a, b, s, dst, i, i1, row);
}
void elementwise_generic(Ew op, const float* a, const float* b, float s, float* dst, int64_t i0, int64_t i1,
                         int64_t row) {
  elementwise(op, a, b, s, dst, i0, i1, row);
}
// AVX-512: SwiGLU as elementwise_avx2's, 16 at a time; GeGLU as elementwise_avx2's; the rest plain.
LOOM_AVX512 void elementwise_avx512(Ew op, const float* a, const float* b, float s, float* dst, int64_t i0,
                                    int64_t i1, int64_t row) {
  if (op == Ew::geglu) {
    elementwise_avx2(op, a, b, s, dst, i0, i1, row);
    return;
  }
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

} // namespace loom::cpu
