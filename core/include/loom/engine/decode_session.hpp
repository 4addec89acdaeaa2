// loom/engine/decode_session.hpp — one request as its decoder sees it (the host side of loom_session).
//
// A request owns sequences (request-local ids; 0 holds the prompt). Each sequence has its tokens,
// its K/V in the store, the logits of its last evaluated token, and its own sampler-chain, stop and
// detokenizer state. The bookkeeping — tokens, K/V, logits rows, the step's work, preemption — is the
// request's SequenceBook (loom/engine/sequence_book.hpp), which the engine owns and drives; this
// class is the decoder's face (built-in or plugin, through the C ABI): sampling, stop rules, text and
// streaming, checkpoints for truncate, results — and it drives the book for everything touching K/V.
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
//   draft     uncommitted tokens after the committed ones: the next plan evaluates them in
//             the same forward with a logits row after each; commit(n) takes the first n through the
//             stop rules exactly as append would; append / truncate / set_draft drop the rest (tokens,
//             KV positions, rows). Drafts are never streamed nor seen by stop rules or the chain.
//   models    a sequence lives on the target or on the pipeline's draft model (ModelRole; fork_draft);
//             both kinds are planned alike and each model gets one batched forward per step.
#pragma once

#include "loom/engine/sequence_book.hpp"
#include "loom/sample/sampler.hpp"
#include "loom/sample/stop.hpp"
#include "loom/sdk/decoder.hpp"
#include "loom/tokenizer/tokenizer.hpp"

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

// The per-sequence state a new request starts from.
// Per generated token: the most likely tokens at its position and their log-probabilities.
using TokenAlternatives = std::vector<std::pair<TokenId, float>>;

struct SequenceTemplate {
  std::function<std::unique_ptr<Sampler>()> make_chain;
  // The custom stop criteria (plugins) of a new sequence, run after StopConfig's built-in ones.
  std::function<std::vector<std::unique_ptr<StopCriterion>>()> make_stop_criteria; // may be empty
  StopConfig stop;
};

class DecodeSession {
public:
  // `book` is the request's (the engine owns it, beside this session, and drives it): it outlives the
  // session.
  DecodeSession(SessionContext& ctx, SequenceBook& book, RequestId id, std::vector<TokenId> prompt,
                uint64_t seed, int32_t max_new_tokens, StreamCallback cb);
  ~DecodeSession();
  DecodeSession(const DecodeSession&) = delete;
  DecodeSession& operator=(const DecodeSession&) = delete;

  // The request as its decoder sees it (loom::Session over abi.h's session table, which the host
  // implements on this class), and back: host code — the engine, `loom explain` — may reach past the
  // table to the request itself.
  Session handle() noexcept { return Session(reinterpret_cast<loom_session*>(this)); }
  static DecodeSession& of(const Session& s) noexcept { return *reinterpret_cast<DecodeSession*>(s.raw()); }

  // ---- decoder-facing ----
  int32_t n_vocab() const noexcept { return ctx_.n_vocab; }
  size_t n_prompt() const noexcept { return prompt_.size(); }
  int32_t max_new_tokens() const noexcept { return max_new_tokens_; }

  LocalSeq fork(LocalSeq parent); // -1: no free KV sequence (recoverable)
  void free(LocalSeq seq);
  void truncate(LocalSeq seq, size_t n_tokens);   // also drops the draft
  StopReason append(LocalSeq seq, TokenId token); // drops any draft first
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
  const std::vector<std::pair<std::string, std::string>>& outputs() const noexcept { return outputs_; }
  std::mt19937_64& rng() noexcept { return rng_; }
  RequestId id() const noexcept { return id_; }

  // ---- drafts and token trees (speculative decoding: session_draft.cpp) ----
  // A sequence on the draft model holding parent's committed tokens (none evaluated there yet) and
  // a copy of its sampler/stop state. -1: the draft store has no free sequence (recoverable).
  LocalSeq fork_draft(LocalSeq parent);
  bool has_draft_model() const noexcept { return ctx_.has_draft(); }
  ModelRole role_of(LocalSeq seq) const;
  // Uncommitted tokens after the committed ones: evaluated by the next plan, which then yields a
  // logits row after the committed tokens and after each draft token (logits_at 0..n). Not streamed,
  // not seen by stop rules or the sampler chain until commit(). Replaces an earlier draft; keeps
  // what the context has room for and returns that count.
  size_t set_draft(LocalSeq seq, std::span<const TokenId> tokens);
  size_t n_draft(LocalSeq seq) const;
  // Commits the first n draft tokens in order, as append would (stop rules, streaming, sampler
  // accept); stops early when one ends the sequence (the rest are dropped). Row 1 becomes row 0, ….
  StopReason commit(LocalSeq seq, size_t n);
  // A draft tree: node i is tokens[i], a child of node parents[i] < i (-1: of the last committed
  // token). The next plan evaluates every node in one forward (tree attention: each node sees the
  // committed tokens and its own ancestors) with row 1 + i after node i (row 0: after the committed
  // tokens). Replaces an earlier draft; keeps the first nodes the context has room for, returns how many.
  // At most max_tree_nodes(seq) nodes (0: the backend runs no tree rows — a chain is still accepted) and
  // max_tree_depth(seq) deep.
  size_t set_draft_tree(LocalSeq seq, std::span<const TokenId> tokens, std::span<const int32_t> parents);
  // Commits node `node` of an evaluated tree, a child of the last committed node (or of the root), as
  // append would; its row becomes row 0. Nodes off the committed path are dropped with the tree (the
  // next append, truncate or draft); committed nodes whose K/V are not at their own positions are then
  // evaluated again in the next forward.
  StopReason commit_node(LocalSeq seq, int32_t node);
  int32_t max_tree_nodes(LocalSeq seq) const;
  int32_t max_tree_depth(LocalSeq seq) const;

  // ---- the verifier (session_verifier.cpp) ----
  bool has_verifier() const noexcept { return ctx_.verifier != nullptr; }
  double verify(std::string_view text) const; // the pipeline's verifier on this request's prompt + text
  // The verifier on several texts at once: one outcome each (a failing text fails alone). Throws only
  // when the pipeline names no verifier.
  std::vector<VerifyOutcome> verify_many(std::span<const std::string_view> texts) const;
  size_t verifier_tokens() const noexcept { return verifier_tokens_; }   // rows its verifier calls evaluated
  void set_task(std::string task_json) { task_ = std::move(task_json); } // what the verifier is also given

  // ---- engine-facing ----
  // Creates sequence 0 (the prompt) and reserves its KV sequence; false when the store has none free.
  bool open(const SequenceTemplate& tmpl);
  const std::vector<TokenId>& prompt() const noexcept { return prompt_; }
  // Ends a pending sequence that cannot get KV room even with the engine to itself.
  void end_pending(LocalSeq seq, StopReason reason);
  // Ends every live sequence with `reason` (cancel, failure).
  void end_all(StopReason reason);

  struct Outcome {
    LocalSeq seq;
    double score;
    std::vector<TokenId> tokens; // generated
    std::string text;
    std::vector<float> logprobs;
    StopReason stop_reason;
    std::string stop_string;
    std::vector<TokenAlternatives> top_logprobs; // empty unless set_top_logprobs(k > 0)
  };
  // The reported results (sequence 0 with its own score if the decoder reported none), best first.
  std::vector<Outcome> outcomes() const;
  // Record, for every token committed from now on, the k most likely tokens at its position (0 = off).
  void set_top_logprobs(size_t k) { top_logprobs_ = k; }
  // Whether truncate may be called: when not (the decoder never rolls back), no sequence keeps a
  // checkpoint per committed token, and truncate is an error.
  void set_rollback(bool on) { rollback_ = on; }
  void release() { book_.release(); } // frees every sequence's KV

private:
  struct Seq;
  struct Checkpoint;
  Seq& at(LocalSeq seq);
  const Seq& at(LocalSeq seq) const;
  void end_seq(Seq& s, StopReason reason);
  void stream(Seq& s);
  void checkpoint(Seq& s);
  StopReason commit_token(Seq& s, TokenId token);
  void copy_state(const Seq& p, Seq& c);
  LocalSeq adopt(SequenceBook::Entry e, std::unique_ptr<Seq> s);
  template <class Apply> TokenId sample_with(LocalSeq seq, Seq& s, Apply&& apply);
  SamplerContext sampler_context(const Seq& s);

  SessionContext& ctx_;
  RequestId id_;
  std::vector<TokenId> prompt_;
  std::mt19937_64 rng_;
  std::vector<TokenData> candidates_; // the storage sample() views as Candidates (reused per token)
  int32_t max_new_tokens_;
  StreamCallback on_text_;
  SequenceBook& book_;                            // tokens, K/V, rows, work (by the same ids as seqs_)
  std::map<LocalSeq, std::unique_ptr<Seq>> seqs_; // sampler / stop / detokenizer state, text, results
  LocalSeq stream_ = 0;
  size_t streamed_ = 0; // bytes of the streamed sequence's text already handed to on_text_
  std::vector<std::pair<LocalSeq, double>> results_;
  std::vector<std::pair<std::string, std::string>> outputs_; // (key, JSON text)
  std::vector<std::pair<std::string, double>> metrics_;      // decoder metrics
  mutable size_t verifier_tokens_ = 0;
  const std::string& verifier_prompt() const;      // the prompt's text; NOT_FOUND without a verifier
  mutable std::optional<std::string> prompt_text_; // decoded once, for the verifier
  std::string task_;                               // the request's task (JSON), for the verifier
  size_t top_logprobs_ = 0;                        // alternatives recorded per committed token
  bool rollback_ = true;                           // truncate allowed: checkpoints kept
};

} // namespace loom
