// The paged KV store: blocks shared by fork (no copy), copy-on-write when a sequence writes into a
// block it shares, truncate and free returning blocks, clean refusals without room; its rows equal
// the contiguous store's under any sequence of operations; the prefix cache. (Whole pipelines on either
// store, and the KV budget `loom inspect` reports: tests/integration/test_kv_paged.cpp.)
#include "kv_rows.hpp"
#include "loom/kv/kv_cache.hpp"

#include <gtest/gtest.h>
#include <random>

namespace {

using namespace loom;

KVShape small_shape(int32_t block = 16, int64_t blocks = 0) {
  KVShape s;
  s.n_layer = 2;
  s.n_head_kv = 2;
  s.head_dim = 4;
  s.n_ctx = 64;
  s.n_seq_max = 8;
  s.block_size = block;
  s.n_blocks = blocks;
  return s;
}

void write(KVCacheStore& kv, SeqId seq, Pos from, Pos to, float base) {
  const auto n = static_cast<size_t>(kv.shape().row_elems());
  std::vector<float> k(n), v(n);
  for (int32_t l = 0; l < kv.shape().n_layer; ++l)
    for (Pos p = from; p < to; ++p) {
      for (size_t i = 0; i < n; ++i) {
        k[i] = base + static_cast<float>(p * 100 + l * 10) + static_cast<float>(i) * 0.01f;
        v[i] = -(base + static_cast<float>(p * 100 + l * 10) + static_cast<float>(i) * 0.01f);
      }
      loom::test::set_kv_f32(kv, l, 0, seq, p, k);
      loom::test::set_kv_f32(kv, l, 1, seq, p, v);
    }
}
using loom::test::k_f32;
using loom::test::same_row;
using loom::test::v_f32;

TEST(PagedKv, ReleasedBlocksGoBackToThePoolAndAreNeverReadAgain) {
  auto kv = make_paged_kv_cache(small_shape(4, 12));
  ASSERT_TRUE(kv->allocate(0, 30)); // 8 blocks of 4
  write(*kv, 0, 0, 30, 1.0f);
  EXPECT_EQ(kv->units_in_use(), 8);
  // A sliding window with 2 sinks whose next query reads from 21 on: blocks wholly inside [2, 21)
  // are blocks 1..4 (positions 4..19); block 0 keeps the sinks, block 5 holds 20.
  EXPECT_EQ(kv->release_positions(0, 2, 21), 16);
  EXPECT_EQ(kv->units_in_use(), 4);
  EXPECT_EQ(kv->length(0), 30) << "the length stays";
  EXPECT_EQ(kv->first_released(0), 4);
  EXPECT_TRUE(kv->holds(0, 0, 4));
  EXPECT_TRUE(kv->holds(0, 20, 30));
  EXPECT_FALSE(kv->holds(0, 19, 30));
  EXPECT_EQ(k_f32(*kv, 1, 0, 21)[0], 1.0f + 2100 + 10) << "kept rows are untouched";
  EXPECT_EQ(kv->stats().bytes_used, (30u - 16u) * 2 * 2 * 8 * sizeof(float));
  EXPECT_EQ(kv->release_positions(0, 2, 21), 0) << "released once";
  // The freed blocks serve another sequence; growing this one reuses none of its released slots.
  ASSERT_TRUE(kv->allocate(1, 16));
  ASSERT_TRUE(kv->allocate(0, 2));
  EXPECT_EQ(kv->units_in_use(), 8);
  // A fork shares what is left; freeing both returns every block.
  ASSERT_TRUE(kv->fork(0, 2));
  EXPECT_EQ(kv->first_released(2), 4);
  EXPECT_EQ(kv->units_in_use(), 8);
  // Truncating back into the released range drops those entries with the rest.
  kv->truncate(2, 4);
  EXPECT_EQ(kv->first_released(2), 4);
  EXPECT_TRUE(kv->holds(2, 0, 4));
  ASSERT_TRUE(kv->allocate(2, 3));
  EXPECT_TRUE(kv->holds(2, 0, 7));
  for (SeqId s : {0, 1, 2})
    kv->free(s);
  EXPECT_EQ(kv->units_in_use(), 0);
  // The contiguous store releases nothing (a slab is one unit).
  auto ct = make_contiguous_kv_cache(small_shape());
  ASSERT_TRUE(ct->allocate(0, 30));
  EXPECT_EQ(ct->release_positions(0, 2, 21), 0);
  EXPECT_TRUE(ct->holds(0, 0, 30));
}

TEST(PagedKv, ForkSharesBlocksAndCopiesOnlyTheBlockItWritesInto) {
  auto kv = make_paged_kv_cache(small_shape(16));
  const size_t block = 2ull * 2 * 16 * 8 * sizeof(float); // [kv][layer][16 positions][8 floats]
  ASSERT_TRUE(kv->allocate(0, 40));                       // 3 blocks, the last one half full
  write(*kv, 0, 0, 40, 1.0f);
  EXPECT_EQ(kv->stats().bytes_allocated, 3 * block);
  ASSERT_TRUE(kv->fork(0, 1));
  EXPECT_EQ(kv->stats().bytes_allocated, 3 * block) << "a fork copies nothing";
  EXPECT_TRUE(same_row(*kv, 1, 1, 0, 39)) << "the child reads the parent's rows";
  ASSERT_TRUE(kv->allocate(1, 1)); // position 40 is in the shared third block: copy-on-write
  EXPECT_EQ(kv->stats().bytes_allocated, 4 * block);
  EXPECT_FALSE(same_row(*kv, 1, 1, 0, 39));
  EXPECT_TRUE(same_row(*kv, 0, 1, 0, 5)) << "full blocks stay shared";
  write(*kv, 1, 40, 41, 9.0f);
  for (Pos p = 0; p < 40; ++p) // the child's copy holds the parent's rows; the parent is untouched
    EXPECT_EQ(k_f32(*kv, 1, 1, p)[3], k_f32(*kv, 1, 0, p)[3]) << p;
  EXPECT_EQ(kv->length(0), 40);
  EXPECT_FALSE(kv->allocate(1, 30)) << "41 + 30 positions exceed n_ctx = 64";
  EXPECT_EQ(kv->length(1), 41);
  ASSERT_TRUE(kv->allocate(1, 20)); // to 61: a fourth block of its own
  EXPECT_EQ(kv->stats().bytes_allocated, 5 * block);
}

TEST(PagedKv, TruncateAndFreeReturnBlocks) {
  auto kv = make_paged_kv_cache(small_shape(8));
  const size_t block = 2ull * 2 * 8 * 8 * sizeof(float);
  ASSERT_TRUE(kv->allocate(0, 30)); // 4 blocks
  ASSERT_TRUE(kv->fork(0, 1));
  kv->truncate(1, 9); // keeps 2 of the shared blocks
  EXPECT_EQ(kv->stats().bytes_allocated, 4 * block) << "the parent still holds all four";
  kv->free(0);
  EXPECT_EQ(kv->stats().bytes_allocated, 2 * block);
  kv->free(1);
  EXPECT_EQ(kv->stats().bytes_allocated, 0u);
  EXPECT_EQ(kv->free_sequences(), 8);
}

TEST(PagedKv, RefusesWithoutRoomAndChangesNothing) {
  auto kv = make_paged_kv_cache(small_shape(16, 3)); // three blocks in the pool
  ASSERT_TRUE(kv->allocate(0, 40));
  ASSERT_TRUE(kv->fork(0, 1));
  EXPECT_FALSE(kv->allocate(1, 1)) << "copy-on-write needs a fourth block";
  EXPECT_EQ(kv->length(1), 40);
  EXPECT_FALSE(kv->allocate(2, 1)) << "no block for a new sequence";
  EXPECT_FALSE(kv->contains(2));
  EXPECT_FALSE(kv->allocate(0, 30)) << "beyond n_ctx";
  kv->free(1);
  EXPECT_TRUE(kv->allocate(0, 8)) << "the parent's own third block has room";
}

// Random operations on both stores with the same writes: every readable row is equal.
TEST(PagedKv, RowsEqualTheContiguousStoreUnderRandomOperations) {
  for (int32_t block : {1, 4, 16, 64}) {
    SCOPED_TRACE(block);
    KVShape s = small_shape(block);
    auto paged = make_paged_kv_cache(s);
    auto flat = make_contiguous_kv_cache(s);
    std::mt19937 g(static_cast<uint32_t>(block));
    std::vector<SeqId> live;
    SeqId next = 0;
    float stamp = 0;
    for (int step = 0; step < 400; ++step) {
      const int op = static_cast<int>(g() % 10);
      if (op < 4 || live.empty()) { // allocate (new or existing) and write the new positions
        const SeqId seq = live.empty() || g() % 3 == 0 ? next++ : live[g() % live.size()];
        const int32_t n = static_cast<int32_t>(g() % 9);
        const Pos from = flat->length(seq);
        const bool a = flat->allocate(seq, n), b = paged->allocate(seq, n);
        ASSERT_EQ(a, b);
        if (!a) continue;
        if (std::find(live.begin(), live.end(), seq) == live.end()) live.push_back(seq);
        write(*flat, seq, from, from + n, stamp);
        write(*paged, seq, from, from + n, stamp);
        stamp += 1000;
      } else if (op < 6) {
        const SeqId parent = live[g() % live.size()], child = next++;
        const bool a = flat->fork(parent, child), b = paged->fork(parent, child);
        ASSERT_EQ(a, b);
        if (a) live.push_back(child);
      } else if (op < 8) {
        const SeqId seq = live[g() % live.size()];
        const int32_t n = static_cast<int32_t>(g() % static_cast<uint32_t>(flat->length(seq) + 1));
        flat->truncate(seq, n);
        paged->truncate(seq, n);
      } else {
        const size_t i = g() % live.size();
        flat->free(live[i]);
        paged->free(live[i]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      }
      for (SeqId seq : live) {
        ASSERT_EQ(flat->length(seq), paged->length(seq));
        for (int32_t l = 0; l < s.n_layer; ++l)
          for (Pos p = 0; p < flat->length(seq); ++p)
            for (int64_t i = 0; i < s.row_elems(); ++i) {
              ASSERT_EQ(k_f32(*flat, l, seq, p)[static_cast<size_t>(i)],
                        k_f32(*paged, l, seq, p)[static_cast<size_t>(i)])
                  << "seq " << seq << " pos " << p;
              ASSERT_EQ(v_f32(*flat, l, seq, p)[static_cast<size_t>(i)],
                        v_f32(*paged, l, seq, p)[static_cast<size_t>(i)]);
            }
      }
    }
  }
}

// ---- prefix cache ----------------------------------------------------------------------------------

// A paged store of `blocks` blocks of 4 with the prefix cache, whose sequence 0 holds `toks` (rows written,
// its full blocks registered).
std::unique_ptr<KVCacheStore> cached_store(int64_t blocks, const std::vector<TokenId>& toks) {
  KVShape sh = small_shape(4, blocks);
  sh.prefix_cache = true;
  auto kv = make_paged_kv_cache(sh);
  const auto n = static_cast<int32_t>(toks.size());
  EXPECT_TRUE(kv->allocate(0, n));
  write(*kv, 0, 0, n, 1.0f);
  kv->register_prefix(0, toks);
  return kv;
}

TEST(PagedKvPrefix, FullBlocksAreFoundByContentAndShareStorage) {
  const std::vector<TokenId> toks = {1, 5, 9, 2, 7, 7, 3, 8, 4, 4};
  auto kv = cached_store(6, toks); // blocks 0..1 are full (positions 0..7)
  EXPECT_EQ(kv->stats().cached_blocks, 2);
  ASSERT_TRUE(kv->allocate(1, 0));
  EXPECT_EQ(kv->reuse_prefix(1, toks, 9), 8);
  EXPECT_EQ(kv->length(1), 8);
  EXPECT_EQ(kv->units_in_use(), 3) << "two blocks shared, one of seq 0's own";
  for (Pos p = 0; p < 8; ++p)
    EXPECT_TRUE(same_row(*kv, 1, 1, 0, p)) << "the same storage at " << p;
  // A second block that differs at its second token: the first block, then the cached second block's first
  // position (its common start); a limit below one block: the start of the first block.
  std::vector<TokenId> other = toks;
  other[5] = 6;
  ASSERT_TRUE(kv->allocate(2, 0));
  EXPECT_EQ(kv->reuse_prefix(2, other, 10), 5);
  ASSERT_TRUE(kv->allocate(3, 0));
  EXPECT_EQ(kv->reuse_prefix(3, toks, 3), 3);
  // The same first tokens after another first block: nothing (a block's hash covers its prefix).
  std::vector<TokenId> shifted = {9, 9, 9, 9, 1, 5, 9, 2};
  ASSERT_TRUE(kv->allocate(4, 0));
  EXPECT_EQ(kv->reuse_prefix(4, shifted, 8), 0);
}

// A prompt sharing part of a cached block (llama-server's slots reuse any common prefix; whole blocks alone
// left up to block_size − 1 positions to evaluate again): those positions are copied from the cached block
// into one of the sequence's own, and the cached block keeps its content.
TEST(PagedKvPrefix, APartlySharedBlockGivesACopyOfItsCommonStart) {
  const std::vector<TokenId> toks = {1, 2, 3, 4, 5, 6, 7, 8};
  auto kv = cached_store(8, toks);
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6, 9, 9, 9};
  ASSERT_TRUE(kv->allocate(1, 0));
  ASSERT_EQ(kv->reuse_prefix(1, prompt, 8), 6) << "block 0 whole, then 2 positions of block 1";
  EXPECT_EQ(kv->units_in_use(), 3) << "block 0 shared, block 1 copied";
  for (Pos p = 0; p < 4; ++p)
    EXPECT_TRUE(same_row(*kv, 0, 1, 0, p)) << "the same storage at " << p;
  for (Pos p = 4; p < 6; ++p) {
    EXPECT_FALSE(same_row(*kv, 0, 1, 0, p)) << "a copy at " << p;
    EXPECT_EQ(k_f32(*kv, 0, 1, p), k_f32(*kv, 0, 0, p)) << "with the same values at " << p;
  }
  const std::vector<float> kept = k_f32(*kv, 0, 0, 6);
  EXPECT_EQ(kv->units_to_grow(1, 3), 1) << "writes go to its own block: one more for position 8";
  ASSERT_TRUE(kv->allocate(1, 3));
  std::vector<float> r = k_f32(*kv, 0, 1, 6);
  r[0] = -7.0f;
  loom::test::set_kv_f32(*kv, 0, 1, 0, 6, r);
  EXPECT_EQ(k_f32(*kv, 0, 0, 6), kept) << "the cached block kept its content";
  // No free block for the copy: only the whole blocks are reused.
  auto kt = cached_store(2, toks);
  ASSERT_TRUE(kt->allocate(1, 0));
  EXPECT_EQ(kt->reuse_prefix(1, prompt, 8), 4);
}

TEST(PagedKvPrefix, UnreferencedCachedBlocksAreEvictedLeastRecentlyUsedFirst) {
  KVShape sh = small_shape(4, 3);
  sh.prefix_cache = true;
  auto kv = make_paged_kv_cache(sh);
  const std::vector<TokenId> a = {1, 1, 1, 1}, b = {2, 2, 2, 2}, c = {3, 3, 3, 3};
  for (auto [seq, toks] : {std::pair{0, a}, std::pair{1, b}}) {
    ASSERT_TRUE(kv->allocate(seq, 4));
    write(*kv, seq, 0, 4, static_cast<float>(seq));
    kv->register_prefix(seq, toks);
    kv->free(seq); // unreferenced, still findable
  }
  EXPECT_EQ(kv->units_in_use(), 0);
  EXPECT_EQ(kv->free_positions(), 12) << "cached blocks nobody holds count as free";
  // a is used again (most recent now); then two fresh blocks are needed: the third block of the
  // pool and then the least recently used cached one, b.
  ASSERT_TRUE(kv->allocate(2, 0));
  EXPECT_EQ(kv->reuse_prefix(2, a, 4), 4);
  kv->free(2);
  ASSERT_TRUE(kv->allocate(3, 8));
  kv->register_prefix(3, std::vector<TokenId>{3, 3, 3, 3, 4, 4, 4, 4});
  ASSERT_TRUE(kv->allocate(4, 0));
  EXPECT_EQ(kv->reuse_prefix(4, b, 4), 0) << "b was evicted";
  ASSERT_TRUE(kv->allocate(5, 0));
  EXPECT_EQ(kv->reuse_prefix(5, a, 4), 4) << "a was used more recently and stays";
  ASSERT_TRUE(kv->allocate(6, 0));
  EXPECT_EQ(kv->reuse_prefix(6, c, 4), 4);
}

TEST(PagedKvPrefix, ACachedBlockIsNeverWrittenInPlace) {
  const std::vector<TokenId> toks = {1, 2, 3, 4, 5, 6, 7, 8};
  auto kv = cached_store(8, toks);
  const float before = k_f32(*kv, 0, 0, 5)[0];
  kv->truncate(0, 6); // into the second (cached) block; seq 0 alone holds it
  ASSERT_TRUE(kv->allocate(0, 1));
  std::vector<float> r = k_f32(*kv, 0, 0, 6);
  r[0] = -123.0f;
  loom::test::set_kv_f32(*kv, 0, 0, 0, 6, r); // writes a private copy
  ASSERT_TRUE(kv->allocate(1, 0));
  ASSERT_EQ(kv->reuse_prefix(1, toks, 8), 8);
  EXPECT_EQ(k_f32(*kv, 0, 1, 5)[0], before);
  EXPECT_NE(k_f32(*kv, 0, 1, 6)[0], -123.0f) << "the cached block kept its content";
}

} // namespace
