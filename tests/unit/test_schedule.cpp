// The scheduler's step plan as a function of the engine's state, without a model: KV stores hold only
// their accounting (no memory), requests are described by their pending work and the KV sequences they
// hold, and Scheduler::schedule() returns the actions a step applies — takes within the token budget,
// decodes before prefills, preemption of the newest request for room, a self-preempting decode, a
// request alone ending with max_context — and never changes the store.
#include "loom/engine/scheduler.hpp"
#include "loom/kv/kv_cache.hpp"

#include <gtest/gtest.h>
#include <vector>

namespace {

using namespace loom;
using Op = Scheduler::Action::Op;
using Action = Scheduler::Action;

std::unique_ptr<KVCacheStore> paged(int64_t n_blocks, int32_t block_size = 16, int32_t n_ctx = 256) {
  KVShape s;
  s.n_layer = 1;
  s.n_head_kv = 1;
  s.head_dim = 4;
  s.n_ctx = n_ctx;
  s.n_seq_max = 16;
  s.block_size = block_size;
  s.n_blocks = n_blocks;
  return make_paged_kv_cache(s);
}

// A request whose sequence 0 is KV sequence `kv` holding `held` positions, with `remaining` to evaluate.
Scheduler::RequestState request(KVCacheStore& kv, SeqId id, int32_t held, int32_t remaining, bool decoding) {
  EXPECT_TRUE(kv.allocate(id, held));
  Scheduler::RequestState r;
  r.decoding = decoding;
  r.pending.push_back({0, ModelRole::target, id, remaining});
  r.kv_held.target = {id};
  return r;
}

Action take(size_t req, int32_t n) {
  return {Op::take, req, 0, ModelRole::target, n, StopReason::none};
}
Action preempt(size_t req) {
  return {Op::preempt, req, -1, ModelRole::target, 0, StopReason::none};
}

TEST(Schedule, DecodesFirstThenPrefillChunksWithinTheTokenBudget) {
  auto kv = paged(64);
  Scheduler sch(*kv, 256);
  sch.set_max_batch_tokens(40);
  std::vector<Scheduler::RequestState> reqs;
  reqs.push_back(request(*kv, 0, 0, 100, false)); // a prompt of 100 (oldest)
  reqs.push_back(request(*kv, 1, 20, 1, true));   // a decode
  reqs.push_back(request(*kv, 2, 30, 1, true));   // a decode
  const int64_t free_before = kv->free_units();
  const auto plan = sch.schedule(reqs, nullptr);
  EXPECT_EQ(plan.actions, (std::vector<Action>{take(1, 1), take(2, 1), take(0, 38)}));
  EXPECT_EQ(plan.tokens.target, 40);
  EXPECT_TRUE(plan.preempted.empty());
  // 38 new positions of an empty sequence: 3 blocks; the decodes land in blocks they have (20→21: the
  // second block is there; 30→31 too).
  EXPECT_EQ(plan.units.target, 3);
  EXPECT_EQ(kv->free_units(), free_before) << "planning changes nothing";
  EXPECT_EQ(kv->length(0), 0);
}

TEST(Schedule, TheNewestRequestIsPreemptedForRoomAndWhatItHeldIsCounted) {
  auto kv = paged(6); // 6 blocks of 16
  Scheduler sch(*kv, 256);
  std::vector<Scheduler::RequestState> reqs;
  reqs.push_back(request(*kv, 0, 32, 1, true)); // 2 blocks, full: the next token needs a third
  reqs.push_back(request(*kv, 1, 32, 0, true)); // 2 blocks, nothing pending this step
  reqs.push_back(request(*kv, 2, 32, 0, true)); // 2 blocks (the newest)
  ASSERT_EQ(kv->free_units(), 0);
  const auto plan = sch.schedule(reqs, nullptr);
  // No free block: the newest request not in the batch (2) gives its two back, and 0 takes one.
  EXPECT_EQ(plan.actions, (std::vector<Action>{preempt(2), take(0, 1)}));
  EXPECT_EQ(plan.preempted, (std::vector<size_t>{2}));
  EXPECT_EQ(plan.units.target, 1);
}

TEST(Schedule, ADecodeWithNoNewerRequestPreemptsItself) {
  auto kv = paged(4);
  Scheduler sch(*kv, 256);
  std::vector<Scheduler::RequestState> reqs;
  reqs.push_back(request(*kv, 0, 32, 0, true)); // the oldest holds 2 blocks
  reqs.push_back(request(*kv, 1, 32, 1, true)); // the newest needs a third block: none free
  const auto plan = sch.schedule(reqs, nullptr);
  EXPECT_EQ(plan.actions, (std::vector<Action>{preempt(1)}));
  EXPECT_EQ(plan.tokens.target, 0);
}

TEST(Schedule, APrefillWithNoRoomWaitsForTheNextStep) {
  auto kv = paged(4);
  Scheduler sch(*kv, 256);
  std::vector<Scheduler::RequestState> reqs;
  reqs.push_back(request(*kv, 0, 48, 1, true));  // 3 blocks, the next token needs a fourth: takes it
  reqs.push_back(request(*kv, 1, 0, 20, false)); // a prompt of 20: 2 blocks, none left
  reqs.push_back(request(*kv, 2, 0, 0, true));   // newer, holds nothing
  const auto plan = sch.schedule(reqs, nullptr);
  // The newest holds nothing but preempting it is still tried before the prefill gives up; the prefill
  // is not preempted (a decode is in the batch): it waits.
  EXPECT_EQ(plan.actions, (std::vector<Action>{take(0, 1), preempt(2)}));
}

TEST(Schedule, ARequestAloneThatCannotGrowEndsWithMaxContext) {
  auto kv = paged(2);
  Scheduler sch(*kv, 256);
  std::vector<Scheduler::RequestState> reqs;
  reqs.push_back(request(*kv, 0, 32, 1, true)); // the whole pool, and one more token
  const auto plan = sch.schedule(reqs, nullptr);
  ASSERT_EQ(plan.actions.size(), 1u);
  EXPECT_EQ(plan.actions[0].op, Op::end);
  EXPECT_EQ(plan.actions[0].reason, StopReason::max_context);
}

TEST(Schedule, ASharedPartlyFilledBlockCostsACopyAndIsFreedOnlyWithAllItsHolders) {
  auto kv = paged(8);
  ASSERT_TRUE(kv->allocate(0, 20)); // 2 blocks, the second part full
  ASSERT_TRUE(kv->fork(0, 1));      // 1 shares both
  EXPECT_EQ(kv->units_to_grow(0, 1), 1) << "writing into the shared block needs a private copy";
  EXPECT_EQ(kv->units_to_grow(0, 12), 1) << "positions 20..31 fit in that copy";
  EXPECT_EQ(kv->units_to_grow(0, 13), 2);
  EXPECT_EQ(kv->units_freed_by(std::vector<SeqId>{0}), 0) << "1 still holds both blocks";
  EXPECT_EQ(kv->units_freed_by(std::vector<SeqId>{0, 1}), 2);
  EXPECT_EQ(kv->units_to_grow(0, 300), -1) << "past n_ctx: never";
  // What allocate() then does matches.
  const int64_t before = kv->free_units();
  ASSERT_TRUE(kv->allocate(0, 13));
  EXPECT_EQ(before - kv->free_units(), 2);
}

TEST(Schedule, TheBlockCopiesOfAStepAreListedAndAreTheOnesTheStoreRecords) {
  auto kv = paged(16);
  ASSERT_TRUE(kv->allocate(0, 20)); // blocks b0 (full), b1 (4 of 16)
  ASSERT_TRUE(kv->fork(0, 1));      // beams 0 and 1 share both
  ASSERT_TRUE(kv->allocate(2, 32)); // a third request: two full blocks, nothing shared
  const auto shared = kv->copies_to_grow(0, 1);
  ASSERT_EQ(shared.size(), 1u);
  ASSERT_GE(shared[0].src, 0);
  EXPECT_EQ(shared[0].positions, 4) << "the positions written in the shared block are copied";
  EXPECT_TRUE(kv->copies_to_grow(2, 1).empty()) << "a full last block: a new block, no copy";
  Scheduler sch(*kv, 256);
  std::vector<Scheduler::RequestState> reqs(2);
  reqs[0].decoding = true; // the beams: a token each
  reqs[0].pending = {{0, ModelRole::target, 0, 1}, {1, ModelRole::target, 1, 1}};
  reqs[0].kv_held.target = {0, 1};
  reqs[1].decoding = true;
  reqs[1].pending = {{0, ModelRole::target, 2, 1}};
  reqs[1].kv_held.target = {2};
  const auto plan = sch.schedule(reqs, nullptr);
  ASSERT_EQ(plan.actions.size(), 3u);
  // Each beam's take is planned with a copy of the shared block (an upper bound: the second beam's take
  // then finds it no longer shared).
  ASSERT_EQ(plan.copies.size(), 2u);
  EXPECT_EQ(plan.copies[0], (Scheduler::Schedule::BlockCopy{0, 0, ModelRole::target, shared[0]}));
  EXPECT_EQ(plan.copies[1], (Scheduler::Schedule::BlockCopy{0, 1, ModelRole::target, shared[0]}));
  EXPECT_EQ(kv->memory().queued_copies().size(), 0u) << "planning changes nothing";
  // Applying the takes records one copy, of the listed block, and the second beam writes in place.
  for (const auto& a : plan.actions)
    ASSERT_TRUE(kv->allocate(reqs[a.request].pending[static_cast<size_t>(a.seq)].kv, a.n));
  ASSERT_EQ(kv->memory().queued_copies().size(), 1u);
  EXPECT_EQ(kv->memory().queued_copies()[0].src, shared[0].src);
  EXPECT_EQ(kv->memory().queued_copies()[0].n_positions, 4);
  kv->memory().sync(); // no memory attached: the copies are dropped (nothing was written)
  EXPECT_EQ(kv->memory().queued_copies().size(), 0u);
}

TEST(Schedule, TheContiguousStoreGrowsWithinItsSlab) {
  KVShape s;
  s.n_layer = 1;
  s.n_head_kv = 1;
  s.head_dim = 4;
  s.n_ctx = 64;
  s.n_seq_max = 2;
  auto kv = make_contiguous_kv_cache(s);
  EXPECT_EQ(kv->units_to_grow(0, 10), 1) << "a new sequence takes a slab";
  ASSERT_TRUE(kv->allocate(0, 10));
  EXPECT_EQ(kv->units_to_grow(0, 54), 0);
  EXPECT_EQ(kv->units_to_grow(0, 55), -1);
  EXPECT_EQ(kv->units_freed_by(std::vector<SeqId>{0, 0, 7}), 1);
  Scheduler sch(*kv, 64);
  Scheduler::RequestState r;
  r.decoding = true;
  r.pending.push_back({0, ModelRole::target, 0, 60}); // more than the slab has left: alone, it ends
  r.kv_held.target = {0};
  const auto plan = sch.schedule(std::vector<Scheduler::RequestState>{r}, nullptr);
  ASSERT_EQ(plan.actions.size(), 1u);
  EXPECT_EQ(plan.actions[0].op, Op::end);
}

} // namespace
