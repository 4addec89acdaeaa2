// The step loop: admit → plan → one batched forward → update → collect finished requests.
#include "loom/engine.hpp"

#include "loom/error.hpp"

#include <algorithm>
#include <chrono>

namespace loom {

namespace {
using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
} // namespace

// ---------------------------------------------------------------------------------------------
// Sequences

struct DecodeSession::Seq {
  SeqId kv = -1;               // id in the KV store (-1 once freed)
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

  explicit Seq(StopConfig cfg) : stop(std::move(cfg)) {}
};

DecodeSession::DecodeSession(Engine& e, RequestId id, std::vector<TokenId> prompt, uint64_t seed,
                             int32_t max_new_tokens, StreamCallback cb)
    : engine_(e), id_(id), prompt_(std::move(prompt)), rng_(seed), max_new_tokens_(max_new_tokens),
      on_text_(std::move(cb)) {}

int32_t DecodeSession::n_vocab() const noexcept {
  return engine_.model_.config().n_vocab;
}

DecodeSession::Seq& DecodeSession::at(LocalSeq seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end())
    fail(Errc::invalid_argument, "decoder",
         "sequence " + std::to_string(seq) + " does not exist in this request");
  return *it->second;
}
const DecodeSession::Seq& DecodeSession::at(LocalSeq seq) const {
  return const_cast<DecodeSession*>(this)->at(seq);
}

LocalSeq DecodeSession::fork(LocalSeq parent) {
  Seq& p = at(parent);
  if (p.kv < 0)
    fail(Errc::invalid_argument, "decoder", "cannot fork freed sequence " + std::to_string(parent));
  const SeqId kv = engine_.next_kv_seq_++;
  if (p.n_cached > 0 && !engine_.kv_.fork(p.kv, kv))
    fail(Errc::out_of_memory, "engine",
         "no free KV slot to fork sequence " + std::to_string(parent) +
             " (raise [kv_cache] max_tokens or lower the decoder's width)");
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
  const LocalSeq id = next_seq_++;
  seqs_.emplace(id, std::move(c));
  return id;
}

void DecodeSession::free(LocalSeq seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second->kv < 0) return;
  engine_.kv_.free(it->second->kv);
  it->second->kv = -1;
  if (it->second->finished == StopReason::none) it->second->finished = StopReason::cancelled;
}

void DecodeSession::truncate(LocalSeq seq, size_t n_tokens) {
  Seq& s = at(seq);
  if (n_tokens < prompt_.size() || n_tokens > s.tokens.size())
    fail(Errc::invalid_argument, "decoder",
         "truncate to " + std::to_string(n_tokens) + " tokens is outside [prompt " +
             std::to_string(prompt_.size()) + ", length " + std::to_string(s.tokens.size()) + "]");
  const size_t n_gen = n_tokens - prompt_.size();
  s.tokens.resize(n_tokens);
  s.logprobs.resize(n_gen);
  s.logprob_sum = 0;
  for (float lp : s.logprobs)
    s.logprob_sum += static_cast<double>(lp);
  if (s.n_cached > static_cast<int32_t>(n_tokens)) {
    s.n_cached = static_cast<int32_t>(n_tokens);
    if (s.kv >= 0) engine_.kv_.truncate(s.kv, s.n_cached);
  }
  s.has_logits = false;
}

void DecodeSession::end_seq(Seq& s, StopReason reason) {
  s.finished = reason;
  if (reason != StopReason::eos && reason != StopReason::stop_string && reason != StopReason::stop_token &&
      reason != StopReason::custom) {
    std::string tail = s.stop.flush();
    engine_.tok_.decode_flush(s.detok, tail);
    if (!tail.empty()) {
      s.text += tail;
      if (on_text_ && stream_ >= 0 && seqs_.count(stream_) && seqs_.at(stream_).get() == &s) on_text_(tail);
    }
  }
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

  const Tokenizer& tok = engine_.tok_;
  std::string piece;
  if (!tok.is_eog(token) || !s.stop.config().eos) tok.decode_step(s.detok, token, piece);
  StopStep st = s.stop.on_token(token, piece);
  const bool streamed = on_text_ && seqs_.count(stream_) && seqs_.at(stream_).get() == &s;
  if (!st.emit.empty()) {
    s.text += st.emit;
    if (streamed) on_text_(st.emit);
  }
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
  if (st.reason == StopReason::none && static_cast<int32_t>(s.tokens.size()) > engine_.n_ctx_)
    st.reason = StopReason::max_context; // the token just sampled has no position left to be evaluated at
  if (st.reason == StopReason::none && s.stop.timed_out()) st.reason = StopReason::timeout;
  if (st.reason != StopReason::none) {
    s.stop_string = st.matched;
    end_seq(s, st.reason);
    s.final_score = s.logprob_sum;
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
  if (s.finished != StopReason::none || s.kv < 0)
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
  SamplerContext ctx{
      prompt_, std::span<const TokenId>(s.tokens.data() + prompt_.size(), s.tokens.size() - prompt_.size()),
      &rng_};
  Candidates c = Candidates::from_logits(s.logits);
  s.chain->apply(c, ctx);
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
  return engine_.tok_.decode(ids);
}

void DecodeSession::add_result(LocalSeq seq, double score) {
  (void)at(seq);
  results_.emplace_back(seq, score);
}

// ---------------------------------------------------------------------------------------------
// Requests and the step loop

struct Engine::Request {
  RequestId id;
  std::unique_ptr<DecodeSession> session;
  std::unique_ptr<Decoder> decoder;
  bool started = false;
  bool cancelled = false;
  std::string error; // a decoder or backend failure ended this request
  uint64_t seed = 0;
  Clock::time_point t_submit, t_first{}, t_prefill0{}, t_prefill1{};
  bool prefilled = false;
};

Engine::Engine(Model& model, const Tokenizer& tok, Backend& backend, KVCacheStore& kv, int32_t n_ctx,
               RequestTemplate tmpl)
    : model_(model), tok_(tok), backend_(backend), kv_(kv), n_ctx_(n_ctx), tmpl_(std::move(tmpl)) {}

Engine::~Engine() {
  for (auto& r : running_)
    for (auto& [id, s] : r->session->seqs_)
      if (s->kv >= 0) kv_.free(s->kv);
}

RequestId Engine::submit(EngineRequest req) {
  auto r = std::make_unique<Request>();
  r->id = next_id_++;
  r->seed = req.seed;
  r->t_submit = Clock::now();
  const int32_t n_vocab = model_.config().n_vocab;
  for (TokenId t : req.prompt)
    if (t < 0 || t >= n_vocab)
      fail(Errc::invalid_argument, "engine",
           "prompt token " + std::to_string(t) + " is outside the vocabulary (0.." +
               std::to_string(n_vocab - 1) + ")");
  if (req.prompt.empty())
    fail(Errc::invalid_argument, "engine",
         "the prompt is empty and no BOS token is added: there is nothing to condition on (give a prompt or "
         "enable "
         "[run] add_bos)");
  r->session = std::unique_ptr<DecodeSession>(new DecodeSession(*this, r->id, std::move(req.prompt), req.seed,
                                                                req.max_new_tokens, std::move(req.on_text)));
  r->decoder = tmpl_.make_decoder();
  const RequestId id = r->id;
  waiting_.push_back(std::move(r));
  return id;
}

bool Engine::idle() const noexcept {
  return waiting_.empty() && running_.empty() && early_.empty();
}
size_t Engine::n_running() const noexcept {
  return running_.size();
}

void Engine::cancel(RequestId id) {
  for (auto& r : running_)
    if (r->id == id) r->cancelled = true;
  for (auto& r : waiting_)
    if (r->id == id) r->cancelled = true;
}

std::pair<RequestId, GenerationResult> Engine::finish_request(Request& r) {
  DecodeSession& s = *r.session;
  GenerationResult res;
  res.prompt_tokens = s.prompt_;
  res.seed = r.seed;
  if (s.results_.empty() && !s.seqs_.empty())
    s.results_.emplace_back(0, s.seqs_.begin()->second->final_score);
  for (const auto& [seq, score] : s.results_) {
    auto it = s.seqs_.find(seq);
    if (it == s.seqs_.end()) continue;
    const auto& q = *it->second;
    Hypothesis h;
    h.tokens.assign(q.tokens.begin() + static_cast<std::ptrdiff_t>(s.prompt_.size()), q.tokens.end());
    h.text = q.text;
    h.logprobs = q.logprobs;
    h.stop_reason = q.finished;
    h.stop_string = q.stop_string;
    h.score = score;
    res.n_best.push_back(std::move(h));
  }
  if (!res.n_best.empty()) {
    const Hypothesis& b = res.n_best.front();
    res.tokens = b.tokens;
    res.text = b.text;
    res.logprobs = b.logprobs;
    res.stop_reason = b.stop_reason;
    res.stop_string = b.stop_string;
  }
  for (auto& [id, q] : s.seqs_)
    if (q->kv >= 0) {
      kv_.free(q->kv);
      q->kv = -1;
    }
  const auto t_end = Clock::now();
  auto& m = res.metrics;
  m.n_prompt = static_cast<int32_t>(s.prompt_.size());
  m.n_generated = static_cast<int32_t>(res.tokens.size());
  m.total_ms = ms_between(r.t_submit, t_end);
  if (r.t_first != Clock::time_point{}) m.ttft_ms = ms_between(r.t_submit, r.t_first);
  const double prefill_s = std::chrono::duration<double>(r.t_prefill1 - r.t_prefill0).count();
  m.prefill_tok_s = prefill_s > 0 ? m.n_prompt / prefill_s : 0;
  if (m.n_generated > 1 && r.t_first != Clock::time_point{}) {
    const double decode_ms = ms_between(r.t_first, t_end);
    m.tpot_ms = decode_ms / (m.n_generated - 1);
    m.decode_tok_s = decode_ms > 0 ? (m.n_generated - 1) * 1000.0 / decode_ms : 0;
  }
  return {r.id, std::move(res)};
}

namespace {
// Runs one decoder call of a request; an exception ends that request (not the engine).
template <class R, class F> void guard(R& r, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    r.error = e.what();
    r.cancelled = true;
  }
}
} // namespace

std::vector<std::pair<RequestId, GenerationResult>> Engine::step() {
  std::vector<std::pair<RequestId, GenerationResult>> done = std::move(early_);
  early_.clear();

  // 1. Admit waiting requests; a prompt that does not fit ends at once with max_context.
  while (!waiting_.empty() && running_.size() < max_running_) {
    auto r = std::move(waiting_.front());
    waiting_.pop_front();
    DecodeSession& s = *r->session;
    StopConfig stop_cfg = tmpl_.stop;
    stop_cfg.max_tokens = s.max_new_tokens_;
    auto seq = std::make_unique<DecodeSession::Seq>(std::move(stop_cfg));
    seq->kv = next_kv_seq_++;
    seq->tokens = s.prompt_;
    seq->chain = tmpl_.make_chain();
    if (tmpl_.make_stop_plugins) seq->plugins = tmpl_.make_stop_plugins();
    { // SentencePiece's leading-space rule applies only when the prompt produced no text
      std::string prompt_text;
      for (TokenId t : s.prompt_)
        tok_.decode_step(seq->detok, t, prompt_text);
      seq->detok.pending.clear();
    }
    s.seqs_.emplace(s.next_seq_++, std::move(seq));
    DecodeSession::Seq& root = *s.seqs_.at(0);
    if (static_cast<int32_t>(s.prompt_.size()) >= n_ctx_ || r->cancelled || s.max_new_tokens_ == 0) {
      root.finished = r->cancelled             ? StopReason::cancelled
                      : s.max_new_tokens_ == 0 ? StopReason::max_tokens
                                               : StopReason::max_context;
      auto res = finish_request(*r);
      if (root.finished == StopReason::max_context)
        res.second.message = "the prompt has " + std::to_string(s.prompt_.size()) +
                             " tokens but the context holds " + std::to_string(n_ctx_) +
                             " (prompt + at least one new token); shorten the prompt or raise [model] n_ctx";
      done.push_back(std::move(res));
      continue;
    }
    running_.push_back(std::move(r));
  }

  // 2. Plans.
  for (auto& r : running_) {
    DecodeSession& s = *r->session;
    if (r->cancelled) {
      for (auto& [id, q] : s.seqs_)
        if (q->finished == StopReason::none) s.end_seq(*q, StopReason::cancelled);
      continue;
    }
    guard(*r, [&] {
      if (!r->started) {
        r->started = true;
        r->decoder->start(s);
      }
      if (!r->decoder->done(s)) r->decoder->plan(s);
    });
  }

  // 3. One batch with every planned sequence's unevaluated tokens.
  std::vector<TokenId> tokens;
  std::vector<Pos> positions;
  std::vector<SeqId> seq_ids;
  std::vector<int32_t> out_rows;
  struct Out {
    DecodeSession::Seq* seq;
    Request* req;
  };
  std::vector<Out> outs;
  for (auto& r : running_) {
    DecodeSession& s = *r->session;
    for (LocalSeq id : s.planned_) {
      DecodeSession::Seq& q = s.at(id);
      q.planned = false;
      const auto n_new = static_cast<int32_t>(q.tokens.size()) - q.n_cached;
      if (n_new <= 0) continue; // logits already current (e.g. a fresh fork)
      if (!kv_.allocate(q.kv, n_new)) {
        s.end_seq(q, StopReason::max_context);
        continue;
      }
      for (int32_t i = 0; i < n_new; ++i) {
        tokens.push_back(q.tokens[static_cast<size_t>(q.n_cached + i)]);
        positions.push_back(q.n_cached + i);
        seq_ids.push_back(q.kv);
      }
      out_rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
      outs.push_back({&q, r.get()});
      q.n_cached += n_new;
    }
    s.planned_.clear();
  }
  if (!tokens.empty()) {
    const int32_t V = model_.config().n_vocab;
    std::vector<float> logits(out_rows.size() * static_cast<size_t>(V));
    const auto t0 = Clock::now();
    try {
      model_.forward(backend_, BatchView{tokens, positions, seq_ids, out_rows}, kv_, logits);
    } catch (const std::exception& e) { // a backend failure fails the requests of this batch
      for (auto& o : outs) {
        o.req->error = std::string("the forward pass failed: ") + e.what();
        o.req->cancelled = true;
      }
      outs.clear();
    }
    const auto t1 = Clock::now();
    for (size_t i = 0; i < outs.size(); ++i) {
      DecodeSession::Seq& q = *outs[i].seq;
      q.logits.assign(logits.begin() + static_cast<std::ptrdiff_t>(i) * V,
                      logits.begin() + static_cast<std::ptrdiff_t>(i + 1) * V);
      q.has_logits = true;
      Request& r = *outs[i].req;
      if (!r.prefilled) {
        r.prefilled = true;
        r.t_prefill0 = t0;
        r.t_prefill1 = t1;
      }
    }
  }

  // 4. Updates, then collect the finished requests.
  for (auto& r : running_) {
    DecodeSession& s = *r->session;
    if (r->cancelled) continue;
    guard(*r, [&] {
      if (r->decoder->done(s)) return;
      r->decoder->update(s);
      if (r->t_first == Clock::time_point{}) {
        for (auto& [id, q] : s.seqs_)
          if (q->tokens.size() > s.prompt_.size()) {
            r->t_first = Clock::now();
            break;
          }
      }
    });
  }
  for (size_t i = 0; i < running_.size();) {
    Request& r = *running_[i];
    bool finished = r.cancelled;
    if (!finished) guard(r, [&] { finished = r.decoder->done(*r.session); });
    finished = finished || r.cancelled;
    if (finished) {
      if (!r.cancelled) guard(r, [&] { r.decoder->results(*r.session); });
      for (auto& [id, q] : r.session->seqs_)
        if (q->finished == StopReason::none) r.session->end_seq(*q, StopReason::cancelled);
      done.push_back(finish_request(r));
      if (!r.error.empty()) done.back().second.message = "the request failed: " + r.error;
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  return done;
}

// ---------------------------------------------------------------------------------------------
// The built-in `sample` decoder

namespace {
class SampleDecoder final : public Decoder {
public:
  std::string_view name() const noexcept override { return "sample"; }
  void plan(DecodeSession& s) override {
    if (s.finished(0) == StopReason::none) s.plan(0);
  }
  void update(DecodeSession& s) override {
    if (s.finished(0) != StopReason::none || !s.logits(0)) return;
    s.append(0, s.sample(0));
  }
  bool done(const DecodeSession& s) const override { return s.finished(0) != StopReason::none; }
  void results(DecodeSession& s) override { s.add_result(0, s.score(0)); }
};
} // namespace

std::unique_ptr<Decoder> make_sample_decoder() {
  return std::make_unique<SampleDecoder>();
}

} // namespace loom
