// kv_cache.cpp — the two KV stores, contiguous and paged, and the part of their accounting they share
// (the slots and block tables a forward reads).
#include "loom/kv_cache.hpp"

#include "loom/error.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

namespace loom {

namespace {

// Bytes of one stored K (or V) row.
size_t kv_row_bytes(const KVShape& s) noexcept {
  return row_bytes(s.dtype, s.row_elems());
}

// The storage types a store accepts: f32, f16, bf16, q8_0 (its blocks of 32 run along the row).
void check_dtype(const KVShape& s) {
  if (!kv_dtype_valid(s.dtype))
    fail(Errc::unsupported, "kv_cache",
         "KV rows cannot be stored as " + std::string(dtype_name(s.dtype)) + "; use f32, f16, bf16 or q8_0");
  if (s.dtype == DType::q8_0 && s.row_elems() % 32 != 0)
    fail(Errc::unsupported, "kv_cache",
         "q8_0 KV needs n_head_kv · head_dim to be a multiple of 32, this model has " +
             std::to_string(s.row_elems()) + "; use f16 or bf16");
}

// Bytes of K and V at the written positions of every sequence (Σ lengths), whatever the layout.
template <class Map> size_t positions_bytes(const KVShape& s, const Map& seqs) noexcept {
  size_t n = 0;
  for (const auto& kv : seqs)
    n += static_cast<size_t>(kv.second.length - kv.second.released);
  return n * 2 * static_cast<size_t>(s.n_layer) * kv_row_bytes(s);
}

// The pool's layout for a shape: blocks of block_size (paged) or one n_ctx block per sequence.
KVLayout layout_of(const KVShape& s, int32_t block_size, int64_t n_blocks) noexcept {
  KVLayout l;
  l.dtype = s.dtype;
  l.n_layer = s.n_layer;
  l.n_head_kv = s.n_head_kv;
  l.head_dim = s.head_dim;
  l.block_size = block_size;
  l.n_blocks = n_blocks;
  return l;
}

// One slab per live sequence: K and V of every layer, [n_layer][n_ctx][n_head_kv · head_dim] in
// shape.dtype.
class ContiguousKVCache final : public KVCacheStore {
public:
  explicit ContiguousKVCache(const KVShape& s)
      : KVCacheStore(checked_layout(s)), shape_(s), rb_(kv_row_bytes(s)) {}
  std::string_view name() const noexcept override { return "contiguous"; }
  const KVShape& shape() const noexcept override { return shape_; }
  int32_t free_sequences() const noexcept override {
    return shape_.n_seq_max - static_cast<int32_t>(seqs_.size());
  }

  bool allocate(SeqId seq, int32_t n_new) override {
    if (n_new < 0) return false;
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) {
      if (static_cast<int32_t>(seqs_.size()) >= shape_.n_seq_max || n_new > shape_.n_ctx) return false;
      Slab s;
      s.id[0] = take_slab(); // untouched pages cost nothing
      s.length = n_new;
      seqs_.emplace(seq, std::move(s));
      peak_seqs_ = std::max(peak_seqs_, seqs_.size());
      return true;
    }
    if (it->second.length + n_new > shape_.n_ctx) return false;
    it->second.length += n_new;
    return true;
  }
  int64_t units_to_grow(SeqId seq, int32_t n_new) const noexcept override {
    if (n_new < 0) return -1;
    auto it = seqs_.find(seq);
    if (it == seqs_.end())
      return static_cast<int32_t>(seqs_.size()) < shape_.n_seq_max && n_new <= shape_.n_ctx ? 1 : -1;
    return it->second.length + n_new <= shape_.n_ctx ? 0 : -1;
  }
  int64_t units_freed_by(std::span<const SeqId> seqs) const override {
    int64_t n = 0;
    for (size_t i = 0; i < seqs.size(); ++i)
      if (seqs_.count(seqs[i]) && std::find(seqs.begin(), seqs.begin() + static_cast<std::ptrdiff_t>(i),
                                            seqs[i]) == seqs.begin() + static_cast<std::ptrdiff_t>(i))
        ++n;
    return n;
  }
  void free(SeqId seq) noexcept override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    free_slabs_.push_back(it->second.id[0]);
    seqs_.erase(it);
  }
  bool fork(SeqId parent, SeqId child) override {
    auto it = seqs_.find(parent);
    if (it == seqs_.end() || seqs_.count(child) || static_cast<int32_t>(seqs_.size()) >= shape_.n_seq_max)
      return false;
    Slab copy;
    copy.id[0] = take_slab();
    copy.length = it->second.length;
    // Only the used positions, by the backend before the next forward.
    if (copy.length > 0) record_copy({it->second.id[0], copy.id[0], copy.length});
    seqs_.emplace(child, std::move(copy));
    peak_seqs_ = std::max(peak_seqs_, seqs_.size());
    return true;
  }
  void truncate(SeqId seq, int32_t n) override {
    auto it = seqs_.find(seq);
    if (it != seqs_.end()) it->second.length = std::clamp(n, 0, it->second.length);
  }
  int32_t length(SeqId seq) const noexcept override {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? 0 : it->second.length;
  }
  bool contains(SeqId seq) const noexcept override { return seqs_.count(seq) != 0; }

  KVStats stats() const noexcept override {
    KVStats st;
    st.bytes_allocated = seqs_.size() * slab_bytes();
    st.bytes_used = positions_bytes(shape_, seqs_);
    st.bytes_allocated_peak = peak_seqs_ * slab_bytes();
    st.bytes_capacity = static_cast<size_t>(shape_.n_seq_max) * slab_bytes();
    st.bytes_resident = st.bytes_allocated; // the live slabs
    return st;
  }
  void reset_peak() noexcept override { peak_seqs_ = seqs_.size(); }
  int64_t n_units() const noexcept override { return shape_.n_seq_max; }
  int64_t units_in_use() const noexcept override { return static_cast<int64_t>(seqs_.size()); }
  int32_t positions_per_unit() const noexcept override { return shape_.n_ctx; }

private:
  // The shape checked, as a pool of one n_ctx block per sequence that can live at once.
  static KVLayout checked_layout(const KVShape& s) {
    if (s.n_layer <= 0 || s.n_head_kv <= 0 || s.head_dim <= 0 || s.n_ctx <= 0 || s.n_seq_max <= 0)
      fail(Errc::invalid_argument, "kv_cache", "KV cache dimensions must be positive");
    check_dtype(s);
    return layout_of(s, s.n_ctx, s.n_seq_max);
  }
  size_t peak_seqs_ = 0; // the most sequences held at once since reset_peak()
  std::span<const int32_t> table(SeqId seq) const noexcept override {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? std::span<const int32_t>() : std::span<const int32_t>(it->second.id, 1);
  }
  struct Slab {
    int32_t id[1] = {-1}; // the pool's block of n_ctx positions; rows ≥ length are uninitialised
    int32_t length = 0;
    int32_t released = 0; // never: a slab is one unit
  };
  // A free slab id: the most recently freed one (its pages are resident already), else the next new one.
  int32_t take_slab() {
    if (!free_slabs_.empty()) {
      const int32_t id = free_slabs_.back();
      free_slabs_.pop_back();
      return id;
    }
    return next_slab_++;
  }
  size_t slab_bytes() const noexcept {
    return 2ull * static_cast<size_t>(shape_.n_layer) * static_cast<size_t>(shape_.n_ctx) * rb_;
  }

  KVShape shape_;
  size_t rb_ = 0; // bytes of one stored row
  std::map<SeqId, Slab> seqs_;
  std::vector<int32_t> free_slabs_;
  int32_t next_slab_ = 0;
};

// Blocks of `block_size` positions from one pool, a block table per sequence, reference counts:
// fork shares the parent's blocks (no copy); a block is copied only when a sequence is about to
// write into one it shares (copy-on-write at allocate); truncate and free return blocks to the pool.
// A block holds K and V of every layer: [kv][layer][block_size][n_head_kv · head_dim] in shape.dtype.
class PagedKVCache final : public KVCacheStore {
public:
  explicit PagedKVCache(const KVShape& s)
      : KVCacheStore(checked_layout(s)), shape_(s), rb_(kv_row_bytes(s)),
        n_blocks_(memory().layout().n_blocks) {}
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
    // A block findable by content is never written in place either (a truncate left it part full).
    const auto last = n_new > 0 && len % shape_.block_size != 0
                          ? static_cast<size_t>(table[static_cast<size_t>(len / shape_.block_size)])
                          : size_t{0};
    if (n_new > 0 && len % shape_.block_size != 0 && table[static_cast<size_t>(len / shape_.block_size)] < 0)
      fail(Errc::internal, "kv_cache", "a sequence grows into a block it released (sliding window)");
    const bool cow = n_new > 0 && len % shape_.block_size != 0 && (refs_[last] > 1 || cached_of_[last] != 0);
    if (free_blocks() < fresh_blocks + (cow ? 1 : 0)) return false;
    if (fresh) it = seqs_.emplace(seq, Seq{}).first;
    Seq& q = it->second;
    if (cow) {
      const size_t at = static_cast<size_t>(len / shape_.block_size);
      const int32_t copy = take_block();
      record_copy({q.blocks[at], copy, len % shape_.block_size}); // the positions written so far
      release(q.blocks[at]);
      q.blocks[at] = copy;
    }
    for (; fresh_blocks > 0; --fresh_blocks)
      q.blocks.push_back(take_block());
    q.length = len + n_new;
    peak_blocks_ = std::max(peak_blocks_, in_use_);
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
      cow = refs_[static_cast<size_t>(last)] > 1 || cached_of_[static_cast<size_t>(last)] != 0;
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
    if (refs_[static_cast<size_t>(last)] > 1 || cached_of_[static_cast<size_t>(last)] != 0)
      return {last, len % shape_.block_size};
    return {};
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
      if (r == refs_[static_cast<size_t>(b)]) ++n;
    return n;
  }
  void free(SeqId seq) noexcept override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    for (int32_t b : it->second.blocks)
      if (b >= 0) release(b);
    seqs_.erase(it);
  }
  bool fork(SeqId parent, SeqId child) override {
    auto it = seqs_.find(parent);
    if (it == seqs_.end() || seqs_.count(child) || static_cast<int32_t>(seqs_.size()) >= shape_.n_seq_max)
      return false;
    Seq c = it->second; // the same blocks, shared
    for (int32_t b : c.blocks)
      if (b >= 0) ++refs_[static_cast<size_t>(b)];
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
      if (q.blocks.back() >= 0) release(q.blocks.back());
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
      release(id);
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
    st.bytes_allocated = static_cast<size_t>(in_use_) * block_bytes();
    st.bytes_used = positions_bytes(shape_, seqs_);
    st.bytes_allocated_peak = static_cast<size_t>(peak_blocks_) * block_bytes();
    st.bytes_capacity = static_cast<size_t>(n_blocks_) * block_bytes();
    st.bytes_resident = static_cast<size_t>(made_) * block_bytes(); // free and cached blocks are kept
    st.cached_blocks = static_cast<int64_t>(cached_.size());
    return st;
  }
  void reset_peak() noexcept override { peak_blocks_ = in_use_; }

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
      const uint64_t h = block_hash(parent, toks);
      q.hashes.push_back(h);
      if (q.blocks[i] < 0) continue; // released (sliding window)
      const auto b = static_cast<size_t>(q.blocks[i]);
      if (cached_.count(h) || cached_of_[b] != 0) continue; // this content is findable already
      cached_.emplace(h, q.blocks[i]);
      cached_of_[b] = h;
      block_tokens_[b].assign(toks.begin(), toks.end());
      block_parent_[b] = parent;
    }
  }
  int32_t reuse_prefix(SeqId seq, std::span<const TokenId> tokens, int32_t max_positions) override {
    if (!shape_.prefix_cache) return 0;
    auto it = seqs_.find(seq);
    if (it == seqs_.end() || it->second.length != 0 || !it->second.blocks.empty()) return 0;
    Seq& q = it->second;
    const auto B = static_cast<size_t>(shape_.block_size);
    const size_t limit =
        std::min(tokens.size(), static_cast<size_t>(std::clamp(max_positions, 0, shape_.n_ctx))) / B;
    uint64_t parent = 0;
    for (size_t i = 0; i < limit; ++i) {
      const std::span<const TokenId> toks = tokens.subspan(i * B, B);
      const uint64_t h = block_hash(parent, toks);
      auto c = cached_.find(h);
      if (c == cached_.end()) break;
      const auto b = static_cast<size_t>(c->second);
      if (block_parent_[b] != parent ||
          !std::equal(toks.begin(), toks.end(), block_tokens_[b].begin(), block_tokens_[b].end()))
        break;             // a hash collision: not this content
      if (refs_[b] == 0) { // back from the evictable list
        lru_.erase(lru_pos_[b]);
        ++in_use_;
      }
      ++refs_[b];
      q.blocks.push_back(c->second);
      q.hashes.push_back(h);
      parent = h;
    }
    q.length = static_cast<int32_t>(q.blocks.size() * B);
    peak_blocks_ = std::max(peak_blocks_, in_use_);
    return q.length;
  }

  int64_t n_units() const noexcept override { return n_blocks_; }
  int64_t units_in_use() const noexcept override { return in_use_; }
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
  int64_t free_blocks() const noexcept { return n_blocks_ - in_use_; }
  // A free block: one returned earlier, else a new one while the pool has room, else the least
  // recently used cached block nobody references (it stops being findable).
  int32_t take_block() {
    int32_t b;
    if (!free_list_.empty()) {
      b = free_list_.back();
      free_list_.pop_back();
    } else if (made_ < n_blocks_ || lru_.empty()) {
      b = static_cast<int32_t>(made_++);
      refs_.push_back(0);
      cached_of_.push_back(0);
      block_tokens_.emplace_back();
      block_parent_.push_back(0);
      lru_pos_.emplace_back();
    } else {
      b = lru_.front();
      lru_.pop_front();
      const auto i = static_cast<size_t>(b);
      cached_.erase(cached_of_[i]);
      cached_of_[i] = 0;
      block_tokens_[i].clear();
    }
    refs_[static_cast<size_t>(b)] = 1;
    ++in_use_;
    return b;
  }
  void release(int32_t b) noexcept {
    const auto i = static_cast<size_t>(b);
    if (--refs_[i] == 0) {
      --in_use_;
      if (cached_of_[i] != 0) { // still findable: evictable, the most recently used last
        lru_.push_back(b);
        lru_pos_[i] = std::prev(lru_.end());
      } else {
        free_list_.push_back(b);
      }
    }
  }
  static uint64_t mix(uint64_t z) noexcept { // SplitMix64's finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  static uint64_t block_hash(uint64_t parent, std::span<const TokenId> toks) noexcept {
    uint64_t h = mix(parent + 0x9e3779b97f4a7c15ULL);
    for (TokenId t : toks)
      h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ULL));
    return h == 0 ? 1 : h; // 0 marks "not cached"
  }
  std::span<const int32_t> table(SeqId seq) const noexcept override {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? std::span<const int32_t>() : std::span<const int32_t>(it->second.blocks);
  }

  KVShape shape_;
  size_t rb_ = 0; // bytes of one stored row
  int64_t n_blocks_ = 0;
  int64_t made_ = 0; // blocks handed out so far (ids [0, made_)), reused through free_list_
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_list_;
  // Prefix cache: content hash → block, and per block its hash (0: none), tokens and parent hash.
  std::unordered_map<uint64_t, int32_t> cached_;
  std::vector<uint64_t> cached_of_;
  std::vector<std::vector<TokenId>> block_tokens_;
  std::vector<uint64_t> block_parent_;
  std::list<int32_t> lru_; // cached blocks with no reference, least recently used first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  int64_t in_use_ = 0, peak_blocks_ = 0;
  std::map<SeqId, Seq> seqs_;
};

} // namespace

KVRows KVCacheStore::rows_for(const BatchView& b) {
  LOOM_ASSERT(memory_.buffer() != nullptr, "a forward over a KV store without memory");
  memory_.sync();
  const KVLayout& l = memory_.layout();
  const size_t n = b.tokens.size();
  slots_.resize(n);
  row_seq_.resize(n);
  // The batch's sequences in order of first appearance (a batch holds a few; a linear scan).
  std::vector<SeqId> seqs;
  size_t stride = 1;
  for (size_t t = 0; t < n; ++t) {
    const SeqId s = b.seq_ids[t];
    size_t i = 0;
    while (i < seqs.size() && seqs[i] != s)
      ++i;
    if (i == seqs.size()) {
      seqs.push_back(s);
      stride = std::max(stride, table(s).size());
    }
    row_seq_[t] = static_cast<int32_t>(i);
    const std::span<const int32_t> tb = table(s);
    const Pos p = b.positions[t];
    const auto at = static_cast<size_t>(p / l.block_size);
    LOOM_ASSERT(p >= 0 && p < length(s) && at < tb.size() && tb[at] >= 0,
                "a batch row at a position its sequence has not allocated");
    slots_[t] = static_cast<int64_t>(tb[at]) * l.block_size + p % l.block_size;
  }
  tables_.assign(seqs.size() * stride, -1);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::span<const int32_t> tb = table(seqs[i]);
    std::copy(tb.begin(), tb.end(), tables_.begin() + static_cast<std::ptrdiff_t>(i * stride));
  }
  return KVRows(l, memory_.buffer()->data(), slots_, row_seq_, tables_, static_cast<int32_t>(stride));
}

size_t KVCacheStore::row_offset(int32_t layer, int kv, SeqId seq, Pos pos) const {
  const KVLayout& l = memory_.layout();
  const std::span<const int32_t> tb = table(seq);
  const auto at = static_cast<size_t>(pos / l.block_size);
  LOOM_ASSERT(layer >= 0 && layer < l.n_layer && pos >= 0 && pos < length(seq) && at < tb.size() &&
                  tb[at] >= 0,
              "KV row outside the allocated positions");
  return l.offset(layer, kv, tb[at], pos % l.block_size);
}

std::vector<uint8_t> KVCacheStore::read_row(int32_t layer, int kv, SeqId seq, Pos pos) {
  memory_.prepare_row_io();
  std::vector<uint8_t> out(memory_.layout().row_bytes());
  memory_.buffer()->read(row_offset(layer, kv, seq, pos), out.data(), out.size());
  return out;
}

void KVCacheStore::write_row(int32_t layer, int kv, SeqId seq, Pos pos, std::span<const uint8_t> bytes) {
  memory_.prepare_row_io();
  LOOM_ASSERT(bytes.size() == memory_.layout().row_bytes(), "a KV row of another size");
  memory_.buffer()->write(row_offset(layer, kv, seq, pos), bytes.data(), bytes.size());
}

std::unique_ptr<KVCacheStore> make_contiguous_kv_cache(const KVShape& shape) {
  return std::make_unique<ContiguousKVCache>(shape);
}

std::unique_ptr<KVCacheStore> make_paged_kv_cache(const KVShape& shape) {
  return std::make_unique<PagedKVCache>(shape);
}

} // namespace loom
