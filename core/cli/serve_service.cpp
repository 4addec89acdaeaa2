// `loom serve`: the services a request can go to — one engine's step loop per served pipeline (Service),
// and the A/B splits that choose one of several by weight (Split).
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "serve.hpp"

#include <cstdio>
#include <future>
#include <malloc.h>

namespace loom::cli::serve {

Service::Service(const PipelineConfig& cfg, ServeOptions o) : o_(std::move(o)) {
  std::promise<void> loaded;
  std::future<void> ready = loaded.get_future();
  thread_ = std::thread([this, &cfg, &loaded] {
    try {
      p_ = Pipeline::create(cfg);
      choose_chat_template();
    } catch (...) {
      loaded.set_exception(std::current_exception());
      return;
    }
    loaded.set_value();
    loop();
  });
  try {
    ready.get();
  } catch (...) {
    thread_.join();
    throw;
  }
}

// The chat template: --template, else the model's, else the built-in one whose turn tokens the vocabulary
// holds, else ChatML (as llama-server does), said on stderr; and how it writes tool calls.
void Service::choose_chat_template() {
  try {
    tmpl_.emplace(chat::load_template(o_.chat_template, &p_->model().file()));
  } catch (const Error& e) {
    if (!o_.chat_template.empty()) throw;
    const auto b = chat::builtin_for_vocabulary(p_->model().file());
    const std::string name(b ? *b : "chatml");
    tmpl_.emplace(chat::load_template(name, &p_->model().file()));
    std::fprintf(stderr,
                 "loom serve: the model has no chat template: chat completions use the built-in '%s'\n",
                 name.c_str());
  }
  tool_format_ = tools::format_of_template(
      !o_.chat_template.empty()
          ? std::string_view(o_.chat_template)
          : std::string_view(
                p_->model().file().get_string_opt("tokenizer.chat_template").value_or(tmpl_->name())));
}

Service::~Service() {
  stop();
}

void Service::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

RequestId Service::submit(EngineRequest req, const std::shared_ptr<Job>& job) {
  if (snapshot().waiting >= o_.max_queue)
    throw Error(Errc::out_of_memory, "serve",
                "the queue is full (" + std::to_string(o_.max_queue) + " requests waiting): retry later");
  std::weak_ptr<Job> w = job;
  req.on_text = [w](std::string_view t) {
    if (auto j = w.lock()) {
      {
        std::lock_guard lk(j->mu);
        j->text.append(t);
      }
      j->cv.notify_all();
    }
  };
  req.on_finish = [this, w](RequestId, const GenerationResult& r) {
    metrics_.finished(r, r.message.empty());
    --in_flight_;
    if (auto j = w.lock()) {
      {
        std::lock_guard lk(j->mu);
        j->result = r;
        j->done = true;
      }
      j->cv.notify_all();
    }
  };
  ++in_flight_;
  try {
    return p_->engine().submit(std::move(req));
  } catch (...) {
    --in_flight_;
    throw;
  }
}

Service::Snapshot Service::snapshot() const {
  std::lock_guard lk(snap_mu_);
  return snap_;
}

void Service::loop() {
  Engine& e = p_->engine();
  const KVCacheStore& kv = p_->kv_store();
  // Runs until stop() and no request is left (a drain lets the requests in flight finish).
  bool stepped = false; // since the engine was last idle
  while (!stop_ || in_flight_ > 0) {
    if (e.idle() &&
        !e.wait_for_work(std::chrono::milliseconds(50))) { // nothing to step: sleep until a submit
      if (stepped) {    // the load is gone: the allocator's free pages go back to the system (RSS follows
        malloc_trim(0); // the heap instead of its high-water mark; measured by scripts/soak_serve.py)
        stepped = false;
      }
      if (stop_ && in_flight_ == 0) break;
      continue;
    }
    stepped = true;
    (void)e.step(); // (results reach their jobs through on_finish)
    Snapshot sn;
    sn.running = e.n_running();
    sn.waiting = e.n_waiting();
    sn.preemptions = e.stats().preemptions;
    sn.kv_usage =
        kv.n_units() > 0 ? static_cast<double>(kv.units_in_use()) / static_cast<double>(kv.n_units()) : 0.0;
    std::lock_guard lk(snap_mu_);
    snap_ = sn;
  }
}

// ---- A/B splits ----

Split::Split(std::string name, std::vector<std::pair<Service*, double>> variants)
    : name_(std::move(name)), rng_(std::random_device{}()) {
  double sum = 0;
  for (const auto& [s, w] : variants)
    sum += w;
  for (const auto& [s, w] : variants)
    v_.push_back({s, w / sum, 0});
}

Service& Split::pick(const std::string& user) {
  std::lock_guard lock(mu_);
  double u;
  if (!user.empty()) { // the same user, the same variant: FNV-1a of the name, as a fraction
    uint64_t h = 1469598103934665603ull;
    for (const char c : user)
      h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
    u = static_cast<double>(h >> 11) * 0x1.0p-53;
  } else {
    u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  }
  size_t i = 0;
  for (double acc = v_[0].weight; i + 1 < v_.size() && u >= acc; acc += v_[++i].weight) {
  }
  ++v_[i].chosen;
  return *v_[i].service;
}

std::vector<Split::Variant> Split::variants() const {
  std::lock_guard lock(mu_);
  return v_;
}

} // namespace loom::cli::serve
