// kv_rows.hpp — reading and writing a KV store's f32 rows from tests (through the store's memory:
// read_row / write_row, the pool's bytes copied to and from host memory).
#pragma once

#include "loom/kv/kv_cache.hpp"

#include <cstring>
#include <span>
#include <vector>

namespace loom::test {

// The f32 K (kv 0) or V (kv 1) row of (layer, seq, pos) of an f32 store.
inline std::vector<float> kv_f32(KVCacheStore& kv, int32_t layer, int which, SeqId seq, Pos pos) {
  const std::vector<uint8_t> b = kv.read_row(layer, which, seq, pos);
  std::vector<float> out(b.size() / sizeof(float));
  std::memcpy(out.data(), b.data(), out.size() * sizeof(float));
  return out;
}
inline std::vector<float> k_f32(KVCacheStore& kv, int32_t layer, SeqId seq, Pos pos) {
  return kv_f32(kv, layer, 0, seq, pos);
}
inline std::vector<float> v_f32(KVCacheStore& kv, int32_t layer, SeqId seq, Pos pos) {
  return kv_f32(kv, layer, 1, seq, pos);
}
inline void set_kv_f32(KVCacheStore& kv, int32_t layer, int which, SeqId seq, Pos pos,
                       std::span<const float> v) {
  kv.write_row(layer, which, seq, pos,
               {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)});
}
// Whether two rows are the same storage (one block shared).
inline bool same_row(const KVCacheStore& kv, int32_t layer, SeqId a, SeqId b, Pos pos) {
  return kv.row_offset(layer, 0, a, pos) == kv.row_offset(layer, 0, b, pos);
}

} // namespace loom::test
