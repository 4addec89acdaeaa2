// prefix_cache.cpp — full blocks findable by content, and the evictable ones in least-recently-used order.
#include "kv/prefix_cache.hpp"

#include <algorithm>
#include <iterator>

namespace loom {

namespace {

uint64_t mix(uint64_t z) noexcept { // SplitMix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

} // namespace

uint64_t PrefixCache::block_hash(uint64_t parent, std::span<const TokenId> toks) noexcept {
  uint64_t h = mix(parent + 0x9e3779b97f4a7c15ULL);
  for (TokenId t : toks)
    h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ULL));
  return h == 0 ? 1 : h; // 0 marks "not cached"
}

uint64_t PrefixCache::group_key(uint64_t h, int32_t g) noexcept {
  if (g == 0) return h;
  const uint64_t k = mix(h ^ (static_cast<uint64_t>(g) * 0x9e3779b97f4a7c15ULL));
  return k == 0 ? 1 : k;
}

void PrefixCache::add_block() {
  hash_of_.push_back(0);
  tokens_.emplace_back();
  parent_.push_back(0);
  lru_pos_.emplace_back();
  parked_.push_back(0);
}

void PrefixCache::insert(uint64_t hash, int32_t b, std::span<const TokenId> toks, uint64_t parent) {
  const auto i = static_cast<size_t>(b);
  by_hash_.emplace(hash, b);
  by_parent_.emplace(parent, b);
  hash_of_[i] = hash;
  tokens_[i].assign(toks.begin(), toks.end());
  parent_[i] = parent;
}

int32_t PrefixCache::find(uint64_t hash, uint64_t parent, std::span<const TokenId> toks) const {
  auto c = by_hash_.find(hash);
  if (c == by_hash_.end()) return -1;
  const auto i = static_cast<size_t>(c->second);
  if (parent_[i] != parent || !std::equal(toks.begin(), toks.end(), tokens_[i].begin(), tokens_[i].end()))
    return -1;
  return c->second;
}

int32_t PrefixCache::longest_start(uint64_t parent, std::span<const TokenId> toks, int32_t& common) const {
  int32_t best = -1;
  common = 0;
  const auto [lo, hi] = by_parent_.equal_range(parent);
  for (auto c = lo; c != hi; ++c) {
    const std::vector<TokenId>& t = tokens_[static_cast<size_t>(c->second)];
    const auto n = static_cast<int32_t>(
        std::mismatch(toks.begin(),
                      toks.begin() + static_cast<std::ptrdiff_t>(std::min(toks.size(), t.size())), t.begin())
            .first -
        toks.begin());
    if (n > common) {
      common = n;
      best = c->second;
    }
  }
  return best;
}

void PrefixCache::park(int32_t b, int lane) {
  std::list<int32_t>& l = lru_[static_cast<size_t>(lane)];
  l.push_back(b);
  lru_pos_[static_cast<size_t>(b)] = std::prev(l.end());
  parked_[static_cast<size_t>(b)] = static_cast<int8_t>(lane + 1);
}

void PrefixCache::unpark(int32_t b) {
  const auto i = static_cast<size_t>(b);
  lru_[static_cast<size_t>(parked_[i] - 1)].erase(lru_pos_[i]);
  parked_[i] = 0;
}

int32_t PrefixCache::evict(int lane) {
  const int32_t b = lru_[static_cast<size_t>(lane)].front();
  forget(b);
  return b;
}

void PrefixCache::forget(int32_t b) {
  const auto i = static_cast<size_t>(b);
  if (parked_[i]) unpark(b);
  by_hash_.erase(hash_of_[i]);
  for (auto [lo, hi] = by_parent_.equal_range(parent_[i]); lo != hi; ++lo)
    if (lo->second == b) {
      by_parent_.erase(lo);
      break;
    }
  hash_of_[i] = 0;
  tokens_[i].clear();
}

} // namespace loom
