// Attention variants: the reference kernel equals a softmax under the variant's explicit mask (causal,
// sliding window, attention sinks, soft-cap); variants come from the model's metadata or the
// pipeline; a sliding window releases the KV blocks it no longer reads, so a long generation holds a
// bounded KV cache and still gives the tokens of a store that keeps everything; backends say which
// kernels they run and a pipeline asking for another gets one clear line.
#include "kv_rows.hpp"
#include "loom/attention.hpp"
#include "loom/attention/reference.hpp"
#include "loom/error.hpp"
#include "loom/gguf.hpp"
#include "loom/kv_cache.hpp"
#include "loom/model.hpp"
#include "loom/model_config.hpp"
#include "loom/pipeline.hpp"
#include "test_util.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <gtest/gtest.h>
#include <random>
#include <unistd.h>

namespace {

using namespace loom;

// out[t][h] = Σ_j softmax_j(mask(t, j) ? cap(scale · q·k_j) : −∞) · v_j, over every j ≤ pos[t] — the
// textbook formula with a dense mask, written independently of key_span.
std::vector<float> masked_softmax(const AttentionParams& p, const std::vector<float>& q,
                                  const std::vector<float>& k, const std::vector<float>& v, int32_t T) {
  const int32_t D = p.head_dim, G = p.n_head / p.n_head_kv;
  std::vector<float> out(q.size(), 0.0f);
  for (int32_t t = 0; t < T; ++t)
    for (int32_t h = 0; h < p.n_head; ++h) {
      const int32_t hk = h / G;
      std::vector<double> s(static_cast<size_t>(t) + 1);
      double mx = -INFINITY;
      for (int32_t j = 0; j <= t; ++j) {
        const bool in_window = p.window <= 0 || j > t - p.window;
        const bool sink = p.window > 0 && j < p.sinks;
        if (!in_window && !sink) {
          s[static_cast<size_t>(j)] = -INFINITY;
          continue;
        }
        double d = 0;
        for (int32_t i = 0; i < D; ++i)
          d += static_cast<double>(q[static_cast<size_t>((t * p.n_head + h) * D + i)]) *
               static_cast<double>(k[static_cast<size_t>((j * p.n_head_kv + hk) * D + i)]);
        d *= static_cast<double>(p.scale);
        if (p.softcap > 0) d = static_cast<double>(p.softcap) * std::tanh(d / static_cast<double>(p.softcap));
        s[static_cast<size_t>(j)] = d;
        mx = std::max(mx, d);
      }
      double sum = 0;
      for (double& x : s) {
        x = std::exp(x - mx);
        sum += x;
      }
      for (int32_t j = 0; j <= t; ++j)
        for (int32_t i = 0; i < D; ++i)
          out[static_cast<size_t>((t * p.n_head + h) * D + i)] +=
              static_cast<float>(s[static_cast<size_t>(j)] / sum *
                                 static_cast<double>(v[static_cast<size_t>((j * p.n_head_kv + hk) * D + i)]));
    }
  return out;
}

TEST(Attention, ReferenceKernelEqualsTheSoftmaxUnderTheVariantsMask) {
  struct Case {
    int32_t window, sinks;
    float softcap;
  };
  const int32_t T = 23, Hq = 4, Hkv = 2, D = 6;
  for (const Case c : {Case{0, 0, 0.0f}, Case{5, 0, 0.0f}, Case{5, 3, 0.0f}, Case{1, 2, 0.0f},
                       Case{4, 1, 2.0f}, Case{30, 4, 0.0f}, Case{0, 0, 1.5f}}) {
    SCOPED_TRACE("window " + std::to_string(c.window) + " sinks " + std::to_string(c.sinks) + " softcap " +
                 std::to_string(c.softcap));
    AttentionParams p;
    p.n_head = Hq;
    p.n_head_kv = Hkv;
    p.head_dim = D;
    p.scale = 0.7f;
    p.window = c.window;
    p.sinks = c.sinks;
    p.softcap = c.softcap;
    std::mt19937 rng(static_cast<uint32_t>(c.window * 7 + c.sinks));
    std::normal_distribution<float> nd(0.0f, 1.5f);
    const auto fill = [&](size_t n) {
      std::vector<float> x(n);
      for (float& e : x)
        e = nd(rng);
      return x;
    };
    const auto q = fill(static_cast<size_t>(T * Hq * D)), k = fill(static_cast<size_t>(T * Hkv * D)),
               v = fill(static_cast<size_t>(T * Hkv * D));
    KVShape shape{1, Hkv, D, 64, 1, DType::f32};
    auto kv = make_contiguous_kv_cache(shape);
    ASSERT_TRUE(kv->allocate(0, T));
    for (int32_t t = 0; t < T; ++t) {
      loom::test::set_kv_f32(*kv, 0, 0, 0, t, std::span<const float>(k.data() + t * Hkv * D, Hkv * D));
      loom::test::set_kv_f32(*kv, 0, 1, 0, t, std::span<const float>(v.data() + t * Hkv * D, Hkv * D));
    }
    std::vector<Pos> pos(T);
    std::vector<SeqId> seq(T, 0);
    std::vector<TokenId> toks(T, 0);
    for (int32_t t = 0; t < T; ++t)
      pos[static_cast<size_t>(t)] = t;
    std::vector<float> got(q.size());
    const KVRows rows = kv->rows_for(BatchView{toks, pos, seq, {}});
    attention::reference_attention(p, q.data(), T, pos.data(), rows, got.data());
    const auto want = masked_softmax(p, q, k, v, T);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5) << "element " << i;
  }
}

TEST(Attention, KeySpanIsTheWindowPlusTheSinks) {
  AttentionParams p;
  p.window = 4;
  p.sinks = 2;
  const KeySpan a = key_span(p, 10); // [0, 2) ∪ [7, 10]
  EXPECT_EQ(a.sink_end, 2);
  EXPECT_EQ(a.first, 7);
  EXPECT_EQ(a.count(), 6);
  EXPECT_TRUE(a.contains(1));
  EXPECT_FALSE(a.contains(2));
  EXPECT_FALSE(a.contains(6));
  EXPECT_TRUE(a.contains(7));
  EXPECT_FALSE(a.contains(11));
  const KeySpan b = key_span(p, 3); // the window reaches the sinks: [0, 3]
  EXPECT_EQ(b.first, 0);
  EXPECT_EQ(b.sink_end, 0);
  EXPECT_EQ(b.count(), 4);
  p.window = 0; // causal: sinks mean nothing without a window
  EXPECT_EQ(key_span(p, 10).count(), 11);
  EXPECT_EQ(p.features(), 0u);
  p.window = 4;
  p.softcap = 30.0f;
  EXPECT_EQ(p.features(), attn_window | attn_softcap | attn_sinks);
}

ModelConfig four_layers() {
  ModelConfig mc;
  mc.n_layer = 4;
  return mc;
}

TEST(Attention, VariantsComeFromTheModelUnlessThePipelineChoosesOne) {
  ModelConfig mc = four_layers();
  auto v = make_attention_variant(mc, {});
  EXPECT_EQ(v->name(), "standard");
  EXPECT_EQ(v->features(), 0u);
  EXPECT_FALSE(v->retention().bounded());

  mc.sliding_window = 8;
  mc.sliding_layers = {true, true, true, false}; // gemma-style: every 4th layer attends in full
  mc.attn_softcap = 50.0f;
  v = make_attention_variant(mc, {});
  EXPECT_EQ(v->name(), "sliding_window");
  EXPECT_EQ(v->layer(0), (LayerAttention{8, 0, 50.0f}));
  EXPECT_EQ(v->layer(3), (LayerAttention{0, 0, 50.0f}));
  EXPECT_EQ(v->features(), attn_window | attn_softcap);
  EXPECT_FALSE(v->retention().bounded()) << "layer 3 reads every position";
  EXPECT_NE(v->describe().find("on 3 of 4 layers"), std::string::npos) << v->describe();

  AttentionChoice c;
  c.variant = "standard";
  v = make_attention_variant(mc, c);
  EXPECT_EQ(v->layer(0), (LayerAttention{0, 0, 50.0f}))
      << "standard overrides the window, keeps the soft-cap";
  c.softcap = 0.0f;
  EXPECT_EQ(make_attention_variant(mc, c)->layer(0), (LayerAttention{}));

  c = {};
  c.variant = "sliding_window";
  c.window = 16;
  c.sinks = 4;
  c.kernel = "flash";
  v = make_attention_variant(mc, c);
  for (int32_t l = 0; l < 4; ++l)
    EXPECT_EQ(v->layer(l), (LayerAttention{16, 4, 50.0f})) << "on every layer";
  EXPECT_EQ(v->kernel(), AttnKernel::flash);
  EXPECT_EQ(v->features(), attn_window | attn_softcap | attn_sinks);
  const KVRetention r = v->retention();
  ASSERT_TRUE(r.bounded());
  EXPECT_EQ(r.sinks, 4);
  EXPECT_EQ(r.window, 16);
  EXPECT_EQ(r.keep_from(100), 85 - KVRetention::k_slack);
  AttentionParams p;
  p.layer = 2;
  v->apply(p);
  EXPECT_EQ(p.window, 16);
  EXPECT_EQ(p.sinks, 4);
  EXPECT_EQ(p.kernel, AttnKernel::flash);

  c.kernel = "tiled";
  EXPECT_THROW(make_attention_variant(mc, c), Error);
  c = {};
  c.sinks = 2;
  EXPECT_THROW(make_attention_variant(four_layers(), c), Error) << "sinks without a window";
  c.variant = "diagonal";
  EXPECT_THROW(make_attention_variant(mc, c), Error);
}

// stories260K with attention metadata added (a sliding window, its layer pattern, a soft-cap).
std::filesystem::path with_attention_metadata(const std::filesystem::path& model, const std::string& name,
                                              const std::vector<bool>& pattern, int32_t window,
                                              float softcap) {
  const GgufFile f = GgufFile::open(model.string());
  GgufWriter w;
  for (const auto& kv : f.metadata())
    w.add(kv.key, kv.value);
  w.add_u32("llama.attention.sliding_window", static_cast<uint32_t>(window));
  if (!pattern.empty()) {
    GgufValue a;
    a.type = GgufType::array;
    a.elem_type = GgufType::boolean;
    for (bool b : pattern) {
      GgufValue e;
      e.type = GgufType::boolean;
      e.u = b ? 1 : 0;
      a.items.push_back(e);
    }
    w.add("llama.attention.sliding_window_pattern", a);
  }
  w.add_f32("llama.attn_logit_softcapping", softcap);
  for (const auto& t : f.tensors())
    w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  const auto out = std::filesystem::temp_directory_path() /
                   ("loom-attn-" + std::to_string(::getpid()) + "-" + name + ".gguf");
  w.write(out.string());
  return out;
}

TEST(Attention, TheModelsMetadataChoosesTheVariantPerLayer) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto path = with_attention_metadata(model, "pattern", {true, true, false, true, false}, 8, 30.0f);
  auto m = Model::load(path.string());
  EXPECT_EQ(m->config().sliding_window, 8);
  EXPECT_EQ(m->config().sliding_layers, (std::vector<bool>{true, true, false, true, false}));
  EXPECT_FLOAT_EQ(m->config().attn_softcap, 30.0f);
  // The variant reaches the graph: every attention node carries its layer's window and soft-cap.
  m->set_attention(make_attention_variant(m->config(), {}));
  const auto graph = m->graph(1, 1);
  const Graph& g = *graph;
  int32_t seen = 0;
  for (const Node& n : g.nodes)
    if (n.op == OpKind::attention) {
      EXPECT_EQ(n.attn.window, n.attn.layer == 2 || n.attn.layer == 4 ? 0 : 8) << n.attn.layer;
      EXPECT_FLOAT_EQ(n.attn.softcap, 30.0f);
      ++seen;
    }
  EXPECT_EQ(seen, 5);

  // Greedy text on the reference backend and on the cpu plugin (flash and naive kernels) agree.
  PipelineConfig cfg;
  cfg.model.path = path.string();
  cfg.model.n_ctx = 128;
  cfg.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
  GenerationRequest req;
  req.prompt = "Once upon a time";
  req.max_new_tokens = 40;
  const auto ref = Pipeline::create(cfg)->generate(req);
  LOOM_REQUIRE_BIN(); // the cpu plugin lies next to it
  cfg.plugins.paths = {std::filesystem::path(std::getenv("LOOM_BIN")).parent_path().string()};
  cfg.backend.name = "cpu";
  cfg.backend.threads = 1;
  for (const char* k : {"flash", "naive"}) {
    cfg.attention.kernel = k;
    EXPECT_EQ(Pipeline::create(cfg)->generate(req).tokens, ref.tokens) << k;
  }
  cfg.attention.variant = "standard"; // the pipeline overrides the file: another text
  EXPECT_NE(Pipeline::create(cfg)->generate(req).tokens, ref.tokens);

  // A pattern of the wrong length is a clear error naming the key.
  const auto bad = with_attention_metadata(model, "bad", {true, false}, 8, 0.0f);
  try {
    (void)Model::load(bad.string());
    ADD_FAILURE() << "a 2-entry pattern for 5 layers was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window_pattern' must be 5 bools"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
  std::filesystem::remove(bad);
}

PipelineConfig window_config(const std::filesystem::path& model, const std::string& store) {
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.model.n_ctx = 2100;
  cfg.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
  cfg.stop.eos = false; // generate the whole budget
  cfg.attention.variant = "sliding_window";
  cfg.attention.window = 64;
  cfg.attention.sinks = 4;
  cfg.kv_cache.store = store;
  cfg.kv_cache.block_size = 16;
  return cfg;
}

TEST(Attention, SlidingWindowKVStaysBoundedOverTwoThousandTokens) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  GenerationRequest req;
  req.prompt = "Once upon a time";
  req.max_new_tokens = 2000;
  auto paged = Pipeline::create(window_config(model, "paged"));
  const auto a = paged->generate(req);
  ASSERT_EQ(a.tokens.size(), 2000u) << a.message;
  // sinks (one block) + the window and its slack (96 positions: 6 blocks, 7 when not aligned) + the
  // block being written: at most 9 blocks of 16, whatever the length — not the 126 of 2,005 positions.
  EXPECT_LE(paged->engine().stats().peak_kv_units, 9);
  EXPECT_EQ(paged->engine().stats().plan_misses, 0u)
      << "released blocks are counted as the store counts them";
  EXPECT_LE(paged->engine().stats().peak_kv_units * 16, (KVRetention{4, 64}.bound_positions(16)));
  EXPECT_LE(paged->kv_store().units_in_use(), 0) << "all given back at the end";
  // The same tokens as a contiguous store that keeps every position (nothing released was needed).
  auto whole = Pipeline::create(window_config(model, "contiguous"));
  const auto b = whole->generate(req);
  EXPECT_EQ(a.tokens, b.tokens);
  // And a standard (full) attention run would need them all.
  auto full_cfg = window_config(model, "paged");
  full_cfg.attention = {};
  auto full = Pipeline::create(full_cfg);
  req.max_new_tokens = 300;
  (void)full->generate(req);
  EXPECT_GE(full->engine().stats().peak_kv_units, 19) << "305 positions in blocks of 16";
}

TEST(Attention, ABackendAskedForAKernelItDoesNotRunIsOneClearLine) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.attention.kernel = "flash"; // the reference backend materializes scores: naive only
  try {
    (void)Pipeline::create(cfg);
    ADD_FAILURE() << "flash on the reference backend was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), Errc::unsupported);
    EXPECT_NE(m.find("kernel = \"flash\""), std::string::npos) << m;
    EXPECT_NE(m.find("backend 'reference'"), std::string::npos) << m;
    EXPECT_NE(m.find("\"naive\""), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  cfg.attention.kernel = "naive";
  EXPECT_NO_THROW((void)Pipeline::create(cfg));
}

} // namespace
