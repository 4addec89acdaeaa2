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
  StopTracker stop; // every criterion, built-in and plugin, with its state
  DecodeState detok;
  size_t text_size = 0;
  explicit Checkpoint(const StopTracker& st) : stop(st) {}
};

struct DecodeSession::Seq {
  int model = 0;               // 0: the target; 1: the pipeline's draft model
  SeqId kv = -1;               // id in that model's KV store
  std::vector<TokenId> tokens; // committed: prompt + generated
  std::vector<TokenId> draft;  // uncommitted tokens after `tokens` (not streamed, not seen by stop rules)
  int32_t n_cached = 0;        // of tokens + draft, those whose K/V are in the store
  // Logits rows: row j (j = 0..n_rows-1) is the distribution after tokens + draft[0..j), stored at
  // rows[(row_off + j) * n_vocab].
  std::vector<float> rows;
  size_t row_off = 0;
  size_t n_rows = 0;
  bool has_logits() const noexcept { return n_rows > 0; }
  std::unique_ptr<Sampler> chain; // this sequence's sampler state
  StopTracker stop; // its stop criteria (built-in and plugin) and the text held back from streaming
  DecodeState detok;
  std::string text; // released text
  std::vector<float> logprobs;
  double logprob_sum = 0;
  StopReason finished = StopReason::none;
  std::string stop_string;
  double final_score = 0;
  bool planned = false;
  // Pending work (begin_work): positions [n_cached, target) to evaluate, rows from position out_from.
  bool pending = false;
  bool in_flight = false; // a chunk taken this step, its forward not yet run
  int32_t in_flight_n = 0;
  int32_t target = 0, out_from = 0;
  std::vector<std::shared_ptr<const Checkpoint>> history; // [k]: after k generated tokens

  explicit Seq(StopTracker st) : stop(std::move(st)) {}
};

DecodeSession::DecodeSession(SessionContext& ctx, RequestId id, std::vector<TokenId> prompt, uint64_t seed,
                             int32_t max_new_tokens, StreamCallback cb)
    : ctx_(ctx), id_(id), prompt_(std::move(prompt)), rng_(seed), max_new_tokens_(max_new_tokens),
      on_text_(std::move(cb)) {}

namespace {
// A KV sequence just allocated for a sequence whose state is still being built: that state is cloned from
// plugins (sampler chain, stop criteria), which may throw — then the KV sequence goes back to the store.
struct FreeKvOnThrow {
  SessionContext& ctx;
  KVCacheStore& kv;
  SeqId seq;
  bool armed = true;
  FreeKvOnThrow(SessionContext& c, KVCacheStore& store, SeqId s) : ctx(c), kv(store), seq(s) {}
  FreeKvOnThrow(const FreeKvOnThrow&) = delete;
  FreeKvOnThrow& operator=(const FreeKvOnThrow&) = delete;
  ~FreeKvOnThrow() {
    if (!armed) return;
    kv.free(seq);
    ctx.free_kv_seqs.push_back(seq);
  }
};
} // namespace

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
  cp->detok = s.detok;
  cp->text_size = s.text.size();
  const size_t k = s.tokens.size() - prompt_.size();
  s.history.resize(k);
  s.history.push_back(std::move(cp));
}

bool DecodeSession::open(const SequenceTemplate& tmpl) {
  LOOM_ASSERT(seqs_.empty(), "a session is opened once");
  const SeqId kv = ctx_.kv_seq_to_take();
  if (!ctx_.kv.allocate(kv, 0)) return false;
  ctx_.take_kv_seq(kv);
  FreeKvOnThrow undo{ctx_, ctx_.kv, kv};
  StopConfig stop_cfg = tmpl.stop;
  stop_cfg.max_tokens = max_new_tokens_;
  auto seq = std::make_unique<Seq>(StopTracker(
      std::move(stop_cfg),
      tmpl.make_stop_criteria ? tmpl.make_stop_criteria() : std::vector<std::unique_ptr<StopCriterion>>{}));
  seq->kv = kv;
  seq->tokens = prompt_;
  // Blocks of an earlier request with the same leading tokens (the last prompt token is evaluated
  // here in any case: its logits are the first distribution).
  cached_prompt_ = ctx_.kv.reuse_prefix(kv, prompt_, static_cast<int32_t>(prompt_.size()) - 1);
  seq->n_cached = cached_prompt_;
  seq->chain = tmpl.make_chain();
  // SentencePiece's leading-space rule applies only when the prompt produced no text.
  std::string prompt_text;
  for (TokenId t : prompt_)
    ctx_.tok.decode_step(seq->detok, t, prompt_text);
  seq->detok.pending.clear();
  checkpoint(*seq);
  seqs_.emplace(next_seq_++, std::move(seq));
  undo.armed = false;
  return true;
}

LocalSeq DecodeSession::fork(LocalSeq parent) {
  Seq& p = at(parent);
  KVCacheStore& store = kv_of(p.model);
  const SeqId kv = ctx_.kv_seq_to_take();
  const bool ok = p.n_cached > 0 ? store.fork(p.kv, kv) : store.allocate(kv, 0);
  if (!ok) return -1; // no free KV sequence: the decoder goes on with fewer
  ctx_.take_kv_seq(kv);
  FreeKvOnThrow undo{ctx_, store, kv};
  auto c = std::make_unique<Seq>(p.stop); // clones the stop criteria: may throw
  c->model = p.model;
  c->kv = kv;
  c->tokens = p.tokens;
  c->draft = p.draft;
  c->n_cached = p.n_cached;
  if (p.n_rows > 0) {
    const auto V = static_cast<size_t>(n_vocab());
    c->rows.assign(p.rows.begin() + static_cast<std::ptrdiff_t>(p.row_off * V),
                   p.rows.begin() + static_cast<std::ptrdiff_t>((p.row_off + p.n_rows) * V));
    c->n_rows = p.n_rows;
  }
  copy_state(p, *c); // clones plugin state: may throw
  undo.armed = false;
  return adopt(std::move(c));
}

// What a fork carries besides tokens, K/V, logits and stop state: sampler / detokenizer state, text,
// log-probs, the end state and the per-length checkpoints.
void DecodeSession::copy_state(const Seq& p, Seq& c) {
  c.chain = p.chain->clone();
  c.detok = p.detok;
  c.text = p.text;
  c.logprobs = p.logprobs;
  c.logprob_sum = p.logprob_sum;
  c.finished = p.finished;
  c.stop_string = p.stop_string;
  c.final_score = p.final_score;
  c.history = p.history;
}

LocalSeq DecodeSession::adopt(std::unique_ptr<Seq> s) {
  const LocalSeq id = next_seq_++;
  seqs_.emplace(id, std::move(s));
  ++events_;
  return id;
}

LocalSeq DecodeSession::fork_draft(LocalSeq parent) {
  Seq& p = at(parent);
  if (!ctx_.draft_kv)
    fail(Errc::not_found, "decoder",
         "the pipeline has no draft model; name one with [decoder] draft = \"x.gguf\"");
  if (p.model != 0)
    fail(Errc::invalid_argument, "decoder", "fork_draft: the parent must be a target sequence");
  const SeqId kv = ctx_.kv_seq_to_take();
  if (!ctx_.draft_kv->allocate(kv, 0)) return -1; // no free draft KV sequence: recoverable
  ctx_.take_kv_seq(kv);
  FreeKvOnThrow undo{ctx_, *ctx_.draft_kv, kv};
  auto c = std::make_unique<Seq>(p.stop); // clones the stop criteria: may throw
  c->model = 1;
  c->kv = kv;
  c->tokens = p.tokens; // committed tokens only; none evaluated on the draft model yet
  copy_state(p, *c);    // clones plugin state: may throw
  undo.armed = false;
  return adopt(std::move(c));
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
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int DecodeSession::model_of(LocalSeq seq) const {
  return at(seq).model;
}

KVCacheStore& DecodeSession::kv_of(int model) const {
  return model == 0 ? ctx_.kv : *ctx_.draft_kv;
}

void DecodeSession::free(LocalSeq seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  if (it->second->kv >= 0) {
    kv_of(it->second->model).free(it->second->kv);
    ctx_.free_kv_seqs.push_back(it->second->kv);
  }
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
  drop_draft(s);
  if (n_tokens == s.tokens.size() && s.finished == StopReason::none) return;
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
  s.stop = cp.stop;
  s.detok = cp.detok;
  s.text.resize(cp.text_size);
  s.finished = StopReason::none;
  s.stop_string.clear();
  s.final_score = 0;
  // The logits of the new last token: evaluated again when the sequence is next planned (begin_work
  // drops its K/V then); a decoder that appends first pays only for the new token.
  s.n_rows = 0;
  uncache(s, static_cast<int32_t>(n_tokens));
  // Under a sliding window the next query (at n_tokens − 1) reads the window before it: when the
  // truncate went back past rows already released, they are evaluated again from the first of them.
  if (s.kv >= 0) {
    const KVRetention& r = ctx_.retention[s.model == 0 ? 0 : 1];
    KVCacheStore& store = kv_of(s.model);
    const Pos from = r.first_read(static_cast<Pos>(n_tokens) - 1);
    if (r.bounded() && !store.holds(s.kv, from, s.n_cached)) uncache(s, store.first_released(s.kv));
  }
  ++events_;
}

void DecodeSession::stream(Seq& s, bool final) {
  if (!on_text_ || stream_ < 0) return;
  auto it = seqs_.find(stream_);
  if (it == seqs_.end() || it->second.get() != &s) return;
  (void) final; // s.text holds only released text: what the stop criteria hold back is in s.stop
  const size_t upto = s.text.size();
  if (upto > streamed_) { // text streamed before a truncate is never taken back (nor repeated)
    on_text_(std::string_view(s.text).substr(streamed_, upto - streamed_));
    streamed_ = upto;
  }
}

void DecodeSession::drop_kv(Seq& s) {
  if (s.kv < 0 || s.in_flight) return;
  KVCacheStore& store = kv_of(s.model);
  if (!store.contains(s.kv)) return;
  store.free(s.kv); // the id stays this sequence's until it is freed (allocate() makes it again)
  s.n_cached = 0;
}

void DecodeSession::end_seq(Seq& s, StopReason reason) {
  s.finished = reason;
  drop_kv(s);
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
  drop_draft(s); // an append replaces whatever was drafted after the committed tokens
  return commit_token(s, token);
}

void DecodeSession::drop_draft(Seq& s) {
  if (s.draft.empty()) return;
  s.draft.clear();
  s.n_rows = std::min<size_t>(s.n_rows, 1); // row 0 (after the committed tokens) stays valid
  uncache(s, static_cast<int32_t>(s.tokens.size()));
}

void DecodeSession::uncache(Seq& s, int32_t keep) {
  if (s.n_cached > keep) {
    s.n_cached = keep;
    kv_of(s.model).truncate(s.kv, keep);
  }
}

// Commits `token` as the next token of s (the first draft token, when commit() calls it): its
// log-prob under row 0, the sampler chain's accept, the stop rules, streaming and a checkpoint.
StopReason DecodeSession::commit_token(Seq& s, TokenId token) {
  const auto V = static_cast<size_t>(n_vocab());
  const float lp =
      s.has_logits() ? token_logprob(std::span<const float>(s.rows.data() + s.row_off * V, V), token) : 0.0f;
  s.tokens.push_back(token);
  s.logprobs.push_back(lp);
  s.logprob_sum += static_cast<double>(lp);
  s.chain->accept(token);
  if (s.n_rows > 0) { // the next row (after this token) becomes row 0, if it was evaluated
    ++s.row_off;
    --s.n_rows;
  }
  ++events_;

  const Tokenizer& tok = ctx_.tok;
  std::string piece;
  if (!tok.is_eog(token) || !s.stop.config().eos) tok.decode_step(s.detok, token, piece);
  const std::span<const TokenId> gen(s.tokens.data() + prompt_.size(), s.tokens.size() - prompt_.size());
  StopStep st = s.stop.on_token(token, piece, gen); // built-in and plugin criteria, in order
  s.text += st.emit;
  if (st.reason == StopReason::none && static_cast<int32_t>(s.tokens.size()) > ctx_.n_ctx)
    st.reason = StopReason::max_context; // the token just sampled has no position left to be evaluated at
  checkpoint(s);
  if (st.reason != StopReason::none) {
    drop_draft(s); // tokens drafted after a stop are never committed
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

const float* DecodeSession::logits(LocalSeq seq) const {
  return logits_at(seq, 0);
}

const float* DecodeSession::logits_at(LocalSeq seq, size_t row) const {
  const Seq& s = at(seq);
  return row < s.n_rows ? s.rows.data() + (s.row_off + row) * static_cast<size_t>(n_vocab()) : nullptr;
}

size_t DecodeSession::n_draft(LocalSeq seq) const {
  return at(seq).draft.size();
}

size_t DecodeSession::set_draft(LocalSeq seq, std::span<const TokenId> tokens) {
  Seq& s = at(seq);
  if (s.finished != StopReason::none)
    fail(Errc::invalid_argument, "decoder", "cannot draft after finished sequence " + std::to_string(seq));
  for (TokenId t : tokens)
    if (t < 0 || t >= n_vocab())
      fail(Errc::invalid_argument, "decoder",
           "draft token " + std::to_string(t) + " is outside the vocabulary");
  drop_draft(s);
  // Positions the context has left (the committed tokens' last one is evaluated at tokens.size() - 1).
  const size_t room =
      static_cast<size_t>(std::max<int64_t>(0, ctx_.n_ctx - static_cast<int64_t>(s.tokens.size())));
  const size_t n = std::min(tokens.size(), room);
  s.draft.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
  ++events_;
  return n;
}

StopReason DecodeSession::commit(LocalSeq seq, size_t n) {
  Seq& s = at(seq);
  if (n > s.draft.size())
    fail(Errc::invalid_argument, "decoder",
         "commit of " + std::to_string(n) + " tokens but sequence " + std::to_string(seq) + " has " +
             std::to_string(s.draft.size()) + " drafted");
  StopReason r = StopReason::none;
  for (size_t i = 0; i < n && r == StopReason::none; ++i) {
    if (s.finished != StopReason::none)
      fail(Errc::invalid_argument, "decoder", "commit to finished sequence " + std::to_string(seq));
    const TokenId t = s.draft.front();
    s.draft.erase(s.draft.begin());
    r = commit_token(s, t);
  }
  return r;
}

void DecodeSession::probs(LocalSeq seq, std::span<float> out) {
  Seq& s = at(seq);
  if (!s.has_logits())
    fail(Errc::invalid_argument, "decoder",
         "sequence " + std::to_string(seq) + " has no logits: plan it first");
  const auto V = static_cast<size_t>(n_vocab());
  if (out.size() < V)
    fail(Errc::invalid_argument, "decoder", "probs: the output holds fewer than n_vocab values");
  SamplerContext sc{
      prompt_, std::span<const TokenId>(s.tokens.data() + prompt_.size(), s.tokens.size() - prompt_.size()),
      &rng_};
  sampling_distribution(*s.chain, std::span<const float>(s.rows.data() + s.row_off * V, V), sc, out.first(V));
}

// sample() and sample_traced(): the chain `apply` runs over seq's row 0 as candidates, in the
// request's sampler context; the token it selected.
template <class Apply> TokenId DecodeSession::sample_with(LocalSeq seq, Seq& s, Apply&& apply) {
  if (!s.has_logits())
    fail(Errc::invalid_argument, "decoder",
         "sequence " + std::to_string(seq) + " has no logits: plan it first");
  SamplerContext sc{
      prompt_, std::span<const TokenId>(s.tokens.data() + prompt_.size(), s.tokens.size() - prompt_.size()),
      &rng_};
  const auto V = static_cast<size_t>(n_vocab());
  Candidates c = Candidates::from_logits(std::span<const float>(s.rows.data() + s.row_off * V, V));
  apply(c, sc);
  if (c.selected < 0 || c.selected >= static_cast<int64_t>(c.data.size()))
    fail(Errc::internal, "sampler", "the sampler chain selected no token");
  return c.data[static_cast<size_t>(c.selected)].id;
}

TokenId DecodeSession::sample(LocalSeq seq) {
  Seq& s = at(seq);
  return sample_with(seq, s, [&](Candidates& c, SamplerContext& sc) { s.chain->apply(c, sc); });
}

TokenId
DecodeSession::sample_traced(LocalSeq seq,
                             const std::function<void(size_t, const Sampler*, const Candidates&)>& after) {
  Seq& s = at(seq);
  auto* chain = dynamic_cast<SamplerChain*>(s.chain.get());
  if (!chain) fail(Errc::internal, "decoder", "sample_traced: the sequence's sampler is not a chain");
  return sample_with(seq, s, [&](Candidates& c, SamplerContext& sc) { chain->apply_traced(c, sc, after); });
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

double DecodeSession::verify(std::string_view text) const {
  if (!ctx_.verify)
    fail(Errc::not_found, "decoder",
         "the pipeline names no verifier; add a [verifier] section (name = a verifier plugin)");
  if (!prompt_text_) prompt_text_ = ctx_.tok.decode(prompt_); // once per request, not per candidate
  return ctx_.verify(*prompt_text_, text);
}

// ---- engine-facing ----

void DecodeSession::begin_work() {
  const auto V = static_cast<size_t>(n_vocab());
  for (LocalSeq id : planned_) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    Seq& q = *it->second;
    q.planned = false;
    if (q.finished != StopReason::none || q.kv < 0) continue;
    const auto n_committed = static_cast<int32_t>(q.tokens.size());
    const auto n_all = n_committed + static_cast<int32_t>(q.draft.size());
    const size_t rows_wanted = q.draft.size() + 1; // after the committed tokens and after each draft
    if (q.n_rows >= rows_wanted) continue;         // everything this plan asks is current (e.g. a fresh fork)
    // Rows come from positions out_from .. n_all-1: the committed last token's (unless row 0 is
    // current) and every draft token's. Positions already cached produce no rows: evaluate again.
    const int32_t out_from = q.n_rows >= 1 ? n_committed : n_committed - 1;
    uncache(q, out_from);
    if (q.n_rows > 1) q.n_rows = 1;
    LOOM_ASSERT(n_all - q.n_cached > 0, "a plan evaluates at least one token");
    // Rows buffer: row 0 kept (moved to the front), room for every row this plan writes.
    if (q.n_rows == 1 && q.row_off > 0)
      std::copy_n(q.rows.begin() + static_cast<std::ptrdiff_t>(q.row_off * V), V, q.rows.begin());
    q.row_off = 0;
    q.rows.resize(rows_wanted * V);
    q.n_rows = rows_wanted;
    q.pending = true;
    q.target = n_all;
    q.out_from = out_from;
    ++events_;
  }
  planned_.clear();
}

bool DecodeSession::work_pending() const noexcept {
  for (const auto& [id, q] : seqs_)
    if (q->pending) return true;
  return false;
}

std::vector<DecodeSession::Pending> DecodeSession::pending() const {
  std::vector<Pending> out;
  for (const auto& [id, q] : seqs_)
    if (q->pending) out.push_back({id, q->model, q->kv, q->target - q->n_cached});
  return out;
}

std::vector<SeqId> DecodeSession::kv_held(int model) const {
  std::vector<SeqId> out;
  for (const auto& [id, q] : seqs_)
    if (q->kv >= 0 && (q->model == 0) == (model == 0) && kv_of(q->model).contains(q->kv))
      out.push_back(q->kv);
  return out;
}

std::optional<DecodeSession::Work> DecodeSession::take_chunk(LocalSeq seq, int32_t n) {
  Seq& q = at(seq);
  LOOM_ASSERT(q.pending && !evicted_ && n > 0, "a chunk of pending work");
  n = std::min(n, q.target - q.n_cached);
  if (!kv_of(q.model).allocate(q.kv, n)) return std::nullopt;
  const auto n_committed = static_cast<int32_t>(q.tokens.size());
  Work w;
  w.seq = seq;
  w.model = q.model;
  w.kv = q.kv;
  w.first_pos = q.n_cached;
  w.out_from = q.out_from;
  w.first_row = std::max(q.n_cached, q.out_from) - (n_committed - 1);
  for (int32_t p = q.n_cached; p < q.n_cached + n; ++p)
    w.tokens.push_back(p < n_committed ? q.tokens[static_cast<size_t>(p)]
                                       : q.draft[static_cast<size_t>(p - n_committed)]);
  q.n_cached += n;
  q.in_flight = true;
  q.in_flight_n = n;
  if (q.n_cached == q.target) q.pending = false;
  evaluated_[q.model == 0 ? 0 : 1] += static_cast<size_t>(n);
  ++events_;
  return w;
}

void DecodeSession::end_pending(LocalSeq seq, StopReason reason) {
  Seq& q = at(seq);
  q.pending = false;
  q.n_rows = 0;
  if (q.finished == StopReason::none) end_seq(q, reason);
}

void DecodeSession::chunks_evaluated() {
  for (auto& [id, q] : seqs_) {
    if (q->in_flight && q->kv >= 0) {
      KVCacheStore& store = kv_of(q->model);
      store.register_prefix(q->kv, q->tokens); // findable by content
      // A sliding window: what no later query reads goes back to the store. The next query is at
      // n_cached, or at the last committed token when its row is evaluated again (begin_work).
      const KVRetention& r = ctx_.retention[q->model == 0 ? 0 : 1];
      if (r.bounded()) {
        const Pos next = std::min<Pos>(q->n_cached, static_cast<Pos>(q->tokens.size()) - 1);
        store.release_positions(q->kv, r.sinks, r.keep_from(next));
      }
    }
    q->in_flight = false;
    if (q->finished != StopReason::none) drop_kv(*q);
  }
}

void DecodeSession::evict() {
  for (auto& [id, q] : seqs_) {
    if (q->kv >= 0) kv_of(q->model).free(q->kv);
    q->n_cached = 0;
    if (q->in_flight) { // its chunk never ran: its rows are still owed, its tokens were not evaluated
      q->pending = true;
      evaluated_[q->model == 0 ? 0 : 1] -= static_cast<size_t>(q->in_flight_n);
    }
    q->in_flight = false;
  }
  evicted_ = true;
  ++events_;
}

bool DecodeSession::restore() {
  if (!evicted_) return true;
  std::vector<Seq*> done;
  for (auto& [id, q] : seqs_) {
    if (q->kv < 0 || q->finished != StopReason::none) continue; // a finished sequence holds no K/V
    if (!kv_of(q->model).allocate(q->kv, 0)) {
      for (Seq* d : done)
        kv_of(d->model).free(d->kv);
      return false;
    }
    done.push_back(q.get());
  }
  evicted_ = false;
  // What is still cached of each live sequence's positions comes back without evaluation: up to the
  // first position whose logits row is owed (pending), or all its committed tokens.
  for (Seq* q : done) {
    if (q->finished != StopReason::none) continue;
    const auto n_committed = static_cast<int32_t>(q->tokens.size());
    const int32_t cap = q->pending ? std::min(q->out_from, n_committed) : n_committed;
    q->n_cached = kv_of(q->model).reuse_prefix(q->kv, q->tokens, cap);
    if (q->pending && q->n_cached >= q->target) q->pending = false;
    // The prefix cache hands back the blocks a sliding window had released too: release them again.
    const KVRetention& r = ctx_.retention[q->model == 0 ? 0 : 1];
    if (r.bounded() && q->n_cached > 0)
      kv_of(q->model).release_positions(
          q->kv, r.sinks, r.keep_from(std::min<Pos>(q->n_cached, static_cast<Pos>(q->tokens.size()) - 1)));
  }
  return true;
}

int64_t DecodeSession::positions_needed() const noexcept {
  int64_t n = 0;
  for (const auto& [id, q] : seqs_)
    if (q->kv >= 0 && q->model == 0)
      n += std::min(
          ctx_.retention[0].bounded() ? ctx_.retention[0].bound_positions(ctx_.kv.positions_per_unit())
                                      : INT64_MAX,
          q->pending ? q->target
                     : (q->finished == StopReason::none ? static_cast<int64_t>(q->tokens.size()) : 0));
  return n;
}

size_t DecodeSession::max_generated() const noexcept {
  size_t n = 0;
  for (const auto& [id, q] : seqs_)
    n = std::max(n, q->tokens.size() - prompt_.size());
  return n;
}

void DecodeSession::set_logits(LocalSeq seq, size_t row, std::span<const float> logits) {
  Seq& s = at(seq);
  const auto V = static_cast<size_t>(n_vocab());
  LOOM_ASSERT(logits.size() == V && row < s.n_rows && s.row_off == 0, "a row begin_work() prepared");
  std::copy(logits.begin(), logits.end(), s.rows.begin() + static_cast<std::ptrdiff_t>(row * V));
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
      kv_of(q->model).free(q->kv);
      ctx_.free_kv_seqs.push_back(q->kv);
      q->kv = -1;
    }
}

} // namespace loom
