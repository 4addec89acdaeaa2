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

} // namespace loom
