// loom/decode_session.hpp — one request as its decoder sees it (the host side of loom_session).
//
// A request owns sequences (request-local ids; 0 holds the prompt). Each sequence has its tokens,
// its K/V in the store, the logits of its last evaluated token, and its own sampler-chain, stop and
// detokenizer state. The decoder-facing half is what a decoder (built-in or plugin, through the C
// ABI) calls; the engine-facing half is what the engine and its scheduler call around it.
//
// The contract decoders rely on:
//   fork      copies tokens, the used KV positions, logits, sampler/stop/detokenizer state and the
//             released text. Returns -1 when the KV store has no free sequence: a recoverable outcome
//             (go on with fewer sequences, or wait), not an error.
//   truncate  to n tokens (prompt ≤ n ≤ length): tokens, KV, log-probs, released text, stop,
//             detokenizer, stop-plugin and sampler state become what they were when the sequence had
//             n tokens; a finished sequence is live again. The logits are those of the new last token
//             once the sequence has been planned again. Text already streamed is never taken back:
//             a decoder streams (set_stream) only a sequence whose tokens it has committed.
//   free      releases everything the sequence holds (KV, logits, state); its id no longer exists.
#pragma once

#include "loom/kv_cache.hpp"
#include "loom/sampler.hpp"
#include "loom/stop.hpp"
#include "loom/tokenizer.hpp"

#include <cstdint>
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
using StreamCallback = std::function<void(std::string_view text)>;

// A plugin stop criterion (custom rule) as the engine sees it.
class StopPlugin {
public:
  virtual ~StopPlugin() = default;
  // StopReason::none to go on.
  virtual StopReason check(std::span<const TokenId> generated, std::string_view new_text) = 0;
  // Bytes at the end of the text so far that must not be streamed yet.
  virtual size_t holdback_bytes() const { return 0; }
  virtual std::unique_ptr<StopPlugin> clone() const = 0;
};

// What a session needs of the engine: shared, outliving every session.
struct SessionContext {
  const Tokenizer& tok;
  KVCacheStore& kv;
  int32_t n_ctx = 0;
  int32_t n_vocab = 0;
  SeqId next_kv_seq = 0; // KV store ids, unique over the engine's life
  // The pipeline's verifier (score of a prompt and a candidate text, in [0, 1]); empty = none.
  std::function<double(std::string_view prompt, std::string_view text)> verify;
};

// The per-sequence state a new request starts from.
struct SequenceTemplate {
  std::function<std::unique_ptr<Sampler>()> make_chain;
  std::function<std::vector<std::unique_ptr<StopPlugin>>()> make_stop_plugins; // may be empty
  StopConfig stop;
};

class DecodeSession {
public:
  DecodeSession(SessionContext& ctx, RequestId id, std::vector<TokenId> prompt, uint64_t seed,
                int32_t max_new_tokens, StreamCallback cb);
  ~DecodeSession();
  DecodeSession(const DecodeSession&) = delete;
  DecodeSession& operator=(const DecodeSession&) = delete;

  // ---- decoder-facing ----
  int32_t n_vocab() const noexcept { return ctx_.n_vocab; }
  size_t n_prompt() const noexcept { return prompt_.size(); }
  int32_t max_new_tokens() const noexcept { return max_new_tokens_; }

  LocalSeq fork(LocalSeq parent); // -1: no free KV sequence (recoverable)
  void free(LocalSeq seq);
  void truncate(LocalSeq seq, size_t n_tokens);
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
  // A field the decoder adds to the result: one JSON value (validated) under a key that is not one of
  // the result's own fields.
  void set_output(const std::string& key, const std::string& json);
  bool has_verifier() const noexcept { return static_cast<bool>(ctx_.verify); }
  double verify(std::string_view text) const; // the pipeline's verifier on this request's prompt + text
  const std::vector<std::pair<std::string, std::string>>& outputs() const noexcept { return outputs_; }
  std::mt19937_64& rng() noexcept { return rng_; }
  RequestId id() const noexcept { return id_; }

  // ---- engine-facing ----
  // Creates sequence 0 (the prompt) and reserves its KV sequence; false when the store has none free.
  bool open(const SequenceTemplate& tmpl);
  const std::vector<TokenId>& prompt() const noexcept { return prompt_; }

  // One planned sequence's unevaluated tokens, for the scheduler's batch.
  struct Work {
    LocalSeq seq;
    SeqId kv;
    Pos first_pos;                   // position of tokens[0]
    std::span<const TokenId> tokens; // to evaluate
  };
  // Takes this step's plans: every planned sequence with tokens to evaluate. A sequence whose
  // positions the store cannot hold ends with max_context. Marks the tokens as evaluated.
  std::vector<Work> take_work();
  void set_logits(LocalSeq seq, std::span<const float> logits);
  // Ends every live sequence with `reason` (cancel, failure).
  void end_all(StopReason reason);
  // A number that changes whenever the decoder does something (appends, evaluates, ends, forks).
  uint64_t progress() const noexcept;
  bool any_generated() const noexcept;

  struct Outcome {
    LocalSeq seq;
    double score;
    std::vector<TokenId> tokens; // generated
    std::string text;
    std::vector<float> logprobs;
    StopReason stop_reason;
    std::string stop_string;
  };
  // The reported results (sequence 0 with its own score if the decoder reported none), best first.
  std::vector<Outcome> outcomes() const;
  void release(); // frees every sequence's KV

private:
  struct Seq;
  struct Checkpoint;
  Seq& at(LocalSeq seq);
  const Seq& at(LocalSeq seq) const;
  void end_seq(Seq& s, StopReason reason);
  void stream(Seq& s, bool final);
  void checkpoint(Seq& s);

  SessionContext& ctx_;
  RequestId id_;
  std::vector<TokenId> prompt_;
  std::mt19937_64 rng_;
  int32_t max_new_tokens_;
  StreamCallback on_text_;
  std::map<LocalSeq, std::unique_ptr<Seq>> seqs_;
  LocalSeq next_seq_ = 0;
  LocalSeq stream_ = 0;
  size_t streamed_ = 0; // bytes of the streamed sequence's text already handed to on_text_
  std::vector<LocalSeq> planned_;
  std::vector<std::pair<LocalSeq, double>> results_;
  std::vector<std::pair<std::string, std::string>> outputs_; // (key, JSON text)
  uint64_t events_ = 0;                                      // progress counter
  mutable std::optional<std::string> prompt_text_;           // decoded once, for the verifier
};

} // namespace loom
