// format/hf_metadata.hpp — the GGUF metadata a Hugging Face checkpoint is read into (private
// header): keys in the order they are added, values made with v_str, v_u32 … as GGUF types them.
#pragma once

#include "loom/format/gguf.hpp"

#include <string>
#include <utility>
#include <vector>

namespace loom::hf {

inline GgufValue v_str(std::string s) {
  GgufValue v;
  v.type = GgufType::string;
  v.str = std::move(s);
  return v;
}
inline GgufValue v_u32(int64_t x) {
  GgufValue v;
  v.type = GgufType::u32;
  v.u = static_cast<uint64_t>(x);
  return v;
}
inline GgufValue v_i32(int64_t x) {
  GgufValue v;
  v.type = GgufType::i32;
  v.i = x;
  return v;
}
inline GgufValue v_f32(double x) {
  GgufValue v;
  v.type = GgufType::f32;
  v.f = static_cast<double>(static_cast<float>(x));
  return v;
}
inline GgufValue v_bool(bool b) {
  GgufValue v;
  v.type = GgufType::boolean;
  v.u = b ? 1 : 0;
  return v;
}
template <class T, class Make> GgufValue v_array(GgufType elem, const std::vector<T>& xs, Make make) {
  GgufValue v;
  v.type = GgufType::array;
  v.elem_type = elem;
  for (const auto& x : xs)
    v.items.push_back(make(x));
  return v;
}

struct Meta {
  std::vector<GgufKV> kv;
  void add(std::string key, GgufValue v) { kv.push_back({std::move(key), std::move(v)}); }
};

} // namespace loom::hf
