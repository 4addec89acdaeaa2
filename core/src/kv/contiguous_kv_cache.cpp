// contiguous_kv_cache.cpp — the contiguous KV store: one slab of n_ctx positions per live sequence.
#include "kv/kv_shape.hpp"
#include "loom/kv/kv_cache.hpp"

#include <algorithm>
#include <map>
#include <memory>

namespace loom {

namespace {

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
  std::span<const int32_t> table(SeqId seq, int32_t /*group: one*/) const noexcept override {
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

} // namespace

std::unique_ptr<KVCacheStore> make_contiguous_kv_cache(const KVShape& shape) {
  return std::make_unique<ContiguousKVCache>(shape);
}

} // namespace loom
