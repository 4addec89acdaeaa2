// The cpu backend's executor op by op against the reference backend: one small graph per op, random
// inputs, both ISA paths, matrix products on every weight type through all three routes (decode
// kernels, the four-token kernels, oneDNN's GEMM), and attention on random shapes — GQA, MQA, odd
// head dims, sliding window, soft-capping, a cache filled by an earlier batch, several sequences.
// Tolerances (relative to the magnitude of the terms summed):
//   element-wise ops, norms, RoPE, attention: 1e-5 (f32 throughout; only the order of sums differs);
//   matmul f32/f16/bf16 and every type through oneDNN (weights dequantized exactly): 1e-5;
//   matmul q8_0/q4_0 on our kernels: 1e-2 (activations quantized to 8 bits per block of 32).
#include "../../backends/cpu/cpu_backend.hpp"
#include "kv_rows.hpp"
#include "loom/attention/reference.hpp"
#include "loom/model/reference_backend.hpp"
#include "loom/sdk/dtype.hpp"
#include "op_harness.hpp"

#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <gtest/gtest.h>
#include <random>
#include <sys/mman.h>
#include <unistd.h>

namespace {

using namespace loom;
using test::expect_close;
using test::Rand;
using test::Weight;

// Every level this CPU runs (the log of each test names the level of each check).
std::vector<cpu::Isa> isas() {
  std::vector<cpu::Isa> v;
  for (cpu::Isa l : cpu::k_isa_levels)
    if (cpu::isa_supported(l)) v.push_back(l);
  return v;
}

// A graph whose inputs are T tokens; `src` rows are looked up from an f32 table, so every op under
// test reads activations that earlier nodes wrote.
struct Harness {
  Graph g;
  std::vector<TokenId> tokens;
  std::vector<Pos> pos;
  std::vector<SeqId> seq;
  std::vector<int32_t> out_rows;
  std::vector<Weight> tables; // kept alive: the graph points into them

  explicit Harness(int32_t T) {
    g.n_tokens = T;
    g.n_outputs = 0;
    g.in_tokens = g.add_tensor({"tokens", TensorKind::input, DType::f32, {T, 1, 1, 1}, nullptr});
    g.in_positions = g.add_tensor({"pos", TensorKind::input, DType::f32, {T, 1, 1, 1}, nullptr});
    g.in_out_ids = g.add_tensor({"out", TensorKind::input, DType::f32, {0, 1, 1, 1}, nullptr});
    for (int32_t t = 0; t < T; ++t) {
      tokens.push_back(t);
      pos.push_back(t);
      seq.push_back(0);
    }
  }
  // An activation [ne] (T rows of n_elements / T values) of random values.
  int32_t input(Rand& r, std::array<int64_t, 4> ne, float sd = 1.0f) {
    const int64_t row = ne[0] * ne[1] * ne[2] * ne[3] / g.n_tokens;
    tables.reserve(16);
    tables.emplace_back(DType::f32, row, g.n_tokens, r, sd);
    const int32_t w = tables.back().add(g, "table" + std::to_string(tables.size()));
    Node n;
    n.op = OpKind::get_rows;
    n.src = {w, g.in_tokens, -1};
    n.dst = g.add_activation("in", ne);
    return g.add_node(n);
  }
  int32_t op(OpKind k, int32_t a, int32_t b, std::array<int64_t, 4> ne, Node n = {}) {
    n.op = k;
    n.src = {a, b, -1};
    n.dst = g.add_activation(op_name(k), ne);
    return g.add_node(n);
  }
  BatchView batch() const { return {tokens, pos, seq, out_rows}; }

  // Runs the graph with `be`, returning tensor `out`.
  std::vector<float> run(Backend& be, int32_t out, KVCacheStore* kv = nullptr) {
    g.out_logits = out;
    std::vector<float> y(static_cast<size_t>(g.tensors[static_cast<size_t>(out)].n_elements()), NAN);
    if (!kv) { // no attention: no KV pool
      be.compute(g, batch(), KVRows{}, y);
      return y;
    }
    if (!kv->memory().buffer()) kv->memory().attach(be.alloc(kv->memory().layout().bytes(), BufferUsage::kv));
    be.compute(g, batch(), kv->rows_for(batch()), y);
    return y;
  }
};

// gemm_min applies to every matrix type here, so a test asking for oneDNN gets it for quantized ones too.
std::unique_ptr<Backend> cpu_backend(cpu::Isa isa, int gemm_min = 16, bool repack = true,
                                     bool bf16_gemm = true, bool bf16_gemv = true, bool f16_as_bf16 = false,
                                     bool f16_gemv = true, bool exact_logits = false,
                                     bool exact_matmul = false) {
  cpu::CpuOptions o;
  o.threads = 2;
  o.isa = isa;
  o.gemm_min_rows = gemm_min;
  o.gemm_min_rows_quant = gemm_min;
  o.gemm_min_rows_f16 = gemm_min; // (both routes of F16 at avx512 by gemm_min, as for the other types)
  o.repack = repack;
  o.bf16_gemm = bf16_gemm;
  o.bf16_gemv = bf16_gemv;
  o.f16_as_bf16 = f16_as_bf16;
  o.f16_gemv = f16_gemv;
  o.exact_logits = exact_logits; // (off: a matmul that is the graph's output takes its type's route)
  o.exact_matmul = exact_matmul;
  return cpu::make_cpu_backend(o);
}

TEST(CpuBackendOps, ElementwiseNormRopeMatchTheReference) {
  auto ref = make_reference_backend();
  for (cpu::Isa isa : isas())
    for (int32_t T : {1, 5, 70}) {
      SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " T=" + std::to_string(T));
      auto cpu = cpu_backend(isa);
      Rand r(static_cast<uint32_t>(T));
      const int64_t D = 12, H = 3, n = D * H;
      Harness h(T);
      const int32_t a = h.input(r, {n, T, 1, 1}), b = h.input(r, {n, T, 1, 1});
      const int32_t wide = h.input(r, {n, T, 1, 1}, 40.0f); // |v| up to ≈ 150: e^v far beyond f32
      Weight wn(DType::f32, n, 1, r);
      Node nn;
      nn.eps = 1e-5f;
      Node sc;
      sc.scale = 0.37f;
      Node rp;
      rp.rope = {8, 10000.0f, false, 1.0f, 0.0f, 1.0f, 0, 32.0f, 1.0f};
      Node rpx = rp;
      rpx.rope.neox = true;
      rpx.rope.n_dims = D;
      Node yarn = rp;
      yarn.rope = {D, 10000.0f, true, 0.25f, 1.0f, 1.0f, 64, 32.0f, 1.0f};
      const int32_t x3 = h.input(r, {D, H, T, 1});
      const std::vector<std::pair<std::string, int32_t>> outs = {
          {"rms_norm", h.op(OpKind::rms_norm, a, wn.add(h.g, "norm"), {n, T, 1, 1}, nn)},
          {"rms_norm no weight", h.op(OpKind::rms_norm, a, -1, {n, T, 1, 1}, nn)},
          {"add", h.op(OpKind::add, a, b, {n, T, 1, 1})},
          {"mul", h.op(OpKind::mul, a, b, {n, T, 1, 1})},
          {"mul row", h.op(OpKind::mul, a, wn.add(h.g, "row"), {n, T, 1, 1})},
          {"scale", h.op(OpKind::scale, a, -1, {n, T, 1, 1}, sc)},
          {"swiglu", h.op(OpKind::swiglu, a, b, {n, T, 1, 1})},
          {"swiglu wide", h.op(OpKind::swiglu, wide, b, {n, T, 1, 1})},
          {"softmax", h.op(OpKind::softmax, a, -1, {n, T, 1, 1})},
          {"copy", h.op(OpKind::copy, a, -1, {n, T, 1, 1})},
          {"copy weight", h.op(OpKind::copy, wn.add(h.g, "cw"), -1, {n, 1, 1, 1})},
          {"rope", h.op(OpKind::rope, x3, h.g.in_positions, {D, H, T, 1}, rp)},
          {"rope neox", h.op(OpKind::rope, x3, h.g.in_positions, {D, H, T, 1}, rpx)},
          {"rope yarn", h.op(OpKind::rope, x3, h.g.in_positions, {D, H, T, 1}, yarn)},
      };
      for (const auto& [name, id] : outs)
        expect_close(h.run(*ref, id), h.run(*cpu, id), 1e-5, name);
    }
}

// A matrix wider than one GEMM panel (≈ 8 MiB of f32 rows: 512 rows at K = 4096): each panel's output
// lands in its own columns of y (through the GEMM's contiguous buffer), F16 via the f16x64 copy's 64-row
// groups where the CPU has avx512 (else a row at a time), Q8_0 from its GGUF rows (repack off).
TEST(CpuBackendOps, MatmulsWiderThanAPanelMatchTheReference) {
  auto ref = make_reference_backend();
  for (const DType type : {DType::f16, DType::q8_0})
    for (cpu::Isa isa : isas()) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " " + cpu::isa_name(isa));
      Rand r(99);
      const int64_t K = 4096, N = 640;
      const int32_t T = 20;
      Harness h(T);
      const int32_t x = h.input(r, {K, T, 1, 1});
      Weight w(type, K, N, r, 0.05f);
      const int32_t y = h.op(OpKind::matmul, w.add(h.g, "w"), x, {N, T, 1, 1});
      expect_close(h.run(*ref, y), h.run(*cpu_backend(isa, 16, type != DType::q8_0), y), 1e-5,
                   "matmul over two panels");
    }
}

TEST(CpuBackendOps, GetRowsAndMatmulMatchTheReferenceForEveryWeightType) {
  auto ref = make_reference_backend();
  struct Case {
    DType type;
    double kernel_tol;
  };
  for (const Case c : {Case{DType::f32, 1e-5}, Case{DType::f16, 1e-5}, Case{DType::bf16, 1e-5},
                       Case{DType::q8_0, 1e-2}, Case{DType::q4_0, 1e-2}})
    for (cpu::Isa isa : isas())
      for (int32_t T : {1, 2, 6, 20})       // decode kernels, four-token kernels (+ remainder), oneDNN
        for (int64_t N : {1, 7, 64, 128}) { // 64, 128: one and two 64-row groups of bf16x64
          const std::string what = std::string(dtype_name(c.type)) + " " + cpu::isa_name(isa) +
                                   " T=" + std::to_string(T) + " N=" + std::to_string(N);
          SCOPED_TRACE(what);
          Rand r(static_cast<uint32_t>(T * 100 + N));
          const int64_t K = 96;
          Harness h(T);
          const int32_t x = h.input(r, {K, T, 1, 1});
          Weight w(c.type, K, N, r, 0.1f);
          const int32_t wid = w.add(h.g, "w");
          const int32_t y = h.op(OpKind::matmul, wid, x, {N, T, 1, 1});
          for (int32_t t = 0; t < T; ++t) // row ids (positions are not used otherwise here)
            h.pos[static_cast<size_t>(t)] = static_cast<Pos>((t * 5) % N);
          const int32_t rows = h.op(OpKind::get_rows, wid, h.g.in_positions, {K, T, 1, 1});
          const auto want = h.run(*ref, y);
          // the GEMM route only at T ≥ 16; the kernels' tolerance below that (and for repacked Q8_0 / Q4_0
          // on AVX-512 VNNI, which run the int8 GEMM at every size)
          const bool int8 = cpu::int8_gemm(isa, c.type) && N % 8 == 0;
          // BF16 on AVX512-BF16: oneDNN's bf16 matmul on activations rounded to bf16 (relative 2⁻⁹ each)
          const bool bf16mm = c.type == DType::bf16 && cpu::at_least(isa, cpu::Isa::avx512_bf16);
          const double gemm_tol = bf16mm ? 1e-2 : 1e-5;
          // ... and for N = 64 (bf16x64) its decode kernels too (vdpbf16ps on activations rounded to bf16)
          const bool b16 = bf16mm && N % 64 == 0;
          const double kernel_tol = b16 ? 1e-2 : c.kernel_tol;
          expect_close(want, h.run(*cpu_backend(isa), y), T >= 16 && !int8 ? gemm_tol : kernel_tol, "matmul");
          if (b16) // the exact kernels on the GGUF rows without bf16_gemv
            expect_close(want, h.run(*cpu_backend(isa, 16, true, true, false), y), T >= 16 ? gemm_tol : 1e-5,
                         "matmul, bf16_gemv = false");
          if (c.type == DType::f16 && N % 64 == 0 && cpu::at_least(isa, cpu::Isa::avx512)) // the F16 rows
            expect_close(want, h.run(*cpu_backend(isa, 16, true, true, true, false, false), y), 1e-5,
                         "matmul, f16_gemv = false"); // (the default above: the f16x64 copy)
          if (c.type == DType::f16 &&
              cpu::at_least(isa, cpu::Isa::avx512_bf16)) // weights rounded to bf16 too
            expect_close(want, h.run(*cpu_backend(isa, 16, true, true, true, true), y),
                         N % 64 == 0 ? 2e-2 : 1e-5, "matmul, f16_as_bf16");
          expect_close(want, h.run(*cpu_backend(isa, 1), y), int8 ? c.kernel_tol : gemm_tol,
                       int8 ? "matmul via the int8 GEMM" : "matmul via oneDNN");
          if (bf16mm) // and exactly the f32 GEMM's products without it
            expect_close(want, h.run(*cpu_backend(isa, 1, true, false), y), 1e-5,
                         "matmul via oneDNN's sgemm");
          expect_close(want, h.run(*cpu_backend(isa, 0), y), kernel_tol, "matmul via our kernels");
          // q4_0 with N = 64 runs repacked (8-row groups) above; the GGUF-layout kernels here
          expect_close(want, h.run(*cpu_backend(isa, 0, false), y), c.kernel_tol, "matmul, not repacked");
          expect_close(h.run(*ref, rows), h.run(*cpu_backend(isa), rows), 0.0, "get_rows");
        }
}

// Every weight type the reader accepts, at every ISA level this CPU runs, through the decode route (one row),
// small batches (2 and 6 rows: the four-token passes and their remainders) and the prefill route (20 rows:
// the oneDNN GEMM on dequantized panels, or the int8 GEMM), against the reference backend on weights made by
// quantize_row from N(0, 0.1) values (real weight distributions: nothing like random bytes' huge cancelling
// terms). Tolerances, relative to the largest output: the exact routes (f32/f16/bf16 rows, the dq kernels of
// kernels_dq.cpp, the GEMM on dequantized panels) differ only in the order of the sums: 1e-5. The int8 routes
// (q8_0, q4_0, q4_1, q5_0, q4_k, q6_k — repacked, at every level —, q5_1, iq4_nl, q2_k, q3_k, q5_k, iq4_xs
// at avx2 and up, repacked at avx512_vnni; the 20-row batches of all but q4_1 on the int8 GEMM at
// avx512_vnni: activations rounded to 8 bits per block) 2e-2, and 1e-2 for bf16 products on
// activations rounded to bf16. With exact_logits, the logits' matmul of every block type is exact: checked
// with the matmul as the graph's output; with exact_matmul every matmul of every type is.
TEST(CpuBackendOps, EveryWeightTypeMatchesTheReferenceOnEveryRoute) {
  auto ref = make_reference_backend();
  const DType types[] = {DType::f32,  DType::f16,  DType::bf16, DType::q4_0,   DType::q4_1,
                         DType::q5_0, DType::q5_1, DType::q8_0, DType::q2_k,   DType::q3_k,
                         DType::q4_k, DType::q5_k, DType::q6_k, DType::iq4_nl, DType::iq4_xs};
  const auto int8_types = [](DType t) {
    return t == DType::q8_0 || t == DType::q4_0 || t == DType::q4_k || t == DType::q6_k || t == DType::q4_1 ||
           t == DType::q5_0 || t == DType::q5_1 || t == DType::iq4_nl || t == DType::q5_k ||
           t == DType::iq4_xs || t == DType::q2_k || t == DType::q3_k; // (the last eight at avx2 and up)
  };
  for (const DType type : types)
    for (cpu::Isa isa : isas())
      for (int32_t T : {1, 2, 6, 20})
        for (bool as_logits : {false, true}) {
          const std::string what = std::string(dtype_name(type)) + " " + cpu::isa_name(isa) +
                                   " T=" + std::to_string(T) + (as_logits ? " (the logits' matmul)" : "");
          SCOPED_TRACE(what);
          Rand r(static_cast<uint32_t>(T * 31 + static_cast<int>(type)));
          const int64_t K = 512, N = 24;
          Harness h(T);
          const int32_t x = h.input(r, {K, T, 1, 1});
          Weight w(type, K, N, r, 0.1f);
          const int32_t y = h.op(OpKind::matmul, w.add(h.g, "w"), x, {N, T, 1, 1});
          // not the graph's output: a scale after it (so exact_logits leaves this matmul to its type's route)
          Node sc;
          sc.scale = 1.0f;
          const int32_t out = as_logits ? y : h.op(OpKind::scale, y, -1, {N, T, 1, 1}, sc);
          const auto want = h.run(*ref, out);
          const bool bf16mm = type == DType::bf16 && cpu::at_least(isa, cpu::Isa::avx512_bf16);
          double tol = 1e-5;
          if (int8_types(type) && !as_logits &&
              (cpu::has_kernel(type) || cpu::i8dq_supports(isa, type) || cpu::repackable(isa, type, K, N)))
            tol = 2e-2;
          if (bf16mm && T >= 16) tol = 1e-2;
          const auto be = [&](int gemm_min, bool repack) {
            return cpu_backend(isa, gemm_min, repack, true, true, false, true, true);
          };
          expect_close(want, h.run(*be(16, true), out), tol, "default options");
          // repack off: the GGUF-layout int8 kernels (or the dq kernels) on the file's rows
          expect_close(want, h.run(*be(16, false), out), tol, "repack = false");
          // our kernels at every size (no oneDNN)
          expect_close(want, h.run(*be(0, true), out), bf16mm ? 1e-5 : tol, "gemm_min_rows = 0");
          // exact_matmul: every type exact on every route, whether or not it is the logits' matmul (the
          // plugin turns the bf16 routes off with it; CpuOptions leaves that to the caller)
          for (int gemm_min : {16, 0}) {
            auto exact = cpu_backend(isa, gemm_min, true, false, false, false, true, false, true);
            expect_close(want, h.run(*exact, out), 1e-5,
                         "exact_matmul, gemm_min_rows = " + std::to_string(gemm_min));
          }
          if (cpu::dq_supports(isa, type) && !as_logits) { // the dq unpacking gives dequantize_row's values
            std::vector<float> a(static_cast<size_t>(K)), b(static_cast<size_t>(K));
            for (int64_t j = 0; j < N; ++j) {
              const uint8_t* row = w.bytes.data() + static_cast<size_t>(j) * row_bytes(type, K);
              dequantize_row(type, row, a.data(), K);
              cpu::dequantize_dq(type, row, b.data(), K);
              ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "row " << j;
            }
          }
        }
}

// A mixture-of-experts FFN (moe_route, matmul_id, moe_combine) against the reference on every level and
// weight type: 3 of 8 experts a token, batches whose rows choose different experts (one token, a few, more
// than an expert's share of rows for the GEMM routes), each gating, with a selection bias on one and
// gpt-oss's experts' biases and clamped SwiGLU on another. The route is the SDK's code on both: the same
// experts, and a token's experts the same alone as in a batch.
TEST(CpuBackendOps, MixtureOfExpertsMatchesTheReference) {
  auto ref = make_reference_backend();
  const int64_t K = 256, F = 256, NE = 8, k = 3;
  for (const DType type : {DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q4_0, DType::q4_k})
    for (cpu::Isa isa : isas())
      for (int32_t T : {1, 5, 40}) {
        { // each gating in turn (a selection bias with sigmoid)
          const auto gating = static_cast<MoeGating>((static_cast<int>(type) + T) % 3);
          SCOPED_TRACE(std::string(dtype_name(type)) + " " + cpu::isa_name(isa) + " T=" + std::to_string(T) +
                       " gating " + std::to_string(static_cast<int>(gating)));
          Rand r(static_cast<uint32_t>(T * 7 + static_cast<int>(type)));
          Weight xs(DType::f32, K, T, r), router(DType::f32, K, NE, r, 0.2f),
              bias(DType::f32, NE, 1, r, 0.5f);
          Weight gate(type, K, F * NE, r, 0.1f), up(type, K, F * NE, r, 0.1f), down(type, F, K * NE, r, 0.1f);
          Weight gate_b(DType::f32, F, NE, r), up_b(DType::f32, F, NE, r), down_b(DType::f32, K, NE, r);
          // The FFN of the tokens h.tokens (rows of xs); returns {route, output}.
          const auto build = [&](Harness& h) {
            const int32_t xt = xs.add(h.g, "x");
            const int32_t x = h.op(OpKind::get_rows, xt, h.g.in_tokens, {K, 1, h.g.n_tokens, 1});
            const int32_t logits =
                h.op(OpKind::matmul, router.add(h.g, "router"), x, {NE, h.g.n_tokens, 1, 1});
            Node rn;
            rn.moe = {static_cast<int32_t>(k), gating, gating != MoeGating::softmax_selected, 2.5f};
            const int32_t bias_id = gating == MoeGating::sigmoid ? bias.add(h.g, "bias") : -1;
            const int32_t route = h.op(OpKind::moe_route, logits, bias_id, {k, 2, h.g.n_tokens, 1}, rn);
            // gpt-oss's gating: each expert's biases (add_id) and the clamped SwiGLU (limit 1: it clamps)
            const bool oss = gating == MoeGating::softmax_selected;
            const auto by_experts = [&](const Weight& w, const Weight& b, const char* name, int64_t n,
                                        int32_t in) {
              const int32_t wid = h.g.add_weight(name, w.type, {w.n, n, NE, 1}, w.bytes.data());
              Node id;
              id.op = OpKind::matmul_id;
              id.src = {wid, in, route};
              id.dst = h.g.add_activation(name, {n, k, h.g.n_tokens, 1});
              const int32_t y = h.g.add_node(id);
              if (!oss) return y;
              Node ab;
              ab.op = OpKind::add_id;
              ab.src = {
                  y, h.g.add_weight(std::string(name) + ".bias", DType::f32, {n, NE, 1, 1}, b.bytes.data()),
                  route};
              ab.dst = h.g.add_activation(std::string(name) + "_b", {n, k, h.g.n_tokens, 1});
              return h.g.add_node(ab);
            };
            const int32_t g = by_experts(gate, gate_b, "gate", F, x), u = by_experts(up, up_b, "up", F, x);
            Node glu;
            glu.glu.limit = 1.0f;
            const int32_t act =
                h.op(oss ? OpKind::swiglu_oai : OpKind::swiglu, g, u, {F, k, h.g.n_tokens, 1}, glu);
            const int32_t dn = by_experts(down, down_b, "down", K, act);
            return std::pair{route, h.op(OpKind::moe_combine, dn, route, {K, h.g.n_tokens, 1, 1})};
          };
          Harness h(T);
          const auto [route, out] = build(h);
          const bool int8 = type == DType::q8_0 || type == DType::q4_0 || type == DType::q4_k;
          const bool bf16mm = type == DType::bf16 && cpu::at_least(isa, cpu::Isa::avx512_bf16);
          const double tol = int8 ? 3e-2 : bf16mm ? 1e-2 : 1e-5;
          auto cpu = cpu_backend(isa);
          // The same experts, their weights within the router matmul's summation order (the logits' routes
          // differ: oneDNN for the batch, our kernels for one token).
          const auto same_route = [&](const std::vector<float>& want, const std::vector<float>& got,
                                      int64_t t0, const std::string& what) {
            for (int64_t t = 0; t < static_cast<int64_t>(got.size()) / (2 * k); ++t)
              for (int64_t i = 0; i < k; ++i) {
                const size_t w = static_cast<size_t>((t0 + t) * 2 * k + i),
                             g = static_cast<size_t>(t * 2 * k + i);
                ASSERT_EQ(want[w], got[g]) << what << ": token " << t0 + t << " slot " << i;
                ASSERT_NEAR(want[w + static_cast<size_t>(k)], got[g + static_cast<size_t>(k)], 1e-5) << what;
              }
          };
          const auto want_route = h.run(*ref, route);
          same_route(want_route, h.run(*cpu, route), 0, "the route");
          const auto want = h.run(*ref, out);
          expect_close(want, h.run(*cpu, out), tol, "the experts' weighted sum");
          // exact products (bf16 routes off): every type within f32 summation order of the reference
          auto exact = cpu_backend(isa, 16, true, false, false, false, true, false, true);
          expect_close(want, h.run(*exact, out), 1e-5, "exact_matmul");
          // batch invariance: the last token alone chooses the experts it chose in the batch
          Harness one(1);
          one.tokens = {T - 1};
          const auto [route1, out1] = build(one);
          same_route(want_route, one.run(*cpu, route1), T - 1, "the last token alone");
          const std::vector<float> last(want.end() - K, want.end());
          expect_close(last, one.run(*cpu, out1), tol, "the last token alone");
        }
      }
}

struct AttnCase {
  int32_t n_head, n_head_kv, head_dim, window;
  float softcap;
  int32_t sinks = 0;
};

// Learned sink logits (gpt-oss): every kernel adds e^(s_h − max) to head h's denominator — prefill blocks of
// the register-resident and generic kernels, one-token items, and a one-token row over 700 keys split across
// threads (its chunks combined, the sink counted once), with and without a window, on every level.
TEST(CpuBackendOps, AttentionWithLearnedSinkLogitsMatchesTheReference) {
  for (const auto& [n_head, n_head_kv, D, window] :
       {std::tuple{4, 2, 64, 0}, std::tuple{4, 1, 32, 100}, std::tuple{3, 3, 5, 0}, std::tuple{8, 2, 128, 0}})
    for (cpu::Isa isa : isas()) {
      SCOPED_TRACE("Hq=" + std::to_string(n_head) + " Hkv=" + std::to_string(n_head_kv) + " D=" +
                   std::to_string(D) + " window=" + std::to_string(window) + " " + cpu::isa_name(isa));
      KVShape shape{1, n_head_kv, D, 1024, 1, DType::f32};
      auto kv = make_contiguous_kv_cache(shape);
      AttentionParams p{0, n_head, n_head_kv, D, 1.0f / std::sqrt(static_cast<float>(D)), window, 0.0f};
      Rand r(static_cast<uint32_t>(n_head * 7 + D));
      auto sink_logits = r.normal(static_cast<size_t>(n_head), 1.0f);
      for (float& sk : sink_logits) // e^6 ≈ 400 keys' worth: it matters over 700 keys too
        sk += 6.0f;
      p.sink_logits = 0; // (the kernels read `sink_logits`' values; the id only says there are some)
      const size_t row = static_cast<size_t>(n_head_kv) * static_cast<size_t>(D);
      for (const int32_t T : {700, 1}) { // a prompt (blocks), then one token over 701 keys (split)
        const Pos p0 = T == 1 ? 700 : 0;
        std::vector<Pos> pos(static_cast<size_t>(T));
        std::vector<SeqId> seq(static_cast<size_t>(T), 0);
        for (int32_t t = 0; t < T; ++t)
          pos[static_cast<size_t>(t)] = p0 + t;
        ASSERT_TRUE(kv->allocate(0, T));
        const auto q = r.normal(static_cast<size_t>(T) * static_cast<size_t>(n_head * D), 1.0f);
        const auto k = r.normal(static_cast<size_t>(T) * row, 1.0f),
                   v = r.normal(static_cast<size_t>(T) * row, 1.0f);
        for (int32_t t = 0; t < T; ++t) {
          loom::test::set_kv_f32(*kv, 0, 0, 0, pos[static_cast<size_t>(t)],
                                 std::span<const float>(k.data() + static_cast<size_t>(t) * row, row));
          loom::test::set_kv_f32(*kv, 0, 1, 0, pos[static_cast<size_t>(t)],
                                 std::span<const float>(v.data() + static_cast<size_t>(t) * row, row));
        }
        std::vector<float> want(q.size(), NAN), got(q.size(), NAN), plain(q.size(), NAN);
        const std::vector<TokenId> toks(static_cast<size_t>(T), 0);
        const KVRows rows = kv->rows_for(BatchView{toks, pos, seq, {}});
        attention::reference_attention(p, q.data(), T, pos.data(), rows, want.data(), nullptr, nullptr,
                                       nullptr, sink_logits.data());
        cpu::flash_attention(p, q.data(), T, pos.data(), rows, got.data(), isa, nullptr, nullptr, nullptr,
                             sink_logits.data());
        expect_close(want, got, 1e-5, "T=" + std::to_string(T));
        attention::reference_attention(p, q.data(), T, pos.data(), rows, plain.data());
        double diff = 0; // the sinks matter here (else this test could not fail)
        for (size_t i = 0; i < want.size(); ++i)
          diff = std::max(diff, std::fabs(static_cast<double>(want[i]) - static_cast<double>(plain[i])));
        EXPECT_GT(diff, 1e-3);
      }
    }
}

TEST(CpuBackendOps, AttentionMatchesTheReferenceKernel) {
  // Two batches: a prefill of P tokens per sequence (two sequences interleaved), then a few more
  // tokens per sequence attending over the cache the first batch filled.
  for (const AttnCase c :
       {AttnCase{4, 4, 8, 0, 0.0f}, AttnCase{6, 2, 12, 0, 0.0f}, AttnCase{8, 1, 7, 0, 0.0f},
        AttnCase{4, 2, 64, 5, 0.0f}, AttnCase{2, 1, 16, 0, 30.0f}, AttnCase{3, 3, 5, 3, 0.0f},
        // attention sinks: with decode items (D = 8·k), prefill blocks and the generic kernel
        AttnCase{4, 2, 64, 5, 0.0f, 2}, AttnCase{3, 3, 5, 3, 0.0f, 4}, AttnCase{4, 1, 32, 16, 0.0f, 3},
        AttnCase{2, 1, 16, 20, 30.0f, 6}, AttnCase{4, 4, 8, 9, 0.0f, 1},
        // the register-resident prefill kernels for head dims W·NV (8 … 256; one or two rows at a time)
        AttnCase{4, 2, 128, 0, 0.0f}, AttnCase{4, 1, 128, 7, 0.0f, 2}, AttnCase{8, 2, 64, 0, 30.0f},
        AttnCase{3, 1, 32, 11, 0.0f, 1}, AttnCase{2, 1, 256, 70, 0.0f, 1}})
    for (cpu::Isa isa : isas()) {
      const std::string what = "Hq=" + std::to_string(c.n_head) + " Hkv=" + std::to_string(c.n_head_kv) +
                               " D=" + std::to_string(c.head_dim) + " window=" + std::to_string(c.window) +
                               " sinks=" + std::to_string(c.sinks) + " " + cpu::isa_name(isa);
      SCOPED_TRACE(what);
      // The cpu kernel reads a paged store (blocks of 4) that releases, after each batch, the rows no
      // later query attends (sliding window): reading one of those would abort in the store.
      KVShape shape{1, c.n_head_kv, c.head_dim, 256, 2, DType::f32};
      shape.block_size = 4;
      auto kv_ref = make_contiguous_kv_cache(shape), kv_cpu = make_paged_kv_cache(shape);
      AttentionParams p{
          0,        c.n_head, c.n_head_kv, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
          c.window, c.softcap};
      p.sinks = c.sinks;
      Rand r(static_cast<uint32_t>(c.n_head * 31 + c.head_dim));
      int32_t done = 0;
      // prefill with each sequence in a run of its own (query blocks of up to 64 tokens: two whole and a
      // part), then the two interleaved (one-token items), then a decode-sized batch
      for (const auto& [per_seq, interleaved] :
           {std::pair{150, false}, std::pair{37, true}, std::pair{3, false}}) {
        std::vector<Pos> pos;
        std::vector<SeqId> seq;
        if (interleaved) {
          for (int32_t i = 0; i < per_seq; ++i)
            for (SeqId s : {0, 1}) {
              pos.push_back(done + i);
              seq.push_back(s);
            }
        } else {
          for (SeqId s : {0, 1})
            for (int32_t i = 0; i < per_seq; ++i) {
              pos.push_back(done + i);
              seq.push_back(s);
            }
        }
        const auto T = static_cast<int32_t>(pos.size());
        for (SeqId s : {0, 1}) {
          ASSERT_TRUE(kv_ref->allocate(s, per_seq));
          ASSERT_TRUE(kv_cpu->allocate(s, per_seq));
        }
        const size_t row = static_cast<size_t>(c.n_head_kv) * static_cast<size_t>(c.head_dim);
        const auto q = r.normal(static_cast<size_t>(T) * static_cast<size_t>(c.n_head * c.head_dim), 1.0f);
        const auto k = r.normal(static_cast<size_t>(T) * row, 1.0f);
        const auto v = r.normal(static_cast<size_t>(T) * row, 1.0f);
        for (int32_t t = 0; t < T; ++t)
          for (KVCacheStore* kv : {kv_ref.get(), kv_cpu.get()}) {
            loom::test::set_kv_f32(*kv, 0, 0, seq[static_cast<size_t>(t)], pos[static_cast<size_t>(t)],
                                   std::span<const float>(k.data() + static_cast<size_t>(t) * row, row));
            loom::test::set_kv_f32(*kv, 0, 1, seq[static_cast<size_t>(t)], pos[static_cast<size_t>(t)],
                                   std::span<const float>(v.data() + static_cast<size_t>(t) * row, row));
          }
        std::vector<float> want(q.size(), NAN), got(q.size(), NAN);
        const std::vector<TokenId> toks(static_cast<size_t>(T), 0);
        attention::reference_attention(p, q.data(), T, pos.data(),
                                       kv_ref->rows_for(BatchView{toks, pos, seq, {}}), want.data());
        cpu::flash_attention(p, q.data(), T, pos.data(), kv_cpu->rows_for(BatchView{toks, pos, seq, {}}),
                             got.data(), isa);
        expect_close(want, got, 1e-5, "batch of " + std::to_string(T));
        done += per_seq;
        if (c.window > 0) // the next query is at `done`: it reads [0, sinks) and [done − window + 1, done]
          for (SeqId s : {0, 1})
            kv_cpu->release_positions(s, c.sinks, std::max(0, done - c.window + 1));
      }
    }
}

TEST(CpuBackendOps, AttentionNodeWritesTheCacheLikeTheReference) {
  auto ref = make_reference_backend();
  for (cpu::Isa isa : isas()) {
    const int32_t T = 9, Hq = 4, Hkv = 2, D = 8;
    Rand r(11);
    Harness h(T);
    const int32_t q = h.input(r, {D, Hq, T, 1}), k = h.input(r, {D, Hkv, T, 1}),
                  v = h.input(r, {D, Hkv, T, 1});
    Node n;
    n.attn = {0, Hq, Hkv, D, 0.35f, 0, 0.0f};
    n.op = OpKind::attention;
    n.src = {q, k, v};
    n.dst = h.g.add_activation("attn", {D * Hq, T, 1, 1});
    const int32_t out = h.g.add_node(n);
    const KVShape shape{1, Hkv, D, 32, 1, DType::f32};
    auto kv_ref = make_contiguous_kv_cache(shape), kv_cpu = make_contiguous_kv_cache(shape);
    ASSERT_TRUE(kv_ref->allocate(0, T));
    ASSERT_TRUE(kv_cpu->allocate(0, T));
    auto cpu = cpu_backend(isa);
    expect_close(h.run(*ref, out, kv_ref.get()), h.run(*cpu, out, kv_cpu.get()), 1e-5, "attention");
    for (Pos p = 0; p < T; ++p)
      for (int32_t i = 0; i < Hkv * D; ++i) {
        ASSERT_EQ(loom::test::k_f32(*kv_ref, 0, 0, p)[static_cast<size_t>(i)],
                  loom::test::k_f32(*kv_cpu, 0, 0, p)[static_cast<size_t>(i)]);
        ASSERT_EQ(loom::test::v_f32(*kv_ref, 0, 0, p)[static_cast<size_t>(i)],
                  loom::test::v_f32(*kv_cpu, 0, 0, p)[static_cast<size_t>(i)]);
      }
  }
}

} // namespace

namespace {

TEST(CpuBackendOps, ActivationsReuseTheRoomOfDeadTensors) {
  // x → 20 chained adds: `first` stays alive and each add writes in place over the previous one,
  // so the arena holds two tensors of the graph's 21, and the chain's result is still exact.
  using namespace loom;
  const int32_t T = 4;
  const int64_t n = 1024;
  Rand r(5);
  Harness h(T);
  int32_t x = h.input(r, {n, T, 1, 1});
  const int32_t first = x;
  for (int i = 0; i < 20; ++i)
    x = h.op(OpKind::add, x, first, {n, T, 1, 1});
  auto ref = make_reference_backend();
  auto cpu = cpu_backend(cpu::Isa::scalar);
  expect_close(h.run(*ref, x), h.run(*cpu, x), 1e-6, "chain");
  const size_t one = static_cast<size_t>(n * T) * sizeof(float);
  EXPECT_LE(cpu->activation_bytes(), 2 * one);
  EXPECT_GE(cpu->workspace_bytes(), cpu->activation_bytes());
}

// A Q4_0 matrix read from a file mapping (as the GGUF loader maps models): after the first matmul
// repacks it, the process's pages of the file are released (weights resident once) and the
// results and a later get_rows (which faults its row back in) are still right.
TEST(CpuBackendOps, RepackedQ4_0ReleasesTheFilePages) {
  auto ref = make_reference_backend();
  Rand r(11);
  const int64_t K = 1024, N = 256; // 144 KiB of Q4_0: whole pages to release
  const Weight w(DType::q4_0, K, N, r, 0.1f);
  const std::string path = testing::TempDir() + "loom_q4_0_repack.bin";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(w.bytes.data()), static_cast<std::streamsize>(w.bytes.size()));
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* m = mmap(nullptr, w.bytes.size(), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(m, MAP_FAILED);
  // this process's resident KiB of the mapping (/proc/self/smaps)
  const auto rss_kib = [m] {
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    char head[32];
    std::snprintf(head, sizeof head, "%lx-", reinterpret_cast<unsigned long>(m));
    bool in = false;
    while (std::getline(smaps, line)) {
      if (line.rfind(head, 0) == 0)
        in = true;
      else if (in && line.rfind("Rss:", 0) == 0)
        return std::stol(line.substr(4));
    }
    return -1L;
  };
  Harness h(1), h2(16);
  const int32_t x = h.input(r, {K, 1, 1, 1});
  const int32_t y = h.op(OpKind::matmul, h.g.add_weight("w", DType::q4_0, {K, N, 1, 1}, m), x, {N, 1, 1, 1});
  for (int32_t t = 0; t < 16; ++t) // rows all over the matrix (a tied embedding's lookups)
    h2.pos[static_cast<size_t>(t)] = static_cast<Pos>((16 * t + 77) % N);
  const int32_t row = h2.op(OpKind::get_rows, h2.g.add_weight("w", DType::q4_0, {K, N, 1, 1}, m),
                            h2.g.in_positions, {K, 16, 1, 1});
  const auto want = h.run(*ref, y);
  const auto want_rows = h2.run(*ref, row);
  EXPECT_GE(rss_kib(), 100); // the reference read every page
  for (cpu::Isa isa : isas()) {
    auto cpu = cpu_backend(isa, 0);
    expect_close(want, h.run(*cpu, y), 1e-2, "matmul, repacked");
    EXPECT_LE(rss_kib(), 8) << cpu::isa_name(isa) << ": the file's pages should be released after repacking";
    expect_close(want_rows, h2.run(*cpu, row), 0.0, "get_rows after the release");
    // the rows came from the copy: looking them up did not map the file back in
    EXPECT_LE(rss_kib(), 8) << cpu::isa_name(isa) << ": get_rows read the released file";
    // the same matrix as the exact output head: its rescored rows come from the copy too (this backend
    // shares the copy of the one above)
    auto exact_head = cpu_backend(isa, 0, true, true, true, false, true, true);
    expect_close(want, h.run(*exact_head, y), 1e-2, "the exact head");
    EXPECT_LE(rss_kib(), 8) << cpu::isa_name(isa) << ": the exact head's rescoring read the released file";
    expect_close(want, h.run(*cpu, y), 1e-2, "matmul, repacked, again");
    // the copy replaced the file's pages: it is not workspace; from heap weights it would be
    EXPECT_LT(cpu->workspace_bytes(), w.bytes.size()) << cpu::isa_name(isa);
  }
  Harness hh(1);
  const int32_t yh = hh.op(OpKind::matmul, w.add(hh.g, "w"), hh.input(r, {K, 1, 1, 1}), {N, 1, 1, 1});
  auto cpu = cpu_backend(cpu::Isa::scalar, 0);
  hh.run(*cpu, yh);
  EXPECT_GE(cpu->workspace_bytes(), w.bytes.size()) << "a repacked copy of heap weights is a second copy";
  munmap(m, w.bytes.size());
  std::remove(path.c_str());
}

// Two backends on one mapped matrix (two pipelines of one model file in `loom serve`): one repacked copy
// between them, both right; another ISA's layout is its own copy; the copy goes with its last holder.
TEST(CpuBackendOps, BackendsOnOneMappedMatrixShareItsRepackedCopy) {
  auto ref = make_reference_backend();
  Rand r(12);
  const int64_t K = 512, N = 128;
  const Weight w(DType::q8_0, K, N, r, 0.1f);
  const std::string path = testing::TempDir() + "loom_q8_0_shared.bin";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(w.bytes.data()), static_cast<std::streamsize>(w.bytes.size()));
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* m = mmap(nullptr, w.bytes.size(), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(m, MAP_FAILED);
  Harness h(1);
  const int32_t y = h.op(OpKind::matmul, h.g.add_weight("w", DType::q8_0, {K, N, 1, 1}, m),
                         h.input(r, {K, 1, 1, 1}), {N, 1, 1, 1});
  const auto want = h.run(*ref, y);
  const size_t before = cpu::shared_repacked_matrices();
  {
    auto a = cpu_backend(cpu::Isa::scalar, 0), b = cpu_backend(cpu::Isa::scalar, 0);
    expect_close(want, h.run(*a, y), 1e-2, "the first backend");
    EXPECT_EQ(cpu::shared_repacked_matrices(), before + 1);
    expect_close(want, h.run(*b, y), 1e-2, "the second, on the first's copy");
    EXPECT_EQ(cpu::shared_repacked_matrices(), before + 1) << "one copy for both";
    a.reset();
    expect_close(want, h.run(*b, y), 1e-2, "the second, after the first is gone");
    EXPECT_EQ(cpu::shared_repacked_matrices(), before + 1) << "the second still holds it";
    if (cpu::at_least(cpu::cpu_isa(), cpu::Isa::avx2)) {
      auto c = cpu_backend(cpu::Isa::avx2, 0);
      expect_close(want, h.run(*c, y), 1e-2, "another ISA");
      EXPECT_EQ(cpu::shared_repacked_matrices(), before + 2) << "another ISA: its own copy";
    }
  }
  EXPECT_EQ(cpu::shared_repacked_matrices(), before) << "the copies go with their last holder";
  munmap(m, w.bytes.size());
  std::remove(path.c_str());
}

} // namespace
