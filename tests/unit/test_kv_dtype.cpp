// KV rows stored as f16, bf16 or q8_0 (issue 12): both stores keep rows in the configured type at
// the bytes the 2·L·H_kv·D·b formula gives; rows read back within the type's rounding; a q8_0 store needs
// rows of whole blocks. (Whole generations in each type, and the cpu backend's kernels against the
// reference backend: tests/integration/test_kv_dtype.cpp. A backend that reads f32 rows only is refused:
// test_contract_plugins.cpp, with the ABI 1.0 fixture.)
#include "loom/error.hpp"
#include "loom/kv/kv_cache.hpp"

#include <cmath>
#include <gtest/gtest.h>
#include <random>

namespace {

using namespace loom;

KVShape shape(DType t, int32_t row = 64) {
  KVShape s;
  s.n_layer = 2;
  s.n_head_kv = row / 16;
  s.head_dim = 16;
  s.n_ctx = 32;
  s.n_seq_max = 4;
  s.block_size = 8;
  s.dtype = t;
  return s;
}

TEST(KvDtype, RowsRoundTripWithinTheTypesRoundingOnBothStores) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::q8_0})
    for (bool paged : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + (paged ? " paged" : " contiguous"));
      const KVShape sh = shape(t);
      auto kv = paged ? make_paged_kv_cache(sh) : make_contiguous_kv_cache(sh);
      EXPECT_EQ(kv->memory().layout().dtype, t);
      const int64_t E = sh.row_elems();
      std::mt19937 rng(3);
      std::normal_distribution<float> nd(0.0f, 2.0f);
      ASSERT_TRUE(kv->allocate(0, 20));
      std::vector<std::vector<float>> rows;
      for (Pos p = 0; p < 20; ++p) {
        std::vector<float> r(static_cast<size_t>(E));
        for (auto& x : r)
          x = nd(rng);
        std::vector<uint8_t> bytes(row_bytes(t, E));
        kv_store(t, r.data(), bytes.data(), E);
        kv->write_row(1, 0, 0, p, bytes);
        rows.push_back(std::move(r));
      }
      const float tol = t == DType::f32 ? 0.0f : t == DType::f16 ? 4e-3f : t == DType::bf16 ? 3e-2f : 0.06f;
      for (Pos p = 0; p < 20; ++p) {
        std::vector<float> back(static_cast<size_t>(E));
        const std::vector<uint8_t> stored = kv->read_row(1, 0, 0, p);
        ASSERT_EQ(stored.size(), row_bytes(t, E));
        kv_load(t, stored.data(), 0, E, back.data());
        float amax = 0;
        for (float x : rows[static_cast<size_t>(p)])
          amax = std::max(amax, std::fabs(x));
        for (int64_t i = 0; i < E; ++i)
          ASSERT_NEAR(back[static_cast<size_t>(i)], rows[static_cast<size_t>(p)][static_cast<size_t>(i)],
                      tol * (t == DType::q8_0
                                 ? amax
                                 : std::fabs(rows[static_cast<size_t>(p)][static_cast<size_t>(i)])))
              << "position " << p << " value " << i;
        // A slice (one head) reads the same values.
        std::vector<float> head(16);
        kv_load(t, stored.data(), 16, 16, head.data());
        for (int i = 0; i < 16; ++i)
          EXPECT_EQ(head[static_cast<size_t>(i)], back[static_cast<size_t>(16 + i)]);
      }
      // The bytes: 2·L·row bytes per position.
      const size_t per_pos = 2 * 2 * row_bytes(t, E);
      EXPECT_EQ(kv->stats().bytes_used, 20 * per_pos);
      EXPECT_EQ(kv->stats().bytes_capacity, static_cast<size_t>(kv->capacity_positions()) * per_pos);
    }
}

TEST(KvDtype, Q8ZeroNeedsRowsOfWholeBlocks) {
  KVShape sh = shape(DType::q8_0, 48);
  try {
    (void)make_paged_kv_cache(sh);
    FAIL() << "a q8_0 store of 48-value rows was made";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
  }
}

} // namespace
