// KV layer groups (a hybrid model: some layers attend a sliding window, the others every position): the
// paged store keeps the window layers in groups of their own over the one pool, releases their blocks past
// the window while the full layers keep every position, and reuses a cached prefix only where every group
// has what the next query reads. The layout the backends see (KVLayout slots, KVRows' per-group tables) is
// checked here and through the ABI (test_executor_table.cpp); whole models:
// tests/integration/test_attention.cpp.
#include "kv_rows.hpp"
#include "loom/kv/kv_cache.hpp"

#include <algorithm>
#include <gtest/gtest.h>
#include <random>

namespace {

using namespace loom;
using loom::test::k_f32;
using loom::test::same_row;
using loom::test::v_f32;

// Six layers: 0, 2, 3 and 5 attend a window of 8 (no sinks), 1 and 4 every position; blocks of 4.
KVShape hybrid_shape(int64_t blocks = 0, bool prefix_cache = false) {
  KVShape s;
  s.n_layer = 6;
  s.n_head_kv = 1;
  s.head_dim = 4;
  s.n_ctx = 256;
  s.n_seq_max = 8;
  s.block_size = 4;
  s.n_blocks = blocks;
  s.prefix_cache = prefix_cache;
  s.window_layers = {true, false, true, true, false, true};
  s.window_retention = {0, 8};
  return s;
}

// Rows of every layer of positions [from, to), each value naming its layer and position.
void write(KVCacheStore& kv, SeqId seq, Pos from, Pos to) {
  for (int32_t l = 0; l < kv.shape().n_layer; ++l)
    for (Pos p = from; p < to; ++p) {
      const float x = static_cast<float>(p * 10 + l);
      loom::test::set_kv_f32(kv, l, 0, seq, p, std::vector<float>(4, x));
      loom::test::set_kv_f32(kv, l, 1, seq, p, std::vector<float>(4, -x));
    }
}

TEST(KvLayerGroups, WindowLayersLiveInGroupsOfTheirOwnOverOnePool) {
  auto kv = make_paged_kv_cache(hybrid_shape(10));
  const KVLayout& l = kv->memory().layout();
  // Group 0: the two full layers; the four window layers two to a group, in layer order.
  ASSERT_EQ(l.n_groups(), 3);
  EXPECT_EQ(l.n_slots(), 2);
  EXPECT_EQ(std::vector<int32_t>(l.layer_group().begin(), l.layer_group().end()),
            (std::vector<int32_t>{1, 0, 1, 2, 0, 2}));
  EXPECT_EQ(std::vector<int32_t>(l.layer_slot().begin(), l.layer_slot().end()),
            (std::vector<int32_t>{0, 0, 1, 0, 1, 1}));
  // n_blocks counts blocks of every layer: the same bytes as 10 blocks of six layers, in blocks of two.
  EXPECT_EQ(l.n_blocks, 30);
  EXPECT_EQ(l.bytes(), 10u * 6 * 2 * 4 * 4 * sizeof(float));
  // A sequence takes a block per group for its first positions; its rows keep their values in every layer.
  ASSERT_TRUE(kv->allocate(0, 5));
  EXPECT_EQ(kv->units_in_use(), 6) << "two blocks in each of three groups";
  write(*kv, 0, 0, 5);
  for (int32_t layer = 0; layer < 6; ++layer)
    for (Pos p = 0; p < 5; ++p) {
      EXPECT_EQ(k_f32(*kv, layer, 0, p)[0], static_cast<float>(p * 10 + layer));
      EXPECT_EQ(v_f32(*kv, layer, 0, p)[3], -static_cast<float>(p * 10 + layer));
    }
  // A fork shares every group's blocks; growing it copies the shared part-filled block in each group.
  ASSERT_TRUE(kv->fork(0, 1));
  EXPECT_EQ(kv->units_in_use(), 6);
  EXPECT_EQ(kv->copies_to_grow(1, 1).size(), 3u);
  EXPECT_EQ(kv->units_to_grow(1, 1), 3);
  ASSERT_TRUE(kv->allocate(1, 1));
  EXPECT_EQ(kv->units_in_use(), 9);
  EXPECT_EQ(kv->memory().queued_copies().size(), 3u);
  write(*kv, 1, 5, 6);
  for (int32_t layer = 0; layer < 6; ++layer)
    EXPECT_EQ(k_f32(*kv, layer, 1, 4)[0], static_cast<float>(40 + layer)) << "the copy of layer " << layer;
  EXPECT_FALSE(same_row(*kv, 3, 0, 1, 4));
  EXPECT_TRUE(same_row(*kv, 3, 0, 1, 0));
}

TEST(KvLayerGroups, WindowGroupsReleaseWhatTheWindowNoLongerReads) {
  auto kv = make_paged_kv_cache(hybrid_shape());
  ASSERT_TRUE(kv->allocate(0, 100));
  write(*kv, 0, 0, 100);
  EXPECT_EQ(kv->units_in_use(), 75);
  // The next query at 100 reads 93..100 of the window layers; with the slack (32) positions 61.. stay:
  // blocks 15..24 of each window group (block 15 holds 60..63), every block of the full layers.
  EXPECT_EQ(kv->retire(0, 100), 2 * 60);
  EXPECT_EQ(kv->units_in_use(), 25 + 2 * 10);
  EXPECT_EQ(kv->length(0), 100);
  EXPECT_EQ(kv->first_released(0), 0);
  EXPECT_FALSE(kv->holds(0, 0, 100)) << "not every layer holds every position";
  EXPECT_TRUE(kv->holds(0, 60, 100));
  EXPECT_FALSE(kv->holds(0, 59, 100));
  EXPECT_TRUE(kv->readable(0, 100, 100));
  for (int32_t layer : {1, 4})
    EXPECT_EQ(k_f32(*kv, layer, 0, 3)[0], static_cast<float>(30 + layer)) << "a full layer keeps position 3";
  for (int32_t layer : {0, 2, 3, 5})
    EXPECT_EQ(k_f32(*kv, layer, 0, 70)[0], static_cast<float>(700 + layer)) << "a window layer keeps 70";
  EXPECT_EQ(kv->stats().bytes_used, (100u * 2 + 40u * 4) * 2 * 4 * sizeof(float));
  // What admission counts: a window group's blocks stop growing at its bound.
  const int64_t bound = KVRetention{0, 8}.bound_positions(4) / 4;
  EXPECT_EQ(kv->units_for(100), 25 + 2 * bound);
  EXPECT_EQ(kv->units_for(8), 2 + 2 * 2);
  // Going back 40 positions: the window of a query at 59 (52..59) was released: not readable, and what
  // is evaluated again starts at the first released position.
  kv->truncate(0, 60);
  EXPECT_FALSE(kv->readable(0, 59, 60));
  EXPECT_EQ(kv->first_released(0), 0);
  // Going back less than the slack keeps the window readable.
  ASSERT_TRUE(kv->allocate(1, 100));
  kv->retire(1, 100);
  kv->truncate(1, 80);
  EXPECT_TRUE(kv->readable(1, 79, 80));
  kv->free(0);
  kv->free(1);
  EXPECT_EQ(kv->units_in_use(), 0);
}

// A prompt resumes from the cache only where every group has the blocks its next query reads: the full
// group every block, a window group its last window. A window's released blocks stay findable until a block
// is needed — they are evicted before the pool grows.
TEST(KvLayerGroups, PrefixReuseNeedsEachWindowGroupsLastWindow) {
  std::vector<TokenId> toks(100);
  for (size_t i = 0; i < toks.size(); ++i)
    toks[i] = static_cast<TokenId>(i + 1);
  auto kv = make_paged_kv_cache(hybrid_shape(0, true));
  ASSERT_TRUE(kv->allocate(0, 100));
  write(*kv, 0, 0, 100);
  kv->register_prefix(0, toks);
  EXPECT_EQ(kv->stats().cached_blocks, 75);
  kv->retire(0, 100);
  EXPECT_EQ(kv->stats().cached_blocks, 75) << "released, still findable";
  // The same prompt: every block, shared (the window groups' released entries stay released).
  ASSERT_TRUE(kv->allocate(1, 0));
  EXPECT_EQ(kv->reuse_prefix(1, toks, 100), 100);
  EXPECT_TRUE(same_row(*kv, 1, 0, 1, 3));
  EXPECT_TRUE(same_row(*kv, 0, 0, 1, 95));
  EXPECT_TRUE(kv->readable(1, 100, 100));
  EXPECT_EQ(k_f32(*kv, 5, 1, 99)[0], 995.0f);
  // A prompt sharing the first 60 tokens: the window before 60 was released but not yet evicted.
  std::vector<TokenId> other(toks.begin(), toks.begin() + 60);
  other.resize(80, 7);
  ASSERT_TRUE(kv->allocate(2, 0));
  EXPECT_EQ(kv->reuse_prefix(2, other, 80), 60);
  EXPECT_EQ(k_f32(*kv, 0, 2, 55)[0], 550.0f) << "a window block seq 0 released, found again";
  // Its blocks are now those of a sequence that ended (its last window: what a next turn resumes from), kept
  // as any cached block; blocks a window released are evicted before the pool grows: after some takes the
  // window before 40 is gone and nothing of a prompt sharing 40 tokens can be reused, while `other` still is.
  kv->free(2);
  ASSERT_TRUE(kv->allocate(4, 4 * 14));
  std::vector<TokenId> other40(toks.begin(), toks.begin() + 40);
  other40.resize(60, 7);
  ASSERT_TRUE(kv->allocate(2, 0));
  EXPECT_EQ(kv->reuse_prefix(2, other40, 60), 0);
  kv->free(2);
  ASSERT_TRUE(kv->allocate(2, 0));
  EXPECT_EQ(kv->reuse_prefix(2, other, 80), 60);
  kv->free(4);
  // A prompt sharing 98 tokens: 24 whole blocks and, in every group, a copy of the next block's start.
  std::vector<TokenId> near(toks.begin(), toks.begin() + 98);
  near.push_back(1000);
  kv->free(2);
  ASSERT_TRUE(kv->allocate(2, 0));
  const int64_t before = kv->units_in_use();
  EXPECT_EQ(kv->reuse_prefix(2, near, 99), 98);
  EXPECT_EQ(kv->units_in_use(), before + 3) << "one own block per group for positions 96, 97";
  kv->memory().sync();
  for (int32_t layer = 0; layer < 6; ++layer) {
    EXPECT_FALSE(same_row(*kv, layer, 0, 2, 97));
    EXPECT_EQ(k_f32(*kv, layer, 2, 97)[0], static_cast<float>(970 + layer)) << "copied in layer " << layer;
  }
  // The first sequence gone, its held blocks stay findable: the whole prompt again.
  kv->free(0);
  kv->free(1);
  ASSERT_TRUE(kv->allocate(3, 0));
  EXPECT_EQ(kv->reuse_prefix(3, toks, 100), 100);
}

// A long sequence evaluated in chunks, its blocks registered in the prefix cache as they fill: the pool
// grows by the full layers' blocks and a window's worth of the others', not by every layer's.
TEST(KvLayerGroups, ALongSequenceHoldsTheFullLayersAndAWindowOfTheOthers) {
  auto kv = make_paged_kv_cache(hybrid_shape(0, true));
  std::vector<TokenId> toks(240);
  for (size_t i = 0; i < toks.size(); ++i)
    toks[i] = static_cast<TokenId>(i % 17 + 1);
  for (int32_t len = 0; len < 240; len += 16) {
    ASSERT_TRUE(kv->allocate(0, 16));
    kv->register_prefix(0, toks);
    kv->retire(0, len + 16);
  }
  const size_t block = kv->memory().layout().bytes() / static_cast<size_t>(kv->n_units());
  // 60 blocks of the full group; each window group at most its window (8), the slack (32) and a chunk (16).
  EXPECT_LE(kv->stats().bytes_resident, (60 + 2 * ((8 + 32 + 16) / 4 + 2)) * block);
  EXPECT_GE(kv->stats().bytes_resident, (60 + 2 * ((8 + 32) / 4)) * block);
  kv->free(0);
  ASSERT_TRUE(kv->allocate(1, 0));
  EXPECT_EQ(kv->reuse_prefix(1, toks, 240), 240) << "the last window is still there";
}

// Under random allocations, forks, truncations, frees and window releases, every row a query could still
// read — a full layer's at any position, a window layer's in the last window of a sequence whose window is
// readable — equals that of a store that keeps every layer's every position.
void random_operations_against_a_full_store(int32_t sinks);

TEST(KvLayerGroups, ReadableRowsEqualAFullStoresUnderRandomOperations) {
  for (const int32_t sinks : {0, 2}) {
    SCOPED_TRACE("sinks " + std::to_string(sinks));
    random_operations_against_a_full_store(sinks);
  }
}

void random_operations_against_a_full_store(int32_t sinks) {
  KVShape hybrid_s = hybrid_shape();
  hybrid_s.window_retention.sinks = sinks;
  KVShape full_shape = hybrid_s;
  full_shape.window_layers.clear();
  auto hybrid = make_paged_kv_cache(hybrid_s);
  auto full = make_paged_kv_cache(full_shape);
  std::mt19937 g(static_cast<uint32_t>(7 + sinks));
  std::vector<SeqId> live;
  SeqId next = 0;
  const auto put = [](KVCacheStore& kv, SeqId seq, Pos p, float stamp) {
    for (int32_t l = 0; l < 6; ++l) {
      const float x = stamp + static_cast<float>(p * 10 + l);
      loom::test::set_kv_f32(kv, l, 0, seq, p, std::vector<float>(4, x));
      loom::test::set_kv_f32(kv, l, 1, seq, p, std::vector<float>(4, -x));
    }
  };
  float stamp = 0;
  int64_t released = 0;
  for (int step = 0; step < 600; ++step) {
    const int op = static_cast<int>(g() % 10);
    if (op < 4 || live.empty()) {
      const SeqId seq = live.empty() || g() % 3 == 0 ? next++ : live[g() % live.size()];
      const auto n = static_cast<int32_t>(g() % 24);
      const Pos from = full->length(seq);
      if (!hybrid->readable(seq, from, from)) continue; // the engine evaluates such a sequence again
      const bool a = full->allocate(seq, n), b = hybrid->allocate(seq, n);
      ASSERT_EQ(a, b);
      if (!a) continue;
      if (std::find(live.begin(), live.end(), seq) == live.end()) live.push_back(seq);
      for (Pos p = from; p < from + n; ++p) {
        put(*full, seq, p, stamp);
        put(*hybrid, seq, p, stamp);
      }
      stamp += 10000;
      released += hybrid->retire(seq, from + n);
    } else if (op < 6) {
      const SeqId parent = live[g() % live.size()], child = next++;
      ASSERT_EQ(full->fork(parent, child), hybrid->fork(parent, child));
      live.push_back(child);
    } else if (op < 8) {
      const SeqId seq = live[g() % live.size()];
      const auto n = static_cast<int32_t>(g() % static_cast<uint32_t>(full->length(seq) + 1));
      full->truncate(seq, n);
      hybrid->truncate(seq, n);
    } else {
      const size_t i = g() % live.size();
      full->free(live[i]);
      hybrid->free(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    for (const SeqId seq : live) {
      const Pos len = full->length(seq);
      ASSERT_EQ(len, hybrid->length(seq));
      const bool window_readable = hybrid->readable(seq, len, len);
      for (int32_t l = 0; l < 6; ++l) {
        const bool window_layer = hybrid_shape().window_layers[static_cast<size_t>(l)];
        if (window_layer && !window_readable) continue;
        for (Pos p = 0; p < len; ++p)
          if (!window_layer || p < sinks || p >= len - 7) {
            ASSERT_EQ(k_f32(*hybrid, l, seq, p), k_f32(*full, l, seq, p))
                << "seq " << seq << " layer " << l << " pos " << p;
          }
      }
    }
  }
  EXPECT_GT(released, 0) << "windows were released along the way";
}

// A window on every layer (one group, its retention bounded): a prompt resumes from the sinks and the last
// window alone — the released blocks before it need not be found, and the step's chunk counts in admission.
TEST(KvLayerGroups, AWindowOnEveryLayerResumesFromItsLastWindow) {
  KVShape s = hybrid_shape(0, true);
  s.window_layers.clear();
  s.retention = {4, 8};
  auto kv = make_paged_kv_cache(s);
  std::vector<TokenId> toks(100);
  for (size_t i = 0; i < toks.size(); ++i)
    toks[i] = static_cast<TokenId>(i + 1);
  ASSERT_TRUE(kv->allocate(0, 100));
  write(*kv, 0, 0, 100);
  kv->register_prefix(0, toks);
  kv->retire(0, 100);
  ASSERT_TRUE(kv->allocate(2, 40)); // takes evict the released blocks first
  kv->free(0);
  ASSERT_TRUE(kv->allocate(1, 0));
  EXPECT_EQ(kv->reuse_prefix(1, toks, 100), 100);
  EXPECT_TRUE(kv->readable(1, 100, 100));
  EXPECT_EQ(k_f32(*kv, 3, 1, 2)[0], 23.0f) << "a sink";
  EXPECT_EQ(k_f32(*kv, 3, 1, 96)[0], 963.0f);
  const int64_t bound = KVRetention{4, 8}.bound_positions(4) / 4;
  EXPECT_EQ(kv->units_for(1000), bound);
  s.step_positions = 64;
  EXPECT_EQ(make_paged_kv_cache(s)->units_for(1000), bound + 16)
      << "a forward's 64 positions before retiring";
}

TEST(KvLayerGroups, AModelWithoutWindowLayersOrWithOnlyThemHasOneGroup) {
  KVShape s = hybrid_shape(10);
  s.window_layers.assign(6, false);
  EXPECT_EQ(make_paged_kv_cache(s)->memory().layout().n_groups(), 1);
  s.window_layers.assign(6, true); // every layer windowed: one group, its retention bounds everything
  EXPECT_EQ(make_paged_kv_cache(s)->memory().layout().n_groups(), 1);
  s.window_layers = {true, false};
  EXPECT_THROW(make_paged_kv_cache(s), Error);
}

} // namespace
