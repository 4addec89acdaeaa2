// The cpu executor's element-wise and row ops, one body per ISA (ops_cpu.cpp).
#pragma once

#include "simd_cpu.hpp"

#include <cstdint>

namespace loom::cpu {

// One row: y = x / rms(x) · w (w may be null). OpenMP outlines parallel regions into functions of their
// own, which do not inherit a target attribute: so the regions stay in generic code and call these
// per-ISA bodies.
LOOM_AVX2 void rms_norm_row_avx2(const float* x, const float* w, float* y, int64_t n, float eps);
void rms_norm_row_generic(const float* x, const float* w, float* y, int64_t n, float eps);

enum class Ew { add, add_row, mul, mul_row, scale, swiglu, geglu, softcap };

// dst[i0, i1) = a (op) b; add_row / mul_row broadcast b (length `row`) along rows.
LOOM_AVX2 void elementwise_avx2(Ew op, const float* a, const float* b, float s, float* dst, int64_t i0,
                                int64_t i1, int64_t row);
void elementwise_generic(Ew op, const float* a, const float* b, float s, float* dst, int64_t i0, int64_t i1,
                         int64_t row);
LOOM_AVX512 void elementwise_avx512(Ew op, const float* a, const float* b, float s, float* dst, int64_t i0,
                                    int64_t i1, int64_t row);

} // namespace loom::cpu
