// paged_kv_cache.cpp — the paged KV store: a block table per sequence over a BlockPool (block_pool.hpp),
// forks sharing blocks, copy-on-write, truncation, sliding-window release, and prefix reuse through the
// pool's PrefixCache.
#include "kv/block_pool.hpp"
#include "kv/kv_shape.hpp"
#include "loom/kv/kv_cache.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom {

namespace {

// Blocks of `block_size` positions from one pool, a block table per sequence, reference counts:
// fork shares the parent's blocks (no copy); a block is copied only when a sequence is about to
// write into one it shares (copy-on-write at allocate); truncate and free return blocks to the pool.
// A block holds K and V of every layer: [kv][layer][block_size][n_head_kv · head_dim] in shape.dtype.
class PagedKVCache final : public KVCacheStore {
public:
  explicit PagedKVCache(const KVShape& s)
      : KVCacheStore(checked_layout(s)), shape_(s), rb_(kv_row_bytes(s)), pool_(memory().layout().n_blocks) {}
  std::string_view name() const noexcept override { return "paged"; }
  const KVShape& shape() const noexcept override { return shape_; }
  int32_t free_sequences() const noexcept override {
    return shape_.n_seq_max - static_cast<int32_t>(seqs_.size());
  }

  bool allocate(SeqId seq, int32_t n_new) override {
    if (n_new < 0) return false;
    auto it = seqs_.find(seq);
    const bool fresh = it == seqs_.end();
    if (fresh && static_cast<int32_t>(seqs_.size()) >= shape_.n_seq_max) return false;
    const int32_t len = fresh ? 0 : it->second.length;
    if (len + n_new > shape_.n_ctx) return false;
    const std::vector<int32_t> none;
    const std::vector<int32_t>& table = fresh ? none : it->second.blocks;
    // Blocks needed: the ones the new positions reach beyond the table, plus a private copy of the
    // last block when the first new position lands in a block this sequence shares.
    const int32_t need_blocks = (len + n_new + shape_.block_size - 1) / shape_.block_size;
    int64_t fresh_blocks = std::max<int64_t>(0, need_blocks - static_cast<int64_t>(table.size()));
    const bool into_last = n_new > 0 && len % shape_.block_size != 0; // the last block is part full
    const int32_t last = into_last ? table[static_cast<size_t>(len / shape_.block_size)] : 0;
    if (into_last && last < 0)
      fail(Errc::internal, "kv_cache", "a sequence grows into a block it released (sliding window)");
    const bool cow = into_last && write_protected(last);
    if (pool_.free() < fresh_blocks + (cow ? 1 : 0)) return false;
    if (fresh) it = seqs_.emplace(seq, Seq{}).first;
    Seq& q = it->second;
    if (cow) {
      const size_t at = static_cast<size_t>(len / shape_.block_size);
      const int32_t copy = pool_.take();
      record_copy({q.blocks[at], copy, len % shape_.block_size}); // the positions written so far
      pool_.release(q.blocks[at]);
      q.blocks[at] = copy;
    }
    for (; fresh_blocks > 0; --fresh_blocks)
      q.blocks.push_back(pool_.take());
    q.length = len + n_new;
    peak_blocks_ = std::max(peak_blocks_, pool_.in_use());
    return true;
  }
  // allocate()'s arithmetic without its effects.
  int64_t units_to_grow(SeqId seq, int32_t n_new) const noexcept override {
    if (n_new < 0) return -1;
    auto it = seqs_.find(seq);
    const bool fresh = it == seqs_.end();
    if (fresh && static_cast<int32_t>(seqs_.size()) >= shape_.n_seq_max) return -1;
    const int32_t len = fresh ? 0 : it->second.length;
    if (len + n_new > shape_.n_ctx) return -1;
    const size_t n_table = fresh ? 0 : it->second.blocks.size();
    const int32_t need_blocks = (len + n_new + shape_.block_size - 1) / shape_.block_size;
    const int64_t fresh_blocks = std::max<int64_t>(0, need_blocks - static_cast<int64_t>(n_table));
    bool cow = false;
    if (n_new > 0 && len % shape_.block_size != 0) {
      const int32_t last = it->second.blocks[static_cast<size_t>(len / shape_.block_size)];
      if (last < 0) return -1; // grows into a released block: allocate() refuses it as an internal error
      cow = write_protected(last);
    }
    return fresh_blocks + (cow ? 1 : 0);
  }
  GrowCopy copy_to_grow(SeqId seq, int32_t n_new) const noexcept override {
    auto it = seqs_.find(seq);
    if (n_new <= 0 || it == seqs_.end()) return {};
    const int32_t len = it->second.length;
    if (len % shape_.block_size == 0 || len + n_new > shape_.n_ctx) return {};
    const int32_t last = it->second.blocks[static_cast<size_t>(len / shape_.block_size)];
    if (last < 0) return {};
    return write_protected(last) ? GrowCopy{last, len % shape_.block_size} : GrowCopy{};
  }
  int64_t units_freed_by(std::span<const SeqId> seqs) const override {
    std::unordered_map<int32_t, int32_t> held; // block → references from the set
    std::vector<SeqId> seen;
    for (SeqId s : seqs) {
      if (std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
      seen.push_back(s);
      auto it = seqs_.find(s);
      if (it == seqs_.end()) continue;
      for (int32_t b : it->second.blocks)
        if (b >= 0) ++held[b];
    }
    int64_t n = 0;
    for (const auto& [b, r] : held)
      if (r == pool_.refs(b)) ++n;
    return n;
  }
  void free(SeqId seq) noexcept override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    for (int32_t b : it->second.blocks)
      if (b >= 0) pool_.release(b);
    seqs_.erase(it);
  }
  bool fork(SeqId parent, SeqId child) override {
    auto it = seqs_.find(parent);
    if (it == seqs_.end() || seqs_.count(child) || static_cast<int32_t>(seqs_.size()) >= shape_.n_seq_max)
      return false;
    Seq c = it->second; // the same blocks, shared
    for (int32_t b : c.blocks)
      if (b >= 0) pool_.ref(b);
    seqs_.emplace(child, std::move(c));
    return true;
  }
  void truncate(SeqId seq, int32_t n) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    Seq& q = it->second;
    q.length = std::clamp(n, 0, q.length);
    q.hashes.resize(std::min(q.hashes.size(), static_cast<size_t>(q.length / shape_.block_size)));
    const auto keep = static_cast<size_t>((q.length + shape_.block_size - 1) / shape_.block_size);
    while (q.blocks.size() > keep) {
      if (q.blocks.back() >= 0) pool_.release(q.blocks.back());
      q.blocks.pop_back();
    }
    q.released = 0; // the positions of released blocks within the new length
    for (size_t b = 0; b < q.blocks.size(); ++b)
      if (q.blocks[b] < 0)
        q.released += std::min(shape_.block_size, q.length - static_cast<int32_t>(b) * shape_.block_size);
  }
  int32_t release_positions(SeqId seq, Pos from, Pos to) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return 0;
    Seq& q = it->second;
    const int32_t B = shape_.block_size;
    to = std::min(to, q.length);
    int32_t n = 0;
    for (int32_t b = (std::max<Pos>(from, 0) + B - 1) / B; (b + 1) * B <= to; ++b) {
      int32_t& id = q.blocks[static_cast<size_t>(b)];
      if (id < 0) continue;
      pool_.release(id);
      id = -1;
      n += B;
    }
    q.released += n;
    return n;
  }
  bool holds(SeqId seq, Pos from, Pos to) const noexcept override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return from >= to;
    const Seq& q = it->second;
    if (q.released == 0) return true;
    const int32_t B = shape_.block_size;
    to = std::min(to, q.length);
    for (Pos b = std::max<Pos>(from, 0) / B; b * B < to; ++b)
      if (q.blocks[static_cast<size_t>(b)] < 0) return false;
    return true;
  }
  Pos first_released(SeqId seq) const noexcept override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return 0;
    const Seq& q = it->second;
    if (q.released == 0) return q.length;
    const auto at = std::find(q.blocks.begin(), q.blocks.end(), -1);
    return static_cast<Pos>(at - q.blocks.begin()) * shape_.block_size;
  }
  int32_t length(SeqId seq) const noexcept override {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? 0 : it->second.length;
  }
  bool contains(SeqId seq) const noexcept override { return seqs_.count(seq) != 0; }

  KVStats stats() const noexcept override {
    KVStats st;
    st.bytes_allocated = static_cast<size_t>(pool_.in_use()) * block_bytes();
    st.bytes_used = positions_bytes(shape_, seqs_);
    st.bytes_allocated_peak = static_cast<size_t>(peak_blocks_) * block_bytes();
    st.bytes_capacity = static_cast<size_t>(pool_.n_blocks()) * block_bytes();
    st.bytes_resident = static_cast<size_t>(pool_.made()) * block_bytes(); // free and cached blocks are kept
    st.cached_blocks = pool_.cache().size();
    return st;
  }
  void reset_peak() noexcept override { peak_blocks_ = pool_.in_use(); }

  void register_prefix(SeqId seq, std::span<const TokenId> tokens) override {
    if (!shape_.prefix_cache) return;
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    Seq& q = it->second;
    const auto B = static_cast<size_t>(shape_.block_size);
    const size_t full = std::min(static_cast<size_t>(q.length), tokens.size()) / B;
    for (size_t i = q.hashes.size(); i < full; ++i) {
      const uint64_t parent = i == 0 ? 0 : q.hashes[i - 1];
      const std::span<const TokenId> toks = tokens.subspan(i * B, B);
      const uint64_t h = PrefixCache::block_hash(parent, toks);
      q.hashes.push_back(h);
      if (q.blocks[i] < 0) continue; // released (sliding window)
      PrefixCache& cache = pool_.cache();
      if (cache.contains(h) || cache.cached(q.blocks[i])) continue; // this content is findable already
      cache.insert(h, q.blocks[i], toks, parent);
    }
  }
  int32_t reuse_prefix(SeqId seq, std::span<const TokenId> tokens, int32_t max_positions) override {
    if (!shape_.prefix_cache) return 0;
    auto it = seqs_.find(seq);
    if (it == seqs_.end() || it->second.length != 0 || !it->second.blocks.empty()) return 0;
    Seq& q = it->second;
    const auto B = static_cast<size_t>(shape_.block_size);
    const size_t cap =
        std::min(tokens.size(), static_cast<size_t>(std::clamp(max_positions, 0, shape_.n_ctx)));
    const size_t limit = cap / B;
    uint64_t parent = 0;
    for (size_t i = 0; i < limit; ++i) {
      const std::span<const TokenId> toks = tokens.subspan(i * B, B);
      const uint64_t h = PrefixCache::block_hash(parent, toks);
      const int32_t b = pool_.cache().find(h, parent, toks);
      if (b < 0) break;
      pool_.ref(b);
      q.blocks.push_back(b);
      q.hashes.push_back(h);
      parent = h;
    }
    q.length = static_cast<int32_t>(q.blocks.size() * B);
    // Then the cached block after these that starts with the most of the next tokens (as llama-server's
    // slots keep any common prefix): its first `common` positions copied into a block of the sequence's own
    // (one block, as evaluating them again would take; none free: nothing more reused). The block is held
    // while the other is taken, so that taking cannot evict it.
    const size_t at = q.blocks.size() * B;
    int32_t common = 0;
    const int32_t b =
        at < cap ? pool_.cache().longest_start(parent, tokens.subspan(at, std::min(B, cap - at)), common)
                 : -1;
    if (b >= 0) {
      pool_.ref(b);
      if (pool_.free() > 0) {
        const int32_t own = pool_.take();
        record_copy({b, own, common});
        q.blocks.push_back(own);
        q.length += common;
      }
      pool_.release(b);
    }
    peak_blocks_ = std::max(peak_blocks_, pool_.in_use());
    return q.length;
  }

  int64_t n_units() const noexcept override { return pool_.n_blocks(); }
  int64_t units_in_use() const noexcept override { return pool_.in_use(); }
  int32_t positions_per_unit() const noexcept override { return shape_.block_size; }

private:
  // The shape checked, as a pool of blocks: n_blocks, or enough for n_seq_max full sequences.
  static KVLayout checked_layout(const KVShape& s) {
    if (s.n_layer <= 0 || s.n_head_kv <= 0 || s.head_dim <= 0 || s.n_ctx <= 0 || s.n_seq_max <= 0 ||
        s.block_size <= 0)
      fail(Errc::invalid_argument, "kv_cache", "KV cache dimensions must be positive");
    check_dtype(s);
    const int32_t blocks_per_seq = (s.n_ctx + s.block_size - 1) / s.block_size;
    const int64_t n_blocks = s.n_blocks > 0 ? s.n_blocks : static_cast<int64_t>(blocks_per_seq) * s.n_seq_max;
    if (n_blocks > std::numeric_limits<int32_t>::max())
      fail(Errc::invalid_argument, "kv_cache",
           "a paged pool of " + std::to_string(n_blocks) +
               " blocks exceeds 2^31; raise [kv_cache] block_size");
    return layout_of(s, s.block_size, n_blocks);
  }
  struct Seq {
    std::vector<int32_t> blocks;  // -1: released (sliding window), never read again
    std::vector<uint64_t> hashes; // content hashes of the first full blocks (register/reuse_prefix)
    int32_t length = 0;
    int32_t released = 0; // positions in released blocks
  };
  size_t block_bytes() const noexcept {
    return 2ull * static_cast<size_t>(shape_.n_layer) * static_cast<size_t>(shape_.block_size) * rb_;
  }
  // A block another sequence references, or one findable by content (a truncate left it part full), is
  // never written in place: growing into it copies it first.
  bool write_protected(int32_t b) const noexcept { return pool_.refs(b) > 1 || pool_.cache().cached(b); }
  std::span<const int32_t> table(SeqId seq) const noexcept override {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? std::span<const int32_t>() : std::span<const int32_t>(it->second.blocks);
  }

  KVShape shape_;
  size_t rb_ = 0; // bytes of one stored row
  BlockPool pool_;
  int64_t peak_blocks_ = 0; // the most blocks in use at once since reset_peak()
  std::map<SeqId, Seq> seqs_;
};

} // namespace

std::unique_ptr<KVCacheStore> make_paged_kv_cache(const KVShape& shape) {
  return std::make_unique<PagedKVCache>(shape);
}

} // namespace loom
