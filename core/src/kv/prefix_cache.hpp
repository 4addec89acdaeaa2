// prefix_cache.hpp — the paged store's prefix cache: full blocks findable by their content (the hash of
// their tokens and of every block before them), and the ones nobody references kept evictable, least
// recently used first.
#pragma once

#include "loom/sdk/types.hpp"

#include <array>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace loom {

class PrefixCache {
public:
  // The content hash of a block of `toks` following the blocks hashed as `parent` (0: the first block);
  // never 0 (0 marks "not cached").
  static uint64_t block_hash(uint64_t parent, std::span<const TokenId> toks) noexcept;
  // The name of group g's block of the content hashed as h (a store of layer groups caches each group's
  // block of a content apart); g = 0: h itself. Never 0.
  static uint64_t group_key(uint64_t h, int32_t g) noexcept;

  // Makes room for the block the pool made next (ids are dense from 0).
  void add_block();
  bool cached(int32_t b) const noexcept { return hash_of_[static_cast<size_t>(b)] != 0; }
  bool contains(uint64_t hash) const noexcept { return by_hash_.count(hash) != 0; }
  // Block b holds `toks` (after the blocks hashed as `parent`): findable as `hash` from now on.
  void insert(uint64_t hash, int32_t b, std::span<const TokenId> toks, uint64_t parent);
  // The block holding `toks` after `parent`, or -1 (none, or a hash collision: not this content).
  int32_t find(uint64_t hash, uint64_t parent, std::span<const TokenId> toks) const;
  // Of the cached blocks after `parent`, the one whose tokens begin with the longest run of `toks` (its
  // length in `common`, at least 1), or -1: a prompt that shares part of a block reuses those positions.
  int32_t longest_start(uint64_t parent, std::span<const TokenId> toks, int32_t& common) const;
  int64_t size() const noexcept { return static_cast<int64_t>(by_hash_.size()); }
  // A cached block's hash, tokens and parent hash.
  uint64_t hash_of(int32_t b) const noexcept { return hash_of_[static_cast<size_t>(b)]; }
  std::span<const TokenId> tokens_of(int32_t b) const noexcept { return tokens_[static_cast<size_t>(b)]; }

  // Cached blocks nobody references: evictable, the most recently used last, in one of two lanes — lane 1
  // for blocks a sliding window released (BlockPool evicts those before it grows), lane 0 for the others.
  void park(int32_t b, int lane);
  void unpark(int32_t b); // referenced again
  bool has_evictable(int lane) const noexcept { return !lru_[static_cast<size_t>(lane)].empty(); }
  // The least recently used evictable block of a lane, no longer findable.
  int32_t evict(int lane);

private:
  void forget(int32_t b);                                // stops being findable (and evictable)
  std::unordered_map<uint64_t, int32_t> by_hash_;        // content hash → block
  std::unordered_multimap<uint64_t, int32_t> by_parent_; // parent hash → the cached blocks after it
  // Per block: its hash (0: none), tokens and parent hash.
  std::vector<uint64_t> hash_of_;
  std::vector<std::vector<TokenId>> tokens_;
  std::vector<uint64_t> parent_;
  std::array<std::list<int32_t>, 2>
      lru_; // per lane: cached blocks with no reference, least recently used first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<int8_t> parked_; // per block: its lane + 1 (0: not evictable)
};

} // namespace loom
