// Every backend plugin op by op against the reference backend, through the backend ABI as the host drives
// it (weights of any type, a KV pool in the backend's memory, logits through its buffer): reference_plugin,
// cpu and cuda. A backend that cannot run on this machine — cuda without a GPU — is SKIPPED with its
// reason (scripts/gpu-check.sh runs these on a GPU). Tolerances, relative to the largest output value:
// f32 throughout (element-wise ops, norms, RoPE, attention, exact matmuls): 1e-4; matmuls on activations
// rounded to 8 bits (cpu's int8 kernels) 2e-2.
#include "loom/kv/kv_cache.hpp"
#include "loom/model/model.hpp"
#include "loom/model/reference_backend.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "loom/plugin/plugin_host.hpp"
#include "loom/sdk/dtype.hpp"
#include "op_harness.hpp"
#include "plugin/plugin_internal.hpp"
#include "test_util.hpp"

#include <cmath>
#include <filesystem>
#include <gtest/gtest.h>
#include <numeric>
#include <random>

namespace {

using namespace loom;
using test::expect_close;
using test::Rand;
using test::Weight;

// A plugin backend by name from the build's bin directory, with its [backend] keys; nullopt and the reason
// when it cannot run here.
struct Made {
  std::unique_ptr<Backend> be;
  std::string why;
};
Made make(const std::string& name, std::vector<std::pair<std::string, ParamValue>> params = {}) {
  static PluginRegistry reg; // one load per library for the whole run
  const std::string file = std::string(LOOM_BUILD_BIN_DIR) + "/libloom-backend-" +
                           (name == "reference_plugin" ? "reference" : name) + ".so";
  if (!std::filesystem::exists(file)) return {nullptr, file + " was not built (no nvcc on this machine?)"};
  if (!reg.find(LOOM_KIND_BACKEND, name)) { // (the pipeline's way: only the file that provides it)
    DiscoverOptions o;
    o.named_only = true;
    o.only = {{LOOM_KIND_BACKEND, name}};
    reg.discover({LOOM_BUILD_BIN_DIR}, {}, o);
  }
  const auto f = reg.find(LOOM_KIND_BACKEND, name);
  if (!f) return {nullptr, file + " has no backend '" + name + "'"};
  params.emplace_back("threads", int64_t{2});
  try {
    return {plugin::make_plugin_backend(*f, name, params, "test"), {}};
  } catch (const Error& e) {
    if (name == "cuda") return {nullptr, e.what()}; // no GPU: the reason, one line
    throw;
  }
}

// A graph of T tokens whose inputs are looked up from f32 tables (weights), run on a backend with a paged
// KV store of its own (the host's shape: the pool in the backend's memory).
struct Harness {
  Graph g;
  std::vector<TokenId> tokens;
  std::vector<Pos> pos;
  std::vector<SeqId> seq;
  std::vector<int32_t> out_rows;
  std::vector<std::unique_ptr<Weight>> weights;

  explicit Harness(int32_t T) {
    g.n_tokens = T;
    g.in_tokens = g.add_tensor({"tokens", TensorKind::input, DType::i32, {T, 1, 1, 1}, nullptr});
    g.in_positions = g.add_tensor({"pos", TensorKind::input, DType::i32, {T, 1, 1, 1}, nullptr});
    g.in_out_ids = g.add_tensor({"out", TensorKind::input, DType::i32, {0, 1, 1, 1}, nullptr});
    for (int32_t t = 0; t < T; ++t) {
      tokens.push_back(t);
      pos.push_back(t);
      seq.push_back(0);
    }
  }
  int32_t weight(DType t, int64_t n, int64_t rows, Rand& r, float sd = 1.0f) {
    weights.push_back(std::make_unique<Weight>(t, n, rows, r, sd));
    const Weight& w = *weights.back();
    return g.add_weight("w" + std::to_string(weights.size()), t, {n, rows, 1, 1}, w.bytes.data());
  }
  // An activation [ne] of random values (T rows looked up from an f32 table).
  int32_t input(Rand& r, std::array<int64_t, 4> ne, float sd = 1.0f) {
    const int64_t row = ne[0] * ne[1] * ne[2] * ne[3] / g.n_tokens;
    const int32_t w = weight(DType::f32, row, g.n_tokens, r, sd);
    return op(OpKind::get_rows, w, g.in_tokens, ne);
  }
  // y [T][N] = x [T][K] · Wᵀ: random activations, a random weight of `type` (sd 0.1), the product.
  struct Matmul {
    int32_t x, w, y;
  };
  Matmul matmul(DType type, int64_t K, int64_t N, Rand& r) {
    const int32_t x = input(r, {K, g.n_tokens, 1, 1});
    const int32_t w = weight(type, K, N, r, 0.1f);
    return {x, w, op(OpKind::matmul, w, x, {N, g.n_tokens, 1, 1})};
  }
  int32_t op(OpKind k, int32_t a, int32_t b, std::array<int64_t, 4> ne, Node n = {}, int32_t c = -1) {
    n.op = k;
    n.src = {a, b, c};
    n.dst = g.add_activation(op_name(k), ne);
    return g.add_node(n);
  }
  BatchView batch() const { return {tokens, pos, seq, out_rows}; }
  std::vector<float> run(Backend& be, KVCacheStore& kv, int32_t out) {
    g.out_logits = out;
    std::vector<float> y(static_cast<size_t>(g.tensors[static_cast<size_t>(out)].n_elements()), NAN);
    for (size_t t = 0; t < pos.size(); ++t) // the positions the batch writes (tests without a KV plan)
      if (kv.length(seq[t]) <= pos[t]) {
        EXPECT_TRUE(kv.allocate(seq[t], pos[t] + 1 - kv.length(seq[t])));
      }
    if (!kv.memory().buffer()) kv.memory().attach(be.alloc(kv.memory().layout().bytes(), BufferUsage::kv));
    be.compute(g, batch(), kv.rows_for(batch()), y);
    return y;
  }
};

std::unique_ptr<KVCacheStore> store(int32_t n_head_kv, int32_t head_dim, DType dt = DType::f32,
                                    int32_t n_ctx = 256) {
  KVShape s{1, n_head_kv, head_dim, n_ctx, 2, dt};
  s.block_size = 4;
  return make_paged_kv_cache(s);
}

class BackendOps : public ::testing::TestWithParam<std::string> {
protected:
  // The backend under test with exact matrix products where it has the choice.
  Made under_test() {
    const std::string& n = GetParam();
    if (n == "cuda" || n == "cpu") return make(n, {{"exact_matmul", true}});
    return make(n);
  }
};

#define LOOM_BACKEND_OR_SKIP(var)                                                                            \
  Made var = under_test();                                                                                   \
  if (!var.be) GTEST_SKIP() << "SKIPPED: " << GetParam() << ": " << var.why;

TEST_P(BackendOps, ElementwiseNormRopeAndCopies) {
  LOOM_BACKEND_OR_SKIP(m);
  auto ref = make_reference_backend();
  for (int32_t T : {1, 5, 70}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    Rand r(static_cast<uint32_t>(T));
    const int64_t D = 12, H = 3, n = D * H;
    Harness h(T);
    const int32_t a = h.input(r, {n, T, 1, 1}), b = h.input(r, {n, T, 1, 1});
    const int32_t wide = h.input(r, {n, T, 1, 1}, 40.0f);
    const int32_t norm = h.weight(DType::f32, n, 1, r), row16 = h.weight(DType::f16, n, 1, r);
    const int32_t bias = h.weight(DType::f32, D, 1, r), q8 = h.weight(DType::q8_0, 64, 3, r);
    const int32_t ff = h.weight(DType::f32, D / 2, 1, r, 0.3f);
    Node nn;
    nn.eps = 1e-5f;
    Node sc;
    sc.scale = 0.37f;
    Node cap;
    cap.scale = 3.0f;
    Node rp;
    rp.rope = {8, 10000.0f, false, 1.0f, 0.0f, 1.0f, 0, 32.0f, 1.0f};
    Node rpx = rp;
    rpx.rope.neox = true;
    rpx.rope.n_dims = D;
    Node yarn;
    yarn.rope = {D, 10000.0f, true, 0.25f, 1.0f, 1.0f, 64, 32.0f, 1.0f};
    const int32_t x3 = h.input(r, {D, H, T, 1});
    std::vector<float> ffv(D / 2);
    const std::vector<std::pair<std::string, int32_t>> outs = {
        {"rms_norm", h.op(OpKind::rms_norm, a, norm, {n, T, 1, 1}, nn)},
        {"rms_norm f16 weight", h.op(OpKind::rms_norm, a, row16, {n, T, 1, 1}, nn)},
        {"rms_norm no weight", h.op(OpKind::rms_norm, a, -1, {n, T, 1, 1}, nn)},
        {"add", h.op(OpKind::add, a, b, {n, T, 1, 1})},
        {"add bias", h.op(OpKind::add, a, bias, {n, T, 1, 1})},
        {"mul", h.op(OpKind::mul, a, b, {n, T, 1, 1})},
        {"mul row", h.op(OpKind::mul, a, norm, {n, T, 1, 1})},
        {"scale", h.op(OpKind::scale, a, -1, {n, T, 1, 1}, sc)},
        {"softcap", h.op(OpKind::softcap, wide, -1, {n, T, 1, 1}, cap)},
        {"swiglu", h.op(OpKind::swiglu, a, b, {n, T, 1, 1})},
        {"swiglu wide", h.op(OpKind::swiglu, wide, b, {n, T, 1, 1})},
        {"geglu", h.op(OpKind::geglu, a, b, {n, T, 1, 1})},
        {"geglu wide", h.op(OpKind::geglu, wide, b, {n, T, 1, 1})},
        {"softmax", h.op(OpKind::softmax, a, -1, {n, T, 1, 1})},
        {"softmax wide", h.op(OpKind::softmax, wide, -1, {n, T, 1, 1})},
        {"copy", h.op(OpKind::copy, a, -1, {n, T, 1, 1})},
        {"copy q8_0 weight", h.op(OpKind::copy, q8, -1, {64, 3, 1, 1})},
        {"rope", h.op(OpKind::rope, x3, h.g.in_positions, {D, H, T, 1}, rp)},
        {"rope neox", h.op(OpKind::rope, x3, h.g.in_positions, {D, H, T, 1}, rpx)},
        {"rope neox, frequency divisors", h.op(OpKind::rope, x3, h.g.in_positions, {D, H, T, 1}, rpx, ff)},
        {"rope yarn", h.op(OpKind::rope, x3, h.g.in_positions, {D, H, T, 1}, yarn)},
    };
    auto be = under_test().be; // fresh: a backend caches weights it was not given at load by their address
    for (const auto& [name, id] : outs) {
      auto kr = store(1, 4), kb = store(1, 4);
      expect_close(h.run(*ref, *kr, id), h.run(*be, *kb, id), 1e-4, name);
    }
  }
}

TEST_P(BackendOps, GetRowsAndMatmulOnEveryWeightType) {
  LOOM_BACKEND_OR_SKIP(m);
  auto ref = make_reference_backend();
  const DType types[] = {DType::f32,  DType::f16,  DType::bf16, DType::q4_0,   DType::q4_1,
                         DType::q5_0, DType::q5_1, DType::q8_0, DType::q2_k,   DType::q3_k,
                         DType::q4_k, DType::q5_k, DType::q6_k, DType::iq4_nl, DType::iq4_xs};
  for (const DType type : types)
    for (int32_t T : {1, 3, 8, 9, 40}) { // the decode kernels (≤ 8 rows) and the GEMM route
      SCOPED_TRACE(std::string(dtype_name(type)) + " T=" + std::to_string(T));
      Rand r(static_cast<uint32_t>(T * 31 + static_cast<int>(type)));
      const int64_t K = 512, N = 67;
      Harness h(T);
      const auto [x, w, y] = h.matmul(type, K, N, r);
      (void)x;
      for (int32_t t = 0; t < T; ++t)
        h.pos[static_cast<size_t>(t)] = static_cast<Pos>((t * 5) % N);
      const int32_t rows = h.op(OpKind::get_rows, w, h.g.in_positions, {K, T, 1, 1});
      auto be = under_test().be; // (fresh, as above; made before the stores its KV pools outlive)
      auto k1 = store(1, 4), k2 = store(1, 4), k3 = store(1, 4), k4 = store(1, 4);
      // cpu: its int8 kernels round activations to 8 bits (exact_matmul covers the GEMM routes)
      const double tol =
          GetParam() == "cpu" && type != DType::f32 && type != DType::f16 && type != DType::bf16 ? 2e-2
                                                                                                 : 1e-4;
      const auto want = h.run(*ref, *k1, y);
      expect_close(want, h.run(*be, *k2, y), tol, "matmul");
      expect_close(h.run(*ref, *k3, rows), h.run(*be, *k4, rows), 0.0, "get_rows");
      if (GetParam() == "cuda") { // the fast routes: int8 products (≤ 8 rows), f16/bf16 tensor-core tiles
        auto fast = make("cuda", {{"exact_logits", false}}).be;
        auto k5 = store(1, 4);
        expect_close(want, h.run(*fast, *k5, y), 2e-2, "matmul, exact_matmul = false");
      }
    }
}

// The output head under exact_logits (the default) on a block type, cpu and cuda: the int8 route for the
// whole vocabulary, then each row's `logits_rescore` highest recomputed exactly — the arg-max and every
// logit greedy or a small top-k reads are the reference's; the tail is within the int8 route's error.
// logits_rescore = 0: the whole head exact.
TEST(OutputHead, TheHighestLogitsAreExactAndTheRestWithinTheInt8Error) {
  std::vector<std::string> names;
  for (const char* name : {"cpu", "cuda"})
    if (make(name).be) names.emplace_back(name);
  if (names.empty()) GTEST_SKIP() << "SKIPPED: neither cpu nor cuda can run here";
  auto ref = make_reference_backend();
  for (const std::string& name : names)
    for (const DType type : {DType::q4_0, DType::q8_0, DType::q4_k, DType::q6_k, DType::q5_0})
      for (const int32_t T : {1, 3}) {
        SCOPED_TRACE(name + " " + std::string(dtype_name(type)) + " T=" + std::to_string(T));
        Rand r(static_cast<uint32_t>(T * 7 + static_cast<int>(type)));
        const int64_t N = 3000;
        Harness h(T);
        const int32_t y = h.matmul(type, 256, N, r).y; // the graph's output: the head
        auto fast = make(name).be, exact = make(name, {{"logits_rescore", int64_t{0}}}).be;
        auto k1 = store(1, 4), k2 = store(1, 4), k3 = store(1, 4); // (after the backends: pools they own)
        const std::vector<float> want = h.run(*ref, *k1, y);
        const std::vector<float> got = h.run(*fast, *k2, y);
        expect_close(want, got, 2e-2, "every logit, within the int8 route's error");
        for (int32_t t = 0; t < T; ++t) {
          std::vector<int64_t> order(static_cast<size_t>(N));
          std::iota(order.begin(), order.end(), 0);
          const float* wt = want.data() + t * N;
          std::partial_sort(order.begin(), order.begin() + 32, order.end(),
                            [&](int64_t a, int64_t b) { return wt[a] > wt[b]; });
          for (size_t i = 0; i < 32; ++i) // the 32 highest: exact (the 64 rescored, less a margin)
            EXPECT_NEAR(got[static_cast<size_t>(t * N + order[i])], wt[order[i]], 1e-4)
                << "row " << t << ", the " << i + 1 << "th highest logit";
        }
        expect_close(want, h.run(*exact, *k3, y), 1e-4, "logits_rescore = 0: every logit exact");
      }
}

// Attention over a KV pool the backend owns: a prefill of two interleaved sequences, each then in a run of
// its own, then a decode-sized batch, every KV type, GQA / MQA / MHA, sliding window with sinks, soft-cap.
TEST_P(BackendOps, AttentionOverThePagedPoolForEveryKvType) {
  LOOM_BACKEND_OR_SKIP(m);
  auto ref = make_reference_backend();
  struct Case {
    int32_t n_head, n_head_kv, head_dim, window;
    float softcap;
    int32_t sinks;
  };
  for (const DType dt : {DType::f32, DType::f16, DType::bf16, DType::q8_0})
    for (const Case c :
         {Case{4, 4, 32, 0, 0.0f, 0}, Case{8, 2, 64, 0, 0.0f, 0}, Case{8, 1, 128, 0, 0.0f, 0},
          Case{4, 2, 64, 5, 0.0f, 2}, Case{2, 1, 32, 20, 30.0f, 0}, Case{6, 3, 96, 9, 0.0f, 1},
          Case{4, 1, 256, 0, 0.0f, 0}, Case{4, 1, 256, 12, 0.0f, 0}}) { // (256: Gemma 3's heads)
      if (!m.be->supports_kv_dtype(dt)) continue;
      const std::string what = std::string(dtype_name(dt)) + " Hq=" + std::to_string(c.n_head) +
                               " Hkv=" + std::to_string(c.n_head_kv) + " D=" + std::to_string(c.head_dim) +
                               " window=" + std::to_string(c.window) + " sinks=" + std::to_string(c.sinks);
      SCOPED_TRACE(what);
      auto be = under_test().be; // (fresh, as above; the batches' graphs are all kept alive below)
      auto kv_ref = store(c.n_head_kv, c.head_dim, dt), kv_be = store(c.n_head_kv, c.head_dim, dt);
      std::vector<std::unique_ptr<Harness>> kept;
      AttentionParams p{
          0,        c.n_head, c.n_head_kv, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
          c.window, c.softcap};
      p.sinks = c.sinks;
      Rand r(static_cast<uint32_t>(c.n_head * 31 + c.head_dim));
      int32_t done = 0;
      for (const auto& [per_seq, interleaved] :
           {std::pair{40, true}, std::pair{9, false}, std::pair{1, false}}) {
        const int32_t T = 2 * per_seq;
        Harness& h = *kept.emplace_back(std::make_unique<Harness>(T));
        h.pos.clear();
        h.seq.clear();
        for (int32_t i = 0; i < T; ++i) {
          const SeqId s = interleaved ? i % 2 : i / per_seq;
          const int32_t k = interleaved ? i / 2 : i % per_seq;
          h.pos.push_back(done + k);
          h.seq.push_back(s);
        }
        for (SeqId s : {0, 1}) {
          ASSERT_TRUE(kv_ref->allocate(s, per_seq));
          ASSERT_TRUE(kv_be->allocate(s, per_seq));
        }
        const int64_t qe = static_cast<int64_t>(c.n_head) * c.head_dim,
                      ke = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
        const int32_t q = h.input(r, {c.head_dim, c.n_head, T, 1});
        const int32_t k = h.input(r, {c.head_dim, c.n_head_kv, T, 1});
        const int32_t v = h.input(r, {c.head_dim, c.n_head_kv, T, 1});
        Node an;
        an.attn = p;
        const int32_t out = h.op(OpKind::attention, q, k, {qe, T, 1, 1}, an, v);
        (void)ke;
        expect_close(h.run(*ref, *kv_ref, out), h.run(*be, *kv_be, out), 1e-4,
                     "batch of " + std::to_string(T));
        done += per_seq;
      }
    }
}

// stories260K end to end on a cuda pipeline (cfg) against the reference pipeline: the greedy tokens of six
// prompts, the six batched equal to each alone, and a paged store with a prefix cache and too few blocks
// (preemption) changes no token.
void expect_cuda_runs_match(const PipelineConfig& cfg, Pipeline& ref) {
  auto p = Pipeline::create(cfg);
  std::vector<GenerationRequest> reqs;
  for (const char* s : {"Once upon a time", "The little dog", "", "Lily", "Tom and Sue", "One day"}) {
    GenerationRequest q;
    q.prompt = s;
    q.max_new_tokens = 40;
    reqs.push_back(q);
  }
  std::vector<GenerationResult> alone;
  for (const auto& q : reqs) {
    alone.push_back(p->generate(q));
    EXPECT_EQ(alone.back().tokens, ref.generate(q).tokens) << q.prompt;
  }
  const auto batched = p->generate_all(reqs, 6);
  auto paged_cfg = cfg;
  paged_cfg.kv_cache.store = "paged";
  paged_cfg.kv_cache.block_size = 16;
  paged_cfg.kv_cache.prefix_cache = true;
  paged_cfg.kv_cache.max_tokens = 160; // 10 blocks for six requests of up to 50 positions: preemption
  paged_cfg.stop.eos = false;
  auto paged = Pipeline::create(paged_cfg);
  const auto squeezed = paged->generate_all(reqs, 6);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(reqs[i].prompt);
    EXPECT_EQ(batched[i].tokens, alone[i].tokens);
    const size_t n = std::min(squeezed[i].tokens.size(), alone[i].tokens.size());
    EXPECT_TRUE(std::equal(alone[i].tokens.begin(), alone[i].tokens.begin() + static_cast<std::ptrdiff_t>(n),
                           squeezed[i].tokens.begin()));
  }
  EXPECT_GT(paged->engine().stats().preemptions, 0u) << "the budget was meant to force preemption";
}

// The above on the cuda backend (exact f32 GEMMs), eager and with decode steps replayed as CUDA graphs; the
// reference backend is held to run.c by the golden tests. Label `plugin`, not `golden`: it is SKIPPED with
// the reason where no GPU is (scripts/gpu-check.sh runs it on one).
TEST(CudaBackendEndToEnd, GreedyBatchedAndPagedRunsMatchTheReference) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  if (!std::filesystem::exists(std::string(LOOM_BUILD_BIN_DIR) + "/libloom-backend-cuda.so"))
    GTEST_SKIP() << "SKIPPED: the cuda backend was not built (no nvcc)";
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.model.n_ctx = 512;
  cfg.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
  cfg.backend.name = "reference";
  auto ref = Pipeline::create(cfg);
  cfg.backend.name = "cuda";
  cfg.plugins.paths = {LOOM_BUILD_BIN_DIR};
  if (const Made m = make("cuda"); !m.be) GTEST_SKIP() << "SKIPPED: " << m.why;
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "cuda graphs" : "eager");
    cfg.backend.params = {{"exact_matmul", true}, {"cuda_graphs", graphs}};
    expect_cuda_runs_match(cfg, *ref);
  }
}

// A long span read by one token (decode at depth): a device backend splits it over several blocks and
// merges them (split-K), the cpu backend into chunks of 256 keys on any thread; causal and windows with
// sinks, f16 and q8_0 KV.
TEST_P(BackendOps, AttentionOfOneTokenOverALongSpan) {
  LOOM_BACKEND_OR_SKIP(m);
  auto ref = make_reference_backend();
  for (const DType dt : {DType::f16, DType::q8_0})
    for (const int32_t window : {0, 300, 560}) { // 560: a split span with the sinks before it
      SCOPED_TRACE(std::string(dtype_name(dt)) + " window=" + std::to_string(window));
      auto be = under_test().be;
      auto kv_ref = store(2, 64, dt, 1024), kv_be = store(2, 64, dt, 1024);
      AttentionParams p{0, 8, 2, 64, 0.125f, window, 0.0f};
      p.sinks = window > 0 ? 4 : 0;
      Rand r(5);
      std::vector<std::unique_ptr<Harness>> kept;
      int32_t done = 0;
      for (const int32_t T : {600, 1, 1}) { // the decodes: 601 and 602 keys (cuda: three splits, window 300:
                                            // two; cpu: chunks of 256 keys, two)
        Harness& h = *kept.emplace_back(std::make_unique<Harness>(T));
        for (int32_t i = 0; i < T; ++i)
          h.pos[static_cast<size_t>(i)] = done + i;
        const int32_t q = h.input(r, {64, 8, T, 1});
        const int32_t k = h.input(r, {64, 2, T, 1});
        const int32_t v = h.input(r, {64, 2, T, 1});
        Node an;
        an.attn = p;
        const int32_t out = h.op(OpKind::attention, q, k, {64 * 8, T, 1, 1}, an, v);
        expect_close(h.run(*ref, *kv_ref, out), h.run(*be, *kv_be, out), 1e-4,
                     "batch of " + std::to_string(T));
        done += T;
      }
    }
}

// Token trees (speculative decoding): a tree of drafts evaluated in one forward — each node rotated at its
// depth, attending the committed tokens and its ancestors — gives at every node the logits of its path
// evaluated alone as plain tokens (stories260K, f32 and f16 KV, a paged store with blocks smaller than
// the tree).
TEST_P(BackendOps, TreeRowsGiveTheLogitsOfTheirPathsAlone) {
  LOOM_BACKEND_OR_SKIP(m); // (cuda: [backend] tree_attention is on by default)
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  if (!m.be->supports_attention(AttnKernel::auto_, attn_tree))
    GTEST_SKIP() << "SKIPPED: " << GetParam() << " runs no token-tree rows";
  auto mdl = Model::load(model.string());
  const int32_t V = mdl->config().n_vocab;
  const std::vector<TokenId> prompt{1, 403, 407, 1209 % V, 282, 260, 300, 10};
  // node: token, parent (-1: the last prompt token); depths 1 2 3 2 1 2 3 4 4
  const std::vector<TokenId> tok{5, 6, 7, 8, 9, 10, 11, 12, 13};
  const std::vector<int32_t> par{-1, 0, 1, 0, -1, 4, 5, 2, 6};
  for (const DType dt : {DType::f32, DType::f16}) {
    if (!m.be->supports_kv_dtype(dt)) continue;
    SCOPED_TRACE(dtype_name(dt));
    auto be = under_test().be;
    KVShape shape = mdl->kv_shape(64, 2);
    shape.dtype = dt;
    shape.block_size = 4;
    auto kv = make_paged_kv_cache(shape);
    const auto run = [&](const BatchView& b, SeqId seq, int32_t n_new) {
      EXPECT_TRUE(kv->allocate(seq, n_new));
      std::vector<float> logits(b.output_rows.size() * static_cast<size_t>(V));
      mdl->forward(*be, b, *kv, logits);
      return logits;
    };
    const auto plain = [&](const std::vector<TokenId>& toks, SeqId seq, Pos from) {
      std::vector<Pos> pos;
      for (size_t i = 0; i < toks.size(); ++i)
        pos.push_back(from + static_cast<Pos>(i));
      const std::vector<SeqId> seqs(toks.size(), seq);
      const std::vector<int32_t> out{static_cast<int32_t>(toks.size()) - 1};
      return run(BatchView{toks, pos, seqs, out}, seq, static_cast<int32_t>(toks.size()));
    };
    // The prompt but its last token, then that token and the whole tree in one batch.
    const auto n = static_cast<Pos>(prompt.size());
    (void)plain(std::vector<TokenId>(prompt.begin(), prompt.end() - 1), 0, 0);
    std::vector<TokenId> toks{prompt.back()};
    std::vector<Pos> pos{n - 1}, rope{n - 1}, base{n};
    std::vector<uint64_t> mask{0};
    std::vector<int32_t> depth(tok.size());
    for (size_t i = 0; i < tok.size(); ++i) {
      depth[i] = par[i] < 0 ? 1 : depth[static_cast<size_t>(par[i])] + 1;
      uint64_t bits = 0;
      for (auto j = static_cast<int32_t>(i); j >= 0; j = par[static_cast<size_t>(j)])
        bits |= uint64_t{1} << j;
      toks.push_back(tok[i]);
      pos.push_back(n + static_cast<Pos>(i));
      rope.push_back(n - 1 + depth[i]);
      base.push_back(n);
      mask.push_back(bits);
    }
    const std::vector<SeqId> seqs(toks.size(), 0);
    std::vector<int32_t> out;
    for (size_t i = 0; i < toks.size(); ++i)
      out.push_back(static_cast<int32_t>(i));
    BatchView tb{toks, pos, seqs, out};
    tb.rope_positions = rope;
    tb.tree_base = base;
    tb.tree_mask = mask;
    const auto tree = run(tb, 0, static_cast<int32_t>(toks.size()));
    const auto row = [&](size_t r) {
      return std::vector<float>(tree.begin() + static_cast<std::ptrdiff_t>(r * static_cast<size_t>(V)),
                                tree.begin() + static_cast<std::ptrdiff_t>((r + 1) * static_cast<size_t>(V)));
    };
    expect_close(plain(prompt, 1, 0), row(0), 1e-4, "the root");
    kv->free(1);
    for (size_t i = 0; i < tok.size(); ++i) {
      std::vector<TokenId> path;
      for (auto j = static_cast<int32_t>(i); j >= 0; j = par[static_cast<size_t>(j)])
        path.insert(path.begin(), tok[static_cast<size_t>(j)]);
      std::vector<TokenId> all = prompt;
      all.insert(all.end(), path.begin(), path.end());
      expect_close(plain(all, 1, 0), row(1 + i), 1e-4, "node " + std::to_string(i));
      kv->free(1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, BackendOps, ::testing::Values("reference_plugin", "cpu", "cuda"),
                         [](const auto& p) { return p.param; });

} // namespace
