// tests/gguf_values.hpp — GGUF metadata values for tests that craft model files.
#pragma once

#include "loom/format/gguf.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace loom::test {

inline GgufValue str_value(std::string s) {
  GgufValue v;
  v.type = GgufType::string;
  v.str = std::move(s);
  return v;
}
inline GgufValue u32_value(uint32_t x) {
  GgufValue v;
  v.type = GgufType::u32;
  v.u = x;
  return v;
}
inline GgufValue i32_value(int32_t x) {
  GgufValue v;
  v.type = GgufType::i32;
  v.i = x;
  return v;
}
inline GgufValue f32_value(float x) {
  GgufValue v;
  v.type = GgufType::f32;
  v.f = static_cast<double>(x);
  return v;
}
inline GgufValue bool_value(bool b) {
  GgufValue v;
  v.type = GgufType::boolean;
  v.u = b ? 1 : 0;
  return v;
}
// An array of numbers of one element type (f32 from the double, integers truncated).
inline GgufValue array_of(GgufType elem, const std::vector<double>& xs) {
  GgufValue a;
  a.type = GgufType::array;
  a.elem_type = elem;
  for (double x : xs) {
    GgufValue e;
    e.type = elem;
    if (elem == GgufType::f32)
      e.f = x;
    else
      e.i = static_cast<int64_t>(x);
    a.items.push_back(e);
  }
  return a;
}
inline GgufValue strings(const std::vector<std::string>& xs) {
  GgufValue a;
  a.type = GgufType::array;
  a.elem_type = GgufType::string;
  for (const auto& x : xs)
    a.items.push_back(str_value(x));
  return a;
}

} // namespace loom::test
