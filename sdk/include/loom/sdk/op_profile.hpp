// loom/sdk/op_profile.hpp — an executor's [backend] profile: where its computes' time goes. Each node's
// time (however the backend measures it: the host's clock around a CPU kernel, CUDA events around a
// launch) summed by op kind and batch size, and each compute's wall time from the host's clock, so what
// the nodes do not account for — uploads, copies, the host between launches — is the rest; the time
// between one compute's end and the next one's start is the engine's (sampling, scheduling). A table on
// stderr when the profile goes (the backend's destruction).
#pragma once

#include "loom/sdk/graph.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace loom::sdk {

class OpProfile {
public:
  using Clock = std::chrono::steady_clock;

  explicit OpProfile(std::string backend) : backend_(std::move(backend)) {}
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;
  ~OpProfile() { print(); }

  // The name a node's time is summed under: its op and its batch's rows (decode, small batch, long).
  static std::string kind(OpKind op, int64_t rows) {
    return std::string(op_name(op)) + (rows == 1 ? " (1 row)" : rows <= 8 ? " (2-8 rows)" : " (9+ rows)");
  }
  void add(const std::string& kind, double ms) {
    auto& [t, n] = by_kind_[kind];
    t += ms;
    ++n;
    nodes_ms_ += ms;
  }
  // A compute from start to end; the time since the previous one ended is the engine's.
  void add_compute(Clock::time_point start, Clock::time_point end) {
    wall_ms_ += ms_between(start, end);
    if (computes_ > 0) between_ms_ += ms_between(last_end_, start);
    last_end_ = end;
    ++computes_;
  }
  static double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  }

private:
  void print() const {
    if (computes_ == 0) return;
    std::vector<std::pair<std::string, std::pair<double, long>>> rows(by_kind_.begin(), by_kind_.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    const char* b = backend_.c_str();
    const auto pct = [&](double ms) { return wall_ms_ > 0 ? 100.0 * ms / wall_ms_ : 0.0; };
    std::fprintf(stderr, "%s profile: %ld computes, %.1f ms wall, %.1f ms in the nodes (%.1f %%)\n", b,
                 computes_, wall_ms_, nodes_ms_, pct(nodes_ms_));
    std::fprintf(stderr, "%s profile: %-28s %8s %10s %7s %9s\n", b, "op (rows)", "calls", "ms", "wall%",
                 "us/call");
    for (const auto& [k, v] : rows)
      std::fprintf(stderr, "%s profile: %-28s %8ld %10.2f %6.1f%% %9.1f\n", b, k.c_str(), v.second, v.first,
                   pct(v.first), 1000.0 * v.first / static_cast<double>(v.second));
    std::fprintf(stderr, "%s profile: %-28s %8s %10.2f %6.1f%%\n", b, "(rest: uploads, copies, host)", "",
                 wall_ms_ - nodes_ms_, pct(wall_ms_ - nodes_ms_));
    std::fprintf(stderr, "%s profile: between computes (the engine: sampling, scheduling): %.1f ms\n", b,
                 between_ms_);
  }

  std::string backend_;
  std::map<std::string, std::pair<double, long>> by_kind_;
  double nodes_ms_ = 0.0, wall_ms_ = 0.0, between_ms_ = 0.0;
  Clock::time_point last_end_;
  long computes_ = 0;
};

} // namespace loom::sdk
