// paged_kv_cache.cpp — the paged KV store: block tables per sequence over a BlockPool (block_pool.hpp),
// forks sharing blocks, copy-on-write, truncation, sliding-window release, layer groups, and prefix reuse
// through the pool's PrefixCache.
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
// A block holds K and V of the layers of one group: [kv][slot][block_size][n_head_kv · head_dim] in
// shape.dtype (KVLayout). Without layer groups a sequence has one table for every layer. With them
// (a hybrid model: shape.window_layers), each group has a table, all of the same length, over the one
// pool: the full-attention group keeps every position, the sliding-window groups release theirs past the
// window (retire) — vLLM's hybrid KV cache.
class PagedKVCache final : public KVCacheStore {
public:
  explicit PagedKVCache(const KVShape& s)
      : KVCacheStore(checked_layout(s)), shape_(s), rb_(kv_row_bytes(s)), pool_(memory().layout().n_blocks) {
    const KVLayout& l = memory().layout();
    keep_.assign(static_cast<size_t>(l.n_groups()), s.window_retention);
    keep_[0] = s.retention;
    group_layers_.assign(static_cast<size_t>(l.n_groups()), 0);
    for (int32_t layer = 0; layer < l.n_layer; ++layer)
      ++group_layers_[static_cast<size_t>(l.group_of(layer))];
  }
  std::string_view name() const noexcept override { return "paged"; }
  const KVShape& shape() const noexcept override { return shape_; }
  int32_t free_sequences() const noexcept override {
    return shape_.n_seq_max - static_cast<int32_t>(seqs_.size());
  }

  bool allocate(SeqId seq, int32_t n_new) override {
    auto it = seqs_.find(seq);
    if (it != seqs_.end() && n_new > 0 && it->second.length % shape_.block_size != 0)
      for (const Table& t : it->second.g)
        if (t.blocks[static_cast<size_t>(it->second.length / shape_.block_size)] < 0)
          fail(Errc::internal, "kv_cache", "a sequence grows into a block it released (sliding window)");
    const int64_t need = units_to_grow(seq, n_new);
    if (need < 0 || pool_.free() < need) return false;
    if (it == seqs_.end()) it = seqs_.emplace(seq, Seq{std::vector<Table>(keep_.size()), {}, 0}).first;
    Seq& q = it->second;
    for (Table& t : q.g)
      grow(t, q.length, n_new);
    q.length += n_new;
    peak_blocks_ = std::max(peak_blocks_, pool_.in_use());
    return true;
  }
  // allocate()'s arithmetic without its effects: per group, the blocks the new positions reach beyond the
  // table, plus a private copy of the last block when the first new position lands in a block it shares.
  int64_t units_to_grow(SeqId seq, int32_t n_new) const noexcept override {
    if (n_new < 0) return -1;
    auto it = seqs_.find(seq);
    const bool fresh = it == seqs_.end();
    if (fresh && static_cast<int32_t>(seqs_.size()) >= shape_.n_seq_max) return -1;
    const int32_t len = fresh ? 0 : it->second.length;
    if (len + n_new > shape_.n_ctx) return -1;
    const int64_t need_blocks = (len + n_new + shape_.block_size - 1) / shape_.block_size;
    int64_t need = 0;
    for (size_t g = 0; g < keep_.size(); ++g) {
      const std::vector<int32_t>* blocks = fresh ? nullptr : &it->second.g[g].blocks;
      need += std::max<int64_t>(0, need_blocks - (blocks ? static_cast<int64_t>(blocks->size()) : 0));
      if (blocks && n_new > 0 && len % shape_.block_size != 0) {
        const int32_t last = (*blocks)[static_cast<size_t>(len / shape_.block_size)];
        if (last < 0) return -1; // grows into a released block: allocate() refuses it as an internal error
        need += write_protected(last) ? 1 : 0;
      }
    }
    return need;
  }
  std::vector<GrowCopy> copies_to_grow(SeqId seq, int32_t n_new) const override {
    std::vector<GrowCopy> out;
    auto it = seqs_.find(seq);
    if (n_new <= 0 || it == seqs_.end()) return out;
    const int32_t len = it->second.length;
    if (len % shape_.block_size == 0 || len + n_new > shape_.n_ctx) return out;
    for (const Table& t : it->second.g) {
      const int32_t last = t.blocks[static_cast<size_t>(len / shape_.block_size)];
      if (last >= 0 && write_protected(last)) out.push_back({last, len % shape_.block_size});
    }
    return out;
  }
  int64_t units_freed_by(std::span<const SeqId> seqs) const override {
    std::unordered_map<int32_t, int32_t> held; // block → references from the set
    std::vector<SeqId> seen;
    for (SeqId s : seqs) {
      if (std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
      seen.push_back(s);
      auto it = seqs_.find(s);
      if (it == seqs_.end()) continue;
      for (const Table& t : it->second.g)
        for (int32_t b : t.blocks)
          if (b >= 0) ++held[b];
    }
    int64_t n = 0;
    for (const auto& [b, r] : held)
      if (r == pool_.refs(b)) ++n;
    return n;
  }
  // Blocks a sequence of n positions holds at most: every group's blocks of them, a sliding window's
  // group no more than its window needs.
  int64_t units_for(int64_t positions) const noexcept override {
    const int64_t B = shape_.block_size;
    const int64_t blocks = (std::max<int64_t>(positions, 0) + B - 1) / B;
    int64_t n = 0;
    // A window's group holds its bound and what one forward adds before the window is retired.
    const int64_t step = (std::max<int64_t>(shape_.step_positions, 0) + B - 1) / B;
    for (const KVRetention& k : keep_)
      n += k.bounded() ? std::min(blocks, k.bound_positions(shape_.block_size) / B + step) : blocks;
    return n;
  }
  void free(SeqId seq) noexcept override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    for (const Table& t : it->second.g)
      for (int32_t b : t.blocks)
        if (b >= 0) pool_.release(b);
    seqs_.erase(it);
  }
  bool fork(SeqId parent, SeqId child) override {
    auto it = seqs_.find(parent);
    if (it == seqs_.end() || seqs_.count(child) || static_cast<int32_t>(seqs_.size()) >= shape_.n_seq_max)
      return false;
    Seq c = it->second; // the same blocks, shared
    for (const Table& t : c.g)
      for (int32_t b : t.blocks)
        if (b >= 0) pool_.ref(b);
    seqs_.emplace(child, std::move(c));
    return true;
  }
  void truncate(SeqId seq, int32_t n) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return;
    Seq& q = it->second;
    const int32_t B = shape_.block_size;
    q.length = std::clamp(n, 0, q.length);
    q.hashes.resize(std::min(q.hashes.size(), static_cast<size_t>(q.length / B)));
    const auto keep = static_cast<size_t>((q.length + B - 1) / B);
    for (Table& t : q.g) {
      while (t.blocks.size() > keep) {
        if (t.blocks.back() >= 0) pool_.release(t.blocks.back());
        t.blocks.pop_back();
      }
      t.released = 0; // the positions of released blocks within the new length
      for (size_t b = 0; b < t.blocks.size(); ++b)
        if (t.blocks[b] < 0) t.released += std::min(B, q.length - static_cast<int32_t>(b) * B);
    }
  }
  int32_t release_positions(SeqId seq, Pos from, Pos to) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return 0;
    int32_t n = 0;
    for (Table& t : it->second.g)
      n += release(t, it->second.length, from, to);
    return n;
  }
  int32_t retire(SeqId seq, Pos next) override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return 0;
    int32_t n = 0;
    for (size_t g = 0; g < keep_.size(); ++g)
      if (keep_[g].bounded())
        n += release(it->second.g[g], it->second.length, keep_[g].sinks, keep_[g].keep_from(next));
    return n;
  }
  bool holds(SeqId seq, Pos from, Pos to) const noexcept override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return from >= to;
    for (const Table& t : it->second.g)
      if (!holds(t, it->second.length, from, to)) return false;
    return true;
  }
  bool readable(SeqId seq, Pos next, Pos end) const noexcept override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return true;
    for (size_t g = 0; g < keep_.size(); ++g)
      if (!holds(it->second.g[g], it->second.length, keep_[g].first_read(next), end)) return false;
    return true;
  }
  Pos first_released(SeqId seq) const noexcept override {
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) return 0;
    Pos first = it->second.length;
    for (const Table& t : it->second.g)
      if (t.released > 0) {
        const auto at = std::find(t.blocks.begin(), t.blocks.end(), -1);
        first = std::min(first, static_cast<Pos>(at - t.blocks.begin()) * shape_.block_size);
      }
    return first;
  }
  int32_t length(SeqId seq) const noexcept override {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? 0 : it->second.length;
  }
  bool contains(SeqId seq) const noexcept override { return seqs_.count(seq) != 0; }

  KVStats stats() const noexcept override {
    KVStats st;
    const size_t block =
        memory().layout().bytes() / static_cast<size_t>(std::max<int64_t>(pool_.n_blocks(), 1));
    st.bytes_allocated = static_cast<size_t>(pool_.in_use()) * block;
    for (const auto& [id, q] : seqs_)
      for (size_t g = 0; g < q.g.size(); ++g)
        st.bytes_used +=
            static_cast<size_t>(q.length - q.g[g].released) * 2 * static_cast<size_t>(group_layers_[g]) * rb_;
    st.bytes_allocated_peak = static_cast<size_t>(peak_blocks_) * block;
    st.bytes_capacity = memory().layout().bytes();
    st.bytes_resident = static_cast<size_t>(pool_.made()) * block; // free and cached blocks are kept
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
    PrefixCache& cache = pool_.cache();
    for (size_t i = q.hashes.size(); i < full; ++i) {
      const uint64_t parent = i == 0 ? 0 : q.hashes[i - 1];
      const std::span<const TokenId> toks = tokens.subspan(i * B, B);
      const uint64_t h = PrefixCache::block_hash(parent, toks);
      q.hashes.push_back(h);
      for (size_t g = 0; g < q.g.size(); ++g) {
        const int32_t b = q.g[g].blocks[i];
        const auto gi = static_cast<int32_t>(g);
        const uint64_t key = PrefixCache::group_key(h, gi);
        if (b < 0 || cache.contains(key) || cache.cached(b)) continue; // released, or findable already
        cache.insert(key, b, toks, PrefixCache::group_key(parent, gi));
      }
    }
  }
  int32_t reuse_prefix(SeqId seq, std::span<const TokenId> tokens, int32_t max_positions) override;

  int64_t n_units() const noexcept override { return pool_.n_blocks(); }
  int64_t units_in_use() const noexcept override { return pool_.in_use(); }
  int32_t positions_per_unit() const noexcept override { return shape_.block_size; }

private:
  // With window_layers marking some layers but not all (a hybrid model), the layer groups: group 0 the
  // full-attention layers, then the sliding-window layers as many to a group (the last one fewer), so that a
  // block holds as many layers in every group. Empty: one group.
  static std::vector<int32_t> layer_groups(const KVShape& s) {
    const auto n_window =
        static_cast<int32_t>(std::count(s.window_layers.begin(), s.window_layers.end(), true));
    const int32_t n_full = s.n_layer - n_window;
    if (s.window_layers.empty() || n_window == 0 || n_full <= 0) return {};
    if (s.window_layers.size() != static_cast<size_t>(s.n_layer))
      fail(Errc::invalid_argument, "kv_cache", "the sliding-window layers do not match the model's layers");
    std::vector<int32_t> g(static_cast<size_t>(s.n_layer), 0);
    int32_t w = 0;
    for (size_t l = 0; l < g.size(); ++l)
      if (s.window_layers[l]) g[l] = 1 + w++ / n_full;
    return g;
  }
  // The shape checked, as a pool of blocks: n_blocks' bytes, or enough for n_seq_max full sequences (in
  // every group); with window_layers, the layer groups.
  static KVLayout checked_layout(const KVShape& s) {
    if (s.n_layer <= 0 || s.n_head_kv <= 0 || s.head_dim <= 0 || s.n_ctx <= 0 || s.n_seq_max <= 0 ||
        s.block_size <= 0)
      fail(Errc::invalid_argument, "kv_cache", "KV cache dimensions must be positive");
    check_dtype(s);
    KVLayout l = layout_of(s, s.block_size, 0);
    l.set_groups(layer_groups(s));
    // n_blocks counts blocks of every layer: with layer groups (blocks of n_slots layers) the pool keeps
    // those bytes, in more blocks.
    const int64_t blocks_per_seq = (s.n_ctx + s.block_size - 1) / s.block_size;
    l.n_blocks = s.n_blocks > 0 ? (s.n_blocks * s.n_layer + l.n_slots() - 1) / l.n_slots()
                                : blocks_per_seq * s.n_seq_max * l.n_groups();
    if (l.n_blocks > std::numeric_limits<int32_t>::max())
      fail(Errc::invalid_argument, "kv_cache",
           "a paged pool of " + std::to_string(l.n_blocks) +
               " blocks exceeds 2^31; raise [kv_cache] block_size");
    return l;
  }
  struct Table {
    std::vector<int32_t> blocks; // -1: released (sliding window), never read again
    int32_t released = 0;        // positions in released blocks
  };
  struct Seq {
    std::vector<Table> g;         // one per layer group
    std::vector<uint64_t> hashes; // content hashes of the first full blocks (register/reuse_prefix)
    int32_t length = 0;
  };
  // A block another sequence references, or one findable by content (a truncate left it part full), is
  // never written in place: growing into it copies it first.
  bool write_protected(int32_t b) const noexcept { return pool_.refs(b) > 1 || pool_.cache().cached(b); }
  // Table t of a sequence of `len` positions grows by n_new (units_to_grow said there is room).
  void grow(Table& t, int32_t len, int32_t n_new) {
    const int32_t B = shape_.block_size;
    if (n_new > 0 && len % B != 0) {
      int32_t& last = t.blocks[static_cast<size_t>(len / B)];
      if (write_protected(last)) {
        const int32_t copy = pool_.take();
        record_copy({last, copy, len % B}); // the positions written so far
        pool_.release(last);
        last = copy;
      }
    }
    const auto need_blocks = static_cast<size_t>((len + n_new + B - 1) / B);
    while (t.blocks.size() < need_blocks)
      t.blocks.push_back(pool_.take());
  }
  // Gives back table t's blocks that lie inside positions [from, to): a window's past. A cached one stays
  // findable until a block is needed — evicted before the pool grows (BlockPool's window lane), where the
  // blocks of a sequence that ended (its last window included, what a next turn resumes from) are kept as
  // any cached block.
  int32_t release(Table& t, int32_t len, Pos from, Pos to) {
    const int32_t B = shape_.block_size;
    to = std::min(to, len);
    int32_t n = 0;
    for (int32_t b = (std::max<Pos>(from, 0) + B - 1) / B; (b + 1) * B <= to; ++b) {
      int32_t& id = t.blocks[static_cast<size_t>(b)];
      if (id < 0) continue;
      pool_.release(id, true);
      id = -1;
      n += B;
    }
    t.released += n;
    return n;
  }
  bool holds(const Table& t, int32_t len, Pos from, Pos to) const noexcept {
    if (t.released == 0) return true;
    const int32_t B = shape_.block_size;
    to = std::min(to, len);
    for (Pos b = std::max<Pos>(from, 0) / B; b * B < to; ++b)
      if (t.blocks[static_cast<size_t>(b)] < 0) return false;
    return true;
  }
  // Whether group g has cached, of the first k full blocks of `tokens` (hashes[i]), those a query at
  // position k · block_size reads — a sliding window's sinks and window, else all of them; their ids in
  // `found` (-1: not read).
  bool group_has(size_t g, std::span<const uint64_t> hashes, std::span<const TokenId> tokens, size_t k,
                 std::vector<int32_t>* found) const;
  int32_t copy_common_start(Seq& q, std::span<const TokenId> next);
  // How many of the first k blocks (hashes) group g has cached, from the first on.
  size_t cached_run(size_t g, std::span<const uint64_t> hashes, std::span<const TokenId> tokens,
                    size_t k) const;
  std::span<const int32_t> table(SeqId seq, int32_t group) const noexcept override {
    auto it = seqs_.find(seq);
    return it == seqs_.end() ? std::span<const int32_t>()
                             : std::span<const int32_t>(it->second.g[static_cast<size_t>(group)].blocks);
  }

  KVShape shape_;
  size_t rb_ = 0; // bytes of one stored row
  BlockPool pool_;
  std::vector<KVRetention> keep_;     // per layer group: what a sequence keeps of its positions
  std::vector<int32_t> group_layers_; // per layer group: its layers
  int64_t peak_blocks_ = 0;           // the most blocks in use at once since reset_peak()
  std::map<SeqId, Seq> seqs_;
};

bool PagedKVCache::group_has(size_t g, std::span<const uint64_t> hashes, std::span<const TokenId> tokens,
                             size_t k, std::vector<int32_t>* found) const {
  const auto B = static_cast<size_t>(shape_.block_size);
  const KVRetention& keep = keep_[g];
  const auto gi = static_cast<int32_t>(g);
  const auto next = static_cast<Pos>(k * B);
  const size_t sink_blocks = (static_cast<size_t>(keep.sinks) + B - 1) / B;
  const auto window_from = static_cast<size_t>(keep.first_read(next)) / B;
  if (found) found->assign(k, -1);
  for (size_t i = 0; i < k; ++i) {
    if (keep.bounded() && i >= sink_blocks && i < window_from) continue; // released after reuse anyway
    const uint64_t parent = i == 0 ? 0 : hashes[i - 1];
    const int32_t b = pool_.cache().find(PrefixCache::group_key(hashes[i], gi),
                                         PrefixCache::group_key(parent, gi), tokens.subspan(i * B, B));
    if (b < 0) return false;
    if (found) (*found)[i] = b;
  }
  return true;
}

size_t PagedKVCache::cached_run(size_t g, std::span<const uint64_t> hashes, std::span<const TokenId> tokens,
                                size_t k) const {
  const auto B = static_cast<size_t>(shape_.block_size);
  const auto gi = static_cast<int32_t>(g);
  size_t i = 0;
  while (i < k && pool_.cache().find(PrefixCache::group_key(hashes[i], gi),
                                     PrefixCache::group_key(i == 0 ? 0 : hashes[i - 1], gi),
                                     tokens.subspan(i * B, B)) >= 0)
    ++i;
  return i;
}

int32_t PagedKVCache::reuse_prefix(SeqId seq, std::span<const TokenId> tokens, int32_t max_positions) {
  if (!shape_.prefix_cache) return 0;
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second.length != 0 || !it->second.g[0].blocks.empty()) return 0;
  Seq& q = it->second;
  const auto B = static_cast<size_t>(shape_.block_size);
  const size_t cap = std::min(tokens.size(), static_cast<size_t>(std::clamp(max_positions, 0, shape_.n_ctx)));
  // Whole blocks: the most of the prompt's that every group gives back — a group that keeps every position
  // its longest cached run, a window's group what the next query reads (its sinks and last window).
  std::vector<uint64_t> hashes;
  for (size_t i = 0; i < cap / B; ++i)
    hashes.push_back(PrefixCache::block_hash(i == 0 ? 0 : hashes.back(), tokens.subspan(i * B, B)));
  size_t k = hashes.size();
  for (size_t g = 0; g < keep_.size(); ++g)
    if (!keep_[g].bounded()) k = std::min(k, cached_run(g, hashes, tokens, k));
  const auto windows_have = [&](size_t n) {
    for (size_t g = 0; g < keep_.size(); ++g)
      if (keep_[g].bounded() && !group_has(g, hashes, tokens, n, nullptr)) return false;
    return true;
  };
  while (k > 0 && !windows_have(k))
    --k;
  hashes.resize(k);
  std::vector<int32_t> found;
  for (size_t g = 0; g < keep_.size() && k > 0; ++g) {
    group_has(g, hashes, tokens, k, &found);
    Table& t = q.g[g];
    for (const int32_t b : found) {
      if (b >= 0) pool_.ref(b);
      t.blocks.push_back(b);
      t.released += b < 0 ? static_cast<int32_t>(B) : 0;
    }
  }
  q.hashes = hashes;
  q.length = static_cast<int32_t>(k * B) + copy_common_start(q, tokens.subspan(k * B, cap - k * B));
  peak_blocks_ = std::max(peak_blocks_, pool_.in_use());
  return q.length;
}

// After the whole blocks of q (q.hashes): the cached block after them that starts with the most of `next`
// (as llama-server's slots keep any common prefix), its first `common` positions copied into a block of the
// sequence's own in every group (one block each, as evaluating them again would take). No room, or a group
// without that block: nothing. The blocks are held while the others are taken, so that taking cannot evict
// them. Returns the positions copied.
int32_t PagedKVCache::copy_common_start(Seq& q, std::span<const TokenId> next) {
  if (next.empty()) return 0;
  const uint64_t parent = q.hashes.empty() ? 0 : q.hashes.back();
  PrefixCache& cache = pool_.cache();
  int32_t common = 0;
  const int32_t b0 = cache.longest_start(
      parent, next.first(std::min(next.size(), static_cast<size_t>(shape_.block_size))), common);
  if (b0 < 0) return 0;
  std::vector<int32_t> src{b0};
  for (size_t g = 1; g < keep_.size(); ++g) {
    const auto gi = static_cast<int32_t>(g);
    src.push_back(cache.find(PrefixCache::group_key(cache.hash_of(b0), gi),
                             PrefixCache::group_key(parent, gi), cache.tokens_of(b0)));
    if (src.back() < 0) return 0;
  }
  for (const int32_t b : src)
    pool_.ref(b);
  const bool room = pool_.free() >= static_cast<int64_t>(src.size());
  for (size_t g = 0; g < src.size() && room; ++g) {
    const int32_t own = pool_.take();
    record_copy({src[g], own, common});
    q.g[g].blocks.push_back(own);
  }
  for (const int32_t b : src)
    pool_.release(b);
  return room ? common : 0;
}

} // namespace

std::unique_ptr<KVCacheStore> make_paged_kv_cache(const KVShape& shape) {
  return std::make_unique<PagedKVCache>(shape);
}

} // namespace loom
