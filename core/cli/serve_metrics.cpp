// `loom serve`: the Prometheus metrics — each service's counters and latency histograms (Metrics), and
// GET /metrics's text of them all, under vLLM's names and `loom:`.
#include "serve.hpp"

#include <cstdio>
#include <malloc.h>

namespace loom::cli::serve {

void Metrics::Histogram::add(double v) {
  if (counts.empty()) counts.assign(bounds.size() + 1, 0);
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i])
    ++i;
  ++counts[i];
  sum += v;
  ++n;
}

void Metrics::finished(const GenerationResult& r, bool ok) {
  std::lock_guard lk(mu_);
  if (r.stop_reason == StopReason::cancelled)
    ++v_.cancelled;
  else
    (ok ? v_.success : v_.failed) += 1;
  v_.prompt_tokens += static_cast<uint64_t>(r.metrics.n_prompt);
  v_.generation_tokens += static_cast<uint64_t>(r.metrics.n_generated);
  if (r.metrics.n_generated > 0) v_.ttft.add(r.metrics.ttft_ms / 1e3);
  if (r.metrics.n_generated > 1) v_.tpot.add(r.metrics.tpot_ms / 1e3);
  v_.e2e.add(r.metrics.total_ms / 1e3);
  v_.queue.add(r.metrics.queue_ms / 1e3);
  if (r.metrics.n_generated > 0) v_.prefill.add(r.metrics.ttft_forward_ms / 1e3);
}

Metrics::Values Metrics::values() const {
  std::lock_guard lk(mu_);
  Values v = v_;
  v.http_errors = http_errors_.load();
  return v;
}

std::string render_metrics(const Services& ss) {
  struct One {
    std::string label;
    Service::Snapshot snap;
    Metrics::Values v;
  };
  std::vector<One> all;
  for (const auto& s : ss.all())
    all.push_back({"model_name=\"" + s->options().model_name + "\"", s->snapshot(), s->metrics().values()});
  std::string out;
  const auto num = [](double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.17g", v);
    return std::string(b);
  };
  // One family: HELP and TYPE once per namespace, then a sample per model.
  const auto line = [&](const std::string& name, const std::string& type, const std::string& help,
                        const std::function<double(const One&)>& value) {
    for (const char* ns : {"vllm:", "loom:"}) {
      out += "# HELP " + std::string(ns) + name + " " + help + "\n# TYPE " + ns + name + " " + type + "\n";
      for (const One& o : all)
        out += std::string(ns) + name + "{" + o.label + "} " + num(value(o)) + "\n";
    }
  };
  const auto hist = [&](const std::string& name, const std::string& help,
                        const std::function<const Metrics::Histogram&(const One&)>& h) {
    for (const char* ns : {"vllm:", "loom:"}) {
      out += "# HELP " + std::string(ns) + name + " " + help + "\n# TYPE " + ns + name + " histogram\n";
      for (const One& o : all) {
        const Metrics::Histogram& x = h(o);
        uint64_t cum = 0;
        for (size_t i = 0; i <= x.bounds.size(); ++i) {
          cum += x.counts.empty() ? 0 : x.counts[i];
          char le[32];
          if (i < x.bounds.size())
            std::snprintf(le, sizeof le, "%g", x.bounds[i]);
          else
            std::snprintf(le, sizeof le, "+Inf");
          out += std::string(ns) + name + "_bucket{" + o.label + ",le=\"" + le + "\"} " +
                 std::to_string(cum) + "\n";
        }
        out += std::string(ns) + name + "_sum{" + o.label + "} " + num(x.sum) + "\n";
        out += std::string(ns) + name + "_count{" + o.label + "} " + std::to_string(x.n) + "\n";
      }
    }
  };
  const auto d = [](auto v) { return static_cast<double>(v); };
  line("num_requests_running", "gauge", "Requests in the engine's running batch.",
       [&](const One& o) { return d(o.snap.running); });
  line("num_requests_waiting", "gauge", "Requests waiting to start.",
       [&](const One& o) { return d(o.snap.waiting); });
  line("kv_cache_usage_perc", "gauge", "Fraction of the KV cache's blocks in use (1 = full).",
       [&](const One& o) { return o.snap.kv_usage; });
  line("prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
       [&](const One& o) { return d(o.v.prompt_tokens); });
  line("generation_tokens_total", "counter", "Generated tokens of finished requests.",
       [&](const One& o) { return d(o.v.generation_tokens); });
  line("num_preemptions_total", "counter", "Requests preempted (KV taken back, recomputed later).",
       [&](const One& o) { return d(o.snap.preemptions); });
  line("request_success_total", "counter", "Requests that finished without an error.",
       [&](const One& o) { return d(o.v.success); });
  line("request_failure_total", "counter", "Requests that ended with an engine error.",
       [&](const One& o) { return d(o.v.failed); });
  line("request_cancelled_total", "counter", "Requests cancelled (their client went away).",
       [&](const One& o) { return d(o.v.cancelled); });
  line("http_request_errors_total", "counter", "Requests refused with a 4xx/5xx before reaching the engine.",
       [&](const One& o) { return d(o.v.http_errors); });
  hist("time_to_first_token_seconds", "Time to first token.",
       [](const One& o) -> const Metrics::Histogram& { return o.v.ttft; });
  hist("time_per_output_token_seconds", "Time per output token after the first.",
       [](const One& o) -> const Metrics::Histogram& { return o.v.tpot; });
  hist("e2e_request_latency_seconds", "Request latency, submit to end.",
       [](const One& o) -> const Metrics::Histogram& { return o.v.e2e; });
  hist("request_queue_time_seconds", "Time waiting before the first admission.",
       [](const One& o) -> const Metrics::Histogram& { return o.v.queue; });
  hist("request_prefill_time_seconds", "The prompt's forward passes, up to the first token.",
       [](const One& o) -> const Metrics::Histogram& { return o.v.prefill; });
  { // the process's heap (glibc's count of allocated bytes): what the soak test tells a leak from RSS by
    const struct mallinfo2 mi = mallinfo2();
    out += "# HELP loom:heap_in_use_bytes Heap bytes allocated and not freed (malloc's count).\n"
           "# TYPE loom:heap_in_use_bytes gauge\nloom:heap_in_use_bytes " +
           num(static_cast<double>(mi.uordblks + mi.hblkhd)) + "\n";
  }
  if (!ss.splits().empty()) { // which variant each split chose, for reading production traffic as an A/B
    out += "# HELP loom:ab_requests_total Requests an A/B split ([serve] ab) sent to each variant.\n"
           "# TYPE loom:ab_requests_total counter\n";
    for (const auto& sp : ss.splits())
      for (const auto& v : sp->variants())
        out += "loom:ab_requests_total{split=\"" + sp->name() + "\",variant=\"" +
               v.service->options().model_name + "\"} " + num(static_cast<double>(v.chosen)) + "\n";
  }
  return out;
}

} // namespace loom::cli::serve
