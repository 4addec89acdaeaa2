#include "loom/kv_cache.hpp"

#include "loom/error.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>

namespace loom {

namespace {

// One slab per live sequence: K and V of every layer, [n_layer][n_ctx][n_head_kv · head_dim] f32.
class ContiguousKVCache final : public KVCacheStore {
public:
  explicit ContiguousKVCache(const KVShape& s) : shape_(s) {
    if (s.dtype != DType::f32)
      fail(Errc::unsupported, "kv_cache",
           "the contiguous store holds f32 only, asked for " + std::string(dtype_name(s.dtype)));
    if (s.n_layer <= 0 || s.n_head_kv <= 0 || s.head_dim <= 0 || s.n_ctx <= 0 || s.n_seq_max <= 0)
      fail(Errc::invalid_argument, "kv_cache", "KV cache dimensions must be positive");
  }
  std::string_view name() const noexcept override { return "contiguous"; }
  const KVShape& shape() const noexcept override { return shape_; }

  bool allocate(SeqId seq, int32_t n_new) override {
    if (n_new < 0) return false;
    auto it = seqs_.find(seq);
    if (it == seqs_.end()) {
      if (static_cast<int32_t>(seqs_.size()) >= shape_.n_seq_max || n_new > shape_.n_ctx) return false;
      Slab s;
      s.data = new_slab(); // untouched pages cost nothing
      s.length = n_new;
      seqs_.emplace(seq, std::move(s));
      peak_seqs_ = std::max(peak_seqs_, seqs_.size());
      return true;
    }
    if (it->second.length + n_new > shape_.n_ctx) return false;
    it->second.length += n_new;
    return true;
  }
  void free(SeqId seq) noexcept override { seqs_.erase(seq); }
  bool fork(SeqId parent, SeqId child) override {
    auto it = seqs_.find(parent);
    if (it == seqs_.end() || seqs_.count(child) || static_cast<int32_t>(seqs_.size()) >= shape_.n_seq_max)
      return false;
    Slab copy;
    copy.data = new_slab();
    copy.length = it->second.length;
    // Only the used positions: [kv][layer] blocks of `length` rows each.
    const size_t used = static_cast<size_t>(copy.length) * static_cast<size_t>(shape_.row_elems());
    const size_t stride = static_cast<size_t>(shape_.n_ctx) * static_cast<size_t>(shape_.row_elems());
    for (size_t b = 0; b < 2 * static_cast<size_t>(shape_.n_layer); ++b)
      std::memcpy(copy.data.get() + b * stride, it->second.data.get() + b * stride, used * sizeof(float));
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
  int32_t free_sequences() const noexcept override {
    return shape_.n_seq_max - static_cast<int32_t>(seqs_.size());
  }

  float* k_row(int32_t layer, SeqId seq, Pos pos) noexcept override { return row(layer, seq, pos, 0); }
  float* v_row(int32_t layer, SeqId seq, Pos pos) noexcept override { return row(layer, seq, pos, 1); }

  size_t bytes_allocated() const noexcept override { return seqs_.size() * slab_elems() * sizeof(float); }
  size_t bytes_allocated_peak() const noexcept override { return peak_seqs_ * slab_elems() * sizeof(float); }
  void reset_peak() noexcept override { peak_seqs_ = seqs_.size(); }
  size_t bytes_used() const noexcept override {
    size_t n = 0;
    for (const auto& [id, slab] : seqs_)
      n += static_cast<size_t>(slab.length);
    return n * 2 * static_cast<size_t>(shape_.n_layer) * static_cast<size_t>(shape_.row_elems()) *
           sizeof(float);
  }
  size_t bytes_capacity() const noexcept override {
    return static_cast<size_t>(shape_.n_seq_max) * slab_elems() * sizeof(float);
  }

private:
  size_t peak_seqs_ = 0; // the most sequences held at once since reset_peak()
  struct Slab {
    std::unique_ptr<float[]> data; // [2][n_layer][n_ctx][row]; rows ≥ length are uninitialised
    int32_t length = 0;
  };
  std::unique_ptr<float[]> new_slab() const {
    try {
      return std::make_unique_for_overwrite<float[]>(slab_elems());
    } catch (const std::bad_alloc&) {
      fail(Errc::out_of_memory, "kv_cache",
           "cannot reserve " + std::to_string(slab_elems() * sizeof(float) >> 20) +
               " MiB of KV for one sequence of " + std::to_string(shape_.n_ctx) +
               " positions; lower [model] n_ctx (--ctx-size)");
    }
  }
  size_t slab_elems() const noexcept {
    return 2ull * static_cast<size_t>(shape_.n_layer) * static_cast<size_t>(shape_.n_ctx) *
           static_cast<size_t>(shape_.row_elems());
  }
  float* row(int32_t layer, SeqId seq, Pos pos, int kv) noexcept {
    auto it = seqs_.find(seq);
    LOOM_ASSERT(it != seqs_.end(), "KV row of an unknown sequence");
    LOOM_ASSERT(pos >= 0 && pos < it->second.length, "KV row outside the allocated positions");
    LOOM_ASSERT(layer >= 0 && layer < shape_.n_layer, "KV layer out of range");
    const size_t idx =
        ((static_cast<size_t>(kv) * static_cast<size_t>(shape_.n_layer) + static_cast<size_t>(layer)) *
             static_cast<size_t>(shape_.n_ctx) +
         static_cast<size_t>(pos)) *
        static_cast<size_t>(shape_.row_elems());
    return it->second.data.get() + idx;
  }

  KVShape shape_;
  std::map<SeqId, Slab> seqs_;
};

} // namespace

std::unique_ptr<KVCacheStore> make_contiguous_kv_cache(const KVShape& shape) {
  return std::make_unique<ContiguousKVCache>(shape);
}

} // namespace loom
