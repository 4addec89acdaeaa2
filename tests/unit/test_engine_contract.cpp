// The engine's contract on a KV store alone (issue 9): a fork copies only the positions in use, not the
// sequence's whole slab. (The contract on a model — KV room, forks, truncate, free, stops, failures,
// drafts — is tests/integration/test_engine_contract.cpp.)
#include "kv_rows.hpp"
#include "loom/kv/kv_cache.hpp"

#include <fstream>
#include <gtest/gtest.h>
#include <unistd.h>
#include <vector>

namespace {

using namespace loom;

long resident_kib() {
  std::ifstream f("/proc/self/statm");
  long pages_total = 0, pages_rss = 0;
  f >> pages_total >> pages_rss;
  return pages_rss * (sysconf(_SC_PAGESIZE) / 1024);
}

TEST(EngineContract, ForkCopiesOnlyTheUsedPositions) {
  KVShape s;
  s.n_layer = 8;
  s.n_head_kv = 4;
  s.head_dim = 64;
  s.n_ctx = 8192; // 2 × 8 × 8192 × 256 floats = 128 MiB per sequence if it were copied whole
  s.n_seq_max = 8;
  auto kv = make_contiguous_kv_cache(s);
  ASSERT_TRUE(kv->allocate(0, 4));
  std::vector<float> row(256, 0.0f);
  for (int l = 0; l < s.n_layer; ++l)
    for (Pos p = 0; p < 4; ++p) {
      row[0] = static_cast<float>(l * 10 + p);
      row[255] = 0.0f;
      loom::test::set_kv_f32(*kv, l, 0, 0, p, row);
      row[0] = 0.0f;
      row[255] = -static_cast<float>(l * 10 + p);
      loom::test::set_kv_f32(*kv, l, 1, 0, p, row);
    }
  const long before = resident_kib();
  for (SeqId c = 1; c <= 4; ++c)
    ASSERT_TRUE(kv->fork(0, c));
  EXPECT_EQ(kv->memory().queued_copies().size(), 4u)
      << "a fork's copy is recorded, run before the next forward";
  kv->memory().sync();
  const long grown = resident_kib() - before;
  EXPECT_LT(grown, 16 * 1024) << "4 forks of a 4-position sequence made " << grown << " KiB resident";
  for (SeqId c = 1; c <= 4; ++c) {
    EXPECT_EQ(kv->length(c), 4);
    EXPECT_EQ(loom::test::k_f32(*kv, 7, c, 3)[0], 73.0f);
    EXPECT_EQ(loom::test::v_f32(*kv, 2, c, 1)[255], -21.0f);
  }
  EXPECT_EQ(kv->free_sequences(), 3);
  ASSERT_TRUE(kv->allocate(0, 1)); // the parent grows independently of its forks
  EXPECT_EQ(kv->length(0), 5);
  EXPECT_EQ(kv->length(1), 4);
}

} // namespace
