// Element types: half/bfloat conversions and block (de)quantization.
#include "loom/error.hpp"
#include "loom/sdk/dtype.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <gtest/gtest.h>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

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
  EXPECT_THROW(quantize_row(DType::q8_k, y, b, 256), Error);
  try {
    quantize_row(DType::q8_1, y, b, 32);
    FAIL() << "q8_1 quantized";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("supported: f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, "
                                   "q5_k, q6_k, iq4_nl, iq4_xs, bf16"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(dtype_from_name("Q4_0"), DType::q4_0);
  EXPECT_EQ(dtype_from_name("IQ4_XS"), DType::iq4_xs);
  EXPECT_EQ(dtype_from_name("iq4_nl"), DType::iq4_nl);
  EXPECT_EQ(dtype_from_name("nope"), std::nullopt);
}

// Every table entry: its name maps back to its id; what Loom reads it also writes, and the reverse.
TEST(DType, TableIsConsistent) {
  int n = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    const auto tr = dtype_traits(id);
    if (!tr) continue;
    ++n;
    const auto t = static_cast<DType>(id);
    EXPECT_EQ(dtype_from_name(tr->name), t) << tr->name;
    EXPECT_EQ(dtype_name(t), tr->name);
    EXPECT_EQ(tr->can_dequantize, tr->can_quantize) << tr->name;
    EXPECT_EQ(row_bytes(t, 256 * tr->block_size), 256 * tr->block_bytes);
  }
  EXPECT_EQ(n, 23);
  EXPECT_EQ(dtype_traits(DType::iq4_nl).block_size, 32);
  EXPECT_EQ(dtype_traits(DType::iq4_nl).block_bytes, 18u);
  EXPECT_EQ(dtype_traits(DType::iq4_xs).block_size, 256);
  EXPECT_EQ(dtype_traits(DType::iq4_xs).block_bytes, 136u);
  EXPECT_EQ(dtype_names(true), dtype_names(false));
}

// The round trip of N(0,1) data: relative RMS error (of the data's RMS) below a per-type bound, at
// three scales (weights are ~0.02: their k-quant super-scales are f16 subnormals). Measured (seed 5, 16
// super-blocks): q8_0 0.0053, q6_k 0.017, q5_0 0.040, q5_1 0.033, q5_k 0.036, q4_0 0.085, q4_1 0.069,
// q4_k 0.071, iq4_nl 0.073, iq4_xs 0.074, q3_k 0.143, q2_k 0.266.
const std::map<DType, double>& rms_bounds() {
  static const std::map<DType, double> b = {
      {DType::f32, 0.0},    {DType::f16, 1e-3},  {DType::bf16, 5e-3}, {DType::q8_0, 0.01},
      {DType::q6_k, 0.025}, {DType::q5_0, 0.05}, {DType::q5_1, 0.05}, {DType::q5_k, 0.05},
      {DType::q4_0, 0.1},   {DType::q4_1, 0.1},  {DType::q4_k, 0.1},  {DType::iq4_nl, 0.1},
      {DType::iq4_xs, 0.1}, {DType::q3_k, 0.18}, {DType::q2_k, 0.33}, {DType::mxfp4, 0.15},
  };
  return b;
}

double relative_rms_error(DType t, const std::vector<float>& x, std::vector<float>* out = nullptr) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(row_bytes(t, n));
  quantize_row(t, x.data(), q.data(), n);
  std::vector<float> y(x.size());
  dequantize_row(t, q.data(), y.data(), n);
  double se = 0, sx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = static_cast<double>(y[i]) - static_cast<double>(x[i]);
    se += e * e;
    sx += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  }
  if (out) *out = y;
  return sx > 0 ? std::sqrt(se / sx) : std::sqrt(se);
}

TEST(DType, RoundTripRmsErrorWithinPerTypeBound) {
  const auto x = random_row(256 * 16, 5);
  for (const auto& [t, bound] : rms_bounds()) {
    ASSERT_TRUE(dtype_traits(t).can_quantize) << dtype_name(t);
    for (float scale : {1.0f, 0.02f, 30.0f}) {
      std::vector<float> xs(x);
      for (auto& v : xs)
        v *= scale;
      const double e = relative_rms_error(t, xs);
      // f16 at 0.02: values down to ~1e-6 lose bits as subnormals
      const double b = t == DType::f16 && scale < 1.0f ? 2e-3 : bound * (scale < 1.0f ? 1.1 : 1.0);
      EXPECT_LE(e, b) << dtype_name(t) << " at scale " << scale;
      if (scale == 1.0f) std::printf("[ rms     ] %-7s %.4f\n", std::string(dtype_name(t)).c_str(), e);
    }
  }
  EXPECT_EQ(rms_bounds().size(), 16u); // every type quantize_row writes
}

// Blocks that are all zero, constant, or hold one outlier: finite, zeros exact, the outlier kept well.
TEST(DType, QuantizeEdgeCases) {
  for (const auto& [t, bound] : rms_bounds()) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int n = 512;
    std::vector<float> y;
    EXPECT_EQ(relative_rms_error(t, std::vector<float>(n, 0.0f), &y), 0.0);
    for (float v : y)
      EXPECT_EQ(v, 0.0f);
    EXPECT_LE(relative_rms_error(t, std::vector<float>(n, -0.75f), &y), std::max(bound, 1e-3));
    auto x = random_row(n, 9);
    x[100] = 40.0f; // one outlier in its block: it sets that block's range
    relative_rms_error(t, x, &y);
    for (float v : y)
      ASSERT_TRUE(std::isfinite(v));
    // (MXFP4: 40 lies halfway between its block's levels 32 and 48 — FP4's 8 and 12 times 4 — and rounds to
    // the first, as ggml's quantizer does)
    EXPECT_NEAR(y[100], 40.0, 40.0 * (t == DType::mxfp4 ? 0.2 : std::max(bound, 1e-3))) << "the outlier";
  }
}

// ---- bit-exact agreement with an independent implementation: gguf-py's numpy dequantizers ----
// tests/data/dtypes/vectors.json is written by make_vectors.py (see there).

std::vector<uint8_t> from_hex(const std::string& h) {
  std::vector<uint8_t> b(h.size() / 2);
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return b;
}

std::vector<float> floats_from_hex(const std::string& h) {
  const auto b = from_hex(h);
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}

nlohmann::json load_vectors() {
  const std::string path = std::string(LOOM_SOURCE_DIR) + "/tests/data/dtypes/vectors.json";
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(f);
}

// The floats must be the same bits (gguf-py does each product in float32 in ggml's order: d·scale first,
// then ·q, then − dmin·min, so no tolerance is needed).
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0 && ++bad <= 5)
      ADD_FAILURE() << what << " [" << i << "]: loom " << got[i] << ", gguf-py " << want[i];
  EXPECT_EQ(bad, 0) << what;
}

TEST(DType, DequantizeMatchesGgufPyBitForBit) {
  const auto doc = load_vectors();
  std::set<std::string> seen;
  for (const auto& v : doc.at("dequantize")) {
    const std::string name = v.at("type");
    const auto t = dtype_from_name(name);
    ASSERT_TRUE(t) << name;
    const auto bytes = from_hex(v.at("bytes"));
    const auto want = floats_from_hex(v.at("values"));
    const int64_t n = v.at("n");
    ASSERT_EQ(static_cast<int64_t>(want.size()), n) << name;
    ASSERT_EQ(row_bytes(*t, n), bytes.size()) << name << ": block size or bytes differ from gguf-py's";
    std::vector<float> got(want.size());
    dequantize_row(*t, bytes.data(), got.data(), n);
    expect_same_bits(got, want, name);
    seen.insert(name);
  }
  for (uint32_t id = 0; id < 64; ++id)
    if (const auto tr = dtype_traits(id); tr && tr->can_dequantize) {
      EXPECT_TRUE(seen.count(std::string(tr->name))) << tr->name << " has no gguf-py vectors";
    }
}

// quantize_row's blocks are the ones `loom quantize` wrote when the vectors were made (so gguf-py's
// reading of them is on record), and Loom reads them as gguf-py does. A quantizer change fails here:
// then run make_vectors.py again (and check its printed RMS errors). The bytes are those of a build that
// does not fuse a·b + c into FMAs (x86-64 without -march; -ffp-contract=off elsewhere): a fused build
// may pick a different, equally good block for a few types.
TEST(DType, QuantizedBlocksReadTheSameInGgufPy) {
  const auto doc = load_vectors();
  const auto& q = doc.at("quantize");
  const auto x = floats_from_hex(q.at("input"));
  const auto n = static_cast<int64_t>(x.size());
  std::set<std::string> seen;
  for (const auto& v : q.at("types")) {
    const std::string name = v.at("type");
    const auto t = dtype_from_name(name);
    ASSERT_TRUE(t) << name;
    const auto recorded = from_hex(v.at("bytes"));
    std::vector<uint8_t> bytes(row_bytes(*t, n));
    quantize_row(*t, x.data(), bytes.data(), n);
    EXPECT_EQ(bytes, recorded) << name << ": quantize_row's blocks differ from the recorded ones";
    std::vector<float> got(x.size());
    dequantize_row(*t, recorded.data(), got.data(), n);
    expect_same_bits(got, floats_from_hex(v.at("values")), name + " (loom's blocks)");
    seen.insert(name);
  }
  for (uint32_t id = 0; id < 64; ++id)
    if (const auto tr = dtype_traits(id); tr && tr->can_quantize && tr->name != "f32") {
      EXPECT_TRUE(seen.count(std::string(tr->name))) << tr->name << " has no quantize vectors";
    }
}

} // namespace
