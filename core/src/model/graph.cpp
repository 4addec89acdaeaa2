#include "loom/model/graph.hpp"

#include <atomic>

namespace loom {

uint64_t new_graph_id() noexcept {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

} // namespace loom
