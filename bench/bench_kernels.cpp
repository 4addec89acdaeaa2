// Google Benchmark of the cpu backend's decode kernels: one token against a matrix larger than the
// caches (K = 2048, N = 32768), one thread, each weight type in its GGUF layout and (Q8_0, Q4_0, Q4_K, Q6_K)
// repacked. Reports bytes/s of weights read, comparable with `loom bench --bandwidth -t 1`.
//   build/bench/loom_bench_kernels --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include "../backends/cpu/kernels.hpp"
#include "loom/sdk/dtype.hpp"

#include <benchmark/benchmark.h>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

using namespace loom;

constexpr int64_t K = 2048, N = 32768;

// Random blocks with every f16-aligned pair that decodes to a non-finite or large value replaced
// by 0.01 (scales small and finite), as the kernel tests make them.
std::vector<uint8_t> random_matrix(DType t) {
  std::mt19937 rng(1);
  std::vector<uint8_t> w(row_bytes(t, K) * static_cast<size_t>(N));
  for (auto& b : w)
    b = static_cast<uint8_t>(rng());
  if (t == DType::f32) {
    std::normal_distribution<float> nd(0.0f, 0.02f);
    for (size_t i = 0; i + 4 <= w.size(); i += 4) {
      const float v = nd(rng);
      std::memcpy(w.data() + i, &v, 4);
    }
    return w;
  }
  for (size_t i = 0; i + 1 < w.size(); i += 2) {
    uint16_t h;
    std::memcpy(&h, w.data() + i, 2);
    const float v = t == DType::bf16 ? bf16_to_fp32(h) : fp16_to_fp32(h);
    if (!std::isfinite(v) || std::fabs(v) > 4.0f) {
      h = t == DType::bf16 ? fp32_to_bf16(0.01f) : fp32_to_fp16(0.01f);
      std::memcpy(w.data() + i, &h, 2);
    }
  }
  return w;
}

// Threads of the kernels: $LOOM_BENCH_THREADS, default 1 (one core's speed).
int threads() {
  static const int n = [] {
    const char* e = std::getenv("LOOM_BENCH_THREADS");
    return e && std::atoi(e) > 0 ? std::atoi(e) : 1;
  }();
  return n;
}

// T tokens against the matrix (decode: T = 1), in its GGUF layout or repacked.
void run_matmul(benchmark::State& state, DType t, bool repacked, int64_t T) {
  const auto isa = cpu::detect_isa();
  const auto w = random_matrix(t);
  std::vector<uint8_t> wp;
  const bool f16x64 = repacked && t == DType::f16; // F16 "repacked": the 64-row f16x64 copy
  if (f16x64) {
    wp.resize(cpu::bf16x64_bytes(K, N));
    cpu::repack_f16x64(w.data(), row_bytes(t, K), K, N, reinterpret_cast<uint16_t*>(wp.data()));
  } else if (repacked) {
    wp.resize(cpu::repacked_bytes(t, K, N));
    cpu::repack(t, w.data(), row_bytes(t, K), K, N, wp.data());
  }
  std::vector<float> x(static_cast<size_t>(K * T)), y(static_cast<size_t>(N * T));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : x)
    v = nd(rng);
  for (auto _ : state) {
    if (f16x64)
      cpu::matmul_f16x64(isa, reinterpret_cast<const uint16_t*>(wp.data()), K, N, x.data(), T, y.data(),
                         threads());
    else if (repacked)
      cpu::matmul_repacked(isa, t, wp.data(), K, N, x.data(), T, y.data(), threads());
    else
      cpu::matmul(isa, t, w.data(), row_bytes(t, K), K, N, x.data(), T, y.data(), threads());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(repacked && !f16x64 ? wp.size() : w.size()));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * T); // tokens/s
  state.SetLabel(cpu::isa_name(isa));
}

void decode(benchmark::State& state, DType t, bool repacked) {
  run_matmul(state, t, repacked, 1);
}

// A small batch of T tokens (speculative verification of k + 1 positions, beams): compare each T's
// time with T = 1's — while the weights dominate it should stay near one token's.
void small_batch(benchmark::State& state, DType t, bool repacked) {
  run_matmul(state, t, repacked, state.range(0));
}

// The same for F16 in its f16x64 copy (the cpu backend's F16 route at AVX-512): verification batches.
void small_batch_f16x64(benchmark::State& state) {
  if (!cpu::at_least(cpu::detect_isa(), cpu::Isa::avx512)) {
    state.SkipWithError("f16x64 needs AVX-512");
    return;
  }
  run_matmul(state, DType::f16, true, state.range(0));
}

void batch_sizes(benchmark::internal::Benchmark* b) {
  for (int t : {1, 2, 5, 8})
    b->Arg(t);
}

// Prefill-sized batches: GOPS = 2·K·N·T per iteration (the int8 GEMM on AVX-512 VNNI, else AVX2).
void prefill(benchmark::State& state, DType t, bool repacked) {
  run_matmul(state, t, repacked, state.range(0));
  state.counters["GOPS"] = benchmark::Counter(2.0 * K * N * static_cast<double>(state.range(0)) *
                                                  static_cast<double>(state.iterations()),
                                              benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(decode, f32, DType::f32, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, f16, DType::f16, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, bf16, DType::bf16, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, q8_0, DType::q8_0, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, q8_0_repacked, DType::q8_0, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, q4_0, DType::q4_0, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, q4_0_repacked, DType::q4_0, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, q4_k, DType::q4_k, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, q4_k_repacked, DType::q4_k, true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, q6_k, DType::q6_k, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, q6_k_repacked, DType::q6_k, true)->Unit(benchmark::kMillisecond);

} // namespace

BENCHMARK_CAPTURE(small_batch, f16, DType::f16, false)->Apply(batch_sizes)->Unit(benchmark::kMillisecond);
BENCHMARK(small_batch_f16x64)
    ->Arg(1)
    ->Arg(2)
    ->Arg(3)
    ->Arg(4)
    ->Arg(5)
    ->Arg(6)
    ->Arg(8)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(small_batch, bf16, DType::bf16, false)->Apply(batch_sizes)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(small_batch, q8_0_repacked, DType::q8_0, true)
    ->Apply(batch_sizes)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(small_batch, q4_0_repacked, DType::q4_0, true)
    ->Apply(batch_sizes)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_CAPTURE(small_batch, q4_k_repacked, DType::q4_k, true)
    ->Apply(batch_sizes)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(small_batch, q6_k_repacked, DType::q6_k, true)
    ->Apply(batch_sizes)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_CAPTURE(prefill, q8_0_repacked, DType::q8_0, true)
    ->Arg(64)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(prefill, q4_0_repacked, DType::q4_0, true)
    ->Arg(64)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_CAPTURE(prefill, q4_k_repacked, DType::q4_k, true)
    ->Arg(64)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(prefill, q6_k_repacked, DType::q6_k, true)
    ->Arg(64)
    ->Arg(256)
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
