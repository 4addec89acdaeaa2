// loom/kv/kv_retention.hpp — what a sequence must keep of its K/V so that every later query reads what it
// attends: the KV access pattern of a set of layers (an AttentionVariant's, loom/attention.hpp), which a
// store (loom/kv/kv_cache.hpp) applies to the blocks of those layers.
#pragma once

#include "loom/sdk/types.hpp"

#include <algorithm>
#include <cstdint>

namespace loom {

// The positions a sequence must keep so that every later query reads what it attends (the KV access
// pattern of a set of layers): [0, sinks) and the last `window` before the next query. window 0:
// every position (some layer attends in full).
struct KVRetention {
  int32_t sinks = 0;
  int32_t window = 0;
  // Positions kept before the window besides: a decoder that steps back a little (speculative
  // decoding rejecting drafts, a rollback) finds them still there instead of re-evaluating the past.
  static constexpr int32_t k_slack = 32;
  bool bounded() const noexcept { return window > 0; }
  // The first position (after the sinks) a query at `next` reads.
  Pos first_read(Pos next) const noexcept { return bounded() ? std::max<Pos>(0, next - window + 1) : 0; }
  // For a sequence whose next query is at position `next`: positions [sinks, keep_from(next)) are
  // released (no later query reads them, unless it steps back more than k_slack).
  Pos keep_from(Pos next) const noexcept { return std::max<Pos>(0, first_read(next) - k_slack); }
  // The most positions a sequence then holds at once, in units of `unit` positions: the sinks' units,
  // the window and slack (plus a unit of straddle), and the unit being written.
  int64_t bound_positions(int32_t unit) const noexcept {
    const int64_t u = unit;
    return (sinks + u - 1) / u * u + (window + k_slack + u - 1) / u * u + 2 * u;
  }
};

} // namespace loom
