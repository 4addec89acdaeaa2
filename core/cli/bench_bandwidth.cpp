// `loom bench --bandwidth`: the memory read bandwidth that bounds decode (every weight is read once per
// token), measured several ways by `--threads` threads over a 512 MiB buffer, and a STREAM-style triad.
#include "bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace loom::cli {

namespace {

// Σ of n 64-bit words read as `streams` interleaved sequential streams (the n words split into that many
// contiguous parts, four 64-byte lines of each per step), optionally prefetching `ahead` bytes in front of
// each: several streams per thread keep more cache-line misses in flight than one, which is what a
// decode kernel reading 4–16 weight rows at once does. S is a compile-time constant so that the accumulators
// stay in registers (with a run-time index into an array of vectors they lived on the stack, and the
// one-stream way ran at the latency of a store-to-load round trip per line: ≈ 22 GB/s per thread on the Zen 5
// of docs/benchmarks.md). Four lines of each stream per step, each into its own accumulator.
template <int S>
__attribute__((target("avx2"))) uint64_t read_streams_avx2_s(const uint64_t* p, size_t n, size_t ahead) {
  const size_t part = n / S / 32 * 32; // whole groups of four 64-byte lines
  __m256i acc[8];
  for (auto& a : acc)
    a = _mm256_setzero_si256();
  for (size_t i = 0; i < part; i += 32)
    for (int s = 0; s < S; ++s) {
      const uint64_t* q = p + static_cast<size_t>(s) * part + i;
      if (ahead)
        for (int u = 0; u < 4; ++u)
          _mm_prefetch(reinterpret_cast<const char*>(q + 8 * u) + ahead, _MM_HINT_T0);
      for (int u = 0; u < 4; ++u) {
        __m256i& a = acc[(4 * s + u) & 7];
        a = _mm256_add_epi64(
            a, _mm256_add_epi64(_mm256_load_si256(reinterpret_cast<const __m256i*>(q + 8 * u)),
                                _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 8 * u + 4))));
      }
    }
  __m256i t = acc[0];
  for (int k = 1; k < 8; ++k)
    t = _mm256_add_epi64(t, acc[k]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), t);
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (size_t i = part * S; i < n; ++i)
    sum += p[i];
  return sum;
}

// streams: 1, 4 or 8.
uint64_t read_streams_avx2(const uint64_t* p, size_t n, int streams, size_t ahead) {
  switch (streams) {
  case 1:
    return read_streams_avx2_s<1>(p, n, ahead);
  case 4:
    return read_streams_avx2_s<4>(p, n, ahead);
  default:
    return read_streams_avx2_s<8>(p, n, ahead);
  }
}

// The same on any x86-64 (plain 64-bit loads, one line per stream per step).
uint64_t read_streams(const uint64_t* p, size_t n, int streams, size_t ahead) {
  static const bool avx2 = (__builtin_cpu_init(), __builtin_cpu_supports("avx2"));
  if (avx2) return read_streams_avx2(p, n, streams, ahead);
  const size_t part = n / static_cast<size_t>(streams) / 8 * 8;
  uint64_t s0 = 0, s1 = 0;
  for (size_t i = 0; i < part; i += 8)
    for (int s = 0; s < streams; ++s) {
      const uint64_t* q = p + static_cast<size_t>(s) * part + i;
      if (ahead) __builtin_prefetch(reinterpret_cast<const char*>(q) + ahead);
      s0 += q[0] + q[2] + q[4] + q[6];
      s1 += q[1] + q[3] + q[5] + q[7];
    }
  for (size_t i = part * static_cast<size_t>(streams); i < n; ++i)
    s0 += p[i];
  return s0 + s1;
}

// Wall seconds for `threads` threads each running fn(t) once.
template <class Fn> double timed_threads(int threads, Fn fn) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&fn, t] { fn(t); });
  for (auto& t : ts)
    t.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

// Read bandwidth: `threads` threads each read their slice of a 512 MiB buffer, in several ways (one
// stream per thread; 4 and 8 interleaved streams; 4 streams with software prefetch); bytes read / wall
// time, median over -r runs of each way, and the best way's median is the read bandwidth. Decode reads
// every weight once per token, so weight bytes / bandwidth bounds its speed. A STREAM-style triad
// (a = b + s·c over three 128 MiB arrays, 3 × 128 MiB counted) is reported beside it.
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
  // first touch by the threads that read it (the pages' NUMA node)
  timed_threads(threads, [&](int t) {
    const size_t chunk = n / static_cast<size_t>(threads) / 8 * 8;
    const size_t b = chunk * static_cast<size_t>(t), e = t + 1 == threads ? n : b + chunk;
    for (size_t i = b; i < e; ++i)
      buf[i] = i;
  });
  struct Way {
    const char* name;
    int streams; // 1, 4 or 8
    size_t ahead;
  };
  const Way ways[] = {
      {"1 stream", 1, 0}, {"4 streams", 4, 0}, {"8 streams", 8, 0}, {"4 streams + prefetch", 4, 1024}};
  std::vector<std::vector<double>> runs(std::size(ways));
  uint64_t sink = 0;
  for (int r = 0; r < reps + 1; ++r) // the first pass is a warm-up; the ways interleave
    for (size_t w = 0; w < std::size(ways); ++w) {
      std::vector<uint64_t> sums(static_cast<size_t>(threads));
      const double sec = timed_threads(threads, [&](int t) {
        const size_t chunk = n / static_cast<size_t>(threads) / 8 * 8; // whole 64-byte lines
        const size_t b = chunk * static_cast<size_t>(t);
        const size_t e = t + 1 == threads ? n : b + chunk;
        sums[static_cast<size_t>(t)] = read_streams(buf + b, e - b, ways[w].streams, ways[w].ahead);
      });
      for (uint64_t v : sums)
        sink += v;
      if (r > 0) runs[w].push_back(static_cast<double>(n * sizeof(uint64_t)) / sec / 1e9);
    }
  size_t best = 0;
  for (size_t w = 1; w < std::size(ways); ++w)
    if (median(runs[w]) > median(runs[best])) best = w;
  // triad over the same memory: three arrays of 128 MiB (doubles)
  std::vector<double> triad;
  {
    const size_t m = (size_t{128} << 20) / sizeof(double);
    auto* a = reinterpret_cast<double*>(buf);
    double* b = a + m;
    double* c = b + m;
    for (size_t i = 0; i < m; ++i) { // normal numbers (the probe's integers would be denormals)
      b[i] = 1.0;
      c[i] = 2.0;
    }
    for (int r = 0; r < reps + 1; ++r) {
      const double sec = timed_threads(threads, [&](int t) {
        const size_t chunk = m / static_cast<size_t>(threads) / 8 * 8;
        const size_t lo = chunk * static_cast<size_t>(t), hi = t + 1 == threads ? m : lo + chunk;
        for (size_t i = lo; i < hi; ++i)
          a[i] = b[i] + 3.0 * c[i];
      });
      if (r > 0) triad.push_back(3.0 * static_cast<double>(m * sizeof(double)) / sec / 1e9);
    }
    sink += static_cast<uint64_t>(a[m / 3]);
  }
  const auto [mn, mx] = std::minmax_element(runs[best].begin(), runs[best].end());
  if (vm.count("json")) {
    nlohmann::json by_way = nlohmann::json::object();
    for (size_t w = 0; w < std::size(ways); ++w)
      by_way[ways[w].name] = {{"read_gb_s", median(runs[w])}, {"runs", runs[w]}};
    std::cout << nlohmann::json{{"threads", threads},
                                {"read_gb_s", median(runs[best])},
                                {"read_gb_s_runs", runs[best]},
                                {"best_way", ways[best].name},
                                {"ways", by_way},
                                {"triad_gb_s", median(triad)},
                                {"checksum", sink}}
                     .dump()
              << "\n";
  } else {
    std::printf("bandwidth: %.1f GB/s read with %d thread%s (%s; median of %d, min %.1f, max %.1f)\n",
                median(runs[best]), threads, threads == 1 ? "" : "s", ways[best].name, reps, *mn, *mx);
    for (size_t w = 0; w < std::size(ways); ++w)
      std::printf("  %-22s %.1f GB/s\n", ways[w].name, median(runs[w]));
    std::printf("  triad (a = b + s·c)    %.1f GB/s (STREAM counting: 3 arrays)\n", median(triad));
  }
  return k_exit_ok;
}

} // namespace loom::cli
