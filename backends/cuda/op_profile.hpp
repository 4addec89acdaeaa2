// [backend] profile: where a compute's time goes on the cuda backend. Each node's launches are bracketed by
// CUDA events (eager, no graphs: a replayed graph has no per-node times) and summed by op kind and batch
// size; each compute's wall time is kept too, so what the GPU's nodes do not account for — uploads, RoPE
// tables, the logits' copy, the host between launches — is the rest. A table on stderr when the backend goes.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cuda_runtime_api.h>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace loom::cuda {

class OpProfile {
public:
  OpProfile() = default;
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;
  ~OpProfile() {
    print();
    for (cudaEvent_t e : ev_)
      cudaEventDestroy(e);
  }

  // Before (after = false) or after node i of this compute's walk, on stream s.
  void mark(size_t i, bool after, cudaStream_t s) {
    const size_t k = 2 * i + (after ? 1 : 0);
    while (ev_.size() <= k) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreate(&e) != cudaSuccess) return;
      ev_.push_back(e);
    }
    cudaEventRecord(ev_[k], s);
  }
  // After the walk's stream has finished: node i's time under kinds[i] (op kind and batch size).
  void collect(const std::vector<std::string>& kinds) {
    for (size_t i = 0; i < kinds.size() && 2 * i + 1 < ev_.size(); ++i) {
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, ev_[2 * i], ev_[2 * i + 1]) != cudaSuccess) continue;
      auto& [t, n] = by_kind_[kinds[i]];
      t += static_cast<double>(ms);
      ++n;
      gpu_ms_ += static_cast<double>(ms);
    }
  }
  // A compute from start to end (host clock); the time since the previous one ended is the engine's.
  void add_compute(std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end) {
    const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    wall_ms_ += ms(end - start);
    if (computes_ > 0) between_ms_ += ms(start - last_end_);
    last_end_ = end;
    ++computes_;
  }

private:
  void print() const {
    if (computes_ == 0) return;
    std::vector<std::pair<std::string, std::pair<double, long>>> rows(by_kind_.begin(), by_kind_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    std::fprintf(stderr,
                 "cuda profile: %ld computes, %.1f ms wall, %.1f ms in the nodes' kernels (%.1f %%)\n",
                 computes_, wall_ms_, gpu_ms_, wall_ms_ > 0 ? 100.0 * gpu_ms_ / wall_ms_ : 0.0);
    std::fprintf(stderr, "cuda profile: %-28s %8s %10s %7s %9s\n", "op (rows)", "calls", "ms", "wall%",
                 "us/call");
    for (const auto& [k, v] : rows)
      std::fprintf(stderr, "cuda profile: %-28s %8ld %10.2f %6.1f%% %9.1f\n", k.c_str(), v.second, v.first,
                   wall_ms_ > 0 ? 100.0 * v.first / wall_ms_ : 0.0,
                   1000.0 * v.first / static_cast<double>(v.second));
    std::fprintf(stderr, "cuda profile: %-28s %8s %10.2f %6.1f%%\n", "(rest: host, uploads, copies)", "",
                 wall_ms_ - gpu_ms_, wall_ms_ > 0 ? 100.0 * (wall_ms_ - gpu_ms_) / wall_ms_ : 0.0);
    std::fprintf(stderr, "cuda profile: between computes (the engine: sampling, scheduling): %.1f ms\n",
                 between_ms_);
  }

  std::vector<cudaEvent_t> ev_;
  std::map<std::string, std::pair<double, long>> by_kind_;
  double gpu_ms_ = 0.0, wall_ms_ = 0.0, between_ms_ = 0.0;
  std::chrono::steady_clock::time_point last_end_;
  long computes_ = 0;
};

} // namespace loom::cuda
