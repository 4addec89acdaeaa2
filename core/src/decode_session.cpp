// One request's sequences: fork / truncate / free, appending with stop rules and streaming, and the
// plans the scheduler turns into batch rows. The contract is in loom/decode_session.hpp.
#include "loom/decode_session.hpp"

#include "loom/error.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace loom {

// A sequence's state once it had prompt + k generated tokens (immutable; shared by forks), so that
// truncate restores exactly what a sequence of that length had — including sampler state that a
// replay of accept() could not rebuild (Mirostat's μ moves in apply()).
struct DecodeSession::Checkpoint {
  std::unique_ptr<Sampler> chain;
  std::vector<std::unique_ptr<StopPlugin>> plugins;
  StopTracker stop;
  DecodeState detok;
  size_t text_size = 0;
  explicit Checkpoint(const StopTracker& st) : stop(st) {}
};

struct DecodeSession::Seq {
  SeqId kv = -1;               // id in the KV store
  std::vector<TokenId> tokens; // prompt + generated
  int32_t n_cached = 0;        // tokens whose K/V are in the store
  std::vector<float> logits;   // of the last evaluated token
  bool has_logits = false;
  std::unique_ptr<Sampler> chain; // this sequence's sampler state
  StopTracker stop;
  std::vector<std::unique_ptr<StopPlugin>> plugins;
  DecodeState detok;
  std::string text; // released text
  std::vector<float> logprobs;
  double logprob_sum = 0;
  StopReason finished = StopReason::none;
  std::string stop_string;
  double final_score = 0;
  bool planned = false;
  std::vector<std::shared_ptr<const Checkpoint>> history; // [k]: after k generated tokens

  explicit Seq(StopConfig cfg) : stop(std::move(cfg)) {}
};

DecodeSession::DecodeSession(SessionContext& ctx, RequestId id, std::vector<TokenId> prompt, uint64_t seed,
                             int32_t max_new_tokens, StreamCallback cb)
    : ctx_(ctx), id_(id), prompt_(std::move(prompt)), rng_(seed), max_new_tokens_(max_new_tokens),
      on_text_(std::move(cb)) {}

DecodeSession::~DecodeSession() {
  release();
}

DecodeSession::Seq& DecodeSession::at(LocalSeq seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end())
    fail(Errc::invalid_argument, "decoder",
         "sequence " + std::to_string(seq) + " does not exist in this request (never forked, or freed)");
  return *it->second;
}
const DecodeSession::Seq& DecodeSession::at(LocalSeq seq) const {
  return const_cast<DecodeSession*>(this)->at(seq);
}

void DecodeSession::checkpoint(Seq& s) {
  auto cp = std::make_shared<Checkpoint>(s.stop);
  cp->chain = s.chain->clone();
  for (const auto& p : s.plugins)
    cp->plugins.push_back(p->clone());
  cp->detok = s.detok;
  cp->text_size = s.text.size();
  const size_t k = s.tokens.size() - prompt_.size();
  s.history.resize(k);
  s.history.push_back(std::move(cp));
}

bool DecodeSession::open(const SequenceTemplate& tmpl) {
  LOOM_ASSERT(seqs_.empty(), "a session is opened once");
  const SeqId kv = ctx_.next_kv_seq;
  if (!ctx_.kv.allocate(kv, 0)) return false;
  ++ctx_.next_kv_seq;
  StopConfig stop_cfg = tmpl.stop;
  stop_cfg.max_tokens = max_new_tokens_;
  auto seq = std::make_unique<Seq>(std::move(stop_cfg));
  seq->kv = kv;
  seq->tokens = prompt_;
  seq->chain = tmpl.make_chain();
  if (tmpl.make_stop_plugins) seq->plugins = tmpl.make_stop_plugins();
  // SentencePiece's leading-space rule applies only when the prompt produced no text.
  std::string prompt_text;
  for (TokenId t : prompt_)
    ctx_.tok.decode_step(seq->detok, t, prompt_text);
  seq->detok.pending.clear();
  checkpoint(*seq);
  seqs_.emplace(next_seq_++, std::move(seq));
  return true;
}

LocalSeq DecodeSession::fork(LocalSeq parent) {
  Seq& p = at(parent);
  const SeqId kv = ctx_.next_kv_seq;
  const bool ok = p.n_cached > 0 ? ctx_.kv.fork(p.kv, kv) : ctx_.kv.allocate(kv, 0);
  if (!ok) return -1; // no free KV sequence: the decoder goes on with fewer
  ++ctx_.next_kv_seq;
  auto c = std::make_unique<Seq>(p.stop.config());
  c->stop = p.stop;
  c->kv = kv;
  c->tokens = p.tokens;
  c->n_cached = p.n_cached;
  c->logits = p.logits;
  c->has_logits = p.has_logits;
  c->chain = p.chain->clone();
  for (const auto& sp : p.plugins)
    c->plugins.push_back(sp->clone());
  c->detok = p.detok;
  c->text = p.text;
  c->logprobs = p.logprobs;
  c->logprob_sum = p.logprob_sum;
  c->finished = p.finished;
  c->stop_string = p.stop_string;
  c->final_score = p.final_score;
  c->history = p.history;
  const LocalSeq id = next_seq_++;
  seqs_.emplace(id, std::move(c));
  ++events_;
  return id;
}

void DecodeSession::free(LocalSeq seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  if (it->second->kv >= 0) ctx_.kv.free(it->second->kv);
  seqs_.erase(it);
  planned_.erase(std::remove(planned_.begin(), planned_.end(), seq), planned_.end());
  std::erase_if(results_, [seq](const auto& r) { return r.first == seq; });
  if (stream_ == seq) stream_ = -1;
  ++events_;
}

void DecodeSession::truncate(LocalSeq seq, size_t n_tokens) {
  Seq& s = at(seq);
  if (n_tokens < prompt_.size() || n_tokens > s.tokens.size())
    fail(Errc::invalid_argument, "decoder",
         "truncate to " + std::to_string(n_tokens) + " tokens is outside [prompt " +
             std::to_string(prompt_.size()) + ", length " + std::to_string(s.tokens.size()) + "]");
  if (n_tokens == s.tokens.size()) return;
  const size_t k = n_tokens - prompt_.size();
  LOOM_ASSERT(k < s.history.size(), "a checkpoint per generated length");
  const Checkpoint& cp = *s.history[k];
  s.history.resize(k + 1);
  s.tokens.resize(n_tokens);
  s.logprobs.resize(k);
  s.logprob_sum = 0;
  for (float lp : s.logprobs)
    s.logprob_sum += static_cast<double>(lp);
  s.chain = cp.chain->clone();
  s.plugins.clear();
  for (const auto& p : cp.plugins)
    s.plugins.push_back(p->clone());
  s.stop = cp.stop;
  s.detok = cp.detok;
  s.text.resize(cp.text_size);
  s.finished = StopReason::none;
  s.stop_string.clear();
  s.final_score = 0;
  // The logits of the new last token: evaluated again when the sequence is next planned.
  s.has_logits = false;
  const auto keep = static_cast<int32_t>(n_tokens) - 1;
  if (s.n_cached > keep) {
    s.n_cached = keep;
    ctx_.kv.truncate(s.kv, keep);
  }
  ++events_;
}

void DecodeSession::stream(Seq& s, bool final) {
  if (!on_text_ || stream_ < 0) return;
  auto it = seqs_.find(stream_);
  if (it == seqs_.end() || it->second.get() != &s) return;
  size_t hold = 0;
  if (!final)
    for (const auto& p : s.plugins)
      hold = std::max(hold, p->holdback_bytes());
  const size_t upto = s.text.size() > hold ? s.text.size() - hold : 0;
  if (upto > streamed_) { // text streamed before a truncate is never taken back (nor repeated)
    on_text_(std::string_view(s.text).substr(streamed_, upto - streamed_));
    streamed_ = upto;
  }
}

void DecodeSession::end_seq(Seq& s, StopReason reason) {
  s.finished = reason;
  ++events_;
  if (reason != StopReason::stop_string) { // held-back text is released (a matched stop string is not)
    std::string tail = s.stop.flush();
    if (reason != StopReason::eos && reason != StopReason::stop_token) ctx_.tok.decode_flush(s.detok, tail);
    s.text += tail;
  }
  stream(s, true);
}

StopReason DecodeSession::append(LocalSeq seq, TokenId token) {
  Seq& s = at(seq);
  if (s.finished != StopReason::none)
    fail(Errc::invalid_argument, "decoder", "append to finished sequence " + std::to_string(seq));
  if (token < 0 || token >= n_vocab())
    fail(Errc::invalid_argument, "decoder", "token " + std::to_string(token) + " is outside the vocabulary");
  const float lp = s.has_logits ? token_logprob(s.logits, token) : 0.0f;
  s.tokens.push_back(token);
  s.logprobs.push_back(lp);
  s.logprob_sum += static_cast<double>(lp);
  s.chain->accept(token);
  s.has_logits = false;
  ++events_;

  const Tokenizer& tok = ctx_.tok;
  std::string piece;
  if (!tok.is_eog(token) || !s.stop.config().eos) tok.decode_step(s.detok, token, piece);
  StopStep st = s.stop.on_token(token, piece);
  s.text += st.emit;
  if (st.reason == StopReason::none) {
    const std::span<const TokenId> gen(s.tokens.data() + prompt_.size(), s.tokens.size() - prompt_.size());
    for (auto& p : s.plugins) {
      const StopReason r = p->check(gen, piece);
      if (r != StopReason::none) {
        st.reason = r;
        break;
      }
    }
  }
  if (st.reason == StopReason::none && static_cast<int32_t>(s.tokens.size()) > ctx_.n_ctx)
    st.reason = StopReason::max_context; // the token just sampled has no position left to be evaluated at
  if (st.reason == StopReason::none && s.stop.timed_out()) st.reason = StopReason::timeout;
  checkpoint(s);
  if (st.reason != StopReason::none) {
    s.stop_string = st.matched;
    end_seq(s, st.reason);
    s.final_score = s.logprob_sum;
  } else {
    stream(s, false);
  }
  return st.reason;
}

const std::vector<TokenId>& DecodeSession::tokens(LocalSeq seq) const {
  return at(seq).tokens;
}
size_t DecodeSession::n_generated(LocalSeq seq) const {
  return at(seq).tokens.size() - prompt_.size();
}
StopReason DecodeSession::finished(LocalSeq seq) const {
  return at(seq).finished;
}

void DecodeSession::plan(LocalSeq seq) {
  Seq& s = at(seq);
  if (s.finished != StopReason::none)
    fail(Errc::invalid_argument, "decoder", "cannot plan finished sequence " + std::to_string(seq));
  if (!s.planned) {
    s.planned = true;
    planned_.push_back(seq);
  }
}

const std::vector<float>* DecodeSession::logits(LocalSeq seq) const {
  const Seq& s = at(seq);
  return s.has_logits ? &s.logits : nullptr;
}

TokenId DecodeSession::sample(LocalSeq seq) {
  Seq& s = at(seq);
  if (!s.has_logits)
    fail(Errc::invalid_argument, "decoder",
         "sequence " + std::to_string(seq) + " has no logits: plan it first");
  SamplerContext sc{
      prompt_, std::span<const TokenId>(s.tokens.data() + prompt_.size(), s.tokens.size() - prompt_.size()),
      &rng_};
  Candidates c = Candidates::from_logits(s.logits);
  s.chain->apply(c, sc);
  if (c.selected < 0 || c.selected >= static_cast<int64_t>(c.data.size()))
    fail(Errc::internal, "sampler", "the sampler chain selected no token");
  return c.data[static_cast<size_t>(c.selected)].id;
}

float DecodeSession::logprob(LocalSeq seq, TokenId token) const {
  const Seq& s = at(seq);
  if (!s.has_logits || token < 0 || token >= n_vocab()) return -INFINITY;
  return token_logprob(s.logits, token);
}

void DecodeSession::finish(LocalSeq seq, StopReason reason, double score) {
  Seq& s = at(seq);
  if (s.finished == StopReason::none) end_seq(s, reason == StopReason::none ? StopReason::custom : reason);
  s.final_score = score;
}

double DecodeSession::score(LocalSeq seq) const {
  return at(seq).logprob_sum;
}

std::string DecodeSession::detokenize(std::span<const TokenId> ids) const {
  for (TokenId t : ids)
    if (t < 0 || t >= n_vocab())
      fail(Errc::invalid_argument, "decoder", "token " + std::to_string(t) + " is outside the vocabulary");
  return ctx_.tok.decode(ids);
}

void DecodeSession::add_result(LocalSeq seq, double score) {
  (void)at(seq);
  results_.emplace_back(seq, score);
}

void DecodeSession::set_output(const std::string& key, const std::string& json) {
  static const char* reserved[] = {"prompt_tokens", "tokens",     "text",    "logprobs", "stop_reason",
                                   "stop_string",   "hypotheses", "message", "seed",     "metrics"};
  if (key.empty() || std::find(std::begin(reserved), std::end(reserved), key) != std::end(reserved))
    fail(Errc::invalid_argument, "decoder",
         "set_output: key " + user_value(key) + " is empty or one of the result's own fields");
  if (!nlohmann::json::accept(json))
    fail(Errc::invalid_argument, "decoder",
         "set_output: the value of " + user_value(key) + " is not one JSON value: " + user_value(json, 80));
  for (auto& [k, v] : outputs_)
    if (k == key) {
      v = json;
      return;
    }
  outputs_.emplace_back(key, json);
}

double DecodeSession::verify(std::string_view text) const {
  if (!ctx_.verify)
    fail(Errc::not_found, "decoder",
         "the pipeline names no verifier; add a [verifier] section (name = a verifier plugin)");
  if (!prompt_text_) prompt_text_ = ctx_.tok.decode(prompt_); // once per request, not per candidate
  return ctx_.verify(*prompt_text_, text);
}

// ---- engine-facing ----

std::vector<DecodeSession::Work> DecodeSession::take_work() {
  std::vector<Work> out;
  for (LocalSeq id : planned_) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    Seq& q = *it->second;
    q.planned = false;
    if (q.finished != StopReason::none || q.kv < 0) continue;
    auto n_new = static_cast<int32_t>(q.tokens.size()) - q.n_cached;
    if (n_new <= 0) {
      if (q.has_logits) continue;                             // logits already current (e.g. a fresh fork)
      q.n_cached = static_cast<int32_t>(q.tokens.size()) - 1; // evaluate the last token again
      ctx_.kv.truncate(q.kv, q.n_cached);
      n_new = 1;
    }
    if (!ctx_.kv.allocate(q.kv, n_new)) {
      end_seq(q, StopReason::max_context);
      continue;
    }
    out.push_back({id, q.kv, q.n_cached,
                   std::span<const TokenId>(q.tokens.data() + q.n_cached, static_cast<size_t>(n_new))});
    q.n_cached += n_new;
    ++events_;
  }
  planned_.clear();
  return out;
}

void DecodeSession::set_logits(LocalSeq seq, std::span<const float> logits) {
  Seq& s = at(seq);
  s.logits.assign(logits.begin(), logits.end());
  s.has_logits = true;
}

void DecodeSession::end_all(StopReason reason) {
  for (auto& [id, q] : seqs_)
    if (q->finished == StopReason::none) end_seq(*q, reason);
}

uint64_t DecodeSession::progress() const noexcept {
  return events_;
}

bool DecodeSession::any_generated() const noexcept {
  for (const auto& [id, q] : seqs_)
    if (q->tokens.size() > prompt_.size()) return true;
  return false;
}

std::vector<DecodeSession::Outcome> DecodeSession::outcomes() const {
  auto reported = results_;
  if (reported.empty() && !seqs_.empty())
    reported.emplace_back(seqs_.begin()->first, seqs_.begin()->second->final_score);
  std::vector<Outcome> out;
  for (const auto& [seq, score] : reported) {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) continue;
    const Seq& q = *it->second;
    out.push_back(
        {seq, score,
         std::vector<TokenId>(q.tokens.begin() + static_cast<std::ptrdiff_t>(prompt_.size()), q.tokens.end()),
         q.text, q.logprobs, q.finished, q.stop_string});
  }
  return out;
}

void DecodeSession::release() {
  for (auto& [id, q] : seqs_)
    if (q->kv >= 0) {
      ctx_.kv.free(q->kv);
      q->kv = -1;
    }
}

} // namespace loom
