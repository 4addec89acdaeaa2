// loom/sdk/dtype.hpp — element types of tensors (GGML numbering, as GGUF stores them) and their
// conversions to f32 (header-only: the host and every backend plugin share this one definition).
#pragma once

#include "loom/sdk/error.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace loom {

// Values are GGML's type ids (ggml.h `enum ggml_type`), so a GGUF tensor type maps 1:1.
enum class DType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  bf16 = 30,
};

struct DTypeTraits {
  std::string_view name;
  int64_t block_size;  // elements per block (1 for plain types)
  size_t block_bytes;  // bytes per block
  bool can_dequantize; // loom can convert it to f32
};

// nullopt for an id GGML does not define (or that Loom does not know the size of).
inline std::optional<DTypeTraits> dtype_traits(uint32_t id) noexcept;
inline DTypeTraits dtype_traits(DType t) noexcept;
inline std::string_view dtype_name(DType t) noexcept;
inline std::optional<DType>
dtype_from_name(std::string_view name) noexcept; // "f32", "q4_0", ... (case-insensitive)

// Bytes of one row of n elements; n must be a multiple of the block size (checked by callers).
inline size_t row_bytes(DType t, int64_t n) noexcept;

inline float fp16_to_fp32(uint16_t h) noexcept;
inline uint16_t fp32_to_fp16(float f) noexcept;
inline float bf16_to_fp32(uint16_t h) noexcept {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint16_t fp32_to_bf16(float f) noexcept; // round to nearest even, NaN kept

// Converts n elements (a multiple of the block size) of type t at src into f32. Throws
// loom::Error(unsupported) for a type that cannot be dequantized.
inline void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// Quantizes n floats (a multiple of the block size) into type t (f32, f16, bf16, q8_0, q4_0).
inline void quantize_row(DType t, const float* src, void* dst, int64_t n);

namespace dtype_detail {

struct Entry {
  uint32_t id;
  DTypeTraits traits;
};

inline constexpr Entry k_types[] = {
    {0, {"f32", 1, 4, true}},        {1, {"f16", 1, 2, true}},        {2, {"q4_0", 32, 18, true}},
    {3, {"q4_1", 32, 20, true}},     {6, {"q5_0", 32, 22, true}},     {7, {"q5_1", 32, 24, true}},
    {8, {"q8_0", 32, 34, true}},     {9, {"q8_1", 32, 36, false}},    {10, {"q2_k", 256, 84, false}},
    {11, {"q3_k", 256, 110, false}}, {12, {"q4_k", 256, 144, true}},  {13, {"q5_k", 256, 176, false}},
    {14, {"q6_k", 256, 210, true}},  {15, {"q8_k", 256, 292, false}}, {24, {"i8", 1, 1, false}},
    {25, {"i16", 1, 2, false}},      {26, {"i32", 1, 4, false}},      {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},      {30, {"bf16", 1, 2, true}},
};

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

inline void dequant_q4_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 18, y += 32) {
    const float d = load_f16(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

inline void dequant_q4_1(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 20, y += 32) {
    const float d = load_f16(b), m = load_f16(b + 2);
    const uint8_t* qs = b + 4;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

inline void dequant_q5_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 22, y += 32) {
    const float d = load_f16(b);
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const uint8_t* qs = b + 6;
    for (int j = 0; j < 16; ++j) {
      const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10);
      const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      y[j] = static_cast<float>(((qs[j] & 0x0F) | xh0) - 16) * d;
      y[j + 16] = static_cast<float>(((qs[j] >> 4) | xh1) - 16) * d;
    }
  }
}

inline void dequant_q5_1(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 24, y += 32) {
    const float d = load_f16(b), m = load_f16(b + 2);
    uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    const uint8_t* qs = b + 8;
    for (int j = 0; j < 16; ++j) {
      const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10);
      const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      y[j] = static_cast<float>((qs[j] & 0x0F) | xh0) * d + m;
      y[j + 16] = static_cast<float>((qs[j] >> 4) | xh1) * d + m;
    }
  }
}

inline void dequant_q8_0(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 34, y += 32) {
    const float d = load_f16(b);
    const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j)
      y[j] = static_cast<float>(qs[j]) * d;
  }
}

// Q4_K: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

inline void dequant_q4_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 144) {
    const float d = load_f16(b), dmin = load_f16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    int is = 0;
    for (int j = 0; j < 256; j += 64) {
      uint8_t sc, m;
      scale_min_k4(is + 0, scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(is + 1, scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
      is += 2;
    }
  }
}

inline void dequant_q6_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 210) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = load_f16(b + 208);
    for (int n = 0; n < 256; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

} // namespace dtype_detail

inline std::optional<DTypeTraits> dtype_traits(uint32_t id) noexcept {
  for (const auto& e : dtype_detail::k_types)
    if (e.id == id) return e.traits;
  return std::nullopt;
}

inline DTypeTraits dtype_traits(DType t) noexcept {
  auto tr = dtype_traits(static_cast<uint32_t>(t));
  LOOM_ASSERT(tr.has_value(), "DType value outside the known table");
  return *tr;
}

inline std::string_view dtype_name(DType t) noexcept {
  auto tr = dtype_traits(static_cast<uint32_t>(t));
  return tr ? tr->name : std::string_view("unknown");
}

inline std::optional<DType> dtype_from_name(std::string_view name) noexcept {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& e : dtype_detail::k_types)
    if (e.traits.name == lower) return static_cast<DType>(e.id);
  return std::nullopt;
}

inline size_t row_bytes(DType t, int64_t n) noexcept {
  const auto tr = dtype_traits(t);
  return static_cast<size_t>(n / tr.block_size) * tr.block_bytes;
}

inline float fp16_to_fp32(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else { // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3FFu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t fp32_to_fp16(float f) noexcept {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7FFFFFFFu;
  if (absx > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (absx >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u); // overflow → inf
  if (absx < 0x38800000u) {                                              // subnormal or zero in f16
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t exp = absx >> 23;
    const uint32_t mant = (absx & 0x7FFFFFu) | 0x800000u;
    // value = mant * 2^(exp-150); f16 subnormal unit = 2^-24 → q = mant * 2^(exp-126)
    const uint32_t s = 126 - exp; // right shift amount, 1..24
    uint32_t q = mant >> s;
    const uint32_t rem = mant & ((1u << s) - 1);
    const uint32_t halfway = 1u << (s - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = absx + 0xC8000FFFu + ((absx >> 13) & 1u); // rebias (−112<<23) and round to nearest even
  return static_cast<uint16_t>(sign | (r >> 13));
}

inline uint16_t fp32_to_bf16(float f) noexcept {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 64u);
  return static_cast<uint16_t>((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
}

inline void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  const auto tr = dtype_traits(t);
  LOOM_ASSERT(n % tr.block_size == 0, "row length not a multiple of the block size");
  const int64_t nb = n / tr.block_size;
  switch (t) {
  case DType::f32:
    std::memcpy(dst, b, static_cast<size_t>(n) * 4);
    return;
  case DType::f16:
    for (int64_t i = 0; i < n; ++i)
      dst[i] = dtype_detail::load_f16(b + 2 * i);
    return;
  case DType::bf16:
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      dst[i] = bf16_to_fp32(h);
    }
    return;
  case DType::q4_0:
    dtype_detail::dequant_q4_0(b, dst, nb);
    return;
  case DType::q4_1:
    dtype_detail::dequant_q4_1(b, dst, nb);
    return;
  case DType::q5_0:
    dtype_detail::dequant_q5_0(b, dst, nb);
    return;
  case DType::q5_1:
    dtype_detail::dequant_q5_1(b, dst, nb);
    return;
  case DType::q8_0:
    dtype_detail::dequant_q8_0(b, dst, nb);
    return;
  case DType::q4_k:
    dtype_detail::dequant_q4_k(b, dst, nb);
    return;
  case DType::q6_k:
    dtype_detail::dequant_q6_k(b, dst, nb);
    return;
  default:
    break;
  }
  fail(Errc::unsupported, "dtype",
       "cannot convert tensor type " + std::string(tr.name) +
           " to f32; supported: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q6_k");
}

inline void quantize_row(DType t, const float* x, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  const auto tr = dtype_traits(t);
  LOOM_ASSERT(n % tr.block_size == 0, "row length not a multiple of the block size");
  switch (t) {
  case DType::f32:
    std::memcpy(out, x, static_cast<size_t>(n) * 4);
    return;
  case DType::f16:
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = fp32_to_fp16(x[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
    return;
  case DType::bf16:
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = fp32_to_bf16(x[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
    return;
  case DType::q8_0:
    for (int64_t i = 0; i < n / 32; ++i, x += 32, out += 34) {
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j)
        amax = std::max(amax, std::fabs(x[j]));
      const float d = amax / 127.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const uint16_t dh = fp32_to_fp16(d);
      std::memcpy(out, &dh, 2);
      for (int j = 0; j < 32; ++j)
        out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[j] * id)));
    }
    return;
  case DType::q4_0:
    for (int64_t i = 0; i < n / 32; ++i, x += 32, out += 18) {
      float amax = 0.0f, maxv = 0.0f; // the value with the largest magnitude, sign kept
      for (int j = 0; j < 32; ++j)
        if (std::fabs(x[j]) > amax) {
          amax = std::fabs(x[j]);
          maxv = x[j];
        }
      const float d = maxv / -8.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const uint16_t dh = fp32_to_fp16(d);
      std::memcpy(out, &dh, 2);
      for (int j = 0; j < 16; ++j) {
        const auto q0 = static_cast<uint8_t>(std::min(15, static_cast<int>(x[j] * id + 8.5f)));
        const auto q1 = static_cast<uint8_t>(std::min(15, static_cast<int>(x[j + 16] * id + 8.5f)));
        out[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
      }
    }
    return;
  default:
    break;
  }
  fail(Errc::unsupported, "dtype",
       "cannot quantize to " + std::string(tr.name) + "; supported: f32, f16, bf16, q8_0, q4_0");
}

// ---- KV rows in a stored type (KVRows::k_data / v_data) ----

// The types a KV cache may store rows in.
inline bool kv_dtype_valid(DType t) noexcept {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::q8_0;
}
// Values [off, off + n) of a KV row stored in type t, as f32 (q8_0: the blocks of 32 that hold them
// are dequantized).
inline void kv_load(DType t, const void* row, int64_t off, int64_t n, float* out) {
  const auto* b = static_cast<const uint8_t*>(row);
  switch (t) {
  case DType::f32:
    std::memcpy(out, b + off * 4, static_cast<size_t>(n) * 4);
    return;
  case DType::f16:
    for (int64_t i = 0; i < n; ++i)
      out[i] = dtype_detail::load_f16(b + 2 * (off + i));
    return;
  case DType::bf16:
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, b + 2 * (off + i), 2);
      out[i] = bf16_to_fp32(h);
    }
    return;
  case DType::q8_0: {
    float blk[32];
    for (int64_t i = 0; i < n;) {
      const int64_t at = off + i, bi = at / 32, in = at % 32;
      dequantize_row(DType::q8_0, b + bi * 34, blk, 32);
      const int64_t take = std::min<int64_t>(32 - in, n - i);
      std::memcpy(out + i, blk + in, static_cast<size_t>(take) * 4);
      i += take;
    }
    return;
  }
  default:
    fail(Errc::unsupported, "kv", "KV rows cannot be stored as " + std::string(dtype_traits(t).name));
  }
}
// A whole row of n values into the stored type t.
inline void kv_store(DType t, const float* src, void* row, int64_t n) {
  quantize_row(t, src, row, n);
}

} // namespace loom
