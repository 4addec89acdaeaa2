// loom/engine.hpp — requests in, batched forward passes, results out.
//
// One step loop serves one request or hundreds (vLLM's EngineCore shape): step() gathers the plans
// of all running requests into one batch — sequences of different lengths and positions in one
// forward — and hands each decoder its logits. Each request has its own seeded RNG and its own
// sampler-chain state per sequence, so its tokens never depend on its batch-mates.
#pragma once

#include "loom/backend.hpp"
#include "loom/decoder.hpp"
#include "loom/kv_cache.hpp"
#include "loom/model.hpp"
#include "loom/sampler.hpp"
#include "loom/stop.hpp"
#include "loom/tokenizer.hpp"

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

using RequestId = int64_t;
using LocalSeq = int32_t; // request-local sequence id (0 = the prompt sequence)

struct GenerationMetrics {
  double ttft_ms = 0;       // submit → first token sampled
  double tpot_ms = 0;       // mean time per output token after the first
  double prefill_tok_s = 0; // prompt tokens / time of the step that evaluated the prompt
  double decode_tok_s = 0;  // tokens after the first / their time
  double total_ms = 0;
  int32_t n_prompt = 0;
  int32_t n_generated = 0;
};

struct Hypothesis {
  std::vector<TokenId> tokens; // generated ids (an EOS that stopped it included)
  std::string text;            // its text as the stop rules released it
  std::vector<float> logprobs; // per generated token, under the model's raw distribution
  StopReason stop_reason = StopReason::none;
  std::string stop_string;
  double score = 0; // the decoder's score (sample: sum of log-probs)
};

struct GenerationResult {
  std::vector<TokenId> prompt_tokens; // BOS included
  std::vector<TokenId> tokens;        // best hypothesis
  std::string text;
  std::vector<float> logprobs;
  StopReason stop_reason = StopReason::none;
  std::string stop_string;
  std::string message; // why the request ended early (e.g. the prompt did not fit)
  uint64_t seed = 0;
  GenerationMetrics metrics;
  std::vector<Hypothesis> n_best; // every hypothesis the decoder reported, best first
};

using StreamCallback = std::function<void(std::string_view text)>;

// The per-request pieces the engine clones from: sampler chain, stop rules, decoder.
struct RequestTemplate {
  std::function<std::unique_ptr<Decoder>()> make_decoder;
  std::function<std::unique_ptr<Sampler>()> make_chain;                              // a fresh SamplerChain
  std::function<std::vector<std::unique_ptr<class StopPlugin>>()> make_stop_plugins; // may be empty
  StopConfig stop;
};

struct EngineRequest {
  std::vector<TokenId> prompt;
  uint64_t seed = 0;
  int32_t max_new_tokens = -1;
  StreamCallback on_text;
};

// A plugin stop criterion (custom rule) as the engine sees it.
class StopPlugin {
public:
  virtual ~StopPlugin() = default;
  // StopReason::none to go on.
  virtual StopReason check(std::span<const TokenId> generated, std::string_view new_text) = 0;
  virtual std::unique_ptr<StopPlugin> clone() const = 0;
};

class Engine {
public:
  Engine(Model& model, const Tokenizer& tok, Backend& backend, KVCacheStore& kv, int32_t n_ctx,
         RequestTemplate tmpl);
  ~Engine();

  RequestId submit(EngineRequest req);
  // Runs one batched forward pass over every running request; returns the requests that finished.
  std::vector<std::pair<RequestId, GenerationResult>> step();
  bool idle() const noexcept;
  void cancel(RequestId id);
  size_t n_running() const noexcept;
  void set_max_running(size_t n) { max_running_ = n; }

private:
  friend class DecodeSession;
  struct Request;
  std::pair<RequestId, GenerationResult> finish_request(Request& r);

  Model& model_;
  const Tokenizer& tok_;
  Backend& backend_;
  KVCacheStore& kv_;
  int32_t n_ctx_;
  RequestTemplate tmpl_;
  size_t max_running_ = 64;
  RequestId next_id_ = 1;
  SeqId next_kv_seq_ = 0;
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> running_;
  std::vector<std::pair<RequestId, GenerationResult>> early_; // finished at admission
};

// One request as its decoder sees it (the host side of loom_session).
class DecodeSession {
public:
  int32_t n_vocab() const noexcept;
  size_t n_prompt() const noexcept { return prompt_.size(); }
  int32_t max_new_tokens() const noexcept { return max_new_tokens_; }

  LocalSeq fork(LocalSeq parent); // copies tokens, KV, logits, sampler and stop state
  void free(LocalSeq seq);
  void truncate(LocalSeq seq, size_t n_tokens); // rolls back tokens and KV (not below the prompt)
  StopReason append(LocalSeq seq, TokenId token);
  const std::vector<TokenId>& tokens(LocalSeq seq) const;
  size_t n_generated(LocalSeq seq) const;
  StopReason finished(LocalSeq seq) const;
  bool exists(LocalSeq seq) const noexcept { return seqs_.count(seq) != 0; }
  void plan(LocalSeq seq);
  const std::vector<float>* logits(LocalSeq seq) const; // nullptr if none
  TokenId sample(LocalSeq seq);
  float logprob(LocalSeq seq, TokenId token) const;
  void finish(LocalSeq seq, StopReason reason, double score);
  double score(LocalSeq seq) const;
  void set_stream(LocalSeq seq) noexcept { stream_ = seq; }
  std::string detokenize(std::span<const TokenId> ids) const;
  void add_result(LocalSeq seq, double score);
  std::mt19937_64& rng() noexcept { return rng_; }
  RequestId id() const noexcept { return id_; }

private:
  friend class Engine;
  struct Seq;
  DecodeSession(Engine& e, RequestId id, std::vector<TokenId> prompt, uint64_t seed, int32_t max_new_tokens,
                StreamCallback cb);
  Seq& at(LocalSeq seq);
  const Seq& at(LocalSeq seq) const;
  void end_seq(Seq& s, StopReason reason);

  Engine& engine_;
  RequestId id_;
  std::vector<TokenId> prompt_;
  std::mt19937_64 rng_;
  int32_t max_new_tokens_;
  StreamCallback on_text_;
  std::map<LocalSeq, std::unique_ptr<Seq>> seqs_;
  LocalSeq next_seq_ = 0;
  LocalSeq stream_ = 0;
  std::vector<LocalSeq> planned_;
  std::vector<std::pair<LocalSeq, double>> results_;
};

} // namespace loom
