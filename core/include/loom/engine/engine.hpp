// loom/engine/engine.hpp — requests in, batched forward passes, results out.
//
// One step loop serves one request or hundreds (vLLM's EngineCore shape): step() asks the
// scheduler which waiting requests start and gathers the plans of all running requests into one
// batch — sequences of different lengths and positions in one forward — then hands each decoder its
// logits. Each request has its own seeded RNG and its own sampler-chain state per sequence, so its
// tokens never depend on its batch-mates. A request's own path: core/src/pipeline.cpp (tokenize,
// submit) → Engine::step (this file's .cpp) → DecodeSession (decode_session.cpp: append, stop
// rules, streaming) → the decoder.
#pragma once

#include "loom/engine/decode_session.hpp"
#include "loom/engine/sample_decoder.hpp"
#include "loom/engine/scheduler.hpp"
#include "loom/kv/kv_cache.hpp"
#include "loom/model/model.hpp"
#include "loom/sample/sampler.hpp"
#include "loom/sample/stop.hpp"
#include "loom/sdk/executor.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

struct GenerationMetrics {
  double ttft_ms = 0; // submit → first token sampled
  // Of ttft_ms, the forward passes (both models; a long prompt's chunks all) before the first token: the
  // rest is queue_ms and the engine's own work (scheduling, graphs, the first sampling and stop rules).
  double ttft_forward_ms = 0;
  double tpot_ms = 0;       // mean time per output token after the first
  double prefill_tok_s = 0; // prompt tokens evaluated (not from the prefix cache) / their steps' time
  double decode_tok_s = 0;  // tokens after the first / their time
  double total_ms = 0;
  int32_t n_prompt = 0;
  int32_t n_generated = 0;
  // Wall time of the forward passes the request took part in (shared with its batch-mates): the rest
  // of total_ms is the engine's and the decoder's own work, and waiting.
  double forward_ms = 0;
  double draft_forward_ms = 0;                 // on the draft model ([decoder] draft)
  double prefill_ms = 0, draft_prefill_ms = 0; // of them, each model's first forward (the prompt's)
  // The target KV store's peak while the request ran (of every request then running): slabs held,
  // and of them the positions written.
  size_t kv_reserved_peak_bytes = 0;
  size_t tokens_evaluated = 0;          // token rows the target evaluated for this request (prompt once)
  size_t draft_tokens_evaluated = 0;    // on the draft model
  size_t verifier_tokens_evaluated = 0; // by a verifier's model (model_judge) for this request
  size_t draft_kv_copied = 0; // positions whose K/V a draft of the target's layers took from the target
  size_t kv_used_peak_bytes = 0;
  double queue_ms = 0; // submit → first admitted (waiting for a running slot or KV room)
  // Inter-token latency: the gaps between the steps that gave the request new tokens, after the first.
  std::vector<double> itl_ms;
  double itl_p50_ms = 0, itl_p90_ms = 0, itl_max_ms = 0;
  int32_t preemptions = 0;          // times its KV was taken back to make room (then recomputed)
  int32_t cached_prompt_tokens = 0; // prompt positions found in the prefix cache (not evaluated)
  std::vector<std::pair<std::string, double>> decoder; // what the decoder reported (set_metric)
};

struct Hypothesis {
  std::vector<TokenId> tokens;                 // generated ids (an EOS that stopped it included)
  std::string text;                            // its text as the stop rules released it
  std::vector<float> logprobs;                 // per generated token, under the model's raw distribution
  std::vector<TokenAlternatives> top_logprobs; // per generated token (EngineRequest::top_logprobs > 0)
  StopReason stop_reason = StopReason::none;
  std::string stop_string;
  double score = 0; // the decoder's score (sample: sum of log-probs)
};

struct GenerationResult {
  std::vector<TokenId> prompt_tokens; // BOS included
  std::vector<TokenId> tokens;        // best hypothesis
  std::string text;
  std::vector<float> logprobs;
  std::vector<TokenAlternatives> top_logprobs; // per generated token (EngineRequest::top_logprobs > 0)
  StopReason stop_reason = StopReason::none;
  std::string stop_string;
  std::string message; // non-empty: the request failed, and why (the CLI exits 1)
  uint64_t seed = 0;
  GenerationMetrics metrics;
  std::vector<Hypothesis> n_best; // every hypothesis the decoder reported, best first
  std::vector<std::pair<std::string, std::string>> outputs; // decoder fields: (key, JSON text)
};

// The per-request pieces the engine clones from: decoder, and per sequence sampler chain and stop
// rules.
struct RequestTemplate : SequenceTemplate {
  std::function<std::unique_ptr<Decoder>()> make_decoder;
  std::shared_ptr<Verifier> verifier;      // [verifier]; nullptr = none
  std::function<size_t()> verifier_tokens; // optional: token rows the verifier's model evaluated so far
};

struct EngineRequest {
  std::vector<TokenId> prompt;
  uint64_t seed = 0;
  int32_t max_new_tokens = -1;
  StreamCallback on_text;
  std::function<std::unique_ptr<Decoder>()> decoder; // this request's decoder; empty = the pipeline's
  // Called on the stepping thread when the request ends (besides step() returning it).
  std::function<void(RequestId, const GenerationResult&)> on_finish;
  // This request's sampler chain and stop rules (an API request's temperature, stop strings, …); null =
  // the pipeline's. Start from Engine::request_template() to keep its end-of-generation tokens.
  std::shared_ptr<const SequenceTemplate> sequence;
  // Record the k most likely tokens (and their log-probabilities) at each generated position; 0 = off.
  int32_t top_logprobs = 0;
  // The task this request solves, as a JSON object (its tests, its expected output, …): what the
  // pipeline's verifier receives with every candidate besides the prompt; "" = none.
  std::string task{};
};

// What the engine did since it was made (or reset_stats()): the per-run numbers of `loom bench`.
struct EngineStats {
  size_t finished = 0;
  size_t prompt_tokens = 0, output_tokens = 0; // of the finished requests
  size_t preemptions = 0;
  size_t schedule_misses =
      0; // scheduled chunks the KV store refused, or block copies the schedule did not list (0)
  size_t block_copies = 0;         // copy-on-write block copies the steps' takes made (run by the backend)
  size_t cached_prompt_tokens = 0; // of prompt_tokens, found in the prefix cache
  size_t steps = 0, forwards = 0;
  double busy_ms = 0;             // wall time of steps that ran a forward
  double running_ms_integral = 0; // Σ running requests × step time (mean concurrency = this / busy_ms)
  int64_t peak_kv_units = 0;      // the KV store's blocks (paged) or slabs (contiguous) at their most
  size_t peak_batch_tokens = 0;
  // Where the steps' wall time went, in ms summed over steps (`loom bench --profile`): the host's phases
  // of Engine::step, and within `forward` the backends' compute calls (`backend`: for a plugin, the ABI
  // call and the logits' download included) and the copies of the logits into the requests (`logits`).
  struct Phases {
    double admit = 0, plan = 0, schedule = 0, forward = 0, backend = 0, logits = 0, update = 0, finish = 0;
  };
  Phases phase_ms;
};

// A second model decoders may drive sequences on ([decoder] draft): its own backend and KV store,
// the target's vocabulary and context length.
struct DraftModel {
  Model& model;
  Backend& backend;
  KVCacheStore& kv;
  // The draft is the target's own first layers ([decoder] draft_layers): the K/V of those layers for
  // tokens the target has evaluated are the draft's too — copied from the target's store, not evaluated.
  bool target_layers = false;
};

// Threads: submit(), cancel() and wait_for_work() may be called from any thread; everything else,
// step() above all, from one stepping thread. Streaming and finish callbacks run on that thread.
class Engine {
public:
  Engine(Model& model, const Tokenizer& tok, Backend& backend, KVCacheStore& kv, int32_t n_ctx,
         RequestTemplate tmpl, std::optional<DraftModel> draft = std::nullopt);
  ~Engine();

  RequestId submit(EngineRequest req); // thread-safe
  using Finished = std::vector<std::pair<RequestId, GenerationResult>>;
  // Runs one batched forward pass over every running request; returns the requests that finished.
  Finished step();
  bool idle() const noexcept;
  // Ends a waiting or running request (stop_reason cancelled) at the next step, freeing its KV then.
  void cancel(RequestId id); // thread-safe; an unknown or finished id is ignored
  // Blocks until a request was submitted or cancelled since the last step, or the timeout passed.
  bool wait_for_work(std::chrono::milliseconds timeout);
  size_t n_running() const noexcept;
  size_t n_waiting() const noexcept;
  void set_max_running(size_t n) { scheduler_.set_max_running(n); }
  size_t max_running() const noexcept { return scheduler_.max_running(); }
  void set_max_batch_tokens(int32_t n) { scheduler_.set_max_batch_tokens(n); }
  const EngineStats& stats() const noexcept { return stats_; }
  // What a request gets when it names no decoder, chain or stop rules of its own.
  const RequestTemplate& request_template() const noexcept { return tmpl_; }
  void reset_stats() noexcept { stats_ = {}; }

private:
  struct Request;
  struct StepBatch;
  // step()'s phases, in order (engine.cpp).
  void take_incoming();
  void admit(Finished& done);
  std::vector<char> plan_running();
  void release_cancelled();
  StepBatch schedule_batch();
  void apply(const Scheduler::Action& a, StepBatch& step);
  void count_block_copies(const Scheduler::Schedule& sched, ModelRole m, std::span<const KVBlockCopy> made);
  bool forward(StepBatch& step);
  void forward_model(ModelRole m, StepBatch& step);
  void update_evaluated(const std::vector<Request*>& owners);
  void collect_finished(const std::vector<char>& planned, Finished& done);
  void fail_if_stalled(Request& r);
  std::pair<RequestId, GenerationResult> finish_request(Request& r);
  void requeue(std::unique_ptr<Request> r);

  SessionContext ctx_; // the target's and the draft's model slots among what sessions share
  RequestTemplate tmpl_;
  Scheduler scheduler_;
  EngineStats stats_;
  std::vector<float> logits_; // a forward's logits (kept: a step allocates nothing for them)
  static constexpr size_t k_kept_logit_rows = 64; // …up to this many rows (decode batches, drafts)
  std::deque<std::unique_ptr<Request>> waiting_;  // arrival order (preempted requests at their place)
  std::vector<std::unique_ptr<Request>> running_;
  Finished early_; // finished at admission
  // Shared with submitting threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  RequestId next_id_ = 1;
  std::vector<std::unique_ptr<Request>> incoming_;
  std::vector<RequestId> cancels_;
};

} // namespace loom
