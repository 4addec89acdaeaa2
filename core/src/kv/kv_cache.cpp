// kv_cache.cpp — what both KV stores share: the slots and block tables a forward reads, a row's place in
// the pool and its bytes (the stores themselves: contiguous_kv_cache.cpp, paged_kv_cache.cpp).
#include "loom/kv/kv_cache.hpp"

#include "loom/error.hpp"

#include <algorithm>
#include <vector>

namespace loom {

KVRows KVCacheStore::rows_for(const BatchView& b) {
  LOOM_ASSERT(memory_.buffer() != nullptr, "a forward over a KV store without memory");
  memory_.sync();
  const KVLayout& l = memory_.layout();
  const size_t n = b.tokens.size();
  const auto n_groups = static_cast<size_t>(l.n_groups());
  row_seq_.resize(n);
  slots_.resize(n_groups);
  tables_.resize(n_groups);
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
      stride = std::max(stride, table(s, 0).size()); // every group's table has the same length
    }
    row_seq_[t] = static_cast<int32_t>(i);
  }
  std::vector<KVGroupRows> groups(n_groups);
  for (size_t g = 0; g < n_groups; ++g) {
    const auto gi = static_cast<int32_t>(g);
    std::vector<int64_t>& slots = slots_[g];
    slots.resize(n);
    for (size_t t = 0; t < n; ++t) {
      const std::span<const int32_t> tb = table(b.seq_ids[t], gi);
      const Pos p = b.positions[t];
      const auto at = static_cast<size_t>(p / l.block_size);
      LOOM_ASSERT(p >= 0 && p < length(b.seq_ids[t]) && at < tb.size() && tb[at] >= 0,
                  "a batch row at a position its sequence has not allocated");
      slots[t] = static_cast<int64_t>(tb[at]) * l.block_size + p % l.block_size;
    }
    std::vector<int32_t>& tables = tables_[g];
    tables.assign(seqs.size() * stride, -1);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const std::span<const int32_t> tb = table(seqs[i], gi);
      LOOM_ASSERT(tb.size() <= stride, "a layer group's block table longer than group 0's");
      std::copy(tb.begin(), tb.end(), tables.begin() + static_cast<std::ptrdiff_t>(i * stride));
    }
    groups[g] = {slots, tables, static_cast<int32_t>(stride)};
  }
  return KVRows(l, memory_.buffer()->data(), row_seq_, std::move(groups));
}

size_t KVCacheStore::row_offset(int32_t layer, int kv, SeqId seq, Pos pos) const {
  const KVLayout& l = memory_.layout();
  LOOM_ASSERT(layer >= 0 && layer < l.n_layer, "KV row of a layer the model lacks");
  const std::span<const int32_t> tb = table(seq, l.group_of(layer));
  const auto at = static_cast<size_t>(pos / l.block_size);
  LOOM_ASSERT(pos >= 0 && pos < length(seq) && at < tb.size() && tb[at] >= 0,
              "KV row outside the allocated positions");
  return l.offset(layer, kv, tb[at], pos % l.block_size);
}

int64_t KVCacheStore::positions_in(int64_t units) const noexcept {
  // units_for grows with the positions: the largest count that fits, by bisection.
  int64_t lo = 0, hi = std::max<int64_t>(units, 0) * positions_per_unit();
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (units_for(mid) <= units)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
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

} // namespace loom
