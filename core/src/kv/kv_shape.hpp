// kv_shape.hpp — what both KV stores derive from a KVShape: its checks, the bytes of a row, the pool's
// layout, the bytes of the written positions.
#pragma once

#include "loom/error.hpp"
#include "loom/kv/kv_cache.hpp"

#include <string>

namespace loom {

// Bytes of one stored K (or V) row.
inline size_t kv_row_bytes(const KVShape& s) noexcept {
  return row_bytes(s.dtype, s.row_elems());
}

// The storage types a store accepts: f32, f16, bf16, q8_0 (its blocks of 32 run along the row).
inline void check_dtype(const KVShape& s) {
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
inline KVLayout layout_of(const KVShape& s, int32_t block_size, int64_t n_blocks) noexcept {
  KVLayout l;
  l.dtype = s.dtype;
  l.n_layer = s.n_layer;
  l.n_head_kv = s.n_head_kv;
  l.head_dim = s.head_dim;
  l.block_size = block_size;
  l.n_blocks = n_blocks;
  return l;
}

} // namespace loom
