// The weight and KV formats as the cuda backend's kernels read and write them, written once for the
// device and the host (LOOM_HD): the host compiles the same functions in tests/backends/
// test_cuda_formats.cpp and checks them against the SDK's dequantize_row / quantize_row, so the formats'
// arithmetic is tested on machines without a GPU. Every type is read 32 values at a time (a sub-block:
// one block of the 32-value types, an eighth of a K-quant's 256).
#pragma once

#include <cstdint>
#include <math.h>
#include <string.h>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define LOOM_HD __host__ __device__ __forceinline__
#else
#include "loom/sdk/dtype.hpp"
#define LOOM_HD inline
#endif

namespace loom::cuda {

// The SDK's DType ids (the ABI's LOOM_DTYPE_*).
enum QType : uint32_t {
  qt_f32 = 0,
  qt_f16 = 1,
  qt_q4_0 = 2,
  qt_q4_1 = 3,
  qt_q5_0 = 6,
  qt_q5_1 = 7,
  qt_q8_0 = 8,
  qt_q2_k = 10,
  qt_q3_k = 11,
  qt_q4_k = 12,
  qt_q5_k = 13,
  qt_q6_k = 14,
  qt_iq4_nl = 20,
  qt_iq4_xs = 23,
  qt_bf16 = 30,
  qt_mxfp4 = 39,
};

// Whether the kernels read this type (what loom::dequantize_row reads).
LOOM_HD bool readable(uint32_t t) {
  switch (t) {
  case qt_f32:
  case qt_f16:
  case qt_bf16:
  case qt_q4_0:
  case qt_q4_1:
  case qt_q5_0:
  case qt_q5_1:
  case qt_q8_0:
  case qt_q2_k:
  case qt_q3_k:
  case qt_q4_k:
  case qt_q5_k:
  case qt_q6_k:
  case qt_iq4_nl:
  case qt_iq4_xs:
  case qt_mxfp4:
    return true;
  default:
    return false;
  }
}

// Bytes of the block holding 32·k values (0 for plain types: 4 or 2 bytes per value) and values per block.
LOOM_HD int block_values(uint32_t t) {
  switch (t) {
  case qt_q2_k:
  case qt_q3_k:
  case qt_q4_k:
  case qt_q5_k:
  case qt_q6_k:
  case qt_iq4_xs:
    return 256;
  case qt_f32:
  case qt_f16:
  case qt_bf16:
    return 1;
  default:
    return 32;
  }
}
LOOM_HD int block_bytes(uint32_t t) {
  switch (t) {
  case qt_f32:
    return 4;
  case qt_f16:
  case qt_bf16:
    return 2;
  case qt_q4_0:
  case qt_iq4_nl:
    return 18;
  case qt_q4_1:
    return 20;
  case qt_q5_0:
    return 22;
  case qt_q5_1:
    return 24;
  case qt_q8_0:
    return 34;
  case qt_q2_k:
    return 84;
  case qt_q3_k:
    return 110;
  case qt_q4_k:
    return 144;
  case qt_q5_k:
    return 176;
  case qt_q6_k:
    return 210;
  case qt_iq4_xs:
    return 136;
  case qt_mxfp4:
    return 17;
  default:
    return 0;
  }
}
// Bytes of a row of n values (n a multiple of the block size).
LOOM_HD int64_t row_bytes(uint32_t t, int64_t n) {
  return n / block_values(t) * block_bytes(t);
}

LOOM_HD float half_to_float(uint16_t h) {
#ifdef __CUDACC__
  return __half2float(__ushort_as_half(h));
#else
  return loom::fp16_to_fp32(h);
#endif
}
LOOM_HD uint16_t float_to_half(float f) { // round to nearest even (as fp32_to_fp16)
#ifdef __CUDACC__
  return __half_as_ushort(__float2half_rn(f));
#else
  return loom::fp32_to_fp16(f);
#endif
}
LOOM_HD float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
LOOM_HD uint16_t float_to_bf16(float f) { // round to nearest even, NaN kept quiet (as fp32_to_bf16)
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 64u);
  return static_cast<uint16_t>((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
}

LOOM_HD uint16_t load_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
LOOM_HD uint32_t load_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
// Two bytes, little-endian, at p (2-byte aligned: f16 KV values, q8_0 scales). On the device one 16-bit
// store: ptxas 13.0 compiles the byte stores of a value fresh from __float2half_rn as a float-to-integer
// conversion of the half (F2I.U8.F16: the low byte came out as the half's integer part), seen on an H200.
LOOM_HD void store_u16(uint8_t* p, uint16_t v) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<uint16_t*>(p) = v;
#else
  p[0] = static_cast<uint8_t>(v & 0xFF);
  p[1] = static_cast<uint8_t>(v >> 8);
#endif
}
LOOM_HD float load_half(const uint8_t* p) {
  return half_to_float(load_u16(p));
}

LOOM_HD int8_t iq4nl_value(int i) {
  constexpr int8_t v[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  return v[i];
}

// MXFP4: twice FP4 E2M1's values (dtype.hpp's k_mxfp4_values), and the block's scale 2^(e − 128).
LOOM_HD int8_t mxfp4_value(int i) {
  constexpr int8_t v[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  return v[i];
}
LOOM_HD float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// Q4_K / Q5_K: scale and min j (of 8) from their 12 packed bytes.
LOOM_HD void scale_min_k4(int j, const uint8_t* q, int& d, int& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}
LOOM_HD int q3_k_scale(const uint8_t* s, int k) {
  const int lo = (s[k % 8] >> (4 * (k / 8))) & 0xF;
  const int hi = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// Values [32·sb, 32·sb + 32) of a row stored as t into y (t quantized: a multiple of 32 values).
// One function: a switch over the storage types (a dispatch table in all but name), inlined into each kernel.
LOOM_HD void dequant32(uint32_t t, const uint8_t* row, int64_t sb, float* y) {
  switch (t) {
  case qt_f32:
    for (int j = 0; j < 32; ++j)
      memcpy(&y[j], row + 4 * (32 * sb + j), 4);
    return;
  case qt_f16:
    for (int j = 0; j < 32; ++j)
      y[j] = load_half(row + 2 * (32 * sb + j));
    return;
  case qt_bf16:
    for (int j = 0; j < 32; ++j)
      y[j] = bf16_to_float(load_u16(row + 2 * (32 * sb + j)));
    return;
  case qt_q4_0: {
    const uint8_t* b = row + 18 * sb;
    const float d = load_half(b);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((b[2 + j] & 0x0F) - 8) * d;
      y[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
    }
    return;
  }
  case qt_q4_1: {
    const uint8_t* b = row + 20 * sb;
    const float d = load_half(b), m = load_half(b + 2);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(b[4 + j] & 0x0F) * d + m;
      y[j + 16] = static_cast<float>(b[4 + j] >> 4) * d + m;
    }
    return;
  }
  case qt_q5_0:
  case qt_q5_1: {
    const bool one = t == qt_q5_1;
    const uint8_t* b = row + (one ? 24 : 22) * sb;
    const float d = load_half(b), m = one ? load_half(b + 2) : 0.0f;
    const uint32_t qh = load_u32(b + (one ? 4 : 2));
    const uint8_t* qs = b + (one ? 8 : 6);
    for (int j = 0; j < 16; ++j) {
      const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10);
      const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      if (one) {
        y[j] = static_cast<float>((qs[j] & 0x0F) | xh0) * d + m;
        y[j + 16] = static_cast<float>((qs[j] >> 4) | xh1) * d + m;
      } else {
        y[j] = static_cast<float>(((qs[j] & 0x0F) | xh0) - 16) * d;
        y[j + 16] = static_cast<float>(((qs[j] >> 4) | xh1) - 16) * d;
      }
    }
    return;
  }
  case qt_q8_0: {
    const uint8_t* b = row + 34 * sb;
    const float d = load_half(b);
    for (int j = 0; j < 32; ++j)
      y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
    return;
  }
  case qt_iq4_nl: {
    const uint8_t* b = row + 18 * sb;
    const float d = load_half(b);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(iq4nl_value(b[2 + j] & 0xF));
      y[j + 16] = d * static_cast<float>(iq4nl_value(b[2 + j] >> 4));
    }
    return;
  }
  case qt_mxfp4: {
    const uint8_t* b = row + 17 * sb;
    const float d = e8m0_half(b[0]);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(mxfp4_value(b[1 + j] & 0xF)) * d;
      y[j + 16] = static_cast<float>(mxfp4_value(b[1 + j] >> 4)) * d;
    }
    return;
  }
  default:
    break;
  }
  // K-quants and IQ4_XS: sub-block g (of 8) of block sb / 8.
  const int g = static_cast<int>(sb % 8);
  const int64_t blk = sb / 8;
  switch (t) {
  case qt_q2_k: { // value 128h + 32j + 16s + l: g = 4h + j
    const uint8_t* b = row + 84 * blk;
    const float d = load_half(b + 80), dmin = load_half(b + 82);
    const int h = g / 4, j = g % 4;
    for (int s = 0; s < 2; ++s) {
      const int sc = b[8 * h + 2 * j + s];
      const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
      const uint8_t* q = b + 16 + 32 * h + 16 * s;
      for (int l = 0; l < 16; ++l)
        y[16 * s + l] = dl * static_cast<float>((q[l] >> (2 * j)) & 3) - ml;
    }
    return;
  }
  case qt_q3_k: {
    const uint8_t* b = row + 110 * blk;
    const float d = load_half(b + 108);
    const int h = g / 4, j = g % 4, bit = 4 * h + j;
    for (int s = 0; s < 2; ++s) {
      const float dl = d * static_cast<float>(q3_k_scale(b + 96, 8 * h + 2 * j + s));
      const uint8_t* q = b + 32 + 32 * h + 16 * s;
      const uint8_t* m = b + 16 * s;
      for (int l = 0; l < 16; ++l) {
        const int v = ((q[l] >> (2 * j)) & 3) - (((m[l] >> bit) & 1) ? 0 : 4);
        y[16 * s + l] = dl * static_cast<float>(v);
      }
    }
    return;
  }
  case qt_q4_k: {
    const uint8_t* b = row + 144 * blk;
    const float d = load_half(b), dmin = load_half(b + 2);
    int sc = 0, mn = 0;
    scale_min_k4(g, b + 4, sc, mn);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
    const uint8_t* q = b + 16 + 32 * (g / 2);
    for (int l = 0; l < 32; ++l)
      y[l] = dl * static_cast<float>(g % 2 == 0 ? (q[l] & 0xF) : (q[l] >> 4)) - ml;
    return;
  }
  case qt_q5_k: {
    const uint8_t* b = row + 176 * blk;
    const float d = load_half(b), dmin = load_half(b + 2);
    int sc = 0, mn = 0;
    scale_min_k4(g, b + 4, sc, mn);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
    const uint8_t* qh = b + 16;
    const uint8_t* ql = b + 48 + 32 * (g / 2);
    for (int l = 0; l < 32; ++l) {
      const int lo = g % 2 == 0 ? (ql[l] & 0xF) : (ql[l] >> 4);
      y[l] = dl * static_cast<float>(lo | (((qh[l] >> g) & 1) << 4)) - ml;
    }
    return;
  }
  case qt_q6_k: { // half n = g / 4 (128 values), quarter q = g % 4
    const uint8_t* b = row + 210 * blk;
    const float d = load_half(b + 208);
    const int n = g / 4, q = g % 4;
    const uint8_t* ql = b + 64 * n + (q % 2) * 32;
    const uint8_t* qh = b + 128 + 32 * n;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * n);
    for (int l = 0; l < 32; ++l) {
      const int lo = q < 2 ? (ql[l] & 0xF) : (ql[l] >> 4);
      const int v = (lo | (((qh[l] >> (2 * q)) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[l / 16 + 2 * q]) * static_cast<float>(v);
    }
    return;
  }
  case qt_iq4_xs: {
    const uint8_t* b = row + 136 * blk;
    const float d = load_half(b);
    const uint16_t sh = load_u16(b + 2);
    const int ls = ((b[4 + g / 2] >> (4 * (g % 2))) & 0xF) | (((sh >> (2 * g)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    const uint8_t* qs = b + 8 + 16 * g;
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(iq4nl_value(qs[j] & 0xF));
      y[j + 16] = dl * static_cast<float>(iq4nl_value(qs[j] >> 4));
    }
    return;
  }
  default:
    for (int j = 0; j < 32; ++j)
      y[j] = 0.0f;
  }
}

// One value of a row stored as t (any readable type).
LOOM_HD float value_at(uint32_t t, const uint8_t* row, int64_t i) {
  switch (t) {
  case qt_f32: {
    float f;
    memcpy(&f, row + 4 * i, 4);
    return f;
  }
  case qt_f16:
    return load_half(row + 2 * i);
  case qt_bf16:
    return bf16_to_float(load_u16(row + 2 * i));
  case qt_q8_0: {
    const uint8_t* b = row + 34 * (i / 32);
    return static_cast<float>(static_cast<int8_t>(b[2 + i % 32])) * load_half(b);
  }
  default: {
    float y[32];
    dequant32(t, row, i / 32, y);
    return y[i % 32];
  }
  }
}

// A KV row's 32 values [32·sb, 32·sb + 32) stored as q8_0 (as loom::quantize_row: amax / 127 scale in f16,
// values rounded half away from zero).
LOOM_HD void quant32_q8_0(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j)
    amax = fmaxf(amax, fabsf(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_u16(out, float_to_half(d));
  for (int j = 0; j < 32; ++j)
    out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(lroundf(x[j] * id)));
}

} // namespace loom::cuda

namespace loom::cuda {

// ---- integer products: a weight sub-block as int8 values and per-16 affine steps ----

// Values [32·sb, 32·sb + 32) of a quantized row as y[l] = a[l / 16] · w[l] − b[l / 16] with integer w[l] in
// int8 (exactly dequant32's values: the same float steps), so that a dot product with activations quantized
// to int8 (x[l] ≈ dx · q[l]) is a[h] · dx · Σ w·q − b[h] · dx · Σ q per half h — integer sums (dp4a).
// False for the plain types (f32, f16, bf16), which have no such form.
// One function: a switch over the storage types (a dispatch table in all but name), inlined into each kernel.
LOOM_HD bool unpack32(uint32_t t, const uint8_t* row, int64_t sb, int8_t* w, float* a, float* b) {
  a[0] = a[1] = 0.0f;
  b[0] = b[1] = 0.0f;
  switch (t) {
  case qt_q4_0: {
    const uint8_t* p = row + 18 * sb;
    a[0] = a[1] = load_half(p);
    for (int j = 0; j < 16; ++j) {
      w[j] = static_cast<int8_t>((p[2 + j] & 0x0F) - 8);
      w[j + 16] = static_cast<int8_t>((p[2 + j] >> 4) - 8);
    }
    return true;
  }
  case qt_q4_1: {
    const uint8_t* p = row + 20 * sb;
    a[0] = a[1] = load_half(p);
    b[0] = b[1] = -load_half(p + 2);
    for (int j = 0; j < 16; ++j) {
      w[j] = static_cast<int8_t>(p[4 + j] & 0x0F);
      w[j + 16] = static_cast<int8_t>(p[4 + j] >> 4);
    }
    return true;
  }
  case qt_q5_0:
  case qt_q5_1: {
    const bool one = t == qt_q5_1;
    const uint8_t* p = row + (one ? 24 : 22) * sb;
    a[0] = a[1] = load_half(p);
    if (one) b[0] = b[1] = -load_half(p + 2);
    const uint32_t qh = load_u32(p + (one ? 4 : 2));
    const uint8_t* qs = p + (one ? 8 : 6);
    const int off = one ? 0 : 16;
    for (int j = 0; j < 16; ++j) {
      const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10);
      const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      w[j] = static_cast<int8_t>(((qs[j] & 0x0F) | xh0) - off);
      w[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | xh1) - off);
    }
    return true;
  }
  case qt_q8_0: {
    const uint8_t* p = row + 34 * sb;
    a[0] = a[1] = load_half(p);
    for (int j = 0; j < 32; ++j)
      w[j] = static_cast<int8_t>(p[2 + j]);
    return true;
  }
  case qt_iq4_nl: {
    const uint8_t* p = row + 18 * sb;
    a[0] = a[1] = load_half(p);
    for (int j = 0; j < 16; ++j) {
      w[j] = iq4nl_value(p[2 + j] & 0xF);
      w[j + 16] = iq4nl_value(p[2 + j] >> 4);
    }
    return true;
  }
  case qt_mxfp4: {
    const uint8_t* p = row + 17 * sb;
    a[0] = a[1] = e8m0_half(p[0]);
    for (int j = 0; j < 16; ++j) {
      w[j] = mxfp4_value(p[1 + j] & 0xF);
      w[j + 16] = mxfp4_value(p[1 + j] >> 4);
    }
    return true;
  }
  default:
    break;
  }
  const int g = static_cast<int>(sb % 8);
  const int64_t blk = sb / 8;
  switch (t) {
  case qt_q2_k: {
    const uint8_t* p = row + 84 * blk;
    const float d = load_half(p + 80), dmin = load_half(p + 82);
    const int h = g / 4, j = g % 4;
    for (int s = 0; s < 2; ++s) {
      const int sc = p[8 * h + 2 * j + s];
      a[s] = d * static_cast<float>(sc & 0xF);
      b[s] = dmin * static_cast<float>(sc >> 4);
      const uint8_t* q = p + 16 + 32 * h + 16 * s;
      for (int l = 0; l < 16; ++l)
        w[16 * s + l] = static_cast<int8_t>((q[l] >> (2 * j)) & 3);
    }
    return true;
  }
  case qt_q3_k: {
    const uint8_t* p = row + 110 * blk;
    const float d = load_half(p + 108);
    const int h = g / 4, j = g % 4, bit = 4 * h + j;
    for (int s = 0; s < 2; ++s) {
      a[s] = d * static_cast<float>(q3_k_scale(p + 96, 8 * h + 2 * j + s));
      const uint8_t* q = p + 32 + 32 * h + 16 * s;
      const uint8_t* m = p + 16 * s;
      for (int l = 0; l < 16; ++l)
        w[16 * s + l] = static_cast<int8_t>(((q[l] >> (2 * j)) & 3) - (((m[l] >> bit) & 1) ? 0 : 4));
    }
    return true;
  }
  case qt_q4_k:
  case qt_q5_k: {
    const bool five = t == qt_q5_k;
    const uint8_t* p = row + (five ? 176 : 144) * blk;
    const float d = load_half(p), dmin = load_half(p + 2);
    int sc = 0, mn = 0;
    scale_min_k4(g, p + 4, sc, mn);
    a[0] = a[1] = d * static_cast<float>(sc);
    b[0] = b[1] = dmin * static_cast<float>(mn);
    const uint8_t* ql = p + (five ? 48 : 16) + 32 * (g / 2);
    for (int l = 0; l < 32; ++l) {
      int v = g % 2 == 0 ? (ql[l] & 0xF) : (ql[l] >> 4);
      if (five) v |= ((p[16 + l] >> g) & 1) << 4;
      w[l] = static_cast<int8_t>(v);
    }
    return true;
  }
  case qt_q6_k: {
    const uint8_t* p = row + 210 * blk;
    const float d = load_half(p + 208);
    const int n = g / 4, q = g % 4;
    const uint8_t* ql = p + 64 * n + (q % 2) * 32;
    const uint8_t* qh = p + 128 + 32 * n;
    const auto* sc = reinterpret_cast<const int8_t*>(p + 192 + 8 * n);
    a[0] = d * static_cast<float>(sc[2 * q]);
    a[1] = d * static_cast<float>(sc[1 + 2 * q]);
    for (int l = 0; l < 32; ++l) {
      const int lo = q < 2 ? (ql[l] & 0xF) : (ql[l] >> 4);
      w[l] = static_cast<int8_t>((lo | (((qh[l] >> (2 * q)) & 3) << 4)) - 32);
    }
    return true;
  }
  case qt_iq4_xs: {
    const uint8_t* p = row + 136 * blk;
    const float d = load_half(p);
    const uint16_t sh = load_u16(p + 2);
    const int ls = ((p[4 + g / 2] >> (4 * (g % 2))) & 0xF) | (((sh >> (2 * g)) & 3) << 4);
    a[0] = a[1] = d * static_cast<float>(ls - 32);
    const uint8_t* qs = p + 8 + 16 * g;
    for (int j = 0; j < 16; ++j) {
      w[j] = iq4nl_value(qs[j] & 0xF);
      w[j + 16] = iq4nl_value(qs[j] >> 4);
    }
    return true;
  }
  default:
    return false;
  }
}

// 32 activations as int8 with one scale (amax / 127, round half away from zero): x[l] ≈ d · q[l]; s[h] = the
// sum of the q of half h (the offsets' terms).
struct Q8Block {
  float d = 0.0f;
  int32_t s[2] = {0, 0};
  int8_t q[32] = {};
};
LOOM_HD void quantize_q8(const float* x, Q8Block& o) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j)
    amax = fmaxf(amax, fabsf(x[j]));
  o.d = amax / 127.0f;
  const float id = o.d != 0.0f ? 1.0f / o.d : 0.0f;
  o.s[0] = o.s[1] = 0;
  for (int j = 0; j < 32; ++j) {
    o.q[j] = static_cast<int8_t>(lroundf(x[j] * id));
    o.s[j / 16] += o.q[j];
  }
}

// Σ_l w[l] · q[l] over [16·h, 16·h + 16): four bytes at a time (dp4a on the device).
LOOM_HD int32_t dot16(const int8_t* w, const int8_t* q) {
  int32_t s = 0;
#ifdef __CUDA_ARCH__
  for (int k = 0; k < 16; k += 4) {
    int wa, qa;
    memcpy(&wa, w + k, 4);
    memcpy(&qa, q + k, 4);
    s = __dp4a(wa, qa, s);
  }
#else
  for (int k = 0; k < 16; ++k)
    s += static_cast<int32_t>(w[k]) * static_cast<int32_t>(q[k]);
#endif
  return s;
}

// The sub-block's contribution to a dot product with quantized activations x (unpack32's form).
LOOM_HD float dot32(const int8_t* w, const float* a, const float* b, const Q8Block& x) {
  float r = 0.0f;
  for (int h = 0; h < 2; ++h)
    r += x.d *
         (a[h] * static_cast<float>(dot16(w + 16 * h, x.q + 16 * h)) - b[h] * static_cast<float>(x.s[h]));
  return r;
}

} // namespace loom::cuda
