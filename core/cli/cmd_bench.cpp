// `loom bench`: prefill and decode throughput over repetitions (median and spread), TTFT, TPOT,
// peak RSS and the memory breakdown — comparable to llama-bench's pp/tg numbers.
#include "cli.hpp"
#include "loom/error.hpp"
#include "loom/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <immintrin.h>
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

// Σ of n 64-bit words: 32-byte loads into four independent sums when the CPU has AVX2 (the way the
// decode kernels read), else plain loads.
__attribute__((target("avx2"))) uint64_t read_sum_avx2(const uint64_t* p, size_t n) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    c = _mm256_add_epi64(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    d = _mm256_add_epi64(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
  uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < n; ++i)
    s += p[i];
  return s;
}
uint64_t read_sum(const uint64_t* p, size_t n) {
  static const bool avx2 = (__builtin_cpu_init(), __builtin_cpu_supports("avx2"));
  if (avx2) return read_sum_avx2(p, n);
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i)
    s0 += p[i];
  return s0 + s1 + s2 + s3;
}

// Read bandwidth: `threads` threads each sum their slice of a 512 MiB buffer; bytes read / wall
// time. Decode reads every weight once per token, so weight bytes / bandwidth bounds its speed.
int bandwidth_probe(const po::variables_map& vm) {
  const int threads = vm.count("threads") ? vm["threads"].as<int>() : 1;
  const int reps = vm["repetitions"].as<int>();
  if (threads < 1 || threads > 1024 || reps < 1)
    throw UsageError("--bandwidth: --threads must be 1..1024 and -r ≥ 1 (found " + std::to_string(threads) +
                     " and " + std::to_string(reps) + ")");
  const size_t n = (size_t{512} << 20) / sizeof(uint64_t);
  std::unique_ptr<uint64_t, decltype(&std::free)> mem(
      static_cast<uint64_t*>(std::aligned_alloc(64, n * sizeof(uint64_t))), &std::free);
  if (!mem) throw UsageError("--bandwidth: cannot allocate 512 MiB");
  uint64_t* buf = mem.get();
  for (size_t i = 0; i < n; ++i)
    buf[i] = i;
  std::vector<double> gbs;
  uint64_t sink = 0;
  for (int r = 0; r < reps + 1; ++r) { // the first pass is a warm-up
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        const size_t chunk = n / static_cast<size_t>(threads) / 4 * 4; // 32-byte aligned slices
        const size_t b = chunk * static_cast<size_t>(t);
        const size_t e = t + 1 == threads ? n : b + chunk;
        sums[static_cast<size_t>(t)] = read_sum(buf + b, e - b);
      });
    for (auto& t : ts)
      t.join();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (uint64_t v : sums)
      sink += v;
    if (r > 0) gbs.push_back(static_cast<double>(n * sizeof(uint64_t)) / sec / 1e9);
  }
  const auto [mn, mx] = std::minmax_element(gbs.begin(), gbs.end());
  if (vm.count("json")) {
    std::cout << nlohmann::json{{"threads", threads},
                                {"read_gb_s", median(gbs)},
                                {"read_gb_s_runs", gbs},
                                {"checksum", sink}}
                     .dump()
              << "\n";
  } else {
    std::printf("bandwidth: %.1f GB/s read with %d thread%s (median of %d; min %.1f, max %.1f)\n",
                median(gbs), threads, threads == 1 ? "" : "s", reps, *mn, *mx);
  }
  return k_exit_ok;
}

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024u; // Linux reports KiB
}

std::string mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
  return buf;
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
    ("repetitions,r", po::value<int>()->default_value(5), "repetitions (median and spread are reported)")
    ("set", po::value<std::vector<std::string>>()->composing(), "override a pipeline key: section.key=value")
    ("bandwidth", "measure memory read bandwidth instead (the decode bound): 512 MiB read by --threads "
                  "threads, -r times")
    ("json", "print one JSON object");
  // clang-format on
  po::variables_map vm;
  if (!parse_args(
          args, desc, vm,
          "usage: loom bench (-m MODEL.gguf | -c PIPELINE.toml) [--threads N] [--pp N] [--tg N] [-r R] "
          "[--json]\n"
          "Prefill (pp) and decode (tg) throughput, TTFT, TPOT and peak RSS, over R repetitions after one\n"
          "warm-up; prompts are random token ids, decoding is greedy with EOS ignored."))
    return k_exit_ok;
  if (vm.count("bandwidth")) return bandwidth_probe(vm);
  if (!vm.count("model") && !vm.count("config")) throw UsageError("give a model (-m) or a pipeline (-c)");
  const int pp = vm["pp"].as<int>(), tg = vm["tg"].as<int>(), reps = vm["repetitions"].as<int>();
  constexpr int k_max_tokens = 1 << 20; // bounds every size below before anything is allocated
  if (pp < 1 || tg < 1 || reps < 1 || pp > k_max_tokens || tg > k_max_tokens || reps > 1000)
    throw UsageError("--pp and --tg must be in 1.." + std::to_string(k_max_tokens) +
                     " and -r in 1..1000; found --pp " + std::to_string(pp) + ", --tg " + std::to_string(tg) +
                     ", -r " + std::to_string(reps));
  if (vm.count("threads") && (vm["threads"].as<int>() < 0 || vm["threads"].as<int>() > 1024))
    throw UsageError("--threads must be in 0..1024 (0 = all cores, as [backend] threads); found " +
                     std::to_string(vm["threads"].as<int>()));

  PipelineConfig cfg = config_from_args(vm);
  if (vm.count("threads")) cfg.backend.threads = vm["threads"].as<int>();
  cfg.model.n_ctx = std::max(cfg.model.n_ctx, pp + tg + 8);
  cfg.samplers = {SamplerSpec{"greedy", {}}};
  cfg.stop.eos = false;
  cfg.stop.strings.clear();
  cfg.stop.token_ids.clear();
  cfg.stop.timeout_ms = 0;
  cfg.run.seed = 1;

  auto p = Pipeline::create(cfg);
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
  for (int r = 0; r < reps; ++r) {
    if (tty) std::fprintf(stderr, "\rbench: repetition %d/%d", r + 1, reps);
    GenerationRequest q;
    q.prompt_tokens = prompt(pp);
    q.max_new_tokens = tg + 1; // the first token comes from the prefill; tg more are decoded
    const auto res = p->generate(q);
    if (!res.message.empty()) {
      if (tty) std::fprintf(stderr, "\n");
      fail(Errc::device_error, "bench", "repetition " + std::to_string(r + 1) + " failed: " + res.message);
    }
    pre.push_back(res.metrics.prefill_tok_s);
    dec.push_back(res.metrics.decode_tok_s);
    ttft.push_back(res.metrics.ttft_ms);
    tpot.push_back(res.metrics.tpot_ms);
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
                        {"backend", cfg.backend.name},
                        {"threads", cfg.backend.threads},
                        {"weight_type", std::string(dtype_name(mc.weight_type))},
                        {"n_params", mc.n_params},
                        {"pp", pp},
                        {"tg", tg},
                        {"repetitions", reps},
                        {"prefill_tok_s", median(pre)},
                        {"decode_tok_s", median(dec)},
                        {"prefill_tok_s_runs", pre},
                        {"decode_tok_s_runs", dec},
                        {"ttft_ms", median(ttft)},
                        {"tpot_ms", median(tpot)},
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
  std::printf("backend:  %s, threads %d\n", cfg.backend.name.c_str(), cfg.backend.threads);
  std::printf("prefill:  pp%-5d %10.1f tok/s  (median of %d; %s)\n", pp, median(pre), reps,
              spread(pre).c_str());
  std::printf("decode:   tg%-5d %10.1f tok/s  (median of %d; %s)\n", tg, median(dec), reps,
              spread(dec).c_str());
  std::printf("latency:  TTFT %.1f ms, TPOT %.2f ms (medians)\n", median(ttft), median(tpot));
  std::printf("memory:   peak RSS %s; weights %s, KV %s, activations %s, workspace %s (file %s)\n",
              mib(rss).c_str(), mib(mem.weights).c_str(), mib(mem.kv).c_str(), mib(mem.activations).c_str(),
              mib(mem.workspace).c_str(), mib(file_bytes).c_str());
  return k_exit_ok;
}

} // namespace loom::cli
