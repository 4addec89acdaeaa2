// loom/sdk/lru_cache.hpp — the one bounded cache: at most `capacity` values by key, the least recently
// used dropped first. Graph caches (the host's per shape, a plugin's converted graphs) and the cpu
// backend's oneDNN primitives use it: a server sees every prefill shape, so an unbounded cache grows
// without end, and dropping everything at a bound makes the next steps rebuild what they use.
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <utility>

namespace loom {

template <class Key, class Value> class LruCache {
public:
  explicit LruCache(size_t capacity) : capacity_(capacity > 0 ? capacity : 1) {}

  // The value of `key`, made by make() when it is not held (the least recently used dropped for room);
  // an exception from make() changes nothing. The reference holds until the value is dropped.
  template <class Make> Value& get(const Key& key, Make&& make) {
    if (auto it = index_.find(key); it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return it->second->second;
    }
    Value v(make());
    if (order_.size() >= capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    order_.emplace_front(key, std::move(v));
    index_.emplace(key, order_.begin());
    return order_.front().second;
  }
  void clear() noexcept {
    index_.clear();
    order_.clear();
  }
  size_t size() const noexcept { return order_.size(); }

private:
  size_t capacity_;
  std::list<std::pair<Key, Value>> order_; // the most recently used first
  std::map<Key, typename std::list<std::pair<Key, Value>>::iterator> index_;
};

} // namespace loom
