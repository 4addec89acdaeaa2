// core/src/eval/ab_format.hpp — what the A/B reports share (private to core/src/eval/): how they write
// a number and name a setting, and which metrics their tables show.
#pragma once

#include "loom/eval/ab_stats.hpp"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::ab {

// Fixed with `prec` decimals; "—" for a value that is not finite (a metric no run had).
inline std::string fmt(double v, int prec = 3) {
  if (!std::isfinite(v)) return "—";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

inline const char* ci_name(CiMethod m) {
  return m == CiMethod::bca ? "bca" : "percentile";
}

// Metrics no variant has (exact_match without `expected`) are left out of the tables. `doc`: report_json.
inline bool has_data(const nlohmann::json& doc, const std::string& m) {
  for (const auto& agg : doc["aggregates"])
    if (!agg["metrics"][m]["mean"].is_null()) return true;
  return false;
}

} // namespace loom::ab
