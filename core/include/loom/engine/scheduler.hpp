// loom/engine/scheduler.hpp — the one place that decides what goes into a step: which waiting requests
// start (they wait for KV room and a running slot; a request that can never fit is refused with a
// reason) and which planned tokens of which running requests form the batch. Both are functions of
// the engine's state (the KV stores are read, never changed): the engine applies what they return,
// and tests drive them without a model.
#pragma once

#include "loom/engine/decode_session.hpp"
#include "loom/kv/kv_cache.hpp"
#include "loom/model/graph.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace loom {

class Scheduler {
public:
  Scheduler(KVCacheStore& kv, int32_t n_ctx) : kv_(kv), n_ctx_(n_ctx) {}

  void set_max_running(size_t n) noexcept { max_running_ = n > 0 ? n : 1; }
  size_t max_running() const noexcept { return max_running_; }
  // Token rows per forward pass (each model's): decodes first, then prefill chunks with the rest.
  void set_max_batch_tokens(int32_t n) noexcept { max_batch_tokens_ = n > 0 ? n : 1; }
  int32_t max_batch_tokens() const noexcept { return max_batch_tokens_; }

  enum class Admission {
    admit, // start it now
    wait,  // no running slot or no KV room yet: it stays queued (never dropped)
    never, // it cannot fit even with the engine empty; `why` says what and what to do
  };
  struct Decision {
    Admission admission;
    StopReason reason = StopReason::none; // for `never`
    std::string why;
  };
  // For the request at the head of the queue: a prompt of n_prompt tokens, `needed` units of KV to hold
  // its sequences again (a preempted request; its prompt's for a new one: KVCacheStore::units_for).
  Decision admission(size_t n_prompt, int64_t needed, size_t n_running) const;

  // ---- one step: a function of the engine's state that returns what the step does ----

  // What the scheduler reads of a running request (the engine fills it from the request's book; tests
  // write it by hand).
  struct RequestState {
    bool decoding = false;                      // past its prompt: scheduled before the prefills
    bool evicted = false;                       // preempted earlier and not restored: nothing to schedule
    std::vector<SequenceBook::Pending> pending; // its sequences' work left (SequenceBook::pending())
    PerModel<std::vector<SeqId>> kv_held; // the KV sequences it holds on each model (preempting frees them)
  };
  // What a step does, in order: the engine applies the actions one after the other.
  struct Action {
    enum class Op : uint8_t {
      take,    // evaluate the next n tokens of (request, seq): reserve their KV and put them in the batch
      preempt, // evict the request (its KV freed, recomputed when it runs again)
      end,     // end (request, seq) with `reason`: it cannot get KV room even with the engine to itself
    };
    Op op = Op::take;
    size_t request = 0; // index into the states passed to schedule()
    LocalSeq seq = -1;
    ModelRole role = ModelRole::target;
    int32_t n = 0;
    StopReason reason = StopReason::none;
    bool operator==(const Action&) const = default;
  };
  struct Schedule {
    std::vector<Action> actions;
    std::vector<size_t> preempted; // requests preempted (each once), in the order of their actions
    PerModel<int32_t> tokens;      // rows of each model's forward
    PerModel<int64_t> units;       // KV units the takes reserve (blocks, copies of shared blocks)
    // The block copies the takes cause (copy-on-write of a shared last block), in action order: the
    // store records them as the engine applies the takes and the backend runs them before the forward
    // (KVCacheStore::sync). An upper bound, as units: a copy whose sharer is preempted first, or that a
    // co-holder's earlier take already made, is not made.
    struct BlockCopy {
      size_t request = 0;
      LocalSeq seq = -1;
      ModelRole role = ModelRole::target;
      KVCacheStore::GrowCopy copy;
      bool operator==(const BlockCopy&) const = default;
    };
    std::vector<BlockCopy> copies;
  };
  // Requests in admission order (oldest first). Decodes go first, then prefill chunks, within each
  // model's token budget. When the KV store has no room for a chunk, the newest request not yet in the
  // batch is preempted; with none newer, a decode preempts itself and a prefill waits for the next
  // step; a request alone that still does not fit ends that sequence with max_context. Reads the KV
  // stores (kv: the target's; draft: the draft model's, or null) and changes nothing.
  Schedule schedule(std::span<const RequestState> requests, const KVCacheStore* draft) const;

  // The forward pass of one model, built by the engine from the chunks it took: the rows from each
  // sequence's Work::out_from on produce logits.
  struct Batch {
    std::vector<TokenId> tokens;
    std::vector<Pos> positions;
    std::vector<SeqId> seq_ids;
    std::vector<int32_t> out_rows;
    struct Out {
      size_t session; // the request's index
      LocalSeq seq;
      size_t row; // the sequence's logits row (SequenceBook::set_logits)
    };
    std::vector<Out> outs;
    std::vector<size_t> sessions; // requests with tokens in this batch (a failed forward fails them all)
    // Token trees: every row's rope position, tree base and mask, passed on only when some row is in a
    // tree (has_tree).
    std::vector<Pos> rope, tree_base;
    std::vector<uint64_t> tree_mask;
    bool has_tree = false;
    bool empty() const noexcept { return tokens.empty(); }
    BatchView view() const noexcept {
      BatchView v{tokens, positions, seq_ids, out_rows};
      if (has_tree) {
        v.rope_positions = rope;
        v.tree_base = tree_base;
        v.tree_mask = tree_mask;
      }
      return v;
    }
    void add(size_t request, const SequenceBook::Work& w);
  };

private:
  KVCacheStore& kv_;
  int32_t n_ctx_;
  size_t max_running_ = 64;
  int32_t max_batch_tokens_ = 2048;
};

} // namespace loom
