// loom/sdk/decoder.hpp — the Decoder interface and the Session it drives: the built-in `sample` decoder
// and a plugin's implement it alike, over the same session table (abi.h: LOOM_API_SESSION). Header-only.
#pragma once

#include "loom/sdk/abi.h"
#include "loom/sdk/host.hpp"
#include "loom/sdk/verifier.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// One request as its decoder sees it: the core (sequences, tokens, logits, sampling, stopping,
// results) here, the rest in facets over their own tables — request() (tokenizer, RNG, the chain's
// distribution, outputs), draft() (speculative decoding), verification() (the pipeline's verifier).
// Sequence 0 holds the prompt. A handle: copy it freely.
class Session {
public:
  explicit Session(loom_session* s) : s_(s) {}
  loom_session* raw() const noexcept { return s_; }

  int32_t n_vocab() const { return info().n_vocab; }
  size_t n_prompt() const { return info().n_prompt; }
  int32_t max_new_tokens() const { return info().max_new_tokens; } // -1: until the context is full
  // -1 when the KV cache has no free sequence (recoverable: go on with fewer sequences).
  loom_seq fork(loom_seq parent) {
    loom_seq child = -1;
    sdk::check(sdk::session_api().seq_fork(s_, parent, &child));
    return child;
  }
  void free(loom_seq seq) { sdk::session_api().seq_free(s_, seq); }
  void truncate(loom_seq seq, size_t n) { sdk::check(sdk::session_api().seq_truncate(s_, seq, n)); }
  // Returns the stop reason the token caused (LOOM_STOP_NONE = go on).
  int32_t append(loom_seq seq, loom_token t) {
    int32_t reason = 0;
    sdk::check(sdk::session_api().seq_append(s_, seq, t, &reason));
    return reason;
  }
  std::span<const loom_token> tokens(loom_seq seq) const { // prompt + generated
    const loom_token* p = nullptr;
    const size_t n = sdk::session_api().seq_tokens(s_, seq, &p);
    return {p, n};
  }
  size_t n_generated(loom_seq seq) const {
    const size_t n = tokens(seq).size(), prompt = n_prompt();
    return n > prompt ? n - prompt : 0;
  }
  int32_t finished(loom_seq seq) const { return sdk::session_api().seq_finished(s_, seq); }
  void plan(loom_seq seq) { sdk::check(sdk::session_api().plan(s_, seq)); }
  std::span<const float> logits(loom_seq seq) const {
    const float* p = sdk::session_api().seq_logits(s_, seq);
    return p ? std::span<const float>(p, static_cast<size_t>(n_vocab())) : std::span<const float>();
  }
  loom_token sample(loom_seq seq) {
    loom_token t = -1;
    sdk::check(sdk::session_api().seq_sample(s_, seq, &t));
    return t;
  }
  float logprob(loom_seq seq, loom_token t) const { return sdk::session_api().seq_logprob(s_, seq, t); }
  void finish(loom_seq seq, int32_t reason, double score) {
    sdk::check(sdk::session_api().seq_finish(s_, seq, reason, score));
  }
  double score(loom_seq seq) const { return sdk::session_api().seq_score(s_, seq); }
  void set_stream(loom_seq seq) { sdk::session_api().set_stream(s_, seq); } // -1: none
  void add_result(loom_seq seq, double score) { sdk::check(sdk::session_api().add_result(s_, seq, score)); }

  class Request;
  class Draft;
  class Verification;
  Request request() const;
  Draft draft() const;
  Verification verification() const;

private:
  loom_session_info info() const {
    loom_session_info i{};
    i.struct_size = sizeof i;
    sdk::session_api().info(s_, &i);
    return i;
  }
  loom_session* s_;
};

// The request beyond its sequences (LOOM_API_REQUEST).
class Session::Request {
public:
  explicit Request(loom_session* s) : s_(s) {}
  // Tokens of a text with the request's tokenizer (add_special: BOS as the model adds it;
  // parse_special: special-token texts are tokens).
  std::vector<loom_token> tokenize(std::string_view text, bool add_special = false,
                                   bool parse_special = false) const {
    std::vector<loom_token> out(text.size() + 2);
    size_t n = sdk::request_api().tokenize(s_, text.data(), text.size(), add_special ? 1 : 0,
                                           parse_special ? 1 : 0, out.data(), out.size());
    if (n > out.size()) {
      out.resize(n);
      n = sdk::request_api().tokenize(s_, text.data(), text.size(), add_special ? 1 : 0,
                                      parse_special ? 1 : 0, out.data(), out.size());
    }
    out.resize(n);
    return out;
  }
  std::string detokenize(std::span<const loom_token> toks) const {
    std::string out(64, '\0');
    size_t n = sdk::request_api().detokenize(s_, toks.data(), toks.size(), out.data(), out.size());
    if (n > out.size()) {
      out.resize(n);
      n = sdk::request_api().detokenize(s_, toks.data(), toks.size(), out.data(), out.size());
    }
    out.resize(n);
    return out;
  }
  // The sampler chain's distribution of seq's next token (row 0): out.size() ≥ n_vocab.
  void probs(loom_seq seq, std::span<float> out) {
    sdk::check(sdk::request_api().seq_probs(s_, seq, out.data(), out.size()));
  }
  double uniform() { return sdk::request_api().uniform(s_); } // [0, 1), the request's RNG
  // A field of the result (`--json` top level): `json` is one JSON value.
  void set_output(const std::string& key, const std::string& json) {
    sdk::check(sdk::request_api().set_output(s_, key.c_str(), json.c_str()));
  }
  void set_metric(const std::string& key, double value) { // metrics.KEY of the result
    sdk::check(sdk::request_api().set_metric(s_, key.c_str(), value));
  }

private:
  loom_session* s_;
};

// Speculative decoding (LOOM_API_DRAFT): uncommitted tokens, rows of logits, token trees, a draft model.
class Session::Draft {
public:
  explicit Draft(loom_session* s) : s_(s) {}
  // Uncommitted tokens after the committed ones, evaluated by the next plan with a logits row after
  // each (logits_at). Returns how many the context had room for.
  size_t set(loom_seq seq, std::span<const loom_token> toks) {
    size_t kept = 0;
    sdk::check(sdk::draft_api().seq_set_draft(s_, seq, toks.data(), toks.size(), &kept));
    return kept;
  }
  // Commits the first n draft tokens (as append would); returns the stop reason they caused.
  int32_t commit(loom_seq seq, size_t n) {
    int32_t reason = 0;
    sdk::check(sdk::draft_api().seq_commit(s_, seq, n, &reason));
    return reason;
  }
  size_t size(loom_seq seq) const { return sdk::draft_api().seq_n_draft(s_, seq); } // uncommitted tokens
  std::span<const float> logits_at(loom_seq seq, size_t row) const {
    const float* p = sdk::draft_api().seq_logits_at(s_, seq, row);
    return p ? std::span<const float>(p, static_cast<size_t>(Session(s_).n_vocab()))
             : std::span<const float>();
  }
  bool has_model() const { return sdk::draft_api().has_draft(s_) == 1; } // [decoder] draft = "x.gguf"
  // A sequence on the pipeline's draft model with parent's committed tokens; -1 when its KV is full.
  loom_seq fork(loom_seq parent) {
    loom_seq child = -1;
    sdk::check(sdk::draft_api().seq_fork_draft(s_, parent, &child));
    return child;
  }
  // Token trees: node i is tokens[i], a child of node parents[i] < i (-1: of the last committed
  // token); evaluated in one forward with row 1 + i after node i. Returns the nodes kept (context room).
  size_t set_tree(loom_seq seq, std::span<const loom_token> tokens, std::span<const int32_t> parents) {
    if (tokens.size() != parents.size()) throw Error("draft().set_tree: one parent per token");
    size_t kept = 0;
    sdk::check(
        sdk::draft_api().seq_set_draft_tree(s_, seq, tokens.data(), parents.data(), tokens.size(), &kept));
    return kept;
  }
  // Commits node `node` (a child of the last committed node, or of the root at first); returns the stop
  // reason it caused. Its row becomes row 0.
  int32_t commit_node(loom_seq seq, int32_t node) {
    int32_t reason = LOOM_STOP_NONE;
    sdk::check(sdk::draft_api().seq_commit_node(s_, seq, node, &reason));
    return reason;
  }
  int32_t max_tree_nodes(loom_seq seq) const { return sdk::draft_api().seq_max_tree_nodes(s_, seq); }
  int32_t max_tree_depth(loom_seq seq) const { return sdk::draft_api().seq_max_tree_depth(s_, seq); }

private:
  loom_session* s_;
};

// The pipeline's verifier ([verifier]) on texts of this request (LOOM_API_VERIFY).
class Session::Verification {
public:
  explicit Verification(loom_session* s) : s_(s) {}
  bool available() const {
    double v = 0;
    sdk::check(sdk::verify_api().verify(s_, nullptr, 0, &v)); // a NULL text only asks
    return v == 1.0;
  }
  // A score in [0, 1]. Throws (LOOM_STATUS_NOT_FOUND) when the pipeline names no verifier: a decoder
  // that needs one says so at start (available()).
  double score(std::string_view text) {
    double v = 0;
    sdk::check(sdk::verify_api().verify(s_, text.data(), text.size(), &v));
    return v;
  }
  // Several texts at once (a judge model scores them in one batched forward): one outcome each — a
  // score, or why that text failed (the others are still scored). Throws only when the pipeline names
  // no verifier.
  std::vector<VerifyOutcome> score_many(std::span<const std::string> texts) {
    std::vector<VerifyOutcome> r(texts.size());
    std::vector<const char*> ptr(texts.size());
    std::vector<size_t> len(texts.size());
    std::vector<double> score(texts.size());
    std::vector<loom_status*> st(texts.size(), nullptr);
    for (size_t i = 0; i < texts.size(); ++i) {
      ptr[i] = texts[i].data();
      len[i] = texts[i].size();
    }
    sdk::check(
        sdk::verify_api().verify_many(s_, ptr.data(), len.data(), texts.size(), score.data(), st.data()));
    for (size_t i = 0; i < texts.size(); ++i) {
      if (st[i]) {
        r[i].error = sdk::core_api().status_message(st[i]);
        sdk::core_api().status_free(st[i]);
      } else {
        r[i].score = score[i];
      }
    }
    return r;
  }

private:
  loom_session* s_;
};

inline Session::Request Session::request() const {
  return Request(s_);
}
inline Session::Draft Session::draft() const {
  return Draft(s_);
}
inline Session::Verification Session::verification() const {
  return Verification(s_);
}

// A search strategy, driven by the engine: each step plan() on every live request, one batched forward
// of every planned sequence, then update() with the logits in place (abi.h: loom_decoder_i has the
// progress rule). The built-in `sample` decoder and a plugin's implement it alike.
class Decoder {
public:
  virtual ~Decoder() = default;
  virtual void start(Session&) {}
  virtual void plan(Session& s) = 0;
  virtual void update(Session& s) = 0;
  virtual bool done(const Session& s) const = 0;
  virtual void results(Session& s) = 0; // s.add_result(seq, score), best first
  // The name in messages (the host names a plugin's by its TOML name).
  virtual std::string_view name() const noexcept { return "decoder"; }
  // Whether it may call truncate (roll a sequence back). One that never does (the built-in `sample`)
  // spares its session a checkpoint of the sampler chain and stop state per committed token; a plugin's
  // decoder is taken to roll back.
  virtual bool rolls_back() const noexcept { return true; }
};

} // namespace loom
