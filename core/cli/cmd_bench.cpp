// `loom bench`: its options, and the pieces its benchmarks share. The benchmarks: prefill and decode
// throughput over repetitions (bench_tokens.cpp), many requests through the engine at once
// (bench_load.cpp) and the memory bandwidth that bounds decode (bench_bandwidth.cpp).
#include "bench.hpp"
#include "loom/error.hpp"
#include "loom/pipeline/pipeline.hpp"

#include <algorithm>
#include <cstdio>
#include <sys/resource.h>
#include <vector>

namespace loom::cli {

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
  // --profile: the backend's own per-op table too (the cpu and cuda plugins: [backend] profile)
  if (vm.count("profile") &&
      (cfg.backend.name == "cuda" || cfg.backend.name == "cpu" || cfg.backend.name == "auto"))
    cfg.backend.params.emplace_back("profile", true);
  return cfg;
}

void warm_up(Pipeline& p, std::vector<TokenId> prompt) {
  GenerationRequest w;
  w.prompt_tokens = std::move(prompt);
  w.max_new_tokens = 2;
  const auto res = p.generate(w);
  if (!res.message.empty()) fail(Errc::device_error, "bench", "the warm-up request failed: " + res.message);
}

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
    ("profile", "where a decode step's time goes: the engine's host phases and the backend's compute, "
                "and the cpu/cuda backend's per-op table on stderr ([backend] profile)")
    ("json", "print one JSON object");
  // clang-format on
  po::variables_map vm;
  if (!parse_args(
          args, desc, vm,
          "usage: loom bench (-m MODEL.gguf | -c PIPELINE.toml) [--threads N] [--pp N] [--tg N] [-d N] [-r "
          "R] "
          "[--profile] [--json]\n"
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
  return token_bench(vm);
}

} // namespace loom::cli
