// `loom bench`: prefill and decode throughput over repetitions (median and spread), TTFT, TPOT,
// peak RSS and the memory breakdown — comparable to llama-bench's pp/tg numbers.
#include "cli.hpp"
#include "loom/ab_stats.hpp"
#include "loom/error.hpp"
#include "loom/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sys/resource.h>
#include <thread>
#include <vector>

namespace loom::cli {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024u; // Linux reports KiB
}

// The pipeline both benchmarks run: the user's, with --threads, room for n_ctx positions, greedy
// decoding and no stop rule but the token count.
PipelineConfig bench_config(const po::variables_map& vm, int n_ctx) {
  PipelineConfig cfg = config_from_args(vm);
  if (vm.count("threads")) cfg.backend.threads = vm["threads"].as<int>();
  cfg.model.n_ctx = std::max(cfg.model.n_ctx, n_ctx);
  cfg.samplers = {SamplerSpec{"greedy", {}}};
  cfg.stop.eos = false;
  cfg.stop.strings.clear();
  cfg.stop.token_ids.clear();
  cfg.stop.timeout_ms = 0;
  cfg.run.seed = 1;
  return cfg;
}

// `loom bench --requests N`: many requests through the engine at once, closed loop or Poisson.
int load_bench(const po::variables_map& vm) {
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
  PipelineConfig cfg = bench_config(vm, plen + glen + 8);
  cfg.stop.max_tokens = glen;
  cfg.scheduler.max_sequences = conc;
  auto p = Pipeline::create(cfg);
  if (!p->backend_note().empty()) std::cerr << "loom: " << p->backend_note() << "\n";
  Engine& engine = p->engine();
  const int32_t n_vocab = p->model().config().n_vocab;
  std::mt19937_64 rng(vm["seed"].as<uint64_t>());
  std::uniform_int_distribution<int32_t> tok(3, n_vocab - 1);
  std::vector<TokenId> shared;
  shared.push_back(p->tokenizer().bos() >= 0 ? p->tokenizer().bos() : 1);
  while (static_cast<int>(shared.size()) < std::max(prefix, 1))
    shared.push_back(tok(rng));
  std::vector<std::vector<TokenId>> prompts(static_cast<size_t>(n_req));
  for (auto& pr : prompts) {
    pr.assign(shared.begin(), shared.begin() + std::max(prefix, 1));
    while (static_cast<int>(pr.size()) < plen)
      pr.push_back(tok(rng));
  }
  std::vector<double> arrival(static_cast<size_t>(n_req), 0.0); // seconds after the start
  if (rate > 0) {
    std::exponential_distribution<double> gap(rate);
    double t = 0;
    for (auto& a : arrival)
      a = (t += gap(rng));
  }
  { // warm-up: page in the weights, build the graphs
    GenerationRequest w;
    w.prompt_tokens = std::vector<TokenId>(prompts[0].begin(), prompts[0].begin() + std::min(plen, 16));
    w.max_new_tokens = 2;
    const auto res = p->generate(w);
    if (!res.message.empty()) fail(Errc::device_error, "bench", "the warm-up request failed: " + res.message);
  }
  engine.reset_stats();
  const bool tty = stderr_is_tty() && !vm.count("json");
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const auto since = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  std::vector<GenerationResult> results;
  size_t next = 0, in_flight = 0, failed = 0;
  const auto submit_due = [&] {
    while (next < prompts.size() && static_cast<int>(in_flight) < conc && arrival[next] <= since()) {
      GenerationRequest q;
      q.prompt_tokens = prompts[next];
      q.max_new_tokens = glen;
      q.seed = next;
      (void)p->submit(q);
      ++next;
      ++in_flight;
    }
  };
  int last_shown = -1;
  while (results.size() < prompts.size()) {
    submit_due();
    if (engine.idle() && next < prompts.size()) { // nothing to run until the next arrival
      std::this_thread::sleep_for(std::chrono::duration<double>(std::max(0.0, arrival[next] - since())));
      continue;
    }
    for (auto& [id, res] : engine.step()) {
      if (!res.message.empty()) ++failed;
      results.push_back(std::move(res));
      --in_flight;
    }
    if (tty && static_cast<int>(results.size()) != last_shown) {
      last_shown = static_cast<int>(results.size());
      const int w = 30, fill = static_cast<int>(w * results.size() / prompts.size());
      std::fprintf(stderr, "\rbench: [%s%s] %zu/%zu requests",
                   std::string(static_cast<size_t>(fill), '#').c_str(),
                   std::string(static_cast<size_t>(w - fill), '.').c_str(), results.size(), prompts.size());
    }
  }
  const double wall = since();
  if (tty) std::fprintf(stderr, "\n");
  if (failed > 0)
    fail(Errc::device_error, "bench",
         std::to_string(failed) + " of " + std::to_string(n_req) +
             " requests failed: " + std::find_if(results.begin(), results.end(), [](const auto& r) {
                                      return !r.message.empty();
                                    })->message);
  std::vector<double> ttft, tpot, itl, e2e, queue;
  size_t out_tokens = 0, in_tokens = 0;
  int preemptions = 0;
  size_t cached = 0;
  for (const auto& r : results) {
    ttft.push_back(r.metrics.ttft_ms);
    tpot.push_back(r.metrics.tpot_ms);
    e2e.push_back(r.metrics.total_ms);
    queue.push_back(r.metrics.queue_ms);
    itl.insert(itl.end(), r.metrics.itl_ms.begin(), r.metrics.itl_ms.end());
    out_tokens += static_cast<size_t>(r.metrics.n_generated);
    in_tokens += static_cast<size_t>(r.metrics.n_prompt);
    preemptions += r.metrics.preemptions;
    cached += static_cast<size_t>(r.metrics.cached_prompt_tokens);
  }
  const double hit_rate = in_tokens > 0 ? static_cast<double>(cached) / static_cast<double>(in_tokens) : 0;
  const EngineStats& st = engine.stats();
  const KVCacheStore& kv = p->kv_store();
  const uint64_t unit_bytes =
      kv.n_units() > 0 ? kv.bytes_capacity() / static_cast<uint64_t>(kv.n_units()) : 0;
  const uint64_t kv_peak = static_cast<uint64_t>(st.peak_kv_units) * unit_bytes; // held by requests
  const uint64_t kv_resident = std::max<uint64_t>(kv_peak, kv.bytes_resident()); // with cached blocks
  const MemoryReport mem = p->memory();
  const uint64_t rss = peak_rss_bytes();
  const uint64_t accounted = mem.weights + kv_resident + mem.activations + mem.workspace;
  const double mean_conc = st.busy_ms > 0 ? st.running_ms_integral / st.busy_ms : 0;
  const auto pct = [&](const std::vector<double>& v) {
    return nlohmann::json{
        {"p50", ab::quantile(v, 0.5)}, {"p90", ab::quantile(v, 0.9)}, {"p99", ab::quantile(v, 0.99)}};
  };
  if (vm.count("json")) {
    nlohmann::json j = {{"model", cfg.resolved_model_path()},
                        {"backend", p->backend_name()},
                        {"threads", cfg.backend.threads},
                        {"kv_store", cfg.kv_cache.store},
                        {"kv_dtype", cfg.kv_cache.dtype},
                        {"kv_capacity_tokens", kv.capacity_positions()},
                        {"kv_capacity_bytes", kv.bytes_capacity()},
                        {"requests", n_req},
                        {"concurrency", conc},
                        {"rate", rate},
                        {"prompt_len", plen},
                        {"gen_len", glen},
                        {"shared_prefix", prefix},
                        {"wall_s", wall},
                        {"requests_per_s", n_req / wall},
                        {"output_tok_s", static_cast<double>(out_tokens) / wall},
                        {"total_tok_s", static_cast<double>(out_tokens + in_tokens) / wall},
                        {"mean_concurrency", mean_conc},
                        {"ttft_ms", pct(ttft)},
                        {"tpot_ms", pct(tpot)},
                        {"itl_ms", pct(itl)},
                        {"e2e_ms", pct(e2e)},
                        {"queue_ms", pct(queue)},
                        {"preemptions", preemptions},
                        {"prefix_cache", p->kv_store().shape().prefix_cache},
                        {"cached_prompt_tokens", cached},
                        {"prefix_cache_hit_rate", hit_rate},
                        {"peak_kv_units", st.peak_kv_units},
                        {"kv_units", kv.n_units()},
                        {"peak_kv_bytes", kv_peak},
                        {"peak_batch_tokens", st.peak_batch_tokens},
                        {"peak_rss_bytes", rss},
                        {"memory",
                         {{"weights_bytes", mem.weights},
                          {"kv_bytes", kv_resident},
                          {"activations_bytes", mem.activations},
                          {"workspace_bytes", mem.workspace},
                          {"accounted_bytes", accounted}}}};
    std::cout << j.dump() << "\n";
    return k_exit_ok;
  }
  const auto line = [&](const char* name, const std::vector<double>& v) {
    std::printf("%-9s p50 %8.2f  p90 %8.2f  p99 %8.2f ms\n", name, ab::quantile(v, 0.5), ab::quantile(v, 0.9),
                ab::quantile(v, 0.99));
  };
  std::printf("model:    %s, backend %s, threads %d\n", cfg.resolved_model_path().c_str(),
              p->backend_name().c_str(), cfg.backend.threads);
  std::printf("KV:       %s store of %s rows: %lld %s of %d positions = %lld tokens (%s)\n",
              cfg.kv_cache.store.c_str(), cfg.kv_cache.dtype.c_str(), static_cast<long long>(kv.n_units()),
              cfg.kv_cache.store == "paged" ? "blocks" : "slabs", kv.positions_per_unit(),
              static_cast<long long>(kv.capacity_positions()), mib(kv.bytes_capacity()).c_str());
  std::printf("load:     %d requests, concurrency %d, %s, prompt %d, gen %d, shared prefix %d\n", n_req, conc,
              rate > 0 ? ("Poisson " + std::to_string(rate) + "/s").c_str() : "closed loop", plen, glen,
              prefix);
  std::printf("through:  %.2f req/s, %.1f output tok/s, %.1f total tok/s in %.2f s; mean concurrency %.1f\n",
              n_req / wall, static_cast<double>(out_tokens) / wall,
              static_cast<double>(out_tokens + in_tokens) / wall, wall, mean_conc);
  line("TTFT:", ttft);
  line("TPOT:", tpot);
  line("ITL:", itl);
  line("E2E:", e2e);
  line("queue:", queue);
  std::printf("KV use:   peak %lld of %lld %s (%s); %d preemptions; largest batch %zu tokens\n",
              static_cast<long long>(st.peak_kv_units), static_cast<long long>(kv.n_units()),
              cfg.kv_cache.store == "paged" ? "blocks" : "slabs", mib(kv_peak).c_str(), preemptions,
              st.peak_batch_tokens);
  if (kv.shape().prefix_cache)
    std::printf("prefix:   %.1f%% of prompt tokens found in the cache (%zu of %zu)\n", 100.0 * hit_rate,
                cached, in_tokens);
  std::printf("memory:   weights %s + KV %s + activations %s + workspace %s = %s; peak RSS %s\n",
              mib(mem.weights).c_str(), mib(kv_resident).c_str(), mib(mem.activations).c_str(),
              mib(mem.workspace).c_str(), mib(accounted).c_str(), mib(rss).c_str());
  return k_exit_ok;
}

} // namespace

int cmd_bench(const std::vector<std::string>& args) {
  po::options_description desc("loom bench options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("model,m", po::value<std::string>(), "model file (GGUF)")
    ("config,c", po::value<std::string>(), "pipeline TOML (backend, threads, KV …)")
    ("threads,t", po::value<int>(), "threads (overrides [backend] threads)")
    ("pp", po::value<int>()->default_value(512), "prompt tokens to prefill")
    ("tg", po::value<int>()->default_value(128), "tokens to generate")
    ("depth,d", po::value<int>()->default_value(0), "positions already in the context: prefill and decode "
                                                  "are timed after them (llama-bench's -d)")
    ("repetitions,r", po::value<int>()->default_value(5), "repetitions (median and spread are reported)")
    ("set", po::value<std::vector<std::string>>()->composing(), "override a pipeline key: section.key=value")
    ("requests", po::value<int>(), "load benchmark: N requests through the engine (see below)")
    ("concurrency", po::value<int>()->default_value(16), "load: requests in flight at most")
    ("rate", po::value<double>()->default_value(0.0), "load: Poisson arrivals per second (0 = closed loop)")
    ("prompt-len", po::value<int>()->default_value(128), "load: prompt tokens per request (BOS included)")
    ("gen-len", po::value<int>()->default_value(128), "load: tokens generated per request")
    ("shared-prefix", po::value<int>()->default_value(0), "load: leading prompt tokens every request shares")
    ("seed", po::value<uint64_t>()->default_value(1), "load: seed of the prompts and arrival times")
    ("bandwidth", "measure memory read bandwidth instead (the decode bound): 512 MiB read by --threads "
                  "threads as 1, 4 and 8 streams each (and with prefetch), -r times; the best way counts; "
                  "plus a STREAM-style triad")
    ("json", "print one JSON object");
  // clang-format on
  po::variables_map vm;
  if (!parse_args(
          args, desc, vm,
          "usage: loom bench (-m MODEL.gguf | -c PIPELINE.toml) [--threads N] [--pp N] [--tg N] [-d N] [-r "
          "R] "
          "[--json]\n"
          "       loom bench (-m MODEL.gguf | -c PIPELINE.toml) --requests N [--concurrency C] [--rate R]\n"
          "                  [--prompt-len L] [--gen-len G] [--shared-prefix P] [--seed S] [--json]\n"
          "Prefill (pp) and decode (tg) throughput, TTFT, TPOT and peak RSS, over R repetitions after one\n"
          "warm-up; prompts are random token ids, decoding is greedy with EOS ignored. With -d N, both are\n"
          "timed after N positions already in the context (as llama-bench -d): a request of N tokens fills\n"
          "the paged store's prefix cache, then pp new tokens are prefilled after them, and tg tokens are\n"
          "decoded after N + 1.\n"
          "With --requests: a load benchmark through the engine's scheduler — N requests, at most C in\n"
          "flight (closed loop: a new one as one ends), or arriving as a Poisson process at R per second;\n"
          "TTFT / TPOT / inter-token latency percentiles, throughput, mean concurrency, peak KV, "
          "preemptions."))
    return k_exit_ok;
  if (vm.count("bandwidth")) return bandwidth_probe(vm);
  if (!vm.count("model") && !vm.count("config")) throw UsageError("give a model (-m) or a pipeline (-c)");
  if (vm.count("requests")) return load_bench(vm);
  const int pp = vm["pp"].as<int>(), tg = vm["tg"].as<int>(), reps = vm["repetitions"].as<int>();
  const int depth = vm["depth"].as<int>();
  constexpr int k_max_tokens = 1 << 20; // bounds every size below before anything is allocated
  if (pp < 1 || tg < 1 || reps < 1 || pp > k_max_tokens || tg > k_max_tokens || reps > 1000 || depth < 0 ||
      depth > k_max_tokens)
    throw UsageError("--pp and --tg must be in 1.." + std::to_string(k_max_tokens) + ", -d in 0.." +
                     std::to_string(k_max_tokens) + " and -r in 1..1000; found --pp " + std::to_string(pp) +
                     ", --tg " + std::to_string(tg) + ", -d " + std::to_string(depth) + ", -r " +
                     std::to_string(reps));
  if (vm.count("threads") && (vm["threads"].as<int>() < 0 || vm["threads"].as<int>() > 1024))
    throw UsageError("--threads must be in 0..1024 (0 = all cores, as [backend] threads); found " +
                     std::to_string(vm["threads"].as<int>()));

  // depth 0: one request of pp + tg + 1 positions; else the context plus pp, or plus 1 + tg + 1
  PipelineConfig cfg = bench_config(vm, depth == 0 ? pp + tg + 8 : depth + std::max(pp, tg + 2) + 8);
  int32_t block = 1;
  if (depth > 0) { // the context's first `depth` positions come back from the prefix cache, untimed
    cfg.kv_cache.store = "paged";
    cfg.kv_cache.prefix_cache = true;
    block = cfg.kv_cache.block_size;
  }

  auto p = Pipeline::create(cfg);
  if (!p->backend_note().empty()) std::cerr << "loom: " << p->backend_note() << "\n";
  { // refused up front: positions past the trained context (RoPE extrapolates into noise, and attention's
    // cost grows with the square of the length: a million positions would run for hours)
    const int64_t need = static_cast<int64_t>(depth) + (depth == 0 ? int64_t{pp} + tg : std::max(pp, tg + 2));
    const int32_t limit = p->model().config().n_ctx_train;
    if (need > limit)
      fail(Errc::invalid_argument, "bench",
           "-d + --pp + --tg need " + std::to_string(need) + " positions (found -d " + std::to_string(depth) +
               ", --pp " + std::to_string(pp) + ", --tg " + std::to_string(tg) + ") but " +
               cfg.resolved_model_path() + " was trained on " + std::to_string(limit) +
               "; use at most that many in all");
  }
  const int32_t n_vocab = p->model().config().n_vocab;
  std::mt19937 rng(1234);
  auto prompt = [&](int n) {
    std::vector<TokenId> t;
    t.push_back(p->tokenizer().bos() >= 0 ? p->tokenizer().bos() : 1);
    std::uniform_int_distribution<int32_t> d(3, n_vocab - 1);
    while (static_cast<int>(t.size()) < n)
      t.push_back(d(rng));
    return t;
  };
  const bool tty = stderr_is_tty() && !vm.count("json");
  { // warm-up: page in the weights, build the graphs
    GenerationRequest w;
    w.prompt_tokens = prompt(std::min(pp, 16));
    w.max_new_tokens = 2;
    const auto res = p->generate(w);
    if (!res.message.empty()) fail(Errc::device_error, "bench", "the warm-up request failed: " + res.message);
  }
  std::vector<double> pre, dec, ttft, tpot;
  const auto run = [&](std::vector<TokenId> toks, int32_t n_new, int r) {
    GenerationRequest q;
    q.prompt_tokens = std::move(toks);
    q.max_new_tokens = n_new;
    auto res = p->generate(q);
    if (!res.message.empty()) {
      if (tty) std::fprintf(stderr, "\n");
      fail(Errc::device_error, "bench", "repetition " + std::to_string(r + 1) + " failed: " + res.message);
    }
    return res;
  };
  for (int r = 0; r < reps; ++r) {
    if (tty) std::fprintf(stderr, "\rbench: repetition %d/%d", r + 1, reps);
    if (depth == 0) {
      // prefill: pp tokens from an empty context (the first token comes from it); decode: tg tokens from
      // an empty context too, after a one-token prompt — llama-bench's pp and tg, each at depth 0
      const auto p_res = run(prompt(pp), 1, r);
      const auto d_res = run(prompt(1), tg + 1, r);
      pre.push_back(p_res.metrics.prefill_tok_s);
      dec.push_back(d_res.metrics.decode_tok_s);
      ttft.push_back(p_res.metrics.ttft_ms);
      tpot.push_back(d_res.metrics.tpot_ms);
      continue;
    }
    // The context: `depth` tokens (a new draw each repetition), evaluated once and kept by the prefix
    // cache; then pp tokens after them (prefill at depth), and separately one token after them and tg
    // decoded (decode at depth), each request finding the context's whole blocks in the cache.
    const std::vector<TokenId> ctx = prompt(depth);
    (void)run(ctx, 1, r);
    std::vector<TokenId> more = ctx, extra = prompt(pp + 1);
    more.insert(more.end(), extra.begin() + 1, extra.end());
    const auto a = run(more, 1, r);
    if (a.metrics.cached_prompt_tokens < depth / block * block)
      fail(Errc::internal, "bench",
           "the context's " + std::to_string(depth) + " positions were not found in the prefix cache (" +
               std::to_string(a.metrics.cached_prompt_tokens) + " were)");
    pre.push_back(a.metrics.prefill_tok_s); // the evaluated prompt tokens over their steps' time
    ttft.push_back(a.metrics.ttft_ms);
    std::vector<TokenId> one = ctx;
    one.push_back(extra[1]);
    const auto b = run(one, tg + 1, r);
    dec.push_back(b.metrics.decode_tok_s);
    tpot.push_back(b.metrics.tpot_ms);
  }
  if (tty) std::fprintf(stderr, "\n");
  const MemoryReport mem = p->memory();
  const uint64_t rss = peak_rss_bytes();
  const uint64_t file_bytes = std::filesystem::file_size(cfg.resolved_model_path());
  // Weight bytes one decode step reads: all but the token-embedding table (one row of it is read),
  // unless that table is also the output matrix (tied embeddings).
  uint64_t decode_read = mem.weights;
  const GgufFile& gf = p->model().file();
  if (const GgufTensor* te = gf.find_tensor("token_embd.weight"); te && gf.find_tensor("output.weight"))
    decode_read -= std::min(decode_read, te->n_bytes);
  const ModelConfig& mc = p->model().config();
  if (vm.count("json")) {
    nlohmann::json j = {{"model", cfg.resolved_model_path()},
                        {"backend", p->backend_name()},
                        {"threads", cfg.backend.threads},
                        {"weight_type", std::string(dtype_name(mc.weight_type))},
                        {"n_params", mc.n_params},
                        {"pp", pp},
                        {"tg", tg},
                        {"depth", depth},
                        {"backend_info", std::string(p->backend().describe())},
                        {"repetitions", reps},
                        {"prefill_tok_s", median(pre)},
                        {"decode_tok_s", median(dec)},
                        {"prefill_tok_s_runs", pre},
                        {"decode_tok_s_runs", dec},
                        {"ttft_ms", median(ttft)},
                        {"tpot_ms", median(tpot)},
                        {"load_ms", p->load_ms()},
                        {"peak_rss_bytes", rss},
                        {"memory",
                         {{"weights_bytes", mem.weights},
                          {"kv_bytes", mem.kv},
                          {"activations_bytes", mem.activations},
                          {"workspace_bytes", mem.workspace},
                          {"file_bytes", file_bytes},
                          {"decode_read_bytes", decode_read}}}};
    std::cout << j.dump() << "\n";
    return k_exit_ok;
  }
  auto spread = [](const std::vector<double>& v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "min %.1f, max %.1f", *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()));
    return std::string(buf);
  };
  std::printf("model:    %s (%s, %.1f M params)\n", cfg.resolved_model_path().c_str(),
              std::string(dtype_name(mc.weight_type)).c_str(), static_cast<double>(mc.n_params) / 1e6);
  const std::string info(p->backend().describe());
  std::printf("backend:  %s, threads %d%s%s\n", p->backend_name().c_str(), cfg.backend.threads,
              info.empty() ? "" : "; ", info.c_str());
  const std::string at = depth > 0 ? " @ d" + std::to_string(depth) : "";
  std::printf("prefill:  pp%-5d%s %10.1f tok/s  (median of %d; %s)\n", pp, at.c_str(), median(pre), reps,
              spread(pre).c_str());
  std::printf("decode:   tg%-5d%s %10.1f tok/s  (median of %d; %s)\n", tg, at.c_str(), median(dec), reps,
              spread(dec).c_str());
  std::printf(
      "latency:  TTFT %.1f ms, TPOT %.2f ms (medians); load %.1f ms (weights to the backend, KV pool)\n",
      median(ttft), median(tpot), p->load_ms());
  std::printf("memory:   peak RSS %s; weights %s, KV %s, activations %s, workspace %s (file %s)\n",
              mib(rss).c_str(), mib(mem.weights).c_str(), mib(mem.kv).c_str(), mib(mem.activations).c_str(),
              mib(mem.workspace).c_str(), mib(file_bytes).c_str());
  return k_exit_ok;
}

} // namespace loom::cli
