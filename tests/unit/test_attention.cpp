// Attention variants without a model: the reference kernel equals a softmax under the variant's explicit
// mask (causal, sliding window, attention sinks, soft-cap); the key span is the window plus the sinks;
// variants come from the model's configuration or the pipeline. (Variants on a model file — its metadata,
// a bounded KV cache over a long generation, a kernel the backend does not run:
// tests/integration/test_attention.cpp.)
#include "kv_rows.hpp"
#include "loom/attention.hpp"
#include "loom/attention/reference.hpp"
#include "loom/error.hpp"
#include "loom/kv/kv_cache.hpp"
#include "loom/model/model_config.hpp"

#include <cmath>
#include <gtest/gtest.h>
#include <random>
#include <string>

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

} // namespace
