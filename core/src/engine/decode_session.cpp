// One request's sequences: fork / truncate / free, appending with stop rules and streaming, sampling, and
// the plans the scheduler turns into batch rows. The contract is in loom/engine/decode_session.hpp; drafts
// and token trees are in session_draft.cpp, the verifier in session_verifier.cpp.
#include "loom/engine/decode_session.hpp"

#include "engine/session_state.hpp"
#include "loom/error.hpp"
#include "loom/sample/logprobs.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace loom {

DecodeSession::DecodeSession(SessionContext& ctx, SequenceBook& book, RequestId id,
                             std::vector<TokenId> prompt, uint64_t seed, int32_t max_new_tokens,
                             StreamCallback cb)
    : ctx_(ctx), id_(id), prompt_(std::move(prompt)), rng_(seed), max_new_tokens_(max_new_tokens),
      on_text_(std::move(cb)), book_(book) {}

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
  if (!rollback_) return; // truncate is refused: nothing to keep
  auto cp = std::make_shared<Checkpoint>(s.stop);
  cp->chain = s.chain->clone();
  cp->detok = s.detok;
  cp->text_size = s.text.size();
  const size_t k = s.e->tokens.size() - prompt_.size();
  s.history.resize(k);
  s.history.push_back(std::move(cp));
}

bool DecodeSession::open(const SequenceTemplate& tmpl) {
  LOOM_ASSERT(seqs_.empty(), "a session is opened once");
  const SeqId kv = book_.new_kv(ModelRole::target, -1, false);
  if (kv < 0) return false;
  FreeKvOnThrow undo{book_, ModelRole::target, kv};
  StopConfig stop_cfg = tmpl.stop;
  stop_cfg.max_tokens = max_new_tokens_;
  auto seq = std::make_unique<Seq>(StopTracker(
      std::move(stop_cfg),
      tmpl.make_stop_criteria ? tmpl.make_stop_criteria() : std::vector<std::unique_ptr<StopCriterion>>{}));
  SequenceBook::Entry e;
  e.kv = kv;
  e.tokens = prompt_;
  // Blocks of an earlier request with the same leading tokens (the last prompt token is evaluated
  // here in any case: its logits are the first distribution).
  e.n_cached = ctx_.kv().reuse_prefix(kv, prompt_, static_cast<int32_t>(prompt_.size()) - 1);
  book_.set_cached_prompt(e.n_cached);
  seq->chain = tmpl.make_chain();
  // SentencePiece's leading-space rule applies only when the prompt produced no text.
  std::string prompt_text;
  for (TokenId t : prompt_)
    ctx_.tok.decode_step(seq->detok, t, prompt_text);
  seq->detok.pending.clear();
  undo.armed = false;
  const LocalSeq id = adopt(std::move(e), std::move(seq));
  checkpoint(*seqs_.at(id));
  return true;
}
LocalSeq DecodeSession::fork(LocalSeq parent) {
  Seq& p = at(parent);
  const SequenceBook::Entry& pe = *p.e;
  const SeqId kv = book_.new_kv(pe.role, pe.kv, pe.n_cached > 0);
  if (kv < 0) return -1; // no free KV sequence: the decoder goes on with fewer
  FreeKvOnThrow undo{book_, pe.role, kv};
  auto c = std::make_unique<Seq>(p.stop); // clones the stop criteria: may throw
  SequenceBook::Entry e;
  e.role = pe.role;
  e.kv = kv;
  e.tokens = pe.tokens;
  e.draft = pe.draft;
  e.n_cached = pe.n_cached;
  e.finished = pe.finished;
  e.mirror = pe.mirror;
  if (pe.n_rows > 0) {
    const auto V = static_cast<size_t>(n_vocab());
    e.rows.assign(pe.rows.begin() + static_cast<std::ptrdiff_t>(pe.row_off * V),
                  pe.rows.begin() + static_cast<std::ptrdiff_t>((pe.row_off + pe.n_rows) * V));
    e.n_rows = pe.n_rows;
  }
  copy_state(p, *c); // clones plugin state: may throw
  undo.armed = false;
  return adopt(std::move(e), std::move(c));
}
// What a fork carries besides tokens, K/V, logits and stop state: sampler / detokenizer state, text,
// log-probs, the end state and the per-length checkpoints.
void DecodeSession::copy_state(const Seq& p, Seq& c) {
  c.chain = p.chain->clone();
  c.detok = p.detok;
  c.text = p.text;
  c.logprobs = p.logprobs;
  c.top = p.top;
  c.logprob_sum = p.logprob_sum;
  c.finished = p.finished;
  c.stop_string = p.stop_string;
  c.final_score = p.final_score;
  c.history = p.history;
}

LocalSeq DecodeSession::adopt(SequenceBook::Entry e, std::unique_ptr<Seq> s) {
  const LocalSeq id = book_.add(std::move(e));
  s->e = book_.find(id);
  seqs_.emplace(id, std::move(s));
  return id;
}
void DecodeSession::set_metric(const std::string& key, double value) {
  if (key.empty()) fail(Errc::invalid_argument, "decoder", "set_metric: the key is empty");
  if (!std::isfinite(value))
    fail(Errc::invalid_argument, "decoder", "set_metric: " + user_value(key) + " is not a finite number");
  for (auto& [k, v] : metrics_)
    if (k == key) {
      v = value;
      return;
    }
  metrics_.emplace_back(key, value);
}

double DecodeSession::uniform() {
  return rng_uniform(&rng_);
}

void DecodeSession::free(LocalSeq seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  seqs_.erase(it);
  book_.erase(seq); // its K/V and KV id
  std::erase_if(results_, [seq](const auto& r) { return r.first == seq; });
  if (stream_ == seq) stream_ = -1;
}
void DecodeSession::truncate(LocalSeq seq, size_t n_tokens) {
  Seq& s = at(seq);
  SequenceBook::Entry& e = *s.e;
  if (n_tokens < prompt_.size() || n_tokens > e.tokens.size())
    fail(Errc::invalid_argument, "decoder",
         "truncate to " + std::to_string(n_tokens) + " tokens is outside [prompt " +
             std::to_string(prompt_.size()) + ", length " + std::to_string(e.tokens.size()) + "]");
  book_.drop_draft(e);
  if (n_tokens == e.tokens.size() && s.finished == StopReason::none) return;
  if (!rollback_)
    fail(Errc::invalid_argument, "decoder",
         "truncate: this request's decoder said it never rolls back (Decoder::rolls_back() is false), so "
         "no checkpoints were kept");
  const size_t k = n_tokens - prompt_.size();
  LOOM_ASSERT(k < s.history.size(), "a checkpoint per generated length");
  const Checkpoint& cp = *s.history[k];
  s.history.resize(k + 1);
  s.logprobs.resize(k);
  if (s.top.size() > k) s.top.resize(k);
  s.logprob_sum = 0;
  for (float lp : s.logprobs)
    s.logprob_sum += static_cast<double>(lp);
  s.chain = cp.chain->clone();
  s.stop = cp.stop;
  s.detok = cp.detok;
  s.text.resize(cp.text_size);
  s.finished = StopReason::none;
  s.stop_string.clear();
  s.final_score = 0;
  book_.rewind(e, n_tokens); // tokens, K/V and rows (its logits are evaluated again when planned)
}
void DecodeSession::stream(Seq& s) {
  if (!on_text_ || stream_ < 0) return;
  auto it = seqs_.find(stream_);
  if (it == seqs_.end() || it->second.get() != &s) return;
  // s.text holds only released text: what the stop criteria hold back is in s.stop.
  const size_t upto = s.text.size();
  if (upto > streamed_) { // text streamed before a truncate is never taken back (nor repeated)
    on_text_(std::string_view(s.text).substr(streamed_, upto - streamed_));
    streamed_ = upto;
  }
}
void DecodeSession::end_seq(Seq& s, StopReason reason) {
  s.finished = reason;
  s.e->finished = true;
  book_.drop_kv(*s.e);
  book_.note();
  if (reason != StopReason::stop_string) { // held-back text is released (a matched stop string is not)
    std::string tail = s.stop.flush();
    if (reason != StopReason::eos && reason != StopReason::stop_token) ctx_.tok.decode_flush(s.detok, tail);
    s.text += tail;
  }
  stream(s);
}

StopReason DecodeSession::append(LocalSeq seq, TokenId token) {
  Seq& s = at(seq);
  if (s.finished != StopReason::none)
    fail(Errc::invalid_argument, "decoder", "append to finished sequence " + std::to_string(seq));
  if (token < 0 || token >= n_vocab())
    fail(Errc::invalid_argument, "decoder", "token " + std::to_string(token) + " is outside the vocabulary");
  book_.drop_draft(*s.e); // an append replaces whatever was drafted after the committed tokens
  return commit_token(s, token);
}

// Commits `token` as the next token of s (the first draft token, when commit() calls it): its
// log-prob under row 0, the sampler chain's accept, the stop rules, streaming and a checkpoint.
StopReason DecodeSession::commit_token(Seq& s, TokenId token) {
  SequenceBook::Entry& e = *s.e;
  const float* row0 = book_.row(e, 0);
  const float lp =
      row0 ? token_logprob(std::span<const float>(row0, static_cast<size_t>(n_vocab())), token) : 0.0f;
  e.tokens.push_back(token);
  s.logprobs.push_back(lp);
  if (top_logprobs_ > 0)
    s.top.push_back(
        row0 ? top_logprobs(std::span<const float>(row0, static_cast<size_t>(n_vocab())), top_logprobs_)
             : TokenAlternatives{});
  s.logprob_sum += static_cast<double>(lp);
  s.chain->accept(token);
  if (e.n_rows > 0) { // the next row (after this token) becomes row 0, if it was evaluated
    ++e.row_off;
    --e.n_rows;
  }
  book_.note();

  const Tokenizer& tok = ctx_.tok;
  std::string piece;
  if (!tok.is_eog(token) || !s.stop.config().eos) tok.decode_step(s.detok, token, piece);
  const std::span<const TokenId> gen(e.tokens.data() + prompt_.size(), e.tokens.size() - prompt_.size());
  StopStep st = s.stop.on_token(token, piece, gen); // built-in and plugin criteria, in order
  s.text += st.emit;
  if (st.reason == StopReason::none && static_cast<int32_t>(e.tokens.size()) > ctx_.n_ctx)
    st.reason = StopReason::max_context; // the token just sampled has no position left to be evaluated at
  checkpoint(s);
  if (st.reason != StopReason::none) {
    book_.drop_draft(e); // tokens drafted after a stop are never committed
    s.stop_string = st.matched;
    end_seq(s, st.reason);
    s.final_score = s.logprob_sum;
  } else {
    stream(s);
  }
  return st.reason;
}
const std::vector<TokenId>& DecodeSession::tokens(LocalSeq seq) const {
  return at(seq).e->tokens;
}
size_t DecodeSession::n_generated(LocalSeq seq) const {
  return at(seq).e->tokens.size() - prompt_.size();
}
StopReason DecodeSession::finished(LocalSeq seq) const {
  return at(seq).finished;
}

void DecodeSession::plan(LocalSeq seq) {
  Seq& s = at(seq);
  if (s.finished != StopReason::none)
    fail(Errc::invalid_argument, "decoder", "cannot plan finished sequence " + std::to_string(seq));
  book_.mark_planned(seq);
}
const float* DecodeSession::logits(LocalSeq seq) const {
  return logits_at(seq, 0);
}

const float* DecodeSession::logits_at(LocalSeq seq, size_t row) const {
  return book_.row(*at(seq).e, row);
}
// What seq's samplers read: the prompt, its generated tokens, the request's RNG and the vocabulary.
SamplerContext DecodeSession::sampler_context(const Seq& s) {
  return SamplerContext{
      prompt_,
      std::span<const TokenId>(s.e->tokens.data() + prompt_.size(), s.e->tokens.size() - prompt_.size()),
      &rng_, &rng_uniform, &ctx_.tok};
}

void DecodeSession::probs(LocalSeq seq, std::span<float> out) {
  Seq& s = at(seq);
  const float* row0 = book_.row(*s.e, 0);
  if (!row0)
    fail(Errc::invalid_argument, "decoder",
         "sequence " + std::to_string(seq) + " has no logits: plan it first");
  const auto V = static_cast<size_t>(n_vocab());
  if (out.size() < V)
    fail(Errc::invalid_argument, "decoder", "probs: the output holds fewer than n_vocab values");
  const SamplerContext sc = sampler_context(s);
  sampling_distribution(*s.chain, std::span<const float>(row0, V), sc, out.first(V));
}

// sample() and sample_traced(): the chain `apply` runs over seq's row 0 as candidates, in the
// request's sampler context; the token it selected.
template <class Apply> TokenId DecodeSession::sample_with(LocalSeq seq, Seq& s, Apply&& apply) {
  const float* row0 = book_.row(*s.e, 0);
  if (!row0)
    fail(Errc::invalid_argument, "decoder",
         "sequence " + std::to_string(seq) + " has no logits: plan it first");
  const SamplerContext sc = sampler_context(s);
  const auto V = static_cast<size_t>(n_vocab());
  Candidates c = Candidates::from_logits(std::span<const float>(row0, V), candidates_);
  apply(c, sc);
  if (c.selected < 0 || c.selected >= static_cast<int64_t>(c.data.size()))
    fail(Errc::internal, "sampler", "the sampler chain selected no token");
  return c.data[static_cast<size_t>(c.selected)].id;
}

TokenId DecodeSession::sample(LocalSeq seq) {
  Seq& s = at(seq);
  if (const auto* chain = dynamic_cast<const SamplerChain*>(s.chain.get()))
    if (const float* row0 = book_.row(*s.e, 0))
      if (const auto t = chain->greedy_choice(std::span<const float>(row0, static_cast<size_t>(n_vocab()))))
        return *t; // greedy alone: the arg-max, no candidate list
  return sample_with(seq, s, [&](Candidates& c, const SamplerContext& sc) { s.chain->apply(c, sc); });
}

TokenId
DecodeSession::sample_traced(LocalSeq seq,
                             const std::function<void(size_t, const Sampler*, const Candidates&)>& after) {
  Seq& s = at(seq);
  auto* chain = dynamic_cast<SamplerChain*>(s.chain.get());
  if (!chain) fail(Errc::internal, "decoder", "sample_traced: the sequence's sampler is not a chain");
  return sample_with(seq, s,
                     [&](Candidates& c, const SamplerContext& sc) { chain->apply_traced(c, sc, after); });
}

float DecodeSession::logprob(LocalSeq seq, TokenId token) const {
  const float* l = logits(seq);
  if (!l || token < 0 || token >= n_vocab()) return -INFINITY;
  return token_logprob(std::span<const float>(l, static_cast<size_t>(n_vocab())), token);
}

void DecodeSession::finish(LocalSeq seq, StopReason reason, double score) {
  Seq& s = at(seq);
  if (s.finished == StopReason::none) end_seq(s, reason == StopReason::none ? StopReason::custom : reason);
  s.final_score = score;
}

double DecodeSession::score(LocalSeq seq) const {
  return at(seq).logprob_sum;
}

std::vector<TokenId> DecodeSession::tokenize(std::string_view text, bool add_special,
                                             bool parse_special) const {
  EncodeOptions o;
  if (!add_special) {
    o.add_bos = false;
    o.add_eos = false;
  }
  o.parse_special = parse_special;
  return ctx_.tok.encode(text, o);
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

// ---- engine-facing ----

void DecodeSession::end_pending(LocalSeq seq, StopReason reason) {
  Seq& q = at(seq);
  q.e->pending = false;
  q.e->n_rows = 0;
  if (q.finished == StopReason::none) end_seq(q, reason);
}

void DecodeSession::end_all(StopReason reason) {
  for (auto& [id, q] : seqs_)
    if (q->finished == StopReason::none) end_seq(*q, reason);
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
    out.push_back({seq, score,
                   std::vector<TokenId>(q.e->tokens.begin() + static_cast<std::ptrdiff_t>(prompt_.size()),
                                        q.e->tokens.end()),
                   q.text, q.logprobs, q.finished, q.stop_string, q.top});
  }
  return out;
}

} // namespace loom
