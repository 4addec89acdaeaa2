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

#include <compare>
#include <cstdint>
#include <cstdlib>
#include <list>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <utility>

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

  explicit MatmulPrimitives(size_t capacity) : capacity_(capacity) {
    if (std::getenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY") == nullptr) dnnl::set_primitive_cache_capacity(0);
  }

  // The primitive for `s`, made by make() (a dnnl::matmul::primitive_desc) when it is not held.
  template <class Make> dnnl::matmul& get(const Shape& s, Make&& make) {
    if (auto it = index_.find(s); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
    dnnl::matmul prim(make()); // may throw: nothing is changed then
    if (lru_.size() >= capacity_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    lru_.emplace_front(s, std::move(prim));
    index_.emplace(s, lru_.begin());
    return lru_.front().second;
  }

  size_t size() const { return lru_.size(); }

private:
  size_t capacity_;
  std::list<std::pair<Shape, dnnl::matmul>> lru_; // the most recently used first
  std::map<Shape, std::list<std::pair<Shape, dnnl::matmul>>::iterator> index_;
};

} // namespace loom::cpu
