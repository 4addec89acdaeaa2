// block_pool.hpp — the paged store's blocks: reference counts, the free list, blocks made as needed up to
// the pool's size, and the prefix cache's blocks that no sequence references (they count as free and are
// evicted, least recently used first, when a block is needed). Which sequence holds which block is the
// store's business (paged_kv_cache.cpp).
#pragma once

#include "kv/prefix_cache.hpp"

#include <cstdint>
#include <vector>

namespace loom {

class BlockPool {
public:
  explicit BlockPool(int64_t n_blocks) : n_blocks_(n_blocks) {}
  int64_t n_blocks() const noexcept { return n_blocks_; }
  int64_t in_use() const noexcept { return in_use_; } // referenced by some sequence
  int64_t free() const noexcept { return n_blocks_ - in_use_; }
  int64_t made() const noexcept { return made_; } // blocks made so far (ids [0, made)), kept for reuse
  int32_t refs(int32_t b) const noexcept { return refs_[static_cast<size_t>(b)]; }

  // A free block, with one reference: one returned earlier, else a new one while the pool has room, else
  // the least recently used cached block nobody references (it stops being findable).
  int32_t take();
  // One more reference to a held block (a fork) or to a cached one (prefix reuse: back from evictable).
  void ref(int32_t b);
  // One reference fewer; at none the block is free, or evictable while findable by content. A block a
  // sliding window released (`window`) is evicted before the pool grows: only a prompt that stops within
  // that window resumes from it, and kept longer a long sequence's past would hold the memory the window
  // saves.
  void release(int32_t b, bool window = false) noexcept;

  PrefixCache& cache() noexcept { return cache_; }
  const PrefixCache& cache() const noexcept { return cache_; }

private:
  int64_t n_blocks_ = 0;
  int64_t made_ = 0;
  int64_t in_use_ = 0;
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_list_;
  PrefixCache cache_;
};

} // namespace loom
