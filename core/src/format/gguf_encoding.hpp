// format/gguf_encoding.hpp — how a GGUF file encodes values (private header): the magic, the sizes of
// the value types, scalars to and from their little-endian bytes, and the host-memory estimates a parse
// charges against GgufLimits. Shared by the reader (gguf.cpp), the values (gguf_value.cpp) and the
// writer (gguf_writer.cpp).
#pragma once

#include "loom/error.hpp"
#include "loom/format/gguf.hpp"

#include <cstdint>
#include <cstring>
#include <vector>

namespace loom::gguf_encoding {

constexpr uint32_t k_magic = 0x46554747u; // "GGUF" little-endian

// The bytes a value of type t takes in the file (for strings and arrays: the least they take).
inline size_t scalar_size(GgufType t) {
  switch (t) {
  case GgufType::u8:
  case GgufType::i8:
  case GgufType::boolean:
    return 1;
  case GgufType::u16:
  case GgufType::i16:
    return 2;
  case GgufType::u32:
  case GgufType::i32:
  case GgufType::f32:
    return 4;
  case GgufType::u64:
  case GgufType::i64:
  case GgufType::f64:
    return 8;
  case GgufType::string:
    return 8; // at least the length
  case GgufType::array:
    return 12; // at least type + count
  }
  return 1;
}

inline bool valid_type(uint32_t t) {
  return t <= 12;
}

inline bool is_number_or_bool(GgufType t) {
  return t != GgufType::string && t != GgufType::array;
}

// Host memory a std::string of `len` bytes takes beyond itself (a heap block once it is longer than
// the small-string buffer): the estimate charged against GgufLimits::max_metadata_bytes.
inline uint64_t string_heap(uint64_t len) {
  return len > 15 ? len + 1 : 0;
}

// Scalar of `t` at p (little-endian, as in the file) into v's i/u/f.
inline void decode_scalar(GgufType t, const uint8_t* p, GgufValue& v) {
  auto get = [p](auto x) {
    std::memcpy(&x, p, sizeof x);
    return x;
  };
  switch (t) {
  case GgufType::u8:
  case GgufType::boolean:
    v.u = get(uint8_t{});
    break;
  case GgufType::i8:
    v.i = get(int8_t{});
    break;
  case GgufType::u16:
    v.u = get(uint16_t{});
    break;
  case GgufType::i16:
    v.i = get(int16_t{});
    break;
  case GgufType::u32:
    v.u = get(uint32_t{});
    break;
  case GgufType::i32:
    v.i = get(int32_t{});
    break;
  case GgufType::u64:
    v.u = get(uint64_t{});
    break;
  case GgufType::i64:
    v.i = get(int64_t{});
    break;
  case GgufType::f32:
    v.f = static_cast<double>(get(float{}));
    break;
  case GgufType::f64:
    v.f = get(double{});
    break;
  case GgufType::string:
  case GgufType::array:
    break;
  }
}

// (resize + memcpy: GCC 12's -Wstringop-overflow misreads a vector insert of an empty vector at -O3.)
template <class T> inline void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

// A number or bool of type v.type, as the file stores it.
inline void put_scalar(std::vector<uint8_t>& out, const GgufValue& v) {
  switch (v.type) {
  case GgufType::u8:
    put<uint8_t>(out, static_cast<uint8_t>(v.u));
    break;
  case GgufType::i8:
    put<int8_t>(out, static_cast<int8_t>(v.i));
    break;
  case GgufType::u16:
    put<uint16_t>(out, static_cast<uint16_t>(v.u));
    break;
  case GgufType::i16:
    put<int16_t>(out, static_cast<int16_t>(v.i));
    break;
  case GgufType::u32:
    put<uint32_t>(out, static_cast<uint32_t>(v.u));
    break;
  case GgufType::i32:
    put<int32_t>(out, static_cast<int32_t>(v.i));
    break;
  case GgufType::u64:
    put<uint64_t>(out, v.u);
    break;
  case GgufType::i64:
    put<int64_t>(out, v.i);
    break;
  case GgufType::f32:
    put<float>(out, static_cast<float>(v.f));
    break;
  case GgufType::f64:
    put<double>(out, v.f);
    break;
  case GgufType::boolean:
    put<uint8_t>(out, v.u ? 1 : 0);
    break;
  case GgufType::string:
  case GgufType::array:
    LOOM_ASSERT(false, "put_scalar of a string or array");
  }
}

} // namespace loom::gguf_encoding
