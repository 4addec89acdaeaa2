// The cpu backend's matrix kernels against the reference (dequantize, then f32 dot in double), for
// every weight type, both ISA paths (scalar and AVX2 when present) and odd shapes.
// Tolerances, per type, relative to Σ|w·x| of the row (the size of the dot product's terms):
//   f32, f16, bf16: 1e-5 — the weights are exact in f32; only the summation order differs;
//   q8_0, q4_0:     1e-2 — activations are quantized to 8 bits per block of 32 (as llama.cpp does).
#include "../../backends/cpu/kernels.hpp"
#include "loom/model/synth.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "loom/sdk/dtype.hpp"
#include "test_util.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>
#include <unistd.h>

namespace {

using namespace loom;

struct Case {
  DType type;
  double tol;
};

void check(cpu::Isa isa, const Case& c, int64_t K, int64_t N, int64_t T, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> wf(static_cast<size_t>(K * N)), x(static_cast<size_t>(K * T));
  for (auto& v : wf)
    v = nd(rng) * 0.1f;
  for (auto& v : x)
    v = nd(rng);
  const size_t rb = row_bytes(c.type, K);
  std::vector<uint8_t> w(rb * static_cast<size_t>(N));
  for (int64_t j = 0; j < N; ++j)
    quantize_row(c.type, wf.data() + j * K, w.data() + static_cast<size_t>(j) * rb, K);
  std::vector<float> y(static_cast<size_t>(T * N), NAN);
  cpu::matmul(isa, c.type, w.data(), rb, K, N, x.data(), T, y.data(), 2);
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t j = 0; j < N; ++j) {
    dequantize_row(c.type, w.data() + static_cast<size_t>(j) * rb, row.data(), K);
    for (int64_t t = 0; t < T; ++t) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(row[static_cast<size_t>(k)]) *
                         static_cast<double>(x[static_cast<size_t>(t * K + k)]);
        ref += p;
        mag += std::fabs(p);
      }
      ASSERT_NEAR(static_cast<double>(y[static_cast<size_t>(t * N + j)]), ref, c.tol * mag + 1e-6)
          << dtype_name(c.type) << " " << cpu::isa_name(isa) << " K=" << K << " N=" << N << " T=" << T
          << " j=" << j << " t=" << t;
    }
  }
}

class CpuKernels : public ::testing::TestWithParam<cpu::Isa> {};

TEST_P(CpuKernels, EveryTypeMatchesTheReference) {
  const cpu::Isa isa = GetParam();
  if (!cpu::isa_supported(isa))
    GTEST_SKIP() << "this CPU lacks " << cpu::isa_name(isa) << " (it runs up to "
                 << cpu::isa_name(cpu::cpu_isa()) << "): that level's code was compiled, not run";
  const Case cases[] = {
      {DType::f32, 1e-5}, {DType::f16, 1e-5}, {DType::bf16, 1e-5}, {DType::q8_0, 1e-2}, {DType::q4_0, 1e-2}};
  uint32_t seed = 1;
  for (const auto& c : cases) {
    check(isa, c, 32, 1, 1, seed++);     // one block
    check(isa, c, 96, 7, 3, seed++);     // odd rows, few tokens
    check(isa, c, 288, 37, 1, seed++);   // decode-shaped (stories15m width)
    check(isa, c, 1056, 19, 17, seed++); // prefill-shaped, K not a multiple of 64
    if (c.type == DType::f32 || c.type == DType::f16 || c.type == DType::bf16)
      check(isa, c, 200, 9, 1, seed++); // decode, K not a multiple of 16: the kernels' scalar tails
    for (int64_t T : {2, 3, 5, 15}) {   // small batches (speculative verification, beams)
      const bool plain = c.type == DType::f32 || c.type == DType::f16 || c.type == DType::bf16;
      check(isa, c, plain ? 204 : 224, 10, T, seed++); // 204: the two-token kernel's scalar tail
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuKernels, ::testing::ValuesIn(cpu::k_isa_levels),
                         [](const auto& p) { return std::string(cpu::isa_name(p.param)); });

TEST(CpuKernels, WhichTypesHaveKernels) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q4_0, DType::q4_k, DType::q6_k})
    EXPECT_TRUE(cpu::has_kernel(t)) << dtype_name(t);
  for (DType t : {DType::q4_1, DType::q5_0, DType::q5_1})
    EXPECT_FALSE(cpu::has_kernel(t)) << dtype_name(t);
}

// Random weight blocks of any type: random bytes with every f16-aligned pair that decodes to a
// non-finite or large value replaced by 0.01 (so scales are small and finite).
std::vector<uint8_t> random_blocks(DType t, int64_t K, int64_t N, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t rb = row_bytes(t, K);
  std::vector<uint8_t> w(rb * static_cast<size_t>(N));
  for (auto& b : w)
    b = static_cast<uint8_t>(rng());
  for (size_t i = 0; i + 1 < w.size(); i += 2) {
    uint16_t h;
    std::memcpy(&h, w.data() + i, 2);
    if (!std::isfinite(fp16_to_fp32(h)) || std::fabs(fp16_to_fp32(h)) > 4.0f) {
      h = fp32_to_fp16(0.01f);
      std::memcpy(w.data() + i, &h, 2);
    }
  }
  return w;
}

// The integer kernels are exact up to float rounding once the activations' own 8-bit quantization
// (blocks of 32, of 256 for the K-quants and IQ4_XS: scale amax/127, round to nearest) is applied to the
// reference too: 1e-5. Q4_1 / Q5_0 / Q5_1 / IQ4_NL / Q2_K / Q3_K / Q5_K / IQ4_XS: their int8 route
// (matmul_i8dq, avx2 and up; the K-quants' activations in blocks of 32 too), and gemv_multi on it gives
// matmul_i8dq's floats bit for bit (the same rows per thread, the same sums).
TEST_P(CpuKernels, IntegerKernelsAreExactOnQuantizedActivations) {
  const cpu::Isa isa = GetParam();
  if (!cpu::isa_supported(isa))
    GTEST_SKIP() << "this CPU lacks " << cpu::isa_name(isa) << " (it runs up to "
                 << cpu::isa_name(cpu::cpu_isa()) << "): that level's code was compiled, not run";
  for (DType t : {DType::q8_0, DType::q4_0, DType::q4_k, DType::q6_k, DType::q4_1, DType::q5_0, DType::q5_1,
                  DType::iq4_nl, DType::q5_k, DType::iq4_xs, DType::q2_k, DType::q3_k})
    for (const auto& [K, N, T] :
         {std::tuple{256, 5, 1}, std::tuple{512, 9, 2}, std::tuple{768, 6, 5}, std::tuple{576, 37, 1}}) {
      const bool i8dq = !cpu::has_kernel(t);
      if (i8dq && !cpu::i8dq_supports(isa, t)) continue; // below avx2: those types are exact (dq / rows)
      if (K % dtype_traits(t).block_size != 0) continue; // (576: SmolLM2's width, not a k-quant row)
      SCOPED_TRACE(std::string(dtype_name(t)) + " K=" + std::to_string(K) + " T=" + std::to_string(T));
      const auto w = random_blocks(t, K, N, static_cast<uint32_t>(K + N));
      std::mt19937 rng(3);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(K * T)), xq(x.size());
      for (auto& v : x)
        v = nd(rng);
      // the kernels' activation quantization: blocks of 32, of 256 for the k-quants
      const size_t qb = t == DType::q4_k || t == DType::q6_k || cpu::i8dq_superblocks(t) ? 256 : 32;
      for (size_t b = 0; b < x.size(); b += qb) {
        float amax = 0.0f;
        for (size_t i = b; i < b + qb; ++i)
          amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (size_t i = b; i < b + qb; ++i)
          xq[i] = static_cast<float>(std::lround(x[i] * id)) * d;
      }
      std::vector<float> y(static_cast<size_t>(N * T), NAN), row(static_cast<size_t>(K));
      const size_t rb = row_bytes(t, K);
      if (i8dq) {
        cpu::matmul_i8dq(isa, t, w.data(), rb, K, N, x.data(), T, y.data(), 2);
        if (T == 1) { // fused decode: two matrices in one region, the same floats
          std::vector<float> y1(static_cast<size_t>(N), NAN), y2(static_cast<size_t>(N), NAN);
          const cpu::Gemv mats[2] = {cpu::Gemv{t, w.data(), rb, N, y1.data(), true},
                                     cpu::Gemv{t, w.data(), rb, N, y2.data(), true}};
          cpu::gemv_multi(isa, mats, 2, K, x.data(), 2);
          ASSERT_EQ(0, std::memcmp(y1.data(), y.data(), y1.size() * sizeof(float)));
          ASSERT_EQ(0, std::memcmp(y2.data(), y.data(), y2.size() * sizeof(float)));
        }
      } else {
        cpu::matmul(isa, t, w.data(), rb, K, N, x.data(), T, y.data(), 2);
      }
      for (int64_t j = 0; j < N; ++j) {
        dequantize_row(t, w.data() + static_cast<size_t>(j) * rb, row.data(), K);
        for (int64_t tt = 0; tt < T; ++tt) {
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double p = static_cast<double>(row[static_cast<size_t>(k)]) *
                             static_cast<double>(xq[static_cast<size_t>(tt * K + k)]);
            ref += p;
            mag += std::fabs(p);
          }
          ASSERT_NEAR(static_cast<double>(y[static_cast<size_t>(tt * N + j)]), ref, 1e-5 * mag + 1e-6)
              << "j=" << j << " t=" << tt;
        }
      }
    }
}

// Q8_0, Q4_0, Q4_1, Q5_0, Q4_K and Q6_K (at avx2 Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, at avx512_vnni Q5_1)
// repacked into 8-row groups: dequantize to exactly the GGUF rows, and the repacked kernels sum the same
// integers as the GGUF-layout ones (Q4_1 and the others without a GGUF-row kernel of their own: the int8
// route on their rows; 1e-5: float rounding only), at every ISA, one to several tokens.
TEST_P(CpuKernels, RepackedMatricesMatchTheGgufRows) {
  const cpu::Isa isa = GetParam();
  if (!cpu::isa_supported(isa))
    GTEST_SKIP() << "this CPU lacks " << cpu::isa_name(isa) << " (it runs up to "
                 << cpu::isa_name(cpu::cpu_isa()) << "): that level's code was compiled, not run";
  for (DType type : {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q4_k, DType::q6_k,
                     DType::q3_k, DType::q2_k, DType::iq4_xs, DType::q5_1, DType::iq4_nl, DType::q5_k})
    for (const auto& [K, N, T] : {std::tuple{256, 8, 1}, std::tuple{512, 16, 3}, std::tuple{2048, 24, 1},
                                  // the int8 GEMM's tiles of 8, 4, 2 and 1 tokens, and an odd last group
                                  std::tuple{256, 40, 15}, std::tuple{512, 32, 18}, std::tuple{256, 16, 4},
                                  // decode's runs of 4 pairs per thread, with the last pairs and groups apart
                                  std::tuple{256, 128, 1}, std::tuple{512, 88, 1}, std::tuple{256, 200, 2},
                                  std::tuple{256, 256, 1} /* two runs of 4 pairs per thread */}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                   " T=" + std::to_string(T));
      const bool vnni_only = type == DType::q5_1;
      const bool from_avx2 = type == DType::q3_k || type == DType::q2_k || type == DType::q5_k ||
                             type == DType::iq4_nl || type == DType::iq4_xs;
      if ((vnni_only && !cpu::at_least(isa, cpu::Isa::avx512_vnni)) ||
          (from_avx2 && !cpu::at_least(isa, cpu::Isa::avx2))) {
        EXPECT_FALSE(cpu::repackable(isa, type, K, N)); // its i8dq route on the GGUF rows below (or exact)
        continue;
      }
      ASSERT_TRUE(cpu::repackable(isa, type, K, N));
      // batches looped token by token up to gemm_min_rows_quant, except the types whose AVX2 kernels unpack
      // per token (those hand a batch to the f32 GEMM from gemm_min_rows; int8_gemm: never)
      EXPECT_EQ(cpu::repacked_loop_light(isa, type), cpu::int8_gemm(isa, type) || !from_avx2);
      const auto w = random_blocks(type, K, N, static_cast<uint32_t>(K * N));
      const size_t rb = row_bytes(type, K);
      std::vector<uint8_t> wp(cpu::repacked_bytes(type, K, N));
      ASSERT_EQ(wp.size(), w.size()); // resident once: the same bytes, rearranged
      cpu::repack(type, w.data(), rb, K, N, wp.data());
      std::vector<float> a(static_cast<size_t>(K)), b(static_cast<size_t>(K));
      for (int64_t j = 0; j < N; ++j) {
        dequantize_row(type, w.data() + static_cast<size_t>(j) * rb, a.data(), K);
        cpu::dequantize_repacked(isa, type, wp.data(), K, N, j, b.data());
        ASSERT_EQ(a, b) << "row " << j;
      }
      std::mt19937 rng(5);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(static_cast<size_t>(K * T));
      for (auto& v : x)
        v = nd(rng);
      std::vector<float> y0(static_cast<size_t>(N * T), NAN), y1(y0);
      if (type == DType::q4_1 || type == DType::q5_0 || vnni_only ||
          from_avx2) // their GGUF-layout int8 kernel
        cpu::matmul_i8dq(cpu::at_least(isa, cpu::Isa::avx2) ? isa : cpu::Isa::avx2, type, w.data(), rb, K, N,
                         x.data(), T, y0.data(), 2);
      else
        cpu::matmul(isa, type, w.data(), rb, K, N, x.data(), T, y0.data(), 2); // the GGUF-layout kernels
      cpu::matmul_repacked(isa, type, wp.data(), K, N, x.data(), T, y1.data(), 2);
      if (cpu::int8_gemm(isa, type) && !vnni_only && !from_avx2) { // the int8 GEMM: the AVX2 kernel's floats
        std::vector<float> y2(y1.size(), NAN);
        cpu::matmul_repacked(cpu::Isa::avx2, type, wp.data(), K, N, x.data(), T, y2.data(), 2);
        ASSERT_EQ(y1, y2);
      }
      for (int64_t j = 0; j < N; ++j) {
        dequantize_row(type, w.data() + static_cast<size_t>(j) * rb, a.data(), K);
        for (int64_t t = 0; t < T; ++t) {
          double mag = 0;
          for (int64_t k = 0; k < K; ++k)
            mag += std::fabs(static_cast<double>(a[static_cast<size_t>(k)]) *
                             static_cast<double>(x[static_cast<size_t>(t * K + k)]));
          const size_t i = static_cast<size_t>(t * N + j);
          ASSERT_NEAR(static_cast<double>(y1[i]), static_cast<double>(y0[i]), 1e-5 * mag + 1e-6)
              << "j=" << j << " t=" << t;
        }
      }
    }
  EXPECT_FALSE(cpu::repackable(isa, DType::q4_0, 64, 12)); // rows not a multiple of 8
  EXPECT_FALSE(cpu::repackable(isa, DType::f32, 256, 16)); // no repacked layout
  EXPECT_EQ(cpu::repackable(isa, DType::q5_1, 64, 16), cpu::at_least(isa, cpu::Isa::avx512_vnni));
}

// One token against several matrices in one parallel region (the decode step's q/k/v and gate/up):
// bit for bit what each matrix gives alone through matmul_repacked / matmul, whatever the thread count;
// mixed types, the last pairs and an odd group, plain rows with a tail of fewer than 4.
TEST_P(CpuKernels, GemvMultiEqualsOneMatrixAtATime) {
  const cpu::Isa isa = GetParam();
  if (!cpu::isa_supported(isa))
    GTEST_SKIP() << "this CPU lacks " << cpu::isa_name(isa) << ": that level's code was compiled, not run";
  constexpr int64_t K = 512;
  struct M {
    DType type;
    int64_t N;
    bool repacked;
  };
  std::vector<M> ms = {{DType::q4_0, 88, true},  {DType::q6_k, 40, true}, {DType::q4_k, 256, true},
                       {DType::q8_0, 136, true}, {DType::q4_1, 72, true}, {DType::q5_0, 56, true}};
  if (cpu::gemv_multi_supports(isa, DType::f16, false))
    ms.insert(ms.end(), {{DType::f16, 30, false},
                         {DType::f32, 64, false},
                         {DType::bf16, 7, false},
                         {DType::f32, 3, false},
                         {DType::f32, 203, false}});
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(K));
  for (auto& v : x)
    v = nd(rng);
  std::vector<std::vector<uint8_t>> ws;
  std::vector<std::vector<float>> want;
  for (const M& m : ms) {
    auto w = m.repacked ? random_blocks(m.type, K, m.N, static_cast<uint32_t>(m.N))
                        : std::vector<uint8_t>(row_bytes(m.type, K) * static_cast<size_t>(m.N));
    if (!m.repacked) { // finite random rows
      std::vector<float> row(static_cast<size_t>(K));
      for (int64_t j = 0; j < m.N; ++j) {
        for (auto& v : row)
          v = nd(rng);
        uint8_t* dst = w.data() + static_cast<size_t>(j) * row_bytes(m.type, K);
        for (int64_t k = 0; k < K; ++k) {
          const float v = row[static_cast<size_t>(k)];
          if (m.type == DType::f32) {
            std::memcpy(dst + 4 * k, &v, 4);
          } else {
            const uint16_t h = m.type == DType::f16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
            std::memcpy(dst + 2 * k, &h, 2);
          }
        }
      }
    }
    std::vector<float> y(static_cast<size_t>(m.N), NAN);
    if (m.repacked) {
      std::vector<uint8_t> wp(cpu::repacked_bytes(m.type, K, m.N));
      cpu::repack(m.type, w.data(), row_bytes(m.type, K), K, m.N, wp.data());
      w = std::move(wp);
      cpu::matmul_repacked(isa, m.type, w.data(), K, m.N, x.data(), 1, y.data(), 2);
    } else {
      cpu::matmul(isa, m.type, w.data(), row_bytes(m.type, K), K, m.N, x.data(), 1, y.data(), 2);
    }
    ws.push_back(std::move(w));
    want.push_back(std::move(y));
  }
  for (int threads : {1, 2, 3}) {
    std::vector<std::vector<float>> got;
    std::vector<cpu::Gemv> g;
    for (size_t i = 0; i < ms.size(); ++i) {
      got.emplace_back(static_cast<size_t>(ms[i].N), NAN);
      g.push_back({ms[i].type, ws[i].data(), ms[i].repacked ? 0 : row_bytes(ms[i].type, K), ms[i].N,
                   got.back().data()});
    }
    cpu::gemv_multi(isa, g.data(), static_cast<int>(g.size()), K, x.data(), threads);
    for (size_t i = 0; i < ms.size(); ++i)
      EXPECT_EQ(got[i], want[i]) << dtype_name(ms[i].type) << " N=" << ms[i].N << ", " << threads
                                 << " threads";
  }
}

// Whether y[t][j] is within 1e-5 of the double-precision Σ_k w[j][k]·x[t][k] (relative to Σ |terms|), for
// w as N rows of K and x as T rows of K; the first miss as the failure message.
testing::AssertionResult products_match(const std::vector<float>& w, const std::vector<float>& x,
                                        const std::vector<float>& y, int64_t K, int64_t N, int64_t T,
                                        double tol = 1e-5) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(w[static_cast<size_t>(j * K + k)]) *
                         static_cast<double>(x[static_cast<size_t>(t * K + k)]);
        ref += p;
        mag += std::fabs(p);
      }
      const double got = static_cast<double>(y[static_cast<size_t>(t * N + j)]);
      if (!(std::fabs(got - ref) <= tol * mag + tol / 10))
        return testing::AssertionFailure() << "y[" << t << "][" << j << "] = " << got << ", want " << ref;
    }
  return testing::AssertionSuccess();
}

// BF16 (and F16 rounded to BF16) repacked 64 rows at a time for vdpbf16ps (kernels_bf16.cpp): the copy
// holds exactly the weights rounded to bf16 (dequantize_bf16x64), and one or a few tokens against it give
// Σ bf16(w)·bf16(x) — products exact in f32, so within 1e-5 of the double-precision sum of the terms'
// size; gemv_multi (decode, threads 1..3: shares of 1 to 9 groups, four far apart at once and the rest
// singly) gives matmul_bf16x64's floats bit for bit, and so does each token of a batch. Only at avx512_bf16.
TEST(CpuKernelsBf16, RepackedMatricesMatchTheBf16Products) {
  if (!cpu::isa_supported(cpu::Isa::avx512_bf16))
    GTEST_SKIP() << "this CPU lacks avx512_bf16 (it runs up to " << cpu::isa_name(cpu::cpu_isa())
                 << "): the bf16x64 code was compiled, not run";
  for (const cpu::Isa isa : {cpu::Isa::avx512_bf16, cpu::Isa::amx}) {
    if (!cpu::isa_supported(isa)) continue;
    SCOPED_TRACE(cpu::isa_name(isa));
    EXPECT_FALSE(cpu::bf16x64_repackable(DType::bf16, 96, 100)); // N % 64
    EXPECT_FALSE(cpu::bf16x64_repackable(DType::bf16, 40, 64));  // K % 16
    EXPECT_FALSE(cpu::bf16x64_repackable(DType::q8_0, 96, 64));
    std::mt19937 rng(21);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (DType type : {DType::bf16, DType::f16})
      for (const auto& [K, N] : {std::pair<int64_t, int64_t>{16, 64}, {96, 128}, {2048, 192}, {96, 576}}) {
        ASSERT_TRUE(cpu::bf16x64_repackable(type, K, N));
        const size_t rb = row_bytes(type, K);
        std::vector<uint8_t> w(rb * static_cast<size_t>(N));
        std::vector<float> wf(static_cast<size_t>(K));
        for (int64_t j = 0; j < N; ++j) {
          for (auto& v : wf)
            v = nd(rng) * 0.1f;
          quantize_row(type, wf.data(), w.data() + static_cast<size_t>(j) * rb, K);
        }
        std::vector<uint16_t> wp(cpu::bf16x64_bytes(K, N) / 2);
        cpu::repack_bf16x64(type, w.data(), rb, K, N, wp.data());
        // the copy: each weight rounded to bf16 (F16's are; BF16's unchanged)
        std::vector<float> dq(static_cast<size_t>(N * K)), row(static_cast<size_t>(K));
        for (int64_t j = 0; j < N; ++j) {
          cpu::dequantize_bf16x64(wp.data(), K, j, dq.data() + j * K);
          dequantize_row(type, w.data() + static_cast<size_t>(j) * rb, row.data(), K);
          for (int64_t k = 0; k < K; ++k)
            ASSERT_EQ(dq[static_cast<size_t>(j * K + k)],
                      bf16_to_fp32(fp32_to_bf16(row[static_cast<size_t>(k)])))
                << dtype_name(type) << " row " << j << " col " << k;
        }
        for (int64_t T : {1, 2, 3, 5}) {
          std::vector<float> x(static_cast<size_t>(T * K)), y(static_cast<size_t>(T * N), NAN);
          for (auto& v : x)
            v = nd(rng);
          cpu::matmul_bf16x64(isa, wp.data(), K, N, x.data(), T, y.data(), 2);
          std::vector<float> xr(x.size()); // the activations as the kernel multiplies them
          for (size_t i = 0; i < x.size(); ++i)
            xr[i] = bf16_to_fp32(fp32_to_bf16(x[i]));
          ASSERT_TRUE(products_match(dq, xr, y, K, N, T))
              << dtype_name(type) << " K=" << K << " N=" << N << " T=" << T;
          std::vector<float> y1(static_cast<size_t>(N));
          cpu::matmul_bf16x64(isa, wp.data(), K, N, x.data() + (T - 1) * K, 1, y1.data(), 2);
          for (int64_t j = 0; j < N; ++j) // the batch's last token alone
            ASSERT_EQ(y1[static_cast<size_t>(j)], y[static_cast<size_t>((T - 1) * N + j)]) << "T=" << T;
          if (T != 1) continue;
          for (int threads : {1, 2, 3}) {
            std::vector<float> y2(static_cast<size_t>(N), NAN);
            const cpu::Gemv m{DType::bf16, reinterpret_cast<const uint8_t*>(wp.data()), 0, N, y2.data()};
            cpu::gemv_multi(isa, &m, 1, K, x.data(), threads);
            for (int64_t j = 0; j < N; ++j)
              ASSERT_EQ(y2[static_cast<size_t>(j)], y[static_cast<size_t>(j)])
                  << "threads " << threads << " j=" << j;
          }
        }
      }
  }
}

// The exact Q4_1 GEMM on AMX bf16 tiles (matmul_repacked_exact, a prompt's route at amx): every product exact
// (the weights' small integers and the activations as three bf16 parts), the sums f32 — so y is Σ w·x to
// f32's summation error, within 4e-6 of the double-precision sum of the terms' size (measured: ≤ 1.5e-6; a
// block's d·Σq·x and m·Σx can cancel where weights d·q + m are near 0; the exact-FMA kernels of the GGUF rows
// ≤ 1.6e-7; the int8 route ≈ 1e-3) — for one to 40 tokens (tiles of 16 and a tail), quads of pairs and single
// pairs, activations over 2^±12; a second matrix of the same activations reusing their split gives the same
// floats.
TEST(CpuKernelsAmx, ExactQ4_1TilesGiveTheF32Products) {
  if (!cpu::isa_supported(cpu::Isa::amx))
    GTEST_SKIP() << "this CPU lacks amx (it runs up to " << cpu::isa_name(cpu::cpu_isa())
                 << "): the exact tiles were compiled, not run";
  const cpu::Isa amx = cpu::Isa::amx;
  EXPECT_TRUE(cpu::exact_tiles(amx, DType::q4_1, 16));
  EXPECT_FALSE(cpu::exact_tiles(amx, DType::q4_1, 24)); // an odd last group: the f32 GEMM
  EXPECT_FALSE(cpu::exact_tiles(amx, DType::q4_0, 16));
  EXPECT_FALSE(cpu::exact_tiles(cpu::Isa::avx512_bf16, DType::q4_1, 16));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-12, 12);
  cpu::ExactTilesWork work; // one scratch for every call, as the backend's
  for (const auto& [K, N] : {std::pair<int64_t, int64_t>{32, 16}, {576, 80}, {1536, 192}}) {
    const size_t rb = row_bytes(DType::q4_1, K);
    std::vector<uint8_t> w(rb * static_cast<size_t>(N));
    std::vector<float> dq(static_cast<size_t>(N * K));
    for (auto& v : dq)
      v = nd(rng) * 0.05f + 0.01f;
    for (int64_t j = 0; j < N; ++j) { // the rows as quantized, then exactly their values
      quantize_row(DType::q4_1, dq.data() + j * K, w.data() + static_cast<size_t>(j) * rb, K);
      dequantize_row(DType::q4_1, w.data() + static_cast<size_t>(j) * rb, dq.data() + j * K, K);
    }
    std::vector<uint8_t> wp(cpu::repacked_bytes(DType::q4_1, K, N));
    cpu::repack(DType::q4_1, w.data(), rb, K, N, wp.data());
    for (int64_t T : {1, 7, 16, 17, 40}) {
      std::vector<float> x(static_cast<size_t>(T * K)), y(static_cast<size_t>(T * N), NAN);
      for (auto& v : x)
        v = std::ldexp(nd(rng), ex(rng));
      x[0] = 0.0f;
      cpu::matmul_repacked_exact(DType::q4_1, wp.data(), K, N, x.data(), T, y.data(), 2, work);
      EXPECT_TRUE(products_match(dq, x, y, K, N, T, 4e-6)) << "K=" << K << " N=" << N << " T=" << T;
      if (N % 32 != 0) continue;
      // the next matrix of the same activations (N / 2 of these rows) reuses their split: the same floats
      std::vector<float> y2(static_cast<size_t>(T * (N / 2)), NAN);
      cpu::matmul_repacked_exact(DType::q4_1, wp.data(), K, N / 2, x.data(), T, y2.data(), 2, work, true);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < N / 2; ++j)
          ASSERT_EQ(y2[static_cast<size_t>(t * (N / 2) + j)], y[static_cast<size_t>(t * N + j)])
              << "K=" << K << " N=" << N << " T=" << T;
    }
  }
}

// Exact F16 repacked 64 rows at a time (f16x64, kernels_bf16.cpp): the copy dequantizes to exactly the F16
// rows (K with and without a last half gather), one to several tokens (tiles of 3, 2, 1) give Σ w·x with
// the weights exact — within 1e-5 of the double-precision sum of the terms' size — and gemv_multi (decode,
// threads 1..3, after another matrix in the same region) gives matmul_f16x64's floats bit for bit, as does
// each token of a batch. At every
// level from avx512 up that this CPU runs; below avx512 the route must not be offered.
TEST_P(CpuKernels, F16x64CopiesAreExact) {
  const cpu::Isa isa = GetParam();
  if (!cpu::at_least(isa, cpu::Isa::avx512)) { // below it the F16 rows stay in place
    EXPECT_FALSE(cpu::gemv_multi_supports(isa, DType::f16, true)) << cpu::isa_name(isa);
    return;
  }
  if (!cpu::isa_supported(isa))
    GTEST_SKIP() << "this CPU lacks " << cpu::isa_name(isa) << ": that level's code was compiled, not run";
  EXPECT_TRUE(cpu::gemv_multi_supports(isa, DType::f16, true));
  EXPECT_FALSE(cpu::gemv_multi_supports(cpu::Isa::avx2, DType::f16, true));
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const auto& [K, N] :
       {std::pair<int64_t, int64_t>{16, 64}, {48, 128}, {96, 64}, {2048, 192}, {48, 576}}) {
    ASSERT_TRUE(cpu::bf16x64_repackable(DType::f16, K, N));
    const size_t rb = row_bytes(DType::f16, K);
    std::vector<uint8_t> w(rb * static_cast<size_t>(N));
    std::vector<float> wf(static_cast<size_t>(K));
    for (int64_t j = 0; j < N; ++j) {
      for (auto& v : wf)
        v = nd(rng) * 0.1f;
      quantize_row(DType::f16, wf.data(), w.data() + static_cast<size_t>(j) * rb, K);
    }
    std::vector<uint16_t> wp(cpu::bf16x64_bytes(K, N) / 2);
    cpu::repack_f16x64(w.data(), rb, K, N, wp.data());
    std::vector<float> dq(static_cast<size_t>(N * K)), row(static_cast<size_t>(K));
    for (int64_t j = 0; j < N; ++j) {
      cpu::dequantize_f16x64(isa, wp.data(), K, j, dq.data() + j * K);
      dequantize_row(DType::f16, w.data() + static_cast<size_t>(j) * rb, row.data(), K);
      for (int64_t k = 0; k < K; ++k)
        ASSERT_EQ(dq[static_cast<size_t>(j * K + k)], row[static_cast<size_t>(k)])
            << "K=" << K << " row " << j << " col " << k;
    }
    // several rows at a time (the prefill panels): whole groups transposed, the rest row by row
    for (const auto& [j0, n] :
         {std::pair<int64_t, int64_t>{0, N}, {0, 64}, {5, N - 5}, {64, N - 64}, {3, 1}}) {
      if (n <= 0) continue;
      std::vector<float> rows(static_cast<size_t>(n * K), NAN);
      cpu::dequantize_f16x64_rows(isa, wp.data(), K, j0, n, rows.data());
      for (int64_t i = 0; i < n * K; ++i)
        ASSERT_EQ(rows[static_cast<size_t>(i)], dq[static_cast<size_t>(j0 * K + i)])
            << "K=" << K << " rows from " << j0 << ", n=" << n << " at " << i;
    }
    for (int64_t T : {1, 2, 3, 4, 7}) {
      std::vector<float> x(static_cast<size_t>(T * K)), y(static_cast<size_t>(T * N), NAN);
      for (auto& v : x)
        v = nd(rng);
      cpu::matmul_f16x64(isa, wp.data(), K, N, x.data(), T, y.data(), 2);
      ASSERT_TRUE(products_match(dq, x, y, K, N, T)) << "K=" << K << " N=" << N << " T=" << T;
      std::vector<float> y1(static_cast<size_t>(N));
      cpu::matmul_f16x64(isa, wp.data(), K, N, x.data() + (T - 1) * K, 1, y1.data(), 2);
      for (int64_t j = 0; j < N; ++j) // the batch's last token alone
        ASSERT_EQ(y1[static_cast<size_t>(j)], y[static_cast<size_t>((T - 1) * N + j)]) << "T=" << T;
      if (T != 1) continue;
      for (int threads : {1, 2, 3}) {
        std::vector<float> y2(static_cast<size_t>(N), NAN), other(static_cast<size_t>(N), NAN);
        const cpu::Gemv ms[2] = {{DType::f16, w.data(), rb, N, other.data()}, // F16 rows, then the copy
                                 {DType::f16, reinterpret_cast<const uint8_t*>(wp.data()), 0, N, y2.data()}};
        cpu::gemv_multi(isa, ms, 2, K, x.data(), threads);
        for (int64_t j = 0; j < N; ++j) {
          ASSERT_EQ(y2[static_cast<size_t>(j)], y[static_cast<size_t>(j)])
              << "threads " << threads << " j=" << j;
          ASSERT_NEAR(other[static_cast<size_t>(j)], y[static_cast<size_t>(j)], 1e-4f) << "j=" << j;
        }
      }
    }
  }
}

// Activations to bf16 for the bf16 GEMM: round to nearest even exactly as fp32_to_bf16 on every level
// (ties both ways, the largest finite values, infinities, signed zeros; NaN stays NaN), tails included.
// (Denormal inputs are left out: AVX512-BF16's conversion flushes them to zero, as kernels.hpp says.)
TEST_P(CpuKernels, ToBf16RoundsLikeTheScalarCode) {
  const cpu::Isa isa = GetParam();
  if (!cpu::isa_supported(isa))
    GTEST_SKIP() << "this CPU lacks " << cpu::isa_name(isa) << ": that level's code was compiled, not run";
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(1000);
  for (auto& v : x)
    v = nd(rng);
  const uint32_t special[] = {0x3F808000u /* tie, even below */,
                              0x3F818000u /* tie, odd below */,
                              0x3F807FFFu,
                              0x3F808001u,
                              0x7F7FFFFFu,
                              0xFF7FFFFFu,
                              0x7F800000u,
                              0xFF800000u,
                              0x80000000u,
                              0x00000000u,
                              0x7FC00000u,
                              0x7F800001u};
  for (size_t i = 0; i < std::size(special); ++i)
    std::memcpy(&x[3 * i], &special[i], 4);
  for (int64_t n : {1000, 31, 33}) {
    std::vector<uint16_t> y(static_cast<size_t>(n));
    cpu::to_bf16(isa, x.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = fp32_to_bf16(x[static_cast<size_t>(i)]);
      if (std::isnan(x[static_cast<size_t>(i)]))
        EXPECT_TRUE(std::isnan(bf16_to_fp32(y[static_cast<size_t>(i)]))) << i;
      else
        EXPECT_EQ(y[static_cast<size_t>(i)], want) << "element " << i << " n=" << n;
    }
  }
}

// Activations with NaN or Inf: every level quantizes them as the scalar code does (a NaN is skipped by
// the block's max and becomes −127), so the outputs — finite, NaN or infinite — are the AVX2 path's
// (the scalar kernels': finite where it is, within rounding).
TEST_P(CpuKernels, NonFiniteActivationsQuantizeLikeTheScalarCode) {
  const cpu::Isa isa = GetParam();
  if (!cpu::isa_supported(isa))
    GTEST_SKIP() << "this CPU lacks " << cpu::isa_name(isa) << ": that level's code was compiled, not run";
  // The scalar kernels' float steps differ from AVX2's (the same integer sums): non-finite where it is,
  // the rest within rounding; every other level: bit for bit.
  const bool scalar = !cpu::at_least(isa, cpu::Isa::avx2);
  const int64_t N = 16, T = 3;
  for (DType type : {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q4_k, DType::q6_k}) {
    const int64_t K = type == DType::q4_k || type == DType::q6_k ? 256 : 96;
    const auto w = random_blocks(type, K, N, 11);
    std::vector<uint8_t> wp(cpu::repacked_bytes(type, K, N));
    cpu::repack(type, w.data(), row_bytes(type, K), K, N, wp.data());
    std::mt19937 rng(4);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(K * T));
    for (auto& v : x)
      v = nd(rng);
    x[20] = NAN;                      // token 0: a NaN in the first half of block 0
    for (int64_t i = 48; i < 64; ++i) // token 1: the whole second half of block 1
      x[static_cast<size_t>(K + i)] = NAN;
    x[2 * K + 70] = INFINITY; // token 2: an infinity in block 2
    std::vector<float> y(static_cast<size_t>(N * T)), want(y.size());
    cpu::matmul_repacked(isa, type, wp.data(), K, N, x.data(), T, y.data(), 1);
    cpu::matmul_repacked(cpu::Isa::avx2, type, wp.data(), K, N, x.data(), T, want.data(), 1);
    for (size_t i = 0; i < y.size(); ++i) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " output " + std::to_string(i));
      if (scalar) { // an infinite activation may give ∞ here and NaN there (d·Σ against d·Σ − 8·d·Σx)
        ASSERT_EQ(std::isfinite(y[i]), std::isfinite(want[i]));
        if (std::isfinite(want[i])) {
          ASSERT_NEAR(y[i], want[i], 1e-4f * (1.0f + std::fabs(want[i])));
        }
        continue;
      }
      ASSERT_EQ(std::isnan(y[i]), std::isnan(want[i]));
      if (!std::isnan(y[i])) {
        ASSERT_EQ(y[i], want[i]);
      }
    }
    EXPECT_TRUE(std::isfinite(y[0]) && std::isfinite(y[N])) << "NaN activations are clamped, not spread";
  }
}

// End to end through the plugin: greedy golden output on stories260K identical to the reference
// backend, with the AVX2 path and with the scalar path forced.
TEST(CpuBackend, GreedyGoldenIdenticalToReference) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const char* bin = std::getenv("LOOM_BIN");
  if (!bin || !std::filesystem::exists(bin))
    GTEST_SKIP() << "LOOM_BIN not set: cannot find the plugin directory";
  PipelineConfig ref;
  ref.model.path = model.string();
  ref.model.n_ctx = 256;
  ref.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
  auto a = Pipeline::create(ref);
  GenerationRequest req;
  req.prompt = "Once upon a time";
  req.max_new_tokens = 195;
  const auto ra = a->generate(req);
  // our AVX2 kernels, the scalar path forced, and every matmul on oneDNN (gemm_min_rows = 1)
  // every level this CPU runs, and every matmul on oneDNN (gemm_min_rows = 1)
  std::vector<std::pair<std::string, int>> runs;
  for (cpu::Isa l : cpu::k_isa_levels)
    if (cpu::isa_supported(l)) runs.emplace_back(cpu::isa_name(l), 16);
  runs.emplace_back(cpu::isa_name(cpu::cpu_isa()), 1);
  for (const auto& [isa, gemm_min] : runs) {
    SCOPED_TRACE(std::string(isa) + " gemm_min_rows=" + std::to_string(gemm_min));
    setenv("LOOM_CPU_ISA", isa.c_str(), 1);
    PipelineConfig cfg = ref;
    cfg.backend.name = "cpu";
    cfg.backend.threads = 2;
    cfg.backend.params = {{"gemm_min_rows", int64_t{gemm_min}}};
    cfg.plugins.paths = {std::filesystem::path(bin).parent_path().string()};
    auto b = Pipeline::create(cfg);
    const auto rb = b->generate(req);
    EXPECT_EQ(ra.tokens, rb.tokens);
    ASSERT_EQ(ra.logprobs.size(), rb.logprobs.size());
    for (size_t i = 0; i < ra.logprobs.size(); ++i)
      EXPECT_NEAR(ra.logprobs[i], rb.logprobs[i], 1e-4) << i;
  }
  unsetenv("LOOM_CPU_ISA");
}

// The quantized kernels (repacked Q8_0 / Q4_0: the int8 GEMM on AVX-512 VNNI, AMX tiles) on a quantized
// stories260K: bit for bit the same tokens and log-probabilities on every AVX-512 level this CPU runs,
// prefill included (the integer sums and the float steps after them are the same). The AVX2 level is
// not bit-identical to them: stories260K's ffn_down (172 columns, not a multiple of a block) stays F32
// after quantization, and one-token F32 products sum in AVX-512 order at the AVX-512 levels — an ulp
// apart, which an activation's int8 rounding can turn into 1.5 % of a log-probability (the int8 error
// against the exact reference backend is ≈ 2 % here). So AVX2 must give the same first 6 tokens and
// log-probabilities within 0.05 of AVX-512's for 10. The scalar kernels round the float steps differently
// again and are left out. Attention runs the naive kernel, so only the matrix kernels differ by level.
TEST(CpuBackend, QuantizedGreedyIdenticalOnEveryIsaLevel) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  for (const char* type : {"q8_0", "q4_0"}) {
    SCOPED_TRACE(type);
    const auto q = std::filesystem::temp_directory_path() /
                   ("loom-isa-" + std::to_string(::getpid()) + "-" + type + ".gguf");
    ASSERT_EQ(
        loom::test::run_loom("quantize " + model.string() + " --type " + type + " -o " + q.string(), true)
            .code,
        0);
    nlohmann::json first_avx512, avx2;
    for (cpu::Isa l : cpu::k_isa_levels) {
      if (!cpu::isa_supported(l) || l == cpu::Isa::scalar) continue;
      const auto r =
          loom::test::run_loom("run -m " + q.string() +
                                   " -p 'Once upon a time there was a little girl who' -n 60 --temp 0 "
                                   "--ignore-eos --json --set backend.name=cpu --set backend.threads=2 "
                                   "--set attention.kernel='\"naive\"'",
                               false, 0, std::string("LOOM_CPU_ISA=") + cpu::isa_name(l));
      ASSERT_EQ(r.code, 0) << r.err;
      const auto j = nlohmann::json::parse(r.out);
      if (l == cpu::Isa::avx2) {
        avx2 = j;
      } else if (first_avx512.is_null()) {
        first_avx512 = j;
      } else {
        EXPECT_EQ(j["tokens"], first_avx512["tokens"]) << cpu::isa_name(l);
        EXPECT_EQ(j["logprobs"], first_avx512["logprobs"]) << cpu::isa_name(l);
      }
    }
    if (!avx2.is_null() && !first_avx512.is_null())
      for (size_t i = 0; i < 10; ++i) {
        if (i < 6) {
          EXPECT_EQ(avx2["tokens"][i], first_avx512["tokens"][i]) << "token " << i;
        }
        EXPECT_NEAR(avx2["logprobs"][i].get<double>(), first_avx512["logprobs"][i].get<double>(), 0.05) << i;
      }
    std::filesystem::remove(q);
  }
}

// Decode with q/k/v and gate/up in one parallel region (fused_decode, the default) against one region per
// matmul: the same kernels, so the same tokens and log-probabilities, for repacked and plain weights.
TEST(CpuBackend, FusedDecodeGivesTheSameResults) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  for (const char* type : {"q4_0", "f16"}) {
    SCOPED_TRACE(type);
    const auto q = std::filesystem::temp_directory_path() /
                   ("loom-fused-" + std::to_string(::getpid()) + "-" + type + ".gguf");
    ASSERT_EQ(
        loom::test::run_loom("quantize " + model.string() + " --type " + type + " -o " + q.string(), true)
            .code,
        0);
    std::string out[2];
    for (int fused = 0; fused < 2; ++fused) {
      const auto r = loom::test::run_loom("run -m " + q.string() +
                                              " -p 'Once upon a time' -n 40 --temp 0 --ignore-eos --json "
                                              "--set backend.name=cpu --set backend.threads=2 "
                                              "--set backend.fused_decode=" +
                                              (fused ? "true" : "false"),
                                          false);
      ASSERT_EQ(r.code, 0) << r.err;
      const auto j = nlohmann::json::parse(r.out);
      out[fused] = j["tokens"].dump() + j["logprobs"].dump();
    }
    EXPECT_EQ(out[0], out[1]);
    std::filesystem::remove(q);
  }
}

// LOOM_CPU_ISA: an unknown level, or one this CPU lacks, is one line.
TEST(CpuBackend, AnUnknownOrMissingIsaLevelIsAnError) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string run = "run -m " + model.string() + " -p Once -n 2 --set backend.name=cpu";
  const auto bad = loom::test::run_loom(run, false, 0, "LOOM_CPU_ISA=avx1024");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("LOOM_CPU_ISA=avx1024: unknown level; expected one of scalar, avx2, avx512"),
            std::string::npos)
      << bad.err;
  for (cpu::Isa l : cpu::k_isa_levels)
    if (!cpu::isa_supported(l)) {
      const auto r = loom::test::run_loom(run, false, 0, std::string("LOOM_CPU_ISA=") + cpu::isa_name(l));
      EXPECT_EQ(r.code, 1);
      EXPECT_NE(r.err.find("this CPU lacks it"), std::string::npos) << r.err;
    }
}

// `loom plugins` says which level the cpu plugin will use: LOOM_CPU_ISA's, else the best the CPU runs.
TEST(CpuBackend, PluginsListingShowsTheIsaLevel) {
  LOOM_REQUIRE_BIN();
  const auto description = [](const std::string& env) {
    const auto r = loom::test::run_loom("plugins --json", false, 0, env);
    EXPECT_EQ(r.code, 0) << r.err;
    for (const auto& p : nlohmann::json::parse(r.out))
      if (p["name"] == "cpu") return p.value("description", std::string("(none)"));
    return std::string("(cpu plugin not listed)");
  };
  const std::string best = cpu::isa_name(cpu::cpu_isa());
  EXPECT_EQ(description("").rfind("isa " + best + " (the best this CPU runs), ", 0), 0u) << description("");
  EXPECT_EQ(description("LOOM_CPU_ISA=scalar").rfind("isa scalar (CPU: " + best + "), ", 0), 0u)
      << description("LOOM_CPU_ISA=scalar");
  const std::string bad = description("LOOM_CPU_ISA=avx1024");
  EXPECT_EQ(bad.rfind("no usable level: ", 0), 0u) << bad;
  EXPECT_NE(bad.find("LOOM_CPU_ISA=avx1024: unknown level"), std::string::npos) << bad;
  const auto text = loom::test::run_loom("plugins", false, 0, "LOOM_CPU_ISA=scalar");
  EXPECT_NE(text.out.find("  uses     isa scalar (CPU: "), std::string::npos) << text.out;
}

} // namespace

namespace {

// Bad [backend] keys for the cpu plugin: one line naming the key, the expected range and what was found.
TEST(CpuBackend, BadBackendKeysAreOneLineErrors) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string base = "run -m " + model.string() + " -p Once -n 2 --set backend.name=cpu ";
  const auto range = loom::test::run_loom(base + "--set backend.gemm_min_rows=-1", false);
  EXPECT_EQ(range.code, 1);
  EXPECT_NE(range.err.find("gemm_min_rows: expected 0"), std::string::npos) << range.err;
  EXPECT_NE(range.err.find("found -1"), std::string::npos) << range.err;
  const auto repack = loom::test::run_loom(base + "--set backend.repack=3", false);
  EXPECT_EQ(repack.code, 1);
  EXPECT_NE(repack.err.find("key 'repack': expected true or false"), std::string::npos) << repack.err;
  const auto unknown = loom::test::run_loom(base + "--set backend.bogus=1", false);
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.err.find("unknown key 'bogus'"), std::string::npos) << unknown.err;
  const auto bw = loom::test::run_loom("bench --bandwidth -t 0", false);
  EXPECT_EQ(bw.code, 2);
  EXPECT_NE(bw.err.find("found 0"), std::string::npos) << bw.err;
}

// End to end on a real GGUF file (a `loom synth` stories15m in Q4_0: every matrix Q4_0):
// repacked and GGUF-layout kernels give the same greedy tokens and log-probabilities, and with
// repacking the process keeps only a small part of the model file resident (the repacked copy
// replaces the mapped weights), without it nearly all of it.
TEST(CpuBackend, RepackedModelGeneratesTheSameAndKeepsWeightsResidentOnce) {
  LOOM_REQUIRE_MODEL(vocab, "stories260K.gguf");
  const char* bin = std::getenv("LOOM_BIN");
  if (!bin || !std::filesystem::exists(bin))
    GTEST_SKIP() << "LOOM_BIN not set: cannot find the plugin directory";
  SynthOptions o;
  o.shape = "stories15m";
  o.type = DType::q4_0;
  o.vocab_from = vocab.string();
  o.out = (std::filesystem::temp_directory_path() / "loom_repack_e2e.gguf").string();
  synth_model(o);
  const auto file_kib = static_cast<long>(std::filesystem::file_size(o.out) / 1024);
  // this process's resident KiB of every mapping of the model file
  const auto rss_kib = [&o] {
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool in = false;
    long kib = 0;
    while (std::getline(smaps, line)) {
      if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
          line.find('-') != std::string::npos)
        in = line.find(o.out) != std::string::npos;
      else if (in && line.rfind("Rss:", 0) == 0)
        kib += std::stol(line.substr(4));
    }
    return kib;
  };
  GenerationRequest req;
  req.prompt = "Once upon a time";
  req.max_new_tokens = 24;
  std::vector<GenerationResult> results;
  std::vector<long> resident;
  for (bool repack : {true, false}) {
    PipelineConfig cfg;
    cfg.model.path = o.out;
    cfg.model.n_ctx = 64;
    cfg.samplers = {SamplerSpec{"greedy", {}}};
    cfg.stop.eos = false;
    cfg.backend.name = "cpu";
    cfg.backend.threads = 2;
    cfg.backend.params = {{"repack", repack}};
    cfg.plugins.paths = {std::filesystem::path(bin).parent_path().string()};
    auto p = Pipeline::create(cfg);
    results.push_back(p->generate(req));
    resident.push_back(rss_kib());
  }
  std::filesystem::remove(o.out);
  // The integer sums are the same; the float rounding after them differs, and once in a while that
  // moves an activation across an 8-bit rounding boundary in the next layer: log-probabilities then
  // differ by ~1e-3 (each path is as far from the f32 reference backend), hence 2e-2.
  ASSERT_EQ(results[0].tokens, results[1].tokens);
  for (size_t i = 0; i < results[0].logprobs.size(); ++i)
    EXPECT_NEAR(results[0].logprobs[i], results[1].logprobs[i], 2e-2) << i;
  std::printf("model file %ld KiB; resident: %ld KiB repacked, %ld KiB in the GGUF layout\n", file_kib,
              resident[0], resident[1]);
  EXPECT_LT(resident[0], file_kib / 4)
      << "repacked: " << resident[0] << " KiB of a " << file_kib << " KiB file resident";
  EXPECT_GT(resident[1], file_kib / 2)
      << "GGUF layout: " << resident[1] << " KiB of " << file_kib << " KiB resident";
}

} // namespace
