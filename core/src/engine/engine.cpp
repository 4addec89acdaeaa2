// The step loop: take submitted/cancelled → admit (scheduler) → plan (decoders) → the step's schedule
// and batch (decodes first, prefill chunks in the token budget, preemption when KV runs out) → one
// forward per model → update (decoders whose plan is fully evaluated) → collect finished requests.
// A failure of a decoder, the backend or a decoder that stops making progress ends that request with
// StopReason::error and a message — never the engine, and never silently.
#include "loom/engine/engine.hpp"

#include "loom/error.hpp"
#include "loom/eval/ab_stats.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <tuple>

namespace loom {

namespace {
using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
// Steps in a row in which a decoder neither evaluated, appended, forked nor ended anything before
// its request is failed (a decoder that plans nothing would otherwise spin generate_all forever).
constexpr int k_max_stalled_steps = 3;

} // namespace

struct Engine::Request {
  RequestId id;
  // The request's sequences as the engine drives them (tokens, K/V, logits rows, the step's work), and its
  // decoder-facing session over the same book (declared after it: it is destroyed first).
  std::unique_ptr<SequenceBook> book;
  std::unique_ptr<DecodeSession> session;
  std::function<std::unique_ptr<Decoder>()> make_decoder; // called at the first admission (stepping thread)
  std::unique_ptr<Decoder> decoder;
  std::function<void(RequestId, const GenerationResult&)> on_finish;
  std::shared_ptr<const SequenceTemplate> sequence; // its own chain and stop rules (null: the pipeline's)
  bool started = false;
  bool cancelled = false;
  bool admitted = false;
  bool awaiting_update = false; // planned; its update comes once the plan's work is evaluated
  bool recompute = false;       // preempted: its evicted positions are being evaluated again
  std::string error;            // a decoder, backend or engine failure ended this request
  uint64_t seed = 0;
  int32_t max_new_tokens = -1;
  Clock::time_point t_submit, t_admit{}, t_first{}, t_last{}, t_prefill0{}, t_prefill1{};
  bool prefilled = false;
  PerModel<double> forward_ms;       // wall time of the forwards this request took part in
  PerModel<double> first_forward_ms; // of them, the first (the prompt's)
  double forward_ms_to_first = 0;    // of them (both models), those before the first token
  PerModel<bool> forwarded;
  size_t kv_reserved_peak = 0, kv_used_peak = 0; // the target store's, while this request ran
  size_t n_generated = 0;                        // at the last step (inter-token latency)
  std::vector<double> itl_ms;
  int32_t preemptions = 0;
  uint64_t last_progress = 0;
  int stalled = 0;

  void failed(std::string why) {
    if (error.empty()) error = std::move(why);
    cancelled = true;
  }
};

namespace {
// A store that releases rows past a sliding window, or keeps layer groups, relies on the backend reading
// only each query's span, through its layer's group (Model::kv_shape asks it before making such a store).
void check_store(const Model& m, const Backend& be, const KVCacheStore& kv) {
  const AttentionVariant& v = m.attention();
  uint32_t need = kv.shape().retention.bounded() || !kv.shape().window_layers.empty() ? attn_span_only : 0u;
  if (kv.memory().layout().n_groups() > 1) need |= attn_kv_groups;
  if (need != 0 && !be.supports_attention(v.kernel(), v.features() | need))
    fail(Errc::unsupported, "engine",
         "backend '" + std::string(be.name()) +
             "' does not read a KV store that releases rows past a sliding window or keeps layer groups; "
             "make the store with Model::kv_shape(n_ctx, n_seq, &backend)");
}

// Token trees on a model: the most nodes (0 when the backend runs no tree rows) and the deepest tree
// (a node's window is taken at its depth while its ancestors are always attended: below the narrowest
// window, those agree).
std::pair<int32_t, int32_t> tree_limits(const Model& m, const Backend& be) {
  const AttentionVariant& v = m.attention();
  if (!be.supports_attention(v.kernel(), v.features() | attn_tree)) return {0, 0};
  int32_t depth = k_max_tree_nodes;
  for (int32_t il = 0; il < v.n_layer(); ++il)
    if (const int32_t w = v.layer(il).window; w > 0) depth = std::min(depth, w - 1);
  return {k_max_tree_nodes, std::max(depth, 0)};
}
} // namespace

namespace {
// A model's slot: its backend and store, with what the backend runs of its attention.
ModelSlot slot_for(Model& m, Backend& be, KVCacheStore& kv, bool target_layers) {
  check_store(m, be, kv);
  ModelSlot s{&m, &be, &kv, 0, 0, target_layers};
  std::tie(s.tree_nodes, s.tree_depth) = tree_limits(m, be);
  return s;
}
} // namespace

Engine::Engine(Model& model, const Tokenizer& tok, Backend& backend, KVCacheStore& kv, int32_t n_ctx,
               RequestTemplate tmpl, std::optional<DraftModel> draft)
    : ctx_{tok, n_ctx, model.config().n_vocab, {}, 0, {}, nullptr, {}}, tmpl_(std::move(tmpl)),
      scheduler_(kv, n_ctx) {
  ctx_.verifier = tmpl_.verifier;
  ctx_.verifier_tokens = tmpl_.verifier_tokens;
  ctx_.models.target = slot_for(model, backend, kv, false);
  if (draft) {
    if (draft->model.config().n_vocab != ctx_.n_vocab)
      fail(Errc::invalid_argument, "engine",
           "the draft model has " + std::to_string(draft->model.config().n_vocab) +
               " tokens in its vocabulary but the target has " + std::to_string(ctx_.n_vocab));
    ctx_.models.draft = slot_for(draft->model, draft->backend, draft->kv, draft->target_layers);
  }
}

Engine::~Engine() = default; // sessions free their KV sequences

RequestId Engine::submit(EngineRequest req) {
  const int32_t n_vocab = ctx_.n_vocab;
  for (TokenId t : req.prompt)
    if (t < 0 || t >= n_vocab)
      fail(Errc::invalid_argument, "engine",
           "prompt token " + std::to_string(t) + " is outside the vocabulary (0.." +
               std::to_string(n_vocab - 1) + ")");
  if (req.max_new_tokens < -1)
    fail(Errc::invalid_argument, "engine",
         "max_new_tokens " + std::to_string(req.max_new_tokens) +
             ": expected -1 (until a stop rule or the context ends it), 0 or more");
  if (req.prompt.empty())
    fail(Errc::invalid_argument, "engine",
         "the prompt is empty and no BOS token is added: there is nothing to condition on (give a prompt or "
         "enable [run] add_bos)");
  auto r = std::make_unique<Request>();
  r->seed = req.seed;
  r->max_new_tokens = req.max_new_tokens;
  r->t_submit = Clock::now();
  r->make_decoder = req.decoder ? std::move(req.decoder) : tmpl_.make_decoder;
  r->on_finish = std::move(req.on_finish);
  r->sequence = std::move(req.sequence);
  std::lock_guard lock(mu_);
  r->id = next_id_++;
  // The session only keeps references here; the KV store is touched at admission (stepping thread).
  r->book = std::make_unique<SequenceBook>(ctx_, req.prompt.size());
  r->session = std::make_unique<DecodeSession>(ctx_, *r->book, r->id, std::move(req.prompt), req.seed,
                                               req.max_new_tokens, std::move(req.on_text));
  if (req.top_logprobs > 0) r->session->set_top_logprobs(static_cast<size_t>(req.top_logprobs));
  if (!req.task.empty()) r->session->set_task(std::move(req.task));
  const RequestId id = r->id;
  incoming_.push_back(std::move(r));
  cv_.notify_all();
  return id;
}

void Engine::cancel(RequestId id) {
  std::lock_guard lock(mu_);
  cancels_.push_back(id);
  cv_.notify_all();
}

bool Engine::wait_for_work(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return !incoming_.empty() || !cancels_.empty(); });
}

// Brings in what other threads submitted or cancelled since the last step.
void Engine::take_incoming() {
  std::vector<std::unique_ptr<Request>> in;
  std::vector<RequestId> cancels;
  {
    std::lock_guard lock(mu_);
    in.swap(incoming_);
    cancels.swap(cancels_);
  }
  for (auto& r : in)
    waiting_.push_back(std::move(r));
  for (RequestId id : cancels) {
    for (auto& r : running_)
      if (r->id == id) r->cancelled = true;
    for (auto& r : waiting_)
      if (r->id == id) r->cancelled = true;
  }
}

// A preempted request goes back to the queue at its arrival place (ahead of those that came later).
void Engine::requeue(std::unique_ptr<Request> r) {
  auto at = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return w->id > r->id; });
  waiting_.insert(at, std::move(r));
}

bool Engine::idle() const noexcept {
  std::lock_guard lock(mu_);
  return waiting_.empty() && running_.empty() && early_.empty() && incoming_.empty();
}
size_t Engine::n_running() const noexcept {
  return running_.size();
}
size_t Engine::n_waiting() const noexcept {
  std::lock_guard lock(mu_);
  return waiting_.size() + incoming_.size();
}

std::pair<RequestId, GenerationResult> Engine::finish_request(Request& r) {
  DecodeSession& s = *r.session;
  if (!r.error.empty()) s.end_all(StopReason::error);
  GenerationResult res;
  res.prompt_tokens = s.prompt();
  res.seed = r.seed;
  for (auto& o : s.outcomes()) {
    Hypothesis h;
    h.tokens = std::move(o.tokens);
    h.text = std::move(o.text);
    h.logprobs = std::move(o.logprobs);
    h.top_logprobs = std::move(o.top_logprobs);
    h.stop_reason = o.stop_reason;
    h.stop_string = std::move(o.stop_string);
    h.score = o.score;
    res.n_best.push_back(std::move(h));
  }
  if (!res.n_best.empty()) {
    const Hypothesis& b = res.n_best.front();
    res.tokens = b.tokens;
    res.text = b.text;
    res.logprobs = b.logprobs;
    res.top_logprobs = b.top_logprobs;
    res.stop_reason = b.stop_reason;
    res.stop_string = b.stop_string;
  }
  res.outputs = s.outputs();
  res.metrics.decoder = s.metrics();
  if (!r.error.empty()) {
    res.stop_reason = StopReason::error;
    res.message = "the request failed: " + r.error;
  }
  s.release();
  const auto t_end = Clock::now();
  auto& m = res.metrics;
  m.n_prompt = static_cast<int32_t>(s.n_prompt());
  m.n_generated = static_cast<int32_t>(res.tokens.size());
  m.total_ms = ms_between(r.t_submit, t_end);
  m.forward_ms = r.forward_ms.target;
  m.tokens_evaluated = r.book->evaluated(ModelRole::target);
  m.draft_tokens_evaluated = r.book->evaluated(ModelRole::draft);
  m.draft_kv_copied = r.book->kv_copied();
  m.verifier_tokens_evaluated = s.verifier_tokens();
  m.kv_reserved_peak_bytes = r.kv_reserved_peak;
  m.kv_used_peak_bytes = r.kv_used_peak;
  m.draft_forward_ms = r.forward_ms.draft;
  m.prefill_ms = r.first_forward_ms.target;
  m.draft_prefill_ms = r.first_forward_ms.draft;
  if (r.t_first != Clock::time_point{}) m.ttft_ms = ms_between(r.t_submit, r.t_first);
  m.ttft_forward_ms = r.forward_ms_to_first;
  m.queue_ms = ms_between(r.t_submit, r.t_admit != Clock::time_point{} ? r.t_admit : t_end);
  m.itl_ms = r.itl_ms;
  m.itl_p50_ms = ab::quantile(r.itl_ms, 0.5);
  m.itl_p90_ms = ab::quantile(r.itl_ms, 0.9);
  m.itl_max_ms = r.itl_ms.empty() ? 0 : *std::max_element(r.itl_ms.begin(), r.itl_ms.end());
  m.preemptions = r.preemptions;
  m.cached_prompt_tokens = r.book->cached_prompt();
  stats_.cached_prompt_tokens += static_cast<size_t>(m.cached_prompt_tokens);
  ++stats_.finished;
  stats_.prompt_tokens += static_cast<size_t>(m.n_prompt);
  stats_.output_tokens += static_cast<size_t>(m.n_generated);
  const double prefill_s = std::chrono::duration<double>(r.t_prefill1 - r.t_prefill0).count();
  m.prefill_tok_s = prefill_s > 0 ? (m.n_prompt - m.cached_prompt_tokens) / prefill_s : 0; // evaluated ones
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
    r.failed(e.what());
  }
}
} // namespace

// Starts waiting requests in order while the scheduler admits them; one that must wait for room
// keeps its place (and the ones behind it theirs). A preempted request gets its KV sequences back
// and continues its pending work from position 0.
void Engine::admit(Finished& done) {
  while (!waiting_.empty()) {
    Request& head = *waiting_.front();
    DecodeSession& s = *head.session;
    const auto finish_now = [&](StopReason reason, std::string message) {
      if (!head.admitted && !s.exists(0)) try {
          (void)s.open(head.sequence ? *head.sequence
                                     : tmpl_); // a sequence for the result, when there is room
        } catch (const std::exception&) {
          // (the result goes out without one: its error is already recorded)
        }
      s.end_all(reason);
      auto res = finish_request(head);
      if (!message.empty()) {
        res.second.stop_reason = reason;
        res.second.message = std::move(message);
      }
      if (head.on_finish) head.on_finish(res.first, res.second);
      done.push_back(std::move(res));
      waiting_.pop_front();
    };
    if (head.cancelled) {
      finish_now(head.error.empty() ? StopReason::cancelled : StopReason::error, "");
      continue;
    }
    const int64_t needed =
        head.admitted ? head.book->units_needed() : ctx_.kv().units_for(static_cast<int64_t>(s.n_prompt()));
    const Scheduler::Decision d = scheduler_.admission(s.n_prompt(), needed, running_.size());
    if (d.admission == Scheduler::Admission::wait) return;
    if (d.admission == Scheduler::Admission::never) {
      finish_now(d.reason, d.why);
      continue;
    }
    // Opening clones the request's sampler chain and stop plugins (plugin code): an exception fails this
    // request alone, with its KV given back, instead of escaping step() with the request still at the head.
    bool room = false;
    try {
      room = head.admitted ? head.book->restore() : s.open(head.sequence ? *head.sequence : tmpl_);
    } catch (const std::exception& e) {
      head.failed(e.what());
      finish_now(StopReason::error, "");
      continue;
    }
    if (head.admitted) {
      if (!room) return; // no free KV sequences after all: wait
    } else {
      if (!room) return; // the store refused a sequence after all: wait for room
      head.admitted = true;
      head.t_admit = Clock::now();
      if (head.max_new_tokens == 0) {
        finish_now(StopReason::max_tokens, "");
        continue;
      }
      guard(head, [&] { head.decoder = head.make_decoder(); });
      if (!head.decoder) {
        head.failed("the decoder could not be made");
        finish_now(StopReason::error, "");
        continue;
      }
      s.set_rollback(head.decoder->rolls_back());
    }
    // Running requests stay in arrival order (a restored one before those that came after it): the
    // scheduler preempts from the newest.
    auto at = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r->id > head.id; });
    running_.insert(at, std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

// What the step's schedule made of it: the requests in it (the schedule's indices) and each model's
// batch.
struct Engine::StepBatch {
  std::vector<Request*> owners;
  PerModel<Scheduler::Batch> batches; // each model's forward
};

// One step, in the order of the file's header: what other threads sent → admission → plans → the
// scheduler's batch → one forward per model → updates → the finished collected.
Engine::Finished Engine::step() {
  const auto t_step = Clock::now();
  auto t = t_step;
  const auto lap = [&t](double& into) { // the phase that just ended, into stats_.phase_ms
    const auto now = Clock::now();
    into += ms_between(t, now);
    t = now;
  };
  EngineStats::Phases& ph = stats_.phase_ms;
  Finished done = std::move(early_);
  early_.clear();
  take_incoming();
  admit(done);
  lap(ph.admit);
  const std::vector<char> planned = plan_running();
  release_cancelled();
  lap(ph.plan);
  StepBatch step = schedule_batch();
  lap(ph.schedule);
  const bool any_forward = forward(step);
  lap(ph.forward);
  update_evaluated(step.owners);
  lap(ph.update);
  const size_t n_running_step = running_.size();
  collect_finished(planned, done);
  lap(ph.finish);
  ++stats_.steps;
  if (any_forward) {
    const double ms = ms_between(t_step, Clock::now());
    stats_.busy_ms += ms;
    stats_.running_ms_integral += ms * static_cast<double>(n_running_step);
  }
  return done;
}

// Plans, from the requests whose last plan is fully evaluated (the others continue theirs). Returns which
// running requests were asked (in running_'s order).
std::vector<char> Engine::plan_running() {
  std::vector<char> called(running_.size(), 0);
  for (size_t i = 0; i < running_.size(); ++i) {
    Request& r = *running_[i];
    DecodeSession& s = *r.session;
    if (r.cancelled || r.awaiting_update) continue;
    called[i] = 1;
    guard(r, [&] {
      Session h = s.handle();
      if (!r.started) {
        r.started = true;
        r.decoder->start(h);
      }
      if (r.decoder->done(h)) return;
      r.decoder->plan(h);
      r.book->begin_work();
      r.awaiting_update = true;
    });
  }
  return called;
}

// Requests cancelled or failed so far give their KV back before the batch is built (they are collected
// at the end of the step).
void Engine::release_cancelled() {
  for (auto& r : running_)
    if (r->cancelled) r->session->release();
}

// The step's schedule (chunks of pending work within the token budget; preemption for room), applied
// in order: preemptions evict, takes reserve KV and fill each model's batch.
Engine::StepBatch Engine::schedule_batch() {
  StepBatch step;
  std::vector<Scheduler::RequestState> states;
  for (auto& r : running_)
    if (!r->cancelled) {
      step.owners.push_back(r.get());
      const SequenceBook& book = *r->book;
      Scheduler::RequestState st;
      st.decoding = r->prefilled && !r->recompute;
      st.evicted = book.evicted();
      st.pending = book.pending();
      for (ModelRole m : k_model_roles)
        st.kv_held[m] = book.kv_held(m);
      states.push_back(std::move(st));
    }
  const Scheduler::Schedule sched = scheduler_.schedule(states, ctx_.models.draft.kv);
  PerModel<size_t> copies_before;
  for (ModelRole m : k_model_roles)
    if (KVCacheStore* kv = ctx_.models[m].kv) copies_before[m] = kv->memory().queued_copies().size();
  for (const Scheduler::Action& a : sched.actions)
    apply(a, step);
  for (ModelRole m : k_model_roles)
    if (KVCacheStore* kv = ctx_.models[m].kv)
      count_block_copies(sched, m, kv->memory().queued_copies().subspan(copies_before[m]));
  return step;
}

void Engine::apply(const Scheduler::Action& a, StepBatch& step) {
  Request& r = *step.owners[a.request];
  switch (a.op) {
  case Scheduler::Action::Op::preempt:
    r.book->evict();
    r.recompute = true;
    ++r.preemptions;
    ++stats_.preemptions;
    break;
  case Scheduler::Action::Op::end:
    r.session->end_pending(a.seq, a.reason);
    break;
  case Scheduler::Action::Op::take:
    if (auto w = r.book->take_chunk(a.seq, a.n))
      step.batches[a.role].add(a.request, *w);
    else // the schedule is conservative about KV room, so this does not happen; the sequence waits if it does
      ++stats_.schedule_misses;
    break;
  }
}

// The block copies the takes recorded (`made`, on model m's store) are the schedule's: each one listed (the
// schedule may list more); one it did not list is a schedule miss.
void Engine::count_block_copies(const Scheduler::Schedule& sched, ModelRole m,
                                std::span<const KVBlockCopy> made) {
  std::vector<int64_t> listed;
  for (const auto& c : sched.copies)
    if (c.role == m) listed.push_back(c.copy.src);
  for (const KVBlockCopy& c : made) {
    ++stats_.block_copies;
    if (auto it = std::find(listed.begin(), listed.end(), c.src); it != listed.end())
      listed.erase(it);
    else
      ++stats_.schedule_misses;
  }
}

// One forward per model with rows in the step; each request's logits rows go to its sequences. Returns
// whether any forward ran.
bool Engine::forward(StepBatch& step) {
  bool any_forward = false;
  for (ModelRole m : k_model_roles)
    if (!step.batches[m].empty()) {
      LOOM_ASSERT(m == ModelRole::target || ctx_.has_draft(),
                  "draft sequences exist only with a draft model");
      any_forward = true;
      forward_model(m, step);
    }
  for (Request* r : step.owners) // rows of a failed forward are never made findable by content
    if (r->error.empty()) r->book->chunks_evaluated();
  // The KV store's written positions at their fullest (after the forward) while each request runs.
  const size_t kv_used = ctx_.kv().stats().bytes_used;
  for (auto& r : running_)
    r->kv_used_peak = std::max(r->kv_used_peak, kv_used);
  stats_.peak_kv_units = std::max(stats_.peak_kv_units, ctx_.kv().units_in_use());
  return any_forward;
}

void Engine::forward_model(ModelRole m, StepBatch& step) {
  const Scheduler::Batch& batch = step.batches[m];
  ++stats_.forwards;
  stats_.peak_batch_tokens = std::max(stats_.peak_batch_tokens, batch.tokens.size());
  const int32_t V = ctx_.n_vocab;
  logits_.resize(batch.out_rows.size() * static_cast<size_t>(V)); // (kept between steps: see below)
  const std::span<const float> logits(logits_);
  const auto t0 = Clock::now();
  bool ok = true;
  try {
    const ModelSlot& slot = ctx_.models[m];
    stats_.phase_ms.backend += slot.model->forward(*slot.backend, batch.view(), *slot.kv, logits_);
  } catch (const std::exception& e) { // a backend failure fails every request with tokens in it
    ok = false;
    for (size_t i : batch.sessions)
      step.owners[i]->failed(std::string(m == ModelRole::target ? "the forward pass failed: "
                                                                : "the draft model's forward pass failed: ") +
                             e.what());
  }
  const double ms = ms_between(t0, Clock::now());
  std::vector<char> seen(step.owners.size(), 0);
  for (const auto& o : batch.outs) // each request with rows in the batch once
    if (!seen[o.session]) {
      seen[o.session] = 1;
      Request& r = *step.owners[o.session];
      r.forward_ms[m] += ms;
      if (!r.forwarded[m]) r.first_forward_ms[m] = ms;
      r.forwarded[m] = true;
    }
  const auto t_copy = Clock::now();
  for (size_t i = 0; ok && i < batch.outs.size(); ++i) {
    const auto& o = batch.outs[i];
    step.owners[o.session]->book->set_logits(
        o.seq, o.row, logits.subspan(i * static_cast<size_t>(V), static_cast<size_t>(V)));
  }
  stats_.phase_ms.logits += ms_between(t_copy, Clock::now());
  if (batch.out_rows.size() > k_kept_logit_rows) { // a rare wide forward (every prompt row): not kept
    logits_.clear();
    logits_.shrink_to_fit();
  }
}

// Updates: the requests whose plan is now fully evaluated; the inter-token latencies of those that grew.
void Engine::update_evaluated(const std::vector<Request*>& owners) {
  const auto t_forward = Clock::now();
  for (Request* rp : owners) {
    Request& r = *rp;
    DecodeSession& s = *r.session;
    if (r.cancelled || r.book->evicted() || r.book->work_pending()) continue;
    if (!r.prefilled) {
      r.prefilled = true;
      r.t_prefill0 = r.t_admit;
      r.t_prefill1 = t_forward;
    }
    r.recompute = false;
    if (!r.awaiting_update) continue;
    r.awaiting_update = false;
    guard(r, [&] {
      Session h = s.handle();
      if (r.decoder->done(h)) return;
      r.decoder->update(h);
    });
    const size_t g = r.book->max_generated();
    if (g > r.n_generated) {
      const auto now = Clock::now();
      if (r.t_first == Clock::time_point{}) {
        r.t_first = now;
        r.forward_ms_to_first = r.forward_ms.target + r.forward_ms.draft;
      } else
        r.itl_ms.push_back(ms_between(r.t_last, now));
      r.t_last = now;
      r.n_generated = g;
    }
  }
  // The slabs held at their most during this step (forks inside update() included).
  const size_t kv_reserved = ctx_.kv().stats().bytes_allocated_peak;
  for (auto& r : running_)
    r->kv_reserved_peak = std::max(r->kv_reserved_peak, kv_reserved);
  ctx_.kv().reset_peak();
}

// Collects the finished requests; fails the ones whose decoder makes no progress; the preempted ones go
// back to the queue. `planned`: which of the running requests were asked to plan this step.
void Engine::collect_finished(const std::vector<char>& planned, Finished& done) {
  for (size_t i = 0, k = 0; i < running_.size(); ++k) {
    Request& r = *running_[i];
    bool finished = r.cancelled;
    if (!finished && !r.awaiting_update) guard(r, [&] { finished = r.decoder->done(r.session->handle()); });
    if (!finished && !r.cancelled && k < planned.size() && planned[k]) fail_if_stalled(r);
    finished = finished || r.cancelled;
    if (finished) {
      if (!r.cancelled)
        guard(r, [&] {
          Session h = r.session->handle();
          r.decoder->results(h);
        });
      r.session->end_all(r.error.empty() ? StopReason::cancelled : StopReason::error);
      auto res = finish_request(r);
      if (r.on_finish) r.on_finish(res.first, res.second);
      done.push_back(std::move(res));
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (r.book->evicted()) {
      auto owned = std::move(running_[i]);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      requeue(std::move(owned));
    } else {
      ++i;
    }
  }
}

// A request asked to plan whose session shows no progress for k_max_stalled_steps steps in a row fails.
void Engine::fail_if_stalled(Request& r) {
  const uint64_t p = r.book->progress();
  r.stalled = p == r.last_progress ? r.stalled + 1 : 0;
  r.last_progress = p;
  if (r.stalled >= k_max_stalled_steps)
    r.failed("decoder '" + std::string(r.decoder->name()) + "' made no progress in " +
             std::to_string(k_max_stalled_steps) +
             " steps (it planned no sequence with tokens to evaluate and appended, forked or finished "
             "none); this is a bug in the decoder");
}

// ---------------------------------------------------------------------------------------------
// The built-in `sample` decoder

namespace {
// Over the session table, as a plugin's decoder is.
class SampleDecoder final : public Decoder {
public:
  std::string_view name() const noexcept override { return "sample"; }
  void plan(Session& s) override {
    if (s.finished(0) == LOOM_STOP_NONE) s.plan(0);
  }
  void update(Session& s) override {
    if (s.finished(0) != LOOM_STOP_NONE || s.logits(0).empty()) return;
    s.append(0, s.sample(0));
  }
  bool done(const Session& s) const override { return s.finished(0) != LOOM_STOP_NONE; }
  void results(Session& s) override { s.add_result(0, s.score(0)); }
  bool rolls_back() const noexcept override { return false; }
};
} // namespace

std::unique_ptr<Decoder> make_sample_decoder() {
  return std::make_unique<SampleDecoder>();
}

} // namespace loom
