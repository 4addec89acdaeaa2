// loom/scheduler.hpp — the one place that decides what goes into a step: which waiting requests
// start (they wait for KV room and a running slot; a request that can never fit is refused with a
// reason) and which planned tokens of which running requests form the batch.
#pragma once

#include "loom/decode_session.hpp"
#include "loom/graph.hpp"
#include "loom/kv_cache.hpp"

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
  // For the request at the head of the queue, with a prompt of n_prompt tokens.
  Decision admission(size_t n_prompt, size_t n_running) const;

  // The forward passes of one step, one per model: every planned sequence's unevaluated tokens; the
  // rows from each sequence's Work::out_from on produce logits (its last row only, unless drafts
  // were evaluated).
  struct Batch {
    std::vector<TokenId> tokens;
    std::vector<Pos> positions;
    std::vector<SeqId> seq_ids;
    std::vector<int32_t> out_rows;
    struct Out {
      size_t session; // index into the sessions passed to build()
      LocalSeq seq;
      size_t row; // the sequence's logits row (DecodeSession::set_logits)
    };
    std::vector<Out> outs;
    bool empty() const noexcept { return tokens.empty(); }
    BatchView view() const noexcept { return {tokens, positions, seq_ids, out_rows}; }
  };
  // [0]: the target model's batch; [1]: the draft model's.
  std::array<Batch, 2> build(std::span<DecodeSession* const> sessions) const;

private:
  KVCacheStore& kv_;
  int32_t n_ctx_;
  size_t max_running_ = 64;
};

} // namespace loom
