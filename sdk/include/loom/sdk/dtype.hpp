// loom/sdk/dtype.hpp — element types of tensors (GGML numbering, as GGUF stores them) and their
// conversions to and from f32 (header-only: the host and every backend plugin share this one definition).
// Block layouts are GGML's (ggml-common.h) byte for byte, so GGUF files read and written here agree with
// llama.cpp's.
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
  iq4_nl = 20,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  bf16 = 30,
  mxfp4 = 39,
};

struct DTypeTraits {
  std::string_view name;
  int64_t block_size;  // elements per block (1 for plain types)
  size_t block_bytes;  // bytes per block
  bool can_dequantize; // loom can convert it to f32 (dequantize_row)
  bool can_quantize;   // loom can convert f32 to it (quantize_row)
};

// nullopt for an id GGML does not define (or that Loom does not know the size of).
inline std::optional<DTypeTraits> dtype_traits(uint32_t id) noexcept;
inline DTypeTraits dtype_traits(DType t) noexcept;
inline std::string_view dtype_name(DType t) noexcept;
inline std::optional<DType>
dtype_from_name(std::string_view name) noexcept; // "f32", "q4_0", ... (case-insensitive)
// "f32, f16, q4_0, …": the names of the types dequantize_row reads (quantizable = false) or
// quantize_row writes (true), in GGML id order — for help texts and error messages.
inline std::string dtype_names(bool quantizable);

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

// Converts n elements (a multiple of the block size) of type t at src into f32: the values ggml's
// dequantize_row_* gives, bit for bit. Throws loom::Error(unsupported) for a type that cannot be
// dequantized (traits.can_dequantize false).
inline void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// Quantizes n floats (a multiple of the block size) into type t, in GGML's block layout. f32, f16, bf16,
// q8_0 and q4_0 give exactly ggml's reference quantizer's bytes; the other types search each block's
// scales (and mins) for the least squared error (k-quants: per sub-block, then the sub-block scales are
// quantized against the super-block scale and the values re-rounded). Throws loom::Error(unsupported)
// for a type it cannot write (traits.can_quantize false).
inline void quantize_row(DType t, const float* src, void* dst, int64_t n);

namespace dtype_detail {

struct Entry {
  uint32_t id;
  DTypeTraits traits;
};

// clang-format off
inline constexpr Entry k_types[] = {
    {0, {"f32", 1, 4, true, true}},          {1, {"f16", 1, 2, true, true}},
    {2, {"q4_0", 32, 18, true, true}},       {3, {"q4_1", 32, 20, true, true}},
    {6, {"q5_0", 32, 22, true, true}},       {7, {"q5_1", 32, 24, true, true}},
    {8, {"q8_0", 32, 34, true, true}},       {9, {"q8_1", 32, 36, false, false}},
    {10, {"q2_k", 256, 84, true, true}},     {11, {"q3_k", 256, 110, true, true}},
    {12, {"q4_k", 256, 144, true, true}},    {13, {"q5_k", 256, 176, true, true}},
    {14, {"q6_k", 256, 210, true, true}},    {15, {"q8_k", 256, 292, false, false}},
    {20, {"iq4_nl", 32, 18, true, true}},    {23, {"iq4_xs", 256, 136, true, true}},
    {24, {"i8", 1, 1, false, false}},        {25, {"i16", 1, 2, false, false}},
    {26, {"i32", 1, 4, false, false}},       {27, {"i64", 1, 8, false, false}},
    {28, {"f64", 1, 8, false, false}},       {30, {"bf16", 1, 2, true, true}},
    {39, {"mxfp4", 32, 17, true, true}},
};
// clang-format on

// IQ4_NL / IQ4_XS: a 4-bit index selects one of these 16 levels (ggml's kvalues_iq4nl), times the scale.
inline constexpr int8_t k_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                              1,    13,   25,  38,  53,  69,  89,  113};

// MXFP4: a 4-bit index selects one of these (twice FP4 E2M1's values: ggml's kvalues_mxfp4), times the
// block's scale 2^(e − 128) (e: its E8M0 byte, so 2^(e − 127) halved).
inline constexpr int8_t k_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
inline float e8m0_half(uint8_t e) noexcept {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23; // (subnormal below 2)
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}
inline void store_f16(uint8_t* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// ---- dequantization: one function per block type, b = the first block, nb blocks ----

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

// Q2_K (84 bytes): scales[16] (low nibble: scale, high: min, of each 16 values), qs[64] (2-bit quants),
// f16 d, f16 dmin. Value = d·scale·q − dmin·min. Quant k of 128-value half h, group j = k / 32, lane
// l = k % 32 is bits 2j..2j+1 of qs[32h + l].
inline void dequant_q2_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 84) {
    const uint8_t* sc = b;
    const uint8_t* qs = b + 16;
    const float d = load_f16(b + 80), dmin = load_f16(b + 82);
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j)
        for (int g = 0; g < 2; ++g) {
          const uint8_t s = sc[8 * h + 2 * j + g];
          const float dl = d * static_cast<float>(s & 0xF), ml = dmin * static_cast<float>(s >> 4);
          const uint8_t* q = qs + 32 * h + 16 * g;
          for (int l = 0; l < 16; ++l)
            *y++ = dl * static_cast<float>((q[l] >> (2 * j)) & 3) - ml;
        }
  }
}

// Q3_K (110 bytes): hmask[32] (the third bit), qs[64] (low 2 bits, laid out as Q2_K's), scales[12]
// (16 6-bit scales, stored + 32: scale s has its low nibble in byte s % 8 — low half for s < 8 — and
// its high 2 bits in byte 8 + s % 4 at bit 2·(s / 4)), f16 d. Value = d·(scale − 32)·(q − 4·!hbit),
// the high bit of value k = 128h + 32j + l being bit 4h + j of hmask[l].
inline int q3_k_scale(const uint8_t* s, int k) {
  const int lo = (s[k % 8] >> (4 * (k / 8))) & 0xF;
  const int hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

inline void dequant_q3_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 110) {
    const uint8_t* hm = b;
    const uint8_t* qs = b + 32;
    const uint8_t* sc = b + 96;
    const float d = load_f16(b + 108);
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j)
        for (int g = 0; g < 2; ++g) {
          const float dl = d * static_cast<float>(q3_k_scale(sc, 8 * h + 2 * j + g));
          const uint8_t* q = qs + 32 * h + 16 * g;
          const uint8_t* m = hm + 16 * g;
          const int bit = 4 * h + j;
          for (int l = 0; l < 16; ++l) {
            const int v = ((q[l] >> (2 * j)) & 3) - (((m[l] >> bit) & 1) ? 0 : 4);
            *y++ = dl * static_cast<float>(v);
          }
        }
  }
}

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes.
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

// Q5_K (176 bytes): f16 d, f16 dmin, scales[12] (as Q4_K), qh[32] (the fifth bit: value 64j + l has it
// in bit 2j of qh[l], value 64j + 32 + l in bit 2j + 1), qs[128] (low nibbles, as Q4_K).
inline void dequant_q5_k(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 176) {
    const float d = load_f16(b), dmin = load_f16(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* ql = b + 48;
    for (int j = 0; j < 4; ++j, ql += 32) {
      uint8_t sc, m;
      scale_min_k4(2 * j, scales, sc, m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(2 * j + 1, scales, sc, m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * static_cast<float>((ql[l] & 0xF) | (((qh[l] >> (2 * j)) & 1) << 4)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * static_cast<float>((ql[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4)) - m2;
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

// 16 indices (low nibbles: values 0..15, high: 16..31) into k_iq4nl_values, times dl.
inline void iq4_expand(const uint8_t* qs, float dl, float* y) {
  for (int j = 0; j < 16; ++j) {
    y[j] = dl * static_cast<float>(k_iq4nl_values[qs[j] & 0xF]);
    y[j + 16] = dl * static_cast<float>(k_iq4nl_values[qs[j] >> 4]);
  }
}

// IQ4_NL (18 bytes per 32): f16 d, qs[16].
inline void dequant_iq4_nl(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 18, y += 32)
    iq4_expand(b + 2, load_f16(b), y);
}

// MXFP4 (17 bytes per 32): E8M0 e, qs[16] (values j and j + 16 in the low and high nibbles of qs[j]).
inline void dequant_mxfp4(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 17, y += 32) {
    const float d = e8m0_half(b[0]);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(k_mxfp4_values[b[1 + j] & 0xF]) * d;
      y[j + 16] = static_cast<float>(k_mxfp4_values[b[1 + j] >> 4]) * d;
    }
  }
}

// IQ4_XS (136 bytes per 256): f16 d, u16 scales_h, scales_l[4], qs[128]; sub-block k (of 32) has the
// 6-bit scale ls = nibble k % 2 of scales_l[k / 2] | bits 2k..2k+1 of scales_h << 4, dl = d·(ls − 32),
// and its indices in qs[16k..16k+15] as IQ4_NL's.
inline void dequant_iq4_xs(const uint8_t* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, b += 136) {
    const float d = load_f16(b);
    uint16_t sh;
    std::memcpy(&sh, b + 2, 2);
    const uint8_t* sl = b + 4;
    const uint8_t* qs = b + 8;
    for (int k = 0; k < 8; ++k, y += 32, qs += 16) {
      const int ls = ((sl[k / 2] >> (4 * (k % 2))) & 0xF) | (((sh >> (2 * k)) & 3) << 4);
      iq4_expand(qs, d * static_cast<float>(ls - 32), y);
    }
  }
}

// ---- quantization ----

// v rounded to the nearest integer in [lo, hi] (halves round up; NaN → lo), branch-free and with no
// library call.
inline float levelf(float v, float lo, float hi) {
  v = v > lo ? v : lo;
  v = v < hi ? v : hi;
  return static_cast<float>(static_cast<int>(v - lo + 0.5f)) + lo;
}
inline int level(float v, int lo, int hi) {
  return static_cast<int>(levelf(v, static_cast<float>(lo), static_cast<float>(hi)));
}

// t[i] = levelf(s·(x[i] − off), lo, hi) for n (a multiple of 8) values. The loops over values here run
// in chunks of 8 so that GCC and Clang vectorize them (a plain loop of 16 or 32 is unrolled into
// branches instead); this one is not inlined because GCC 12 turns the clamps into branches when it
// sees constant bounds.
[[gnu::noinline]] inline void levels8(const float* x, int n, float s, float off, float lo, float hi,
                                      float* t) {
  for (int i = 0; i < n; i += 8)
    for (int k = 0; k < 8; ++k)
      t[i + k] = levelf(s * (x[i + k] - off), lo, hi);
}

inline float sum8(const float* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// Σ x[i]·l[i] over n (a multiple of 8) values, in 8 partial sums (so it vectorizes).
inline float dot8(const float* x, const float* l, int n) {
  float acc[8] = {};
  for (int i = 0; i < n; i += 8)
    for (int k = 0; k < 8; ++k)
      acc[k] += x[i + k] * l[i + k];
  return sum8(acc);
}

// The value of largest magnitude among n, sign kept (0 for none).
inline float signed_absmax(const float* x, int n) {
  float amax = 0.0f, vmax = 0.0f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      vmax = x[i];
    }
  return vmax;
}

// Scale s and integers L in [lo, hi] (lo < 0 < hi) with x ≈ s·L, n ≤ 32 and a multiple of 8, for the
// least squared error: the value of largest magnitude is put near either end of the range (a few
// stretches each), the scale of each choice fitted by least squares, and the best refined by
// re-rounding until it stops improving.
inline float fit_symmetric(const float* x, int n, int lo, int hi, int* L) {
  const float vmax = signed_absmax(x, n);
  std::fill(L, L + n, 0);
  if (!(std::fabs(vmax) > 1e-30f)) return 0.0f;
  float best = 0.0f, scale = 0.0f; // best: −(Σxl)²/Σl², the squared error less Σx²
  float t[32];
  auto fit = [&](float iscale) {
    levels8(x, n, iscale, 0.0f, static_cast<float>(lo), static_cast<float>(hi), t);
    const float sxl = dot8(x, t, n), sll = dot8(t, t, n);
    if (!(sll > 0.0f)) return false;
    const float err = -sxl * sxl / sll;
    if (!(err < best)) return false;
    best = err;
    scale = sxl / sll;
    for (int i = 0; i < n; ++i)
      L[i] = static_cast<int>(t[i]);
    return true;
  };
  for (int end : {lo, hi})
    for (int k = -9; k <= 9; ++k)
      fit((static_cast<float>(end) + 0.1f * static_cast<float>(k)) / vmax);
  for (int it = 0; it < 4 && scale != 0.0f && fit(1.0f / scale); ++it) {
  }
  return scale;
}

// Scale s, offset m and integers L in [0, nmax] with x ≈ s·L + m, n ≤ 32 and a multiple of 8, for the
// least squared error: candidate steps stretch the range [min, max] by rmin + rdelta·k levels
// (k = 0..nstep), each choice's s and m fitted by least squares, the best refined by re-rounding.
// nonpos_min keeps m ≤ 0 (k-quants store −m as an unsigned amount).
inline float fit_affine(const float* x, int n, int nmax, bool nonpos_min, float rmin, float rdelta, int nstep,
                        int* L, float& m_out) {
  float mn = x[0], mx = x[0], sx = 0.0f;
  for (int i = 0; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
    sx += x[i];
  }
  if (nonpos_min) mn = std::min(mn, 0.0f);
  std::fill(L, L + n, 0);
  m_out = mn;
  if (!(mx > mn)) return 0.0f;
  const auto fn = static_cast<float>(n);
  float best = INFINITY, scale = 0.0f;
  float t[32];
  auto fit = [&](float iscale, float off) {
    levels8(x, n, iscale, off, 0.0f, static_cast<float>(nmax), t);
    float sl = 0.0f;
    for (int i = 0; i < n; ++i)
      sl += t[i]; // exact: small integers
    const float sll = dot8(t, t, n), sxl = dot8(x, t, n);
    const float det = fn * sll - sl * sl;
    if (!(det > 0.0f)) return false;
    float sc = (fn * sxl - sx * sl) / det, m = (sll * sx - sl * sxl) / det;
    if (nonpos_min && m > 0.0f) {
      m = 0.0f;
      sc = sxl / sll;
    }
    // Σ(sc·l + m − x)², less the constant Σx²
    const float err = sc * sc * sll + 2.0f * sc * m * sl + fn * m * m - 2.0f * (sc * sxl + m * sx);
    if (!(err < best)) return false;
    best = err;
    scale = sc;
    m_out = m;
    for (int i = 0; i < n; ++i)
      L[i] = static_cast<int>(t[i]);
    return true;
  };
  for (int k = -1; k <= nstep; ++k) // k = −1: the plain range, nmax levels over [min, max]
    fit((static_cast<float>(nmax) + (k < 0 ? 0.0f : rmin + rdelta * static_cast<float>(k))) / (mx - mn), mn);
  for (int it = 0; it < 4 && scale > 0.0f && fit(1.0f / scale, m_out); ++it) {
  }
  return scale;
}

// IQ4: the midpoints between neighbouring k_iq4nl_values.
inline constexpr float k_iq4_mid[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                                        7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};

// The index of the k_iq4nl_values entry nearest v: the number of midpoints below v.
inline int iq4_index(float v) {
  int i = 0;
  for (float m : k_iq4_mid)
    i += v > m ? 1 : 0;
  return i;
}

// The k_iq4nl_values entry nearest v, without a table lookup (so a loop over values vectorizes).
inline float iq4_nearest(float v) {
  float q = static_cast<float>(k_iq4nl_values[0]);
  for (int k = 0; k < 15; ++k)
    q += v > k_iq4_mid[k] ? static_cast<float>(k_iq4nl_values[k + 1] - k_iq4nl_values[k]) : 0.0f;
  return q;
}

// t[i] = iq4_nearest(s·x[i]) for n (a multiple of 8) values (vectorized as levels8).
[[gnu::noinline]] inline void iq4_nearest8(const float* x, int n, float s, float* t) {
  for (int i = 0; i < n; i += 8)
    for (int k = 0; k < 8; ++k)
      t[i + k] = iq4_nearest(s * x[i + k]);
}

// The scale s with x ≈ s·(the nearest k_iq4nl_values entry to x / s), n ≤ 32 and a multiple of 8, for the
// least squared error (candidates: the largest magnitude near either end of the table, each scale fitted
// by least squares, then re-rounding).
inline float fit_iq4(const float* x, int n) {
  const float vmax = signed_absmax(x, n);
  if (!(std::fabs(vmax) > 1e-30f)) return 0.0f;
  float best = 0.0f, scale = 0.0f;
  float t[32];
  auto fit = [&](float iscale) {
    iq4_nearest8(x, n, iscale, t);
    const float sxv = dot8(x, t, n), svv = dot8(t, t, n); // svv > 0: no table value is 0
    const float err = -sxv * sxv / svv;
    if (!(err < best)) return false;
    best = err;
    scale = sxv / svv;
    return true;
  };
  for (int end : {static_cast<int>(k_iq4nl_values[0]), static_cast<int>(k_iq4nl_values[15])})
    for (int k = -7; k <= 7; ++k)
      fit(static_cast<float>(end + k) / vmax);
  for (int it = 0; it < 4 && scale != 0.0f && fit(1.0f / scale); ++it) {
  }
  return scale;
}

// Re-rounds x to integers in [lo, hi] for the final (stored) scale s and offset m: x ≈ s·L + m.
inline void round_to(const float* x, int n, float s, float m, int lo, int hi, int* L) {
  const float is = s != 0.0f ? 1.0f / s : 0.0f;
  for (int i = 0; i < n; ++i)
    L[i] = s != 0.0f ? level((x[i] - m) * is, lo, hi) : std::min(std::max(0, lo), hi);
}

inline void quant_q8_0(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32, out += 34) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j)
      amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(out, d);
    for (int j = 0; j < 32; ++j)
      out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[j] * id)));
  }
}

inline void quant_q4_0(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32, out += 18) {
    float amax = 0.0f, maxv = 0.0f; // the value with the largest magnitude, sign kept
    for (int j = 0; j < 32; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        maxv = x[j];
      }
    const float d = maxv / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(out, d);
    for (int j = 0; j < 16; ++j) {
      const auto q0 = static_cast<uint8_t>(std::min(15, static_cast<int>(x[j] * id + 8.5f)));
      const auto q1 = static_cast<uint8_t>(std::min(15, static_cast<int>(x[j + 16] * id + 8.5f)));
      out[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Q4_1 (nmax 15) and Q5_1 (nmax 31): f16 d, f16 m, [qh,] qs.
inline void quant_q4_1_q5_1(const float* x, uint8_t* out, int64_t nb, int nmax) {
  const bool five = nmax == 31;
  for (int64_t i = 0; i < nb; ++i, x += 32, out += five ? 24 : 20) {
    int L[32];
    float m;
    const float s = fit_affine(x, 32, nmax, false, -1.0f, 0.1f, 20, L, m);
    store_f16(out, s);
    store_f16(out + 2, m);
    round_to(x, 32, load_f16(out), load_f16(out + 2), 0, nmax, L);
    uint8_t* qs = out + (five ? 8 : 4);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      qs[j] = static_cast<uint8_t>((L[j] & 0xF) | ((L[j + 16] & 0xF) << 4));
      qh |= (static_cast<uint32_t>(L[j] >> 4) << j) | (static_cast<uint32_t>(L[j + 16] >> 4) << (j + 16));
    }
    if (five) std::memcpy(out + 4, &qh, 4);
  }
}

inline void quant_q5_0(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32, out += 22) {
    int L[32];
    store_f16(out, fit_symmetric(x, 32, -16, 15, L));
    round_to(x, 32, load_f16(out), 0.0f, -16, 15, L);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const int a = L[j] + 16, b = L[j + 16] + 16;
      out[6 + j] = static_cast<uint8_t>((a & 0xF) | ((b & 0xF) << 4));
      qh |= (static_cast<uint32_t>(a >> 4) << j) | (static_cast<uint32_t>(b >> 4) << (j + 16));
    }
    std::memcpy(out + 2, &qh, 4);
  }
}

// The unsigned sub-block scales v[0..n) (≥ 0) as integers in [0, qmax] against one f16 super-scale,
// stored at *dst; returns the stored super-scale's value.
inline float quant_scales_unsigned(const float* v, int n, int qmax, uint8_t* dst, int* q) {
  float vmax = 0.0f;
  for (int j = 0; j < n; ++j)
    vmax = std::max(vmax, v[j]);
  store_f16(dst, vmax / static_cast<float>(qmax));
  const float d = load_f16(dst);
  for (int j = 0; j < n; ++j)
    q[j] = d > 0.0f ? level(v[j] / d, 0, qmax) : 0;
  return d;
}

// The signed sub-block scales v[0..n) as integers in [−qmax−1, qmax] against one f16 super-scale (the
// one of largest magnitude lands on −qmax−1, the end with the extra level), stored at *dst.
inline float quant_scales_signed(const float* v, int n, int qmax, uint8_t* dst, int* q) {
  float amax = 0.0f, vmax = 0.0f;
  for (int j = 0; j < n; ++j)
    if (std::fabs(v[j]) > amax) {
      amax = std::fabs(v[j]);
      vmax = v[j];
    }
  store_f16(dst, -vmax / static_cast<float>(qmax + 1));
  const float d = load_f16(dst);
  for (int j = 0; j < n; ++j)
    q[j] = d != 0.0f ? level(v[j] / d, -qmax - 1, qmax) : 0;
  return d;
}

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins.
inline void pack_scale_min_k4(const int* sc, const int* mn, uint8_t* q) {
  std::memset(q, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      q[j] = static_cast<uint8_t>(sc[j]);
      q[j + 4] = static_cast<uint8_t>(mn[j]);
    } else {
      q[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
      q[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      q[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
    }
  }
}

inline void quant_q4_k_q5_k(const float* x, uint8_t* out, int64_t nb, int nmax) {
  const bool five = nmax == 31;
  for (int64_t i = 0; i < nb; ++i, x += 256, out += five ? 176 : 144) {
    int L[256], ls[8], lm[8];
    float sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
      float m;
      sc[j] = five ? fit_affine(x + 32 * j, 32, nmax, true, -0.5f, 0.1f, 15, L + 32 * j, m)
                   : fit_affine(x + 32 * j, 32, nmax, true, -1.0f, 0.1f, 20, L + 32 * j, m);
      mn[j] = -m;
    }
    const float d = quant_scales_unsigned(sc, 8, 63, out, ls);
    const float dmin = quant_scales_unsigned(mn, 8, 63, out + 2, lm);
    pack_scale_min_k4(ls, lm, out + 4);
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m; // the stored values, as the dequantizer reads them
      scale_min_k4(j, out + 4, s, m);
      round_to(x + 32 * j, 32, d * s, -(dmin * m), 0, nmax, L + 32 * j);
    }
    uint8_t* qs = out + (five ? 48 : 16);
    if (five) std::memset(out + 16, 0, 32);
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) {
        const int a = L[64 * j + l], b = L[64 * j + 32 + l];
        qs[32 * j + l] = static_cast<uint8_t>((a & 0xF) | ((b & 0xF) << 4));
        if (five) out[16 + l] |= static_cast<uint8_t>(((a >> 4) << (2 * j)) | ((b >> 4) << (2 * j + 1)));
      }
  }
}

// The 2-bit fields of 256 values (0..3) into qs[64] as Q2_K / Q3_K lay them out.
inline void pack_2bit(const int* L, uint8_t* qs) {
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const int* v = L + 128 * h + l;
      qs[32 * h + l] =
          static_cast<uint8_t>((v[0] & 3) | ((v[32] & 3) << 2) | ((v[64] & 3) << 4) | ((v[96] & 3) << 6));
    }
}

inline void quant_q2_k(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 256, out += 84) {
    int L[256], ls[16], lm[16];
    float sc[16], mn[16];
    for (int j = 0; j < 16; ++j) {
      float m;
      sc[j] = fit_affine(x + 16 * j, 16, 3, true, -0.5f, 0.1f, 15, L + 16 * j, m);
      mn[j] = -m;
    }
    const float d = quant_scales_unsigned(sc, 16, 15, out + 80, ls);
    const float dmin = quant_scales_unsigned(mn, 16, 15, out + 82, lm);
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<uint8_t>(ls[j] | (lm[j] << 4));
      round_to(x + 16 * j, 16, d * static_cast<float>(ls[j]), -(dmin * static_cast<float>(lm[j])), 0, 3,
               L + 16 * j);
    }
    pack_2bit(L, out + 16);
  }
}

inline void quant_q3_k(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 256, out += 110) {
    int L[256], ls[16];
    float sc[16];
    for (int j = 0; j < 16; ++j)
      sc[j] = fit_symmetric(x + 16 * j, 16, -4, 3, L + 16 * j);
    const float d = quant_scales_signed(sc, 16, 31, out + 108, ls);
    uint8_t* s = out + 96;
    std::memset(s, 0, 12);
    for (int j = 0; j < 16; ++j) {
      const int u = ls[j] + 32;
      s[j % 8] |= static_cast<uint8_t>((u & 0xF) << (4 * (j / 8)));
      s[8 + j % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (j / 4)));
      round_to(x + 16 * j, 16, d * static_cast<float>(ls[j]), 0.0f, -4, 3, L + 16 * j);
    }
    std::memset(out, 0, 32); // hmask: the third bit of L + 4
    for (int k = 0; k < 256; ++k) {
      L[k] += 4;
      if (L[k] & 4) out[k % 32] |= static_cast<uint8_t>(1u << (k / 32));
    }
    pack_2bit(L, out + 32);
  }
}

inline void quant_q6_k(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 256, out += 210) {
    int L[256], ls[16];
    float sc[16];
    for (int j = 0; j < 16; ++j)
      sc[j] = fit_symmetric(x + 16 * j, 16, -32, 31, L + 16 * j);
    const float d = quant_scales_signed(sc, 16, 127, out + 208, ls);
    for (int j = 0; j < 16; ++j) {
      out[192 + j] = static_cast<uint8_t>(static_cast<int8_t>(ls[j]));
      round_to(x + 16 * j, 16, d * static_cast<float>(ls[j]), 0.0f, -32, 31, L + 16 * j);
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t* ql = out + 64 * h;
      uint8_t* qh = out + 128 + 32 * h;
      for (int l = 0; l < 32; ++l) {
        const int* v = L + 128 * h + l;
        const int a = v[0] + 32, b = v[32] + 32, c = v[64] + 32, e = v[96] + 32;
        ql[l] = static_cast<uint8_t>((a & 0xF) | ((c & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((b & 0xF) | ((e & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6));
      }
    }
  }
}

// Indices of x / dl into the table, packed as IQ4_NL's 16 bytes.
inline void iq4_pack(const float* x, float dl, uint8_t* qs) {
  int L[32];
  const float id = dl != 0.0f ? 1.0f / dl : 0.0f;
  for (int j = 0; j < 32; ++j)
    L[j] = dl != 0.0f ? iq4_index(x[j] * id) : 8;
  for (int j = 0; j < 16; ++j)
    qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
}

inline void quant_iq4_nl(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32, out += 18) {
    store_f16(out, fit_iq4(x, 32));
    iq4_pack(x, load_f16(out), out + 2);
  }
}

// MXFP4 as ggml's reference quantizer: e = ⌊log2 max|x|⌋ − 2 + 127, each value's nearest level (the first
// of equals).
inline void quant_mxfp4(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 32, out += 17) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j)
      amax = std::max(amax, std::fabs(x[j]));
    const float le = amax > 0.0f ? std::floor(std::log2(amax)) - 2.0f + 127.0f : 0.0f;
    const auto e = static_cast<uint8_t>(std::clamp(le, 0.0f, 255.0f));
    const float d = e8m0_half(e);
    out[0] = e;
    const auto index = [&](float v) {
      int best = 0;
      float err = std::fabs(static_cast<float>(k_mxfp4_values[0]) * d - v);
      for (int k = 1; k < 16; ++k) {
        const float ek = std::fabs(static_cast<float>(k_mxfp4_values[k]) * d - v);
        if (ek < err) {
          best = k;
          err = ek;
        }
      }
      return best;
    };
    for (int j = 0; j < 16; ++j)
      out[1 + j] = static_cast<uint8_t>(index(x[j]) | (index(x[j + 16]) << 4));
  }
}

inline void quant_iq4_xs(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += 256, out += 136) {
    int ls[8];
    float sc[8];
    for (int k = 0; k < 8; ++k)
      sc[k] = fit_iq4(x + 32 * k, 32);
    const float d = quant_scales_signed(sc, 8, 31, out, ls);
    uint16_t sh = 0;
    std::memset(out + 4, 0, 4);
    for (int k = 0; k < 8; ++k) {
      const int u = ls[k] + 32;
      out[4 + k / 2] |= static_cast<uint8_t>((u & 0xF) << (4 * (k % 2)));
      sh = static_cast<uint16_t>(sh | ((u >> 4) << (2 * k)));
      iq4_pack(x + 32 * k, d * static_cast<float>(ls[k]), out + 8 + 16 * k);
    }
    std::memcpy(out + 2, &sh, 2);
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

inline std::string dtype_names(bool quantizable) {
  std::string s;
  for (const auto& e : dtype_detail::k_types)
    if (quantizable ? e.traits.can_quantize : e.traits.can_dequantize)
      s += (s.empty() ? "" : ", ") + std::string(e.traits.name);
  return s;
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
  namespace d = dtype_detail;
  switch (t) {
  case DType::f32:
    std::memcpy(dst, b, static_cast<size_t>(n) * 4);
    return;
  case DType::f16:
    for (int64_t i = 0; i < n; ++i)
      dst[i] = d::load_f16(b + 2 * i);
    return;
  case DType::bf16:
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      dst[i] = bf16_to_fp32(h);
    }
    return;
  case DType::q4_0:
    return d::dequant_q4_0(b, dst, nb);
  case DType::q4_1:
    return d::dequant_q4_1(b, dst, nb);
  case DType::q5_0:
    return d::dequant_q5_0(b, dst, nb);
  case DType::q5_1:
    return d::dequant_q5_1(b, dst, nb);
  case DType::q8_0:
    return d::dequant_q8_0(b, dst, nb);
  case DType::q2_k:
    return d::dequant_q2_k(b, dst, nb);
  case DType::q3_k:
    return d::dequant_q3_k(b, dst, nb);
  case DType::q4_k:
    return d::dequant_q4_k(b, dst, nb);
  case DType::q5_k:
    return d::dequant_q5_k(b, dst, nb);
  case DType::q6_k:
    return d::dequant_q6_k(b, dst, nb);
  case DType::iq4_nl:
    return d::dequant_iq4_nl(b, dst, nb);
  case DType::iq4_xs:
    return d::dequant_iq4_xs(b, dst, nb);
  case DType::mxfp4:
    return d::dequant_mxfp4(b, dst, nb);
  default:
    break;
  }
  fail(Errc::unsupported, "dtype",
       "cannot convert tensor type " + std::string(tr.name) + " to f32; supported: " + dtype_names(false));
}

inline void quantize_row(DType t, const float* x, void* dst, int64_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  const auto tr = dtype_traits(t);
  LOOM_ASSERT(n % tr.block_size == 0, "row length not a multiple of the block size");
  const int64_t nb = n / tr.block_size;
  namespace d = dtype_detail;
  switch (t) {
  case DType::f32:
    std::memcpy(out, x, static_cast<size_t>(n) * 4);
    return;
  case DType::f16:
    for (int64_t i = 0; i < n; ++i)
      d::store_f16(out + 2 * i, x[i]);
    return;
  case DType::bf16:
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = fp32_to_bf16(x[i]);
      std::memcpy(out + 2 * i, &h, 2);
    }
    return;
  case DType::q4_0:
    return d::quant_q4_0(x, out, nb);
  case DType::q4_1:
    return d::quant_q4_1_q5_1(x, out, nb, 15);
  case DType::q5_0:
    return d::quant_q5_0(x, out, nb);
  case DType::q5_1:
    return d::quant_q4_1_q5_1(x, out, nb, 31);
  case DType::q8_0:
    return d::quant_q8_0(x, out, nb);
  case DType::q2_k:
    return d::quant_q2_k(x, out, nb);
  case DType::q3_k:
    return d::quant_q3_k(x, out, nb);
  case DType::q4_k:
    return d::quant_q4_k_q5_k(x, out, nb, 15);
  case DType::q5_k:
    return d::quant_q4_k_q5_k(x, out, nb, 31);
  case DType::q6_k:
    return d::quant_q6_k(x, out, nb);
  case DType::iq4_nl:
    return d::quant_iq4_nl(x, out, nb);
  case DType::iq4_xs:
    return d::quant_iq4_xs(x, out, nb);
  case DType::mxfp4:
    return d::quant_mxfp4(x, out, nb);
  default:
    break;
  }
  fail(Errc::unsupported, "dtype",
       "cannot quantize to " + std::string(tr.name) + "; supported: " + dtype_names(true));
}

// ---- KV rows in a stored type (KVRows' rows, of KVLayout::dtype) ----

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
