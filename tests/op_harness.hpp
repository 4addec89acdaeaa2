// op_harness.hpp — what the backend op tests share: seeded normal values, weights quantized from them, and
// a comparison relative to the largest reference value.
#pragma once

#include "loom/model/graph.hpp"
#include "loom/sdk/dtype.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <gtest/gtest.h>
#include <random>
#include <string>
#include <vector>

namespace loom::test {

struct Rand {
  std::mt19937 rng;
  explicit Rand(uint32_t seed) : rng(seed) {}
  std::vector<float> normal(size_t n, float sd) {
    std::normal_distribution<float> nd(0.0f, sd);
    std::vector<float> v(n);
    for (auto& x : v)
      x = nd(rng);
    return v;
  }
};

// A weight of `rows` rows of `n` elements stored as `type` (random, std sd).
struct Weight {
  DType type;
  int64_t n, rows;
  std::vector<uint8_t> bytes;
  Weight(DType t, int64_t n_, int64_t rows_, Rand& r, float sd = 1.0f) : type(t), n(n_), rows(rows_) {
    const auto f = r.normal(static_cast<size_t>(n * rows), sd);
    const size_t rb = row_bytes(t, n);
    bytes.resize(rb * static_cast<size_t>(rows));
    for (int64_t j = 0; j < rows; ++j)
      quantize_row(t, f.data() + j * n, bytes.data() + static_cast<size_t>(j) * rb, n);
  }
  int32_t add(Graph& g, const std::string& name) const {
    return g.add_weight(name, type, {n, rows, 1, 1}, bytes.data());
  }
};

// got == ref within tol × (the largest |ref| + 1), element by element.
inline void expect_close(const std::vector<float>& ref, const std::vector<float>& got, double tol,
                         const std::string& what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  double mag = 0;
  for (float v : ref)
    mag = std::max(mag, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(static_cast<double>(got[i]), static_cast<double>(ref[i]), tol * (mag + 1.0))
        << what << " at " << i;
}

} // namespace loom::test
