// block_pool.cpp — blocks handed out, shared by reference count, and given back.
#include "kv/block_pool.hpp"

namespace loom {

int32_t BlockPool::take() {
  int32_t b;
  if (!free_list_.empty()) {
    b = free_list_.back();
    free_list_.pop_back();
  } else if (cache_.has_evictable(1)) { // a sliding window's cached block before the pool grows
    b = cache_.evict(1);
  } else if (made_ < n_blocks_ || !cache_.has_evictable(0)) {
    b = static_cast<int32_t>(made_++);
    refs_.push_back(0);
    cache_.add_block();
  } else {
    b = cache_.evict(0);
  }
  refs_[static_cast<size_t>(b)] = 1;
  ++in_use_;
  return b;
}

void BlockPool::ref(int32_t b) {
  const auto i = static_cast<size_t>(b);
  if (refs_[i] == 0) { // back from the evictable list
    cache_.unpark(b);
    ++in_use_;
  }
  ++refs_[i];
}

void BlockPool::release(int32_t b, bool window) noexcept {
  const auto i = static_cast<size_t>(b);
  if (--refs_[i] == 0) {
    --in_use_;
    if (cache_.cached(b)) // still findable: evictable, the most recently used last
      cache_.park(b, window ? 1 : 0);
    else
      free_list_.push_back(b);
  }
}

} // namespace loom
