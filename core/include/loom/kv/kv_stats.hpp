// loom/kv/kv_stats.hpp — what a KV store reports about its storage (metrics, bench, tests); the accounting
// a scheduler plans with (units, free positions) stays on the store itself.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom {

struct KVStats {
  size_t bytes_allocated = 0; // storage currently held
  size_t bytes_used = 0;      // of it, the positions written (Σ lengths)
  // The most storage held at once since KVCacheStore::reset_peak() (forks within a decoder step
  // included).
  size_t bytes_allocated_peak = 0;
  size_t bytes_capacity = 0; // storage if every slot were used
  // Memory the store holds now: paged, every block made so far (free and cached ones are kept for
  // reuse); contiguous, the live slabs.
  size_t bytes_resident = 0;
  int64_t cached_blocks = 0; // prefix cache: blocks findable by content (held or not)
};

} // namespace loom
