// Element types: half/bfloat conversions and block (de)quantization.
#include "loom/dtype.hpp"
#include "loom/error.hpp"

#include <cmath>
#include <cstring>
#include <gtest/gtest.h>
#include <random>

namespace {

using namespace loom;

TEST(DType, Fp16RoundTripsExactValues) {
  for (float v :
       {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 0.333251953125f}) {
    EXPECT_EQ(fp16_to_fp32(fp32_to_fp16(v)), v) << v;
  }
  EXPECT_TRUE(std::isinf(fp16_to_fp32(fp32_to_fp16(1e6f))));
  EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(NAN))));
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(fp32_to_fp16(1.0f + 1.0f / 4096.0f), 0x3C00); // rounds to nearest even
  // Every half value survives half → float → half.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), h) << std::hex << h;
  }
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(-3.0f)), -3.0f);
  EXPECT_NEAR(bf16_to_fp32(fp32_to_bf16(3.14159f)), 3.14159f, 0.01f);
}

std::vector<float> random_row(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x)
    v = d(rng);
  return x;
}

TEST(DType, QuantizeDequantizeWithinBlockTolerance) {
  const int n = 256;
  const auto x = random_row(n, 5);
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q4_0}) {
    std::vector<uint8_t> q(row_bytes(t, n));
    quantize_row(t, x.data(), q.data(), n);
    std::vector<float> y(n);
    dequantize_row(t, q.data(), y.data(), n);
    float max_err = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; ++i) {
      max_err = std::max(max_err, std::fabs(x[static_cast<size_t>(i)] - y[static_cast<size_t>(i)]));
      amax = std::max(amax, std::fabs(x[static_cast<size_t>(i)]));
    }
    const float tol = t == DType::f32    ? 0.0f
                      : t == DType::f16  ? 2e-3f
                      : t == DType::bf16 ? 2e-2f
                      : t == DType::q8_0 ? amax / 127.0f
                                         : amax / 7.0f;
    EXPECT_LE(max_err, tol) << dtype_name(t);
  }
}

TEST(DType, Q4_0KnownBlock) {
  // d = 0.5 (f16 0x3800), nibbles 0..15 → (q - 8) · d.
  uint8_t b[18] = {0x00, 0x38};
  for (int j = 0; j < 16; ++j)
    b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  dequantize_row(DType::q4_0, b, y, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], (j - 8) * 0.5f);
    EXPECT_EQ(y[j + 16], (15 - j - 8) * 0.5f);
  }
}

TEST(DType, Q6_KKnownBlock) {
  // All 6-bit quants = 33 (→ +1), scales = 2, d = 0.25: every value 0.5.
  uint8_t b[210] = {};
  for (int i = 0; i < 128; ++i)
    b[i] = 0x11; // ql: low nibbles 1
  for (int i = 0; i < 64; ++i)
    b[128 + i] = 0xAA; // qh: high bits 2 → 1 | 2<<4 = 33
  for (int i = 0; i < 16; ++i)
    b[192 + i] = 2;
  const uint16_t d = fp32_to_fp16(0.25f);
  std::memcpy(b + 208, &d, 2);
  float y[256];
  dequantize_row(DType::q6_k, b, y, 256);
  for (float v : y)
    EXPECT_EQ(v, 0.5f);
}

TEST(DType, Q4_1AndQ8_0KnownBlocks) {
  uint8_t b[20] = {};
  const uint16_t d = fp32_to_fp16(2.0f), m = fp32_to_fp16(-1.0f);
  std::memcpy(b, &d, 2);
  std::memcpy(b + 2, &m, 2);
  for (int j = 0; j < 16; ++j)
    b[4 + j] = 0x31; // low 1, high 3
  float y[32];
  dequantize_row(DType::q4_1, b, y, 32);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[16], 5.0f);
  uint8_t c[34] = {};
  std::memcpy(c, &d, 2);
  c[2] = static_cast<uint8_t>(-3);
  dequantize_row(DType::q8_0, c, y, 32);
  EXPECT_EQ(y[0], -6.0f);
  EXPECT_EQ(y[1], 0.0f);
}

TEST(DType, UnsupportedConversionIsAnError) {
  uint8_t b[292] = {};
  float y[256];
  EXPECT_THROW(dequantize_row(DType::q8_k, b, y, 256), Error);
  EXPECT_THROW(quantize_row(DType::q6_k, y, b, 256), Error);
  EXPECT_EQ(dtype_from_name("Q4_0"), DType::q4_0);
  EXPECT_EQ(dtype_from_name("nope"), std::nullopt);
}

} // namespace
