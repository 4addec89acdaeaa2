// The cuda backend's weight and KV formats (backends/cuda/quant_device.hpp) compiled for the host: every
// type the kernels read, 32 values at a time and one at a time, equals the SDK's dequantize_row, and the
// q8_0 KV rows the kernels write equal quantize_row's bytes. These run on every machine; the kernels that
// use them are checked on a GPU (scripts/gpu-check.sh).
#include "../../backends/cuda/quant_device.hpp"
#include "loom/sdk/dtype.hpp"

#include <cstring>
#include <gtest/gtest.h>
#include <random>
#include <vector>

namespace {

using namespace loom;

TEST(CudaFormats, EveryReadableTypeDequantizesLikeTheSdk) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 512; // two K-quant blocks
  std::vector<float> x(n), want(n), got(n);
  int checked = 0;
  for (const auto& [id, tr] : dtype_detail::k_types) {
    const auto t = static_cast<DType>(id);
    if (!tr.can_dequantize) continue;
    SCOPED_TRACE(std::string(dtype_name(t)));
    ASSERT_TRUE(cuda::readable(id));
    EXPECT_EQ(cuda::row_bytes(id, n), static_cast<int64_t>(row_bytes(t, n)));
    for (int rep = 0; rep < 4; ++rep) {
      for (auto& v : x)
        v = nd(rng) * (rep + 1.0f);
      std::vector<uint8_t> row(row_bytes(t, n));
      quantize_row(t, x.data(), row.data(), n);
      dequantize_row(t, row.data(), want.data(), n);
      for (int64_t sb = 0; sb < n / 32; ++sb)
        cuda::dequant32(id, row.data(), sb, got.data() + 32 * sb);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)]) << "value " << i;
        ASSERT_EQ(cuda::value_at(id, row.data(), i), want[static_cast<size_t>(i)]) << "value " << i;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 16) << "f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k..q6_k iq4_nl iq4_xs mxfp4";
}

TEST(CudaFormats, Q8_0KvRowsAreQuantizeRowsBytes) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int rep = 0; rep < 200; ++rep) {
    float x[32];
    for (float& v : x)
      v = nd(rng);
    if (rep == 0) std::fill(x, x + 32, 0.0f); // a zero block: scale 0
    uint8_t want[34], got[34];
    quantize_row(DType::q8_0, x, want, 32);
    cuda::quant32_q8_0(x, got);
    ASSERT_EQ(std::memcmp(want, got, 34), 0) << "block " << rep;
  }
}

TEST(CudaFormats, HalfAndBf16ConversionsMatchTheSdk) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f, 3.14159f, 1e30f, -1e-30f}) {
    EXPECT_EQ(cuda::float_to_half(f), fp32_to_fp16(f)) << f;
    EXPECT_EQ(cuda::float_to_bf16(f), fp32_to_bf16(f)) << f;
    EXPECT_EQ(cuda::bf16_to_float(cuda::float_to_bf16(f)), bf16_to_fp32(fp32_to_bf16(f))) << f;
  }
}

} // namespace

namespace {

// The integer form of every quantized type: a·w − b is dequant32's value exactly, and a dot product on
// activations quantized to int8 equals the float dot product of the dequantized weights with the
// dequantized activations (up to float rounding), and the true one within the 8-bit rounding.
TEST(CudaFormats, IntegerFormOfEveryQuantizedTypeIsItsValues) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 512;
  int checked = 0;
  for (const auto& [id, tr] : dtype_detail::k_types) {
    const auto t = static_cast<DType>(id);
    if (!tr.can_dequantize) continue;
    SCOPED_TRACE(std::string(dtype_name(t)));
    std::vector<float> wf(n), x(n), deq(n);
    for (auto& v : wf)
      v = nd(rng) * 0.1f;
    for (auto& v : x)
      v = nd(rng);
    std::vector<uint8_t> row(row_bytes(t, n));
    quantize_row(t, wf.data(), row.data(), n);
    dequantize_row(t, row.data(), deq.data(), n);
    int8_t w[32];
    float a[2], b[2];
    if (!cuda::unpack32(id, row.data(), 0, w, a, b)) {
      EXPECT_TRUE(id == 0 || id == 1 || id == 30) << "only the plain types have no integer form";
      continue;
    }
    double got = 0, want_q = 0, want = 0, mag = 0;
    for (int64_t sb = 0; sb < n / 32; ++sb) {
      ASSERT_TRUE(cuda::unpack32(id, row.data(), sb, w, a, b));
      for (int l = 0; l < 32; ++l)
        ASSERT_EQ(a[l / 16] * static_cast<float>(w[l]) - b[l / 16], deq[static_cast<size_t>(32 * sb + l)])
            << "value " << 32 * sb + l;
      cuda::Q8Block q;
      cuda::quantize_q8(x.data() + 32 * sb, q);
      got += static_cast<double>(cuda::dot32(w, a, b, q));
      for (int l = 0; l < 32; ++l) {
        const double dv = deq[static_cast<size_t>(32 * sb + l)];
        want_q += dv * static_cast<double>(q.d) * q.q[l];
        want += dv * static_cast<double>(x[static_cast<size_t>(32 * sb + l)]);
        mag += std::fabs(dv * static_cast<double>(x[static_cast<size_t>(32 * sb + l)]));
      }
      EXPECT_EQ(q.s[0] + q.s[1], [&] {
        int s = 0;
        for (int l = 0; l < 32; ++l)
          s += q.q[l];
        return s;
      }());
    }
    EXPECT_NEAR(got, want_q, 1e-5 * (mag + 1.0)) << "integer sums, then a few float steps";
    EXPECT_NEAR(got, want, 2e-2 * (mag + 1.0)) << "activations rounded to 8 bits";
    ++checked;
  }
  EXPECT_EQ(checked, 13); // the block types, mxfp4 among them
}

} // namespace
