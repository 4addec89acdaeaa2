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
  // For the request at the head of the queue: a prompt of n_prompt tokens, `needed` positions of KV
  // to hold its sequences again (a preempted request; n_prompt for a new one).
  Decision admission(size_t n_prompt, int64_t needed, size_t n_running) const;

  // The forward passes of one step, one per model: chunks of the running requests' pending work; the
  // rows from each sequence's Work::out_from on produce logits.
  struct Batch {
    std::vector<TokenId> tokens;
    std::vector<Pos> positions;
    std::vector<SeqId> seq_ids;
    std::vector<int32_t> out_rows;
    struct Out {
      size_t session; // index into the candidates passed to build()
      LocalSeq seq;
      size_t row; // the sequence's logits row (DecodeSession::set_logits)
    };
    std::vector<Out> outs;
    std::vector<size_t> sessions; // candidates with tokens in this batch (a failed forward fails them all)
    bool empty() const noexcept { return tokens.empty(); }
    BatchView view() const noexcept { return {tokens, positions, seq_ids, out_rows}; }
  };
  struct Candidate {
    DecodeSession* session;
    bool decoding; // past its prompt: scheduled before the prefills
  };
  struct Step {
    std::array<Batch, 2> batches;  // [0]: the target model's; [1]: the draft model's
    std::vector<size_t> preempted; // candidates evicted to make room (newest first): back to the queue
  };
  // Candidates in admission order (oldest first). Decodes go first, then prefill chunks, within the
  // token budget. When the KV store has no room for a chunk, the newest candidate not yet in the
  // batch is preempted (evicted: its KV freed, recomputed when it runs again); with none newer, a
  // decode preempts itself and a prefill waits for the next step; a request alone that still
  // does not fit ends that sequence with max_context.
  Step build(std::span<const Candidate> candidates) const;

private:
  KVCacheStore& kv_;
  int32_t n_ctx_;
  size_t max_running_ = 64;
  int32_t max_batch_tokens_ = 2048;
};

} // namespace loom
