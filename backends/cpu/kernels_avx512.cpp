// The cpu backend's AVX-512 (F, BW, VL, DQ) kernels, and to_bf16's AVX512-BF16 loop.
#include "avx512_gcc_warnings.hpp"
#include "kernels_internal.hpp"

#include <cstring>
#include <immintrin.h>

namespace loom::cpu {

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

namespace {

// Sixteen weights of a row (f32, f16 or bf16) from element k, as f32.
template <DType type> LOOM_AVX512F inline __m512 wload16(const uint8_t* row, int64_t k) {
  if constexpr (type == DType::f32) return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k));
  if constexpr (type == DType::f16)
    return _mm512_cvtph_ps(h);
  else
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

} // namespace

// rows4_f32_avx2 / rows4_half_avx2 with AVX-512: one cache line of each row per step (16 f32 or 32
// halves), half the instructions per byte — on a core that reads 35 GB/s the AVX2 loop is close to
// its issue limit for 16-bit weights. The four rows lie rb bytes apart (far apart in decode:
// rows_plain_side_by_side).

template <DType type> // f32, f16 or bf16
LOOM_AVX512F void rows4_avx512(const uint8_t* w, size_t rb, const float* x, int64_t K, float* out) {
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

// to_bf16 at Isa::avx512_bf16.
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

// The specializations that kernels.cpp calls.
template void rows4_avx512<DType::f32>(const uint8_t*, size_t, const float*, int64_t, float*);
template void rows4_avx512<DType::f16>(const uint8_t*, size_t, const float*, int64_t, float*);
template void rows4_avx512<DType::bf16>(const uint8_t*, size_t, const float*, int64_t, float*);

} // namespace loom::cpu
