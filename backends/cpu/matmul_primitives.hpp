// The cpu backend's oneDNN matmul primitives, by shape, the least recently used dropped first.
//
// oneDNN's fast kernels (brgemm) need the row count T fixed when the primitive is made (with T a
// runtime dimension 2.6 falls back to gemm:jit, at a third to a half of the speed), and a primitive
// holds about 65 KB of JIT code and tables. A server sees every T from 1 to its batch size, so an
// unbounded set grew without end under load (the soak's RSS); making one costs 0.1–0.2 ms. So: a
// bounded set here, and oneDNN's own primitive cache, which would keep a second reference to every
// primitive ever made (1024 by default), is turned off unless ONEDNN_PRIMITIVE_CACHE_CAPACITY asks
// for it.
#pragma once

#include "loom/sdk/lru_cache.hpp"

#include <compare>
#include <cstdint>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>

namespace loom::cpu {

class MatmulPrimitives {
public:
  // dst[T][N] = src[T][K] · weights[K][N]; strides of the weights' rows and the destination's rows.
  struct Shape {
    dnnl::memory::data_type type;
    int64_t T, N, K, ldb, ldc;
    bool blocked; // the weights in oneDNN's blocked layout (BA16a64b2a), not in place
    auto operator<=>(const Shape&) const = default;
  };

  explicit MatmulPrimitives(size_t capacity) : cache_(capacity) {
    if (std::getenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY") == nullptr) dnnl::set_primitive_cache_capacity(0);
  }

  // The primitive for `s`, made by make() (a dnnl::matmul::primitive_desc) when it is not held.
  template <class Make> dnnl::matmul& get(const Shape& s, Make&& make) {
    return cache_.get(s, [&] { return dnnl::matmul(make()); });
  }

  size_t size() const { return cache_.size(); }

private:
  LruCache<Shape, dnnl::matmul> cache_;
};

} // namespace loom::cpu
