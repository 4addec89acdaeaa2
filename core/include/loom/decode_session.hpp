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
//   draft     (ABI 1.3) uncommitted tokens after the committed ones: the next plan evaluates them in
//             the same forward with a logits row after each; commit(n) takes the first n through the
//             stop rules exactly as append would; append / truncate / set_draft drop the rest (tokens,
//             KV positions, rows). Drafts are never streamed nor seen by stop rules or the chain.
//   models    a sequence lives on the target (0) or on the pipeline's draft model (1, fork_draft);
//             both kinds are planned alike and each model gets one batched forward per step.
#pragma once

#include "loom/attention.hpp"
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

// What a session needs of the engine: shared, outliving every session.
struct SessionContext {
  const Tokenizer& tok;
  KVCacheStore& kv;
  int32_t n_ctx = 0;
  int32_t n_vocab = 0;
  // KV store ids (both stores): unique among the sequences alive. An id goes back to free_kv_seqs when its
  // sequence ends for good (freed, or its request released) — not when it is only evicted — and is used
  // again first, so ids stay below the most sequences ever alive at once and never wrap however many
  // forks a long-running engine makes.
  SeqId next_kv_seq = 0; // never used yet
  std::vector<SeqId> free_kv_seqs;
  SeqId kv_seq_to_take() const noexcept { return free_kv_seqs.empty() ? next_kv_seq : free_kv_seqs.back(); }
  void take_kv_seq(SeqId id) { // after the store allocated kv_seq_to_take()
    if (!free_kv_seqs.empty() && free_kv_seqs.back() == id)
      free_kv_seqs.pop_back();
    else
      ++next_kv_seq;
  }
  KVCacheStore* draft_kv = nullptr; // the draft model's KV store ([decoder] draft); null = no draft model
  // The pipeline's verifier (score of a prompt and a candidate text, in [0, 1]); empty = none.
  std::function<double(std::string_view prompt, std::string_view text)> verify;
  // What the target's (0) and the draft's (1) attention still reads of a sequence: with a bounded
  // window the rest is released from the store after every forward.
  KVRetention retention[2];
};

// The per-sequence state a new request starts from.
struct SequenceTemplate {
  std::function<std::unique_ptr<Sampler>()> make_chain;
  // The custom stop criteria (plugins) of a new sequence, run after StopConfig's built-in ones.
  std::function<std::vector<std::unique_ptr<StopCriterion>>()> make_stop_criteria; // may be empty
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
  // A sequence on the draft model holding parent's committed tokens (none evaluated there yet) and
  // a copy of its sampler/stop state. -1: the draft store has no free sequence (recoverable).
  LocalSeq fork_draft(LocalSeq parent);
  bool has_draft_model() const noexcept { return ctx_.draft_kv != nullptr; }
  int model_of(LocalSeq seq) const; // 0 target, 1 draft
  void free(LocalSeq seq);
  void truncate(LocalSeq seq, size_t n_tokens);   // also drops the draft
  StopReason append(LocalSeq seq, TokenId token); // drops any draft first
  // Uncommitted tokens after the committed ones: evaluated by the next plan, which then yields a
  // logits row after the committed tokens and after each draft token (logits_at 0..n). Not streamed,
  // not seen by stop rules or the sampler chain until commit(). Replaces an earlier draft; keeps
  // what the context has room for and returns that count.
  size_t set_draft(LocalSeq seq, std::span<const TokenId> tokens);
  size_t n_draft(LocalSeq seq) const;
  // Commits the first n draft tokens in order, as append would (stop rules, streaming, sampler
  // accept); stops early when one ends the sequence (the rest are dropped). Row 1 becomes row 0, ….
  StopReason commit(LocalSeq seq, size_t n);
  // The distribution the request's sampler chain draws seq's next token from (its state, row 0):
  // out[n_vocab], zeros for tokens the chain removed; one-hot for a deterministic selector.
  void probs(LocalSeq seq, std::span<float> out);
  const float* logits_at(LocalSeq seq, size_t row) const; // nullptr unless evaluated
  // A decoder metric (`run --json` → metrics): replaces an earlier value of the key.
  void set_metric(const std::string& key, double value);
  const std::vector<std::pair<std::string, double>>& metrics() const noexcept { return metrics_; }
  double uniform();                                       // [0, 1) from the request's RNG
  const std::vector<TokenId>& tokens(LocalSeq seq) const; // committed
  size_t n_generated(LocalSeq seq) const;
  StopReason finished(LocalSeq seq) const;
  bool exists(LocalSeq seq) const noexcept { return seqs_.count(seq) != 0; }
  void plan(LocalSeq seq);
  const float* logits(LocalSeq seq) const; // [n_vocab] of the last committed token; nullptr if none
  TokenId sample(LocalSeq seq);
  // sample() with the chain's stages reported (SamplerChain::apply_traced); the same token and RNG.
  TokenId
  sample_traced(LocalSeq seq,
                const std::function<void(size_t stage, const Sampler* s, const Candidates& c)>& after);
  float logprob(LocalSeq seq, TokenId token) const;
  void finish(LocalSeq seq, StopReason reason, double score);
  double score(LocalSeq seq) const;
  void set_stream(LocalSeq seq) noexcept { stream_ = seq; }
  std::string detokenize(std::span<const TokenId> ids) const;
  // The request's tokenizer on a text: add_special adds BOS/EOS as the model's metadata says;
  // parse_special matches special-token texts.
  std::vector<TokenId> tokenize(std::string_view text, bool add_special, bool parse_special) const;
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
    int model = 0; // 0 target, 1 draft
    SeqId kv = -1;
    Pos first_pos = 0;           // position of tokens[0]
    std::vector<TokenId> tokens; // to evaluate
    Pos out_from = 0;            // positions ≥ out_from produce logits rows …
    int32_t first_row = 0;       // … rows first_row, first_row + 1, … (set_logits)
  };
  // Turns this step's plans into pending work: each planned sequence's tokens without K/V (the
  // committed ones a truncate or a preemption dropped, the new ones, the drafts) and the logits rows
  // it owes. Reserves nothing: the scheduler takes the work in chunks (take_chunk) as its token budget
  // and the KV store allow, over one step or several; the decoder is called again only when
  // work_pending() is false.
  void begin_work();
  bool work_pending() const noexcept;
  struct Pending {
    LocalSeq seq;
    int model = 0;
    SeqId kv = -1;         // its sequence in that model's KV store
    int32_t remaining = 0; // tokens left to evaluate
  };
  std::vector<Pending> pending() const;
  // The KV store sequences this request holds on a model (0 target, 1 draft): what preempting it frees.
  std::vector<SeqId> kv_held(int model) const;
  // The next (at most n) tokens of a pending sequence, their KV positions reserved; nullopt, changing
  // nothing, when the store has no room for them.
  std::optional<Work> take_chunk(LocalSeq seq, int32_t n);
  // The forward passes of this step's chunks ran (their rows are set; their full blocks become
  // findable by content for later requests).
  void chunks_evaluated();
  // Prompt positions found in the prefix cache when the request started (not evaluated again).
  int32_t cached_prompt() const noexcept { return cached_prompt_; }
  // Ends a pending sequence that cannot get KV room even with the engine to itself.
  void end_pending(LocalSeq seq, StopReason reason);
  // Preemption: every sequence's K/V and KV sequence id are given back (logits rows, tokens and all
  // other state stay); its pending work, and any later plan, evaluates from position 0 once restore()
  // got the ids back.
  void evict();
  bool evicted() const noexcept { return evicted_; }
  bool restore(); // false, holding nothing, when the stores lack free sequences
  // Positions the live sequences hold or will need once their pending work is done (admission of a
  // preempted request).
  int64_t positions_needed() const noexcept;
  // Tokens generated so far by the sequence with the most (metrics: inter-token latency).
  size_t max_generated() const noexcept;
  void set_logits(LocalSeq seq, size_t row, std::span<const float> logits);
  // Ends every live sequence with `reason` (cancel, failure).
  void end_all(StopReason reason);
  // A number that changes whenever the decoder does something (appends, evaluates, ends, forks).
  uint64_t progress() const noexcept;
  // Token rows evaluated for this request so far, on the target (0) and on the draft model (1).
  size_t evaluated(int model) const noexcept { return evaluated_[model == 0 ? 0 : 1]; }
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
  // A finished sequence's K/V go back to the store at once (not while its chunk is in flight: then after
  // the forward). A decoder that truncates it back to life has it evaluated again.
  void drop_kv(Seq& s);
  void stream(Seq& s, bool final);
  void checkpoint(Seq& s);
  StopReason commit_token(Seq& s, TokenId token);
  void copy_state(const Seq& p, Seq& c);
  LocalSeq adopt(std::unique_ptr<Seq> s);
  void drop_draft(Seq& s);
  void uncache(Seq& s, int32_t keep); // K/V of positions ≥ keep dropped
  KVCacheStore& kv_of(int model) const;
  template <class Apply> TokenId sample_with(LocalSeq seq, Seq& s, Apply&& apply);

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
  bool evicted_ = false;
  int32_t cached_prompt_ = 0;
  std::vector<std::pair<LocalSeq, double>> results_;
  std::vector<std::pair<std::string, std::string>> outputs_; // (key, JSON text)
  std::vector<std::pair<std::string, double>> metrics_;      // decoder metrics
  size_t evaluated_[2] = {0, 0};
  uint64_t events_ = 0;                            // progress counter
  mutable std::optional<std::string> prompt_text_; // decoded once, for the verifier
};

} // namespace loom
