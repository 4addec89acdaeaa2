// `loom bench --requests N`: a load benchmark through the engine's scheduler — N requests, at most C in
// flight (closed loop) or arriving as a Poisson process — with latency percentiles, throughput, mean
// concurrency, peak KV, preemptions and the prefix cache's hit rate.
#include "bench.hpp"
#include "loom/error.hpp"
#include "loom/eval/ab_stats.hpp"
#include "loom/pipeline/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

namespace loom::cli {

namespace {

// --requests, --concurrency, --prompt-len, --gen-len, --shared-prefix and --rate, checked.
struct LoadSpec {
  int n_req = 0, conc = 0, plen = 0, glen = 0, prefix = 0;
  double rate = 0;
};

LoadSpec load_spec(const po::variables_map& vm) {
  const int n_req = vm["requests"].as<int>(), conc = vm["concurrency"].as<int>();
  const int plen = vm["prompt-len"].as<int>(), glen = vm["gen-len"].as<int>();
  const int prefix = vm["shared-prefix"].as<int>();
  const double rate = vm["rate"].as<double>();
  if (n_req < 1 || n_req > 1'000'000 || conc < 1 || conc > 4096 || plen < 1 || plen > (1 << 20) || glen < 1 ||
      glen > (1 << 20) || prefix < 0 || prefix > plen || !(rate >= 0) || !std::isfinite(rate))
    throw UsageError("--requests must be in 1..1000000, --concurrency in 1..4096, --prompt-len and --gen-len "
                     "in 1..1048576, --shared-prefix in 0..prompt-len and --rate ≥ 0 (found --requests " +
                     std::to_string(n_req) + ", --concurrency " + std::to_string(conc) + ", --prompt-len " +
                     std::to_string(plen) + ", --gen-len " + std::to_string(glen) + ", --shared-prefix " +
                     std::to_string(prefix) + ", --rate " + std::to_string(rate) + ")");
  return {n_req, conc, plen, glen, prefix, rate};
}

// The requests: their prompts (BOS and the shared prefix, then random ids) and arrival times (seconds
// after the start; all 0 in a closed loop), drawn from --seed.
struct Workload {
  std::vector<std::vector<TokenId>> prompts;
  std::vector<double> arrival;
};

Workload make_workload(const Pipeline& p, const LoadSpec& s, uint64_t seed) {
  const int32_t n_vocab = p.model().config().n_vocab;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(3, n_vocab - 1);
  std::vector<TokenId> shared;
  shared.push_back(p.tokenizer().bos() >= 0 ? p.tokenizer().bos() : 1);
  while (static_cast<int>(shared.size()) < std::max(s.prefix, 1))
    shared.push_back(tok(rng));
  Workload w{std::vector<std::vector<TokenId>>(static_cast<size_t>(s.n_req)),
             std::vector<double>(static_cast<size_t>(s.n_req), 0.0)};
  for (auto& pr : w.prompts) {
    pr.assign(shared.begin(), shared.begin() + std::max(s.prefix, 1));
    while (static_cast<int>(pr.size()) < s.plen)
      pr.push_back(tok(rng));
  }
  if (s.rate > 0) {
    std::exponential_distribution<double> gap(s.rate);
    double t = 0;
    for (auto& a : w.arrival)
      a = (t += gap(rng));
  }
  return w;
}

void show_progress(size_t done, size_t all) {
  const int w = 30, fill = static_cast<int>(w * done / all);
  std::fprintf(stderr, "\rbench: [%s%s] %zu/%zu requests",
               std::string(static_cast<size_t>(fill), '#').c_str(),
               std::string(static_cast<size_t>(w - fill), '.').c_str(), done, all);
}

// Submits each request when it is due and room is free, steps the engine until every one has ended;
// the results, and the wall time in *wall. A failed request fails the benchmark.
std::vector<GenerationResult> drive_load(Pipeline& p, const LoadSpec& s, const Workload& w, bool tty,
                                         double* wall) {
  Engine& engine = p.engine();
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  std::vector<GenerationResult> results;
  size_t next = 0, in_flight = 0, failed = 0;
  const auto submit_due = [&] {
    while (next < w.prompts.size() && static_cast<int>(in_flight) < s.conc && w.arrival[next] <= since()) {
      GenerationRequest q;
      q.prompt_tokens = w.prompts[next];
      q.max_new_tokens = s.glen;
      q.seed = next;
      (void)p.submit(q);
      ++next;
      ++in_flight;
    }
  };
  int last_shown = -1;
  while (results.size() < w.prompts.size()) {
    submit_due();
    if (engine.idle() && next < w.prompts.size()) { // nothing to run until the next arrival
      std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, w.arrival[next] - since())));
      continue;
    }
    for (auto& [id, res] : engine.step()) {
      if (!res.message.empty()) ++failed;
      results.push_back(std::move(res));
      --in_flight;
    }
    if (tty && static_cast<int>(results.size()) != last_shown) {
      last_shown = static_cast<int>(results.size());
      show_progress(results.size(), w.prompts.size());
    }
  }
  *wall = since();
  if (tty) std::fprintf(stderr, "\n");
  if (failed > 0)
    fail(Errc::device_error, "bench",
         std::to_string(failed) + " of " + std::to_string(s.n_req) +
             " requests failed: " + std::find_if(results.begin(), results.end(), [](const auto& r) {
                                      return !r.message.empty();
                                    })->message);
  return results;
}

// What the requests measured, gathered: per-request latencies (and every inter-token gap) and totals.
struct LoadTotals {
  std::vector<double> ttft, tpot, itl, e2e, queue;
  size_t out_tokens = 0, in_tokens = 0;
  int preemptions = 0;
  size_t cached = 0;
  double hit_rate = 0; // cached prompt tokens / prompt tokens
};

LoadTotals load_totals(const std::vector<GenerationResult>& results) {
  LoadTotals t;
  for (const auto& r : results) {
    t.ttft.push_back(r.metrics.ttft_ms);
    t.tpot.push_back(r.metrics.tpot_ms);
    t.e2e.push_back(r.metrics.total_ms);
    t.queue.push_back(r.metrics.queue_ms);
    t.itl.insert(t.itl.end(), r.metrics.itl_ms.begin(), r.metrics.itl_ms.end());
    t.out_tokens += static_cast<size_t>(r.metrics.n_generated);
    t.in_tokens += static_cast<size_t>(r.metrics.n_prompt);
    t.preemptions += r.metrics.preemptions;
    t.cached += static_cast<size_t>(r.metrics.cached_prompt_tokens);
  }
  t.hit_rate = t.in_tokens > 0 ? static_cast<double>(t.cached) / static_cast<double>(t.in_tokens) : 0;
  return t;
}

// The KV and memory the run held at its peak.
struct LoadMemory {
  uint64_t kv_peak = 0;     // KV held by requests
  uint64_t kv_resident = 0; // with cached blocks
  MemoryReport mem;
  uint64_t rss = 0, accounted = 0;
  double mean_conc = 0; // running sequences averaged over the engine's busy time
};

LoadMemory load_memory(const Pipeline& p, const EngineStats& st) {
  const KVCacheStore& kv = p.kv_store();
  const KVStats kv_stats = kv.stats();
  const uint64_t unit_bytes =
      kv.n_units() > 0 ? kv_stats.bytes_capacity / static_cast<uint64_t>(kv.n_units()) : 0;
  LoadMemory m;
  m.kv_peak = static_cast<uint64_t>(st.peak_kv_units) * unit_bytes;
  m.kv_resident = std::max<uint64_t>(m.kv_peak, kv_stats.bytes_resident);
  m.mem = p.memory();
  m.rss = peak_rss_bytes();
  m.accounted = m.mem.weights + m.kv_resident + m.mem.activations + m.mem.workspace;
  m.mean_conc = st.busy_ms > 0 ? st.running_ms_integral / st.busy_ms : 0;
  return m;
}

// One load benchmark's figures, for printing.
struct LoadReport {
  const Pipeline& p;
  const PipelineConfig& cfg;
  const LoadSpec& s;
  double wall;
  const LoadTotals& t;
  const EngineStats& st;
  const LoadMemory& m;
};

nlohmann::json percentiles(const std::vector<double>& v) {
  return nlohmann::json{
      {"p50", ab::quantile(v, 0.5)}, {"p90", ab::quantile(v, 0.9)}, {"p99", ab::quantile(v, 0.99)}};
}

void print_load_json(const LoadReport& r) {
  const KVCacheStore& kv = r.p.kv_store();
  const LoadSpec& s = r.s;
  const LoadTotals& t = r.t;
  const double wall = r.wall;
  nlohmann::json j = {{"model", r.cfg.resolved_model_path()},
                      {"backend", r.p.backend_name()},
                      {"threads", r.cfg.backend.threads},
                      {"kv_store", r.cfg.kv_cache.store},
                      {"kv_dtype", r.cfg.kv_cache.dtype},
                      {"kv_capacity_tokens", kv.capacity_positions()},
                      {"kv_capacity_bytes", kv.stats().bytes_capacity},
                      {"requests", s.n_req},
                      {"concurrency", s.conc},
                      {"rate", s.rate},
                      {"prompt_len", s.plen},
                      {"gen_len", s.glen},
                      {"shared_prefix", s.prefix},
                      {"wall_s", wall},
                      {"requests_per_s", s.n_req / wall},
                      {"output_tok_s", static_cast<double>(t.out_tokens) / wall},
                      {"total_tok_s", static_cast<double>(t.out_tokens + t.in_tokens) / wall},
                      {"mean_concurrency", r.m.mean_conc},
                      {"ttft_ms", percentiles(t.ttft)},
                      {"tpot_ms", percentiles(t.tpot)},
                      {"itl_ms", percentiles(t.itl)},
                      {"e2e_ms", percentiles(t.e2e)},
                      {"queue_ms", percentiles(t.queue)},
                      {"preemptions", t.preemptions},
                      {"prefix_cache", kv.shape().prefix_cache},
                      {"cached_prompt_tokens", t.cached},
                      {"prefix_cache_hit_rate", t.hit_rate},
                      {"peak_kv_units", r.st.peak_kv_units},
                      {"kv_units", kv.n_units()},
                      {"peak_kv_bytes", r.m.kv_peak},
                      {"peak_batch_tokens", r.st.peak_batch_tokens},
                      {"peak_rss_bytes", r.m.rss},
                      {"memory",
                       {{"weights_bytes", r.m.mem.weights},
                        {"kv_bytes", r.m.kv_resident},
                        {"activations_bytes", r.m.mem.activations},
                        {"workspace_bytes", r.m.mem.workspace},
                        {"accounted_bytes", r.m.accounted}}}};
  std::cout << j.dump() << "\n";
}

void print_percentiles(const char* name, const std::vector<double>& v) {
  std::printf("%-9s p50 %8.2f  p90 %8.2f  p99 %8.2f ms\n", name, ab::quantile(v, 0.5), ab::quantile(v, 0.9),
              ab::quantile(v, 0.99));
}

void print_load_text(const LoadReport& r) {
  const KVCacheStore& kv = r.p.kv_store();
  const PipelineConfig& cfg = r.cfg;
  const LoadSpec& s = r.s;
  const LoadTotals& t = r.t;
  const double wall = r.wall;
  const char* units = cfg.kv_cache.store == "paged" ? "blocks" : "slabs";
  std::printf("model:    %s, backend %s, threads %d\n", cfg.resolved_model_path().c_str(),
              r.p.backend_name().c_str(), cfg.backend.threads);
  std::printf("KV:       %s store of %s rows: %lld %s of %d positions = %lld tokens (%s)\n",
              cfg.kv_cache.store.c_str(), cfg.kv_cache.dtype.c_str(), static_cast<long long>(kv.n_units()),
              units, kv.positions_per_unit(), static_cast<long long>(kv.capacity_positions()),
              mib(kv.stats().bytes_capacity).c_str());
  std::printf("load:     %d requests, concurrency %d, %s, prompt %d, gen %d, shared prefix %d\n", s.n_req,
              s.conc, s.rate > 0 ? ("Poisson " + std::to_string(s.rate) + "/s").c_str() : "closed loop",
              s.plen, s.glen, s.prefix);
  std::printf("through:  %.2f req/s, %.1f output tok/s, %.1f total tok/s in %.2f s; mean concurrency %.1f\n",
              s.n_req / wall, static_cast<double>(t.out_tokens) / wall,
              static_cast<double>(t.out_tokens + t.in_tokens) / wall, wall, r.m.mean_conc);
  print_percentiles("TTFT:", t.ttft);
  print_percentiles("TPOT:", t.tpot);
  print_percentiles("ITL:", t.itl);
  print_percentiles("E2E:", t.e2e);
  print_percentiles("queue:", t.queue);
  std::printf("KV use:   peak %lld of %lld %s (%s); %d preemptions; largest batch %zu tokens\n",
              static_cast<long long>(r.st.peak_kv_units), static_cast<long long>(kv.n_units()), units,
              mib(r.m.kv_peak).c_str(), t.preemptions, r.st.peak_batch_tokens);
  if (kv.shape().prefix_cache)
    std::printf("prefix:   %.1f%% of prompt tokens found in the cache (%zu of %zu)\n", 100.0 * t.hit_rate,
                t.cached, t.in_tokens);
  std::printf("memory:   weights %s + KV %s + activations %s + workspace %s = %s; peak RSS %s\n",
              mib(r.m.mem.weights).c_str(), mib(r.m.kv_resident).c_str(), mib(r.m.mem.activations).c_str(),
              mib(r.m.mem.workspace).c_str(), mib(r.m.accounted).c_str(), mib(r.m.rss).c_str());
}

} // namespace

int load_bench(const po::variables_map& vm) {
  const LoadSpec s = load_spec(vm);
  PipelineConfig cfg = bench_config(vm, s.plen + s.glen + 8);
  cfg.stop.max_tokens = s.glen;
  cfg.scheduler.max_sequences = s.conc;
  auto p = Pipeline::create(cfg);
  if (!p->backend_note().empty()) std::cerr << "loom: " << p->backend_note() << "\n";
  const Workload w = make_workload(*p, s, vm["seed"].as<uint64_t>());
  warm_up(*p, std::vector<TokenId>(w.prompts[0].begin(), w.prompts[0].begin() + std::min(s.plen, 16)));
  p->engine().reset_stats();
  const bool tty = stderr_is_tty() && !vm.count("json");
  double wall = 0;
  const std::vector<GenerationResult> results = drive_load(*p, s, w, tty, &wall);
  const LoadTotals t = load_totals(results);
  const EngineStats& st = p->engine().stats();
  const LoadMemory m = load_memory(*p, st);
  const LoadReport report{*p, cfg, s, wall, t, st, m};
  if (vm.count("json"))
    print_load_json(report);
  else
    print_load_text(report);
  return k_exit_ok;
}

} // namespace loom::cli
