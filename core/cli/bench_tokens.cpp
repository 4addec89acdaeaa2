// `loom bench` (without --requests or --bandwidth): prefill and decode throughput over repetitions
// (median and spread), TTFT, TPOT, peak RSS and the memory breakdown — comparable to llama-bench's pp/tg
// numbers, at depth 0 or after -d positions already in the context.
#include "bench.hpp"
#include "loom/error.hpp"
#include "loom/pipeline/pipeline.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

namespace loom::cli {

namespace {

// --pp, --tg, -r and -d, checked.
struct TokenBenchSpec {
  int pp = 0, tg = 0, reps = 0, depth = 0;
  bool profile = false;
};

TokenBenchSpec token_bench_spec(const po::variables_map& vm) {
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
  return {pp, tg, reps, depth, vm.count("profile") > 0};
}

// Refused up front: positions past the trained context (RoPE extrapolates into noise, and attention's
// cost grows with the square of the length: a million positions would run for hours).
void check_trained_context(const Pipeline& p, const PipelineConfig& cfg, const TokenBenchSpec& s) {
  const int64_t need =
      static_cast<int64_t>(s.depth) + (s.depth == 0 ? int64_t{s.pp} + s.tg : std::max(s.pp, s.tg + 2));
  const int32_t limit = p.model().config().n_ctx_train;
  if (need > limit)
    fail(Errc::invalid_argument, "bench",
         "-d + --pp + --tg need " + std::to_string(need) + " positions (found -d " + std::to_string(s.depth) +
             ", --pp " + std::to_string(s.pp) + ", --tg " + std::to_string(s.tg) + ") but " +
             cfg.resolved_model_path() + " was trained on " + std::to_string(limit) +
             "; use at most that many in all");
}

// Where the decode steps' time went (--profile): the engine's phases summed over the timed decode
// requests' steps.
struct DecodeProfile {
  size_t steps = 0;
  EngineStats::Phases ms;

  void add(const EngineStats& before, const EngineStats& after) {
    steps += after.steps - before.steps;
    const auto& a = after.phase_ms;
    const auto& b = before.phase_ms;
    ms.admit += a.admit - b.admit;
    ms.plan += a.plan - b.plan;
    ms.schedule += a.schedule - b.schedule;
    ms.forward += a.forward - b.forward;
    ms.backend += a.backend - b.backend;
    ms.logits += a.logits - b.logits;
    ms.update += a.update - b.update;
    ms.finish += a.finish - b.finish;
  }
  double step_ms() const { return ms.admit + ms.plan + ms.schedule + ms.forward + ms.update + ms.finish; }
  // The host's parts of a step, per step (ms), in the order they run.
  std::vector<std::pair<const char*, double>> host_parts() const {
    const double n = steps > 0 ? static_cast<double>(steps) : 1.0;
    return {{"admit", ms.admit / n},
            {"plan", ms.plan / n},
            {"schedule", ms.schedule / n},
            {"forward outside the backend", (ms.forward - ms.backend - ms.logits) / n},
            {"logits into the requests", ms.logits / n},
            {"update (sampling, log-probs, stop rules, streaming)", ms.update / n},
            {"finish", ms.finish / n}};
  }
};

// Per repetition: prefill and decode tokens per second, TTFT and TPOT; the decode steps' profile.
struct TokenRuns {
  std::vector<double> pre, dec, ttft, tpot;
  DecodeProfile profile;
};

// The timed requests: random prompts (BOS, then ids drawn from one seeded generator), each request
// checked.
class TokenBench {
public:
  TokenBench(Pipeline& p, bool tty) : p_(p), tty_(tty), n_vocab_(p.model().config().n_vocab) {}

  std::vector<TokenId> prompt(int n) {
    std::vector<TokenId> t;
    t.push_back(p_.tokenizer().bos() >= 0 ? p_.tokenizer().bos() : 1);
    std::uniform_int_distribution<int32_t> d(3, n_vocab_ - 1);
    while (static_cast<int>(t.size()) < n)
      t.push_back(d(rng_));
    return t;
  }

  // Prefill: pp tokens from an empty context (the first token comes from it); decode: tg tokens from an
  // empty context too, after a one-token prompt — llama-bench's pp and tg, each at depth 0.
  void repetition_at_depth0(const TokenBenchSpec& s, int r, TokenRuns& out) {
    const auto p_res = run(prompt(s.pp), 1, r);
    const EngineStats before = p_.engine().stats();
    const auto d_res = run(prompt(1), s.tg + 1, r);
    out.profile.add(before, p_.engine().stats());
    out.pre.push_back(p_res.metrics.prefill_tok_s);
    out.dec.push_back(d_res.metrics.decode_tok_s);
    out.ttft.push_back(p_res.metrics.ttft_ms);
    out.tpot.push_back(d_res.metrics.tpot_ms);
  }

  // The context: `depth` tokens (a new draw each repetition), evaluated once and kept by the prefix
  // cache; then pp tokens after them (prefill at depth), and separately one token after them and tg
  // decoded (decode at depth), each request finding the context's whole blocks in the cache.
  void repetition_at_depth(const TokenBenchSpec& s, int32_t block, int r, TokenRuns& out) {
    const std::vector<TokenId> ctx = prompt(s.depth);
    (void)run(ctx, 1, r);
    std::vector<TokenId> more = ctx, extra = prompt(s.pp + 1);
    more.insert(more.end(), extra.begin() + 1, extra.end());
    const auto a = run(more, 1, r);
    if (a.metrics.cached_prompt_tokens < s.depth / block * block)
      fail(Errc::internal, "bench",
           "the context's " + std::to_string(s.depth) + " positions were not found in the prefix cache (" +
               std::to_string(a.metrics.cached_prompt_tokens) + " were)");
    out.pre.push_back(a.metrics.prefill_tok_s); // the evaluated prompt tokens over their steps' time
    out.ttft.push_back(a.metrics.ttft_ms);
    std::vector<TokenId> one = ctx;
    one.push_back(extra[1]);
    const EngineStats before = p_.engine().stats();
    const auto b = run(one, s.tg + 1, r);
    out.profile.add(before, p_.engine().stats());
    out.dec.push_back(b.metrics.decode_tok_s);
    out.tpot.push_back(b.metrics.tpot_ms);
  }

private:
  GenerationResult run(std::vector<TokenId> toks, int32_t n_new, int r) {
    GenerationRequest q;
    q.prompt_tokens = std::move(toks);
    q.max_new_tokens = n_new;
    auto res = p_.generate(q);
    if (!res.message.empty()) {
      if (tty_) std::fprintf(stderr, "\n");
      fail(Errc::device_error, "bench", "repetition " + std::to_string(r + 1) + " failed: " + res.message);
    }
    return res;
  }

  Pipeline& p_;
  bool tty_;
  int32_t n_vocab_;
  std::mt19937 rng_{1234};
};

// The memory a run reports beside the pipeline's own breakdown.
struct TokenBenchMemory {
  MemoryReport mem;
  uint64_t rss = 0, file_bytes = 0;
  uint64_t decode_read = 0; // weight bytes one decode step reads
  uint64_t kv_resident = 0; // the KV store's blocks made so far (KVStats::bytes_resident)
};

TokenBenchMemory token_bench_memory(const Pipeline& p, const PipelineConfig& cfg) {
  TokenBenchMemory m{p.memory(), peak_rss_bytes(), std::filesystem::file_size(cfg.resolved_model_path()), 0};
  // Weight bytes one decode step reads: all but the token-embedding table (one row of it is read),
  // unless that table is also the output matrix (tied embeddings).
  m.decode_read = m.mem.weights;
  m.kv_resident = p.kv_store().stats().bytes_resident;
  const GgufFile& gf = p.model().file();
  if (const GgufTensor* te = gf.find_tensor("token_embd.weight"); te && gf.find_tensor("output.weight"))
    m.decode_read -= std::min(m.decode_read, te->n_bytes);
  return m;
}

void print_token_bench_json(const Pipeline& p, const PipelineConfig& cfg, const TokenBenchSpec& s,
                            const TokenRuns& runs, const TokenBenchMemory& m) {
  const ModelConfig& mc = p.model().config();
  nlohmann::json j = {{"model", cfg.resolved_model_path()},
                      {"backend", p.backend_name()},
                      {"threads", cfg.backend.threads},
                      {"weight_type", std::string(dtype_name(mc.weight_type))},
                      {"n_params", mc.n_params},
                      {"pp", s.pp},
                      {"tg", s.tg},
                      {"depth", s.depth},
                      {"backend_info", std::string(p.backend().describe())},
                      {"repetitions", s.reps},
                      {"prefill_tok_s", median(runs.pre)},
                      {"decode_tok_s", median(runs.dec)},
                      {"prefill_tok_s_runs", runs.pre},
                      {"decode_tok_s_runs", runs.dec},
                      {"ttft_ms", median(runs.ttft)},
                      {"tpot_ms", median(runs.tpot)},
                      {"load_ms", p.load_ms()},
                      {"peak_rss_bytes", m.rss},
                      {"memory",
                       {{"weights_bytes", m.mem.weights},
                        {"kv_bytes", m.mem.kv},
                        {"kv_resident_bytes", m.kv_resident},
                        {"activations_bytes", m.mem.activations},
                        {"workspace_bytes", m.mem.workspace},
                        {"file_bytes", m.file_bytes},
                        {"decode_read_bytes", m.decode_read}}}};
  if (s.profile) {
    const DecodeProfile& d = runs.profile;
    const double n = d.steps > 0 ? static_cast<double>(d.steps) : 1.0, step = d.step_ms() / n;
    nlohmann::json parts = nlohmann::json::object();
    double host = 0.0;
    for (const auto& [name, ms] : d.host_parts()) {
      parts[name] = ms;
      host += ms;
    }
    j["profile"] = {{"decode_steps", d.steps},
                    {"step_ms", step},
                    {"backend_ms", d.ms.backend / n},
                    {"host_ms", host},
                    {"host_share", step > 0 ? host / step : 0.0},
                    {"host_ms_by_phase", parts}};
  }
  std::cout << j.dump() << "\n";
}

std::string spread(const std::vector<double>& v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "min %.1f, max %.1f", *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()));
  return std::string(buf);
}

void print_token_bench_text(const Pipeline& p, const PipelineConfig& cfg, const TokenBenchSpec& s,
                            const TokenRuns& runs, const TokenBenchMemory& m) {
  const ModelConfig& mc = p.model().config();
  std::printf("model:    %s (%s, %.1f M params)\n", cfg.resolved_model_path().c_str(),
              std::string(dtype_name(mc.weight_type)).c_str(), static_cast<double>(mc.n_params) / 1e6);
  const std::string info(p.backend().describe());
  std::printf("backend:  %s, threads %d%s%s\n", p.backend_name().c_str(), cfg.backend.threads,
              info.empty() ? "" : "; ", info.c_str());
  const std::string at = s.depth > 0 ? " @ d" + std::to_string(s.depth) : "";
  std::printf("prefill:  pp%-5d%s %10.1f tok/s  (median of %d; %s)\n", s.pp, at.c_str(), median(runs.pre),
              s.reps, spread(runs.pre).c_str());
  std::printf("decode:   tg%-5d%s %10.1f tok/s  (median of %d; %s)\n", s.tg, at.c_str(), median(runs.dec),
              s.reps, spread(runs.dec).c_str());
  std::printf(
      "latency:  TTFT %.1f ms, TPOT %.2f ms (medians); load %.1f ms (weights to the backend, KV pool)\n",
      median(runs.ttft), median(runs.tpot), p.load_ms());
  std::printf(
      "memory:   peak RSS %s; weights %s, KV %s (resident %s), activations %s, workspace %s (file %s)\n",
      mib(m.rss).c_str(), mib(m.mem.weights).c_str(), mib(m.mem.kv).c_str(), mib(m.kv_resident).c_str(),
      mib(m.mem.activations).c_str(), mib(m.mem.workspace).c_str(), mib(m.file_bytes).c_str());
  if (!s.profile) return;
  const DecodeProfile& d = runs.profile;
  const double n = d.steps > 0 ? static_cast<double>(d.steps) : 1.0, step = d.step_ms() / n;
  const auto pct = [&](double ms) { return step > 0 ? 100.0 * ms / step : 0.0; };
  std::printf("profile:  a decode step %.3f ms over %zu steps: backend compute %.3f ms (%.1f %%), host:\n",
              step, d.steps, d.ms.backend / n, pct(d.ms.backend / n));
  for (const auto& [name, ms] : d.host_parts())
    std::printf("          %-52s %8.3f ms %5.1f %%\n", name, ms, pct(ms));
}

} // namespace

int token_bench(const po::variables_map& vm) {
  const TokenBenchSpec s = token_bench_spec(vm);
  // depth 0: one request of pp + tg + 1 positions; else the context plus pp, or plus 1 + tg + 1
  PipelineConfig cfg =
      bench_config(vm, s.depth == 0 ? s.pp + s.tg + 8 : s.depth + std::max(s.pp, s.tg + 2) + 8);
  int32_t block = 1;
  if (s.depth > 0) { // the context's first `depth` positions come back from the prefix cache, untimed
    cfg.kv_cache.store = "paged";
    cfg.kv_cache.prefix_cache = true;
    block = cfg.kv_cache.block_size;
  }
  auto p = Pipeline::create(cfg);
  if (!p->backend_note().empty()) std::cerr << "loom: " << p->backend_note() << "\n";
  check_trained_context(*p, cfg, s);

  const bool tty = stderr_is_tty() && !vm.count("json");
  TokenBench bench(*p, tty);
  warm_up(*p, bench.prompt(std::min(s.pp, 16)));
  TokenRuns runs;
  for (int r = 0; r < s.reps; ++r) {
    if (tty) std::fprintf(stderr, "\rbench: repetition %d/%d", r + 1, s.reps);
    if (s.depth == 0)
      bench.repetition_at_depth0(s, r, runs);
    else
      bench.repetition_at_depth(s, block, r, runs);
  }
  if (tty) std::fprintf(stderr, "\n");
  const TokenBenchMemory m = token_bench_memory(*p, cfg);
  if (vm.count("json"))
    print_token_bench_json(*p, cfg, s, runs, m);
  else
    print_token_bench_text(*p, cfg, s, runs, m);
  return k_exit_ok;
}

} // namespace loom::cli
