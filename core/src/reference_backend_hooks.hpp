// Internal: the reference executor with a pluggable matmul kernel. The cpu backend plugin reuses
// every reference op and replaces the one that dominates the time. Not part of the public API.
#pragma once

#include "loom/backend.hpp"

#include <functional>
#include <memory>
#include <string>

namespace loom {

// y[t][j] = Σ_k W[j][k] · x[t][k] for t < T, j < w.ne[1]; returns false to fall back to the reference.
//   w: the weight tensor (w.data in w.dtype, rows of w.ne[0]);  x: [T][w.ne[0]] f32;  y: [T][w.ne[1]] f32
using MatmulKernel = std::function<bool(const TensorDesc& w, const float* x, int64_t T, float* y)>;

std::unique_ptr<Backend> make_reference_backend_with(MatmulKernel matmul, std::string name);

} // namespace loom
