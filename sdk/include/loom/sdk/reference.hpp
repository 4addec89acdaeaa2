// loom/sdk/reference.hpp — the reference executor: plain F32 C++, one op at a time, no tricks
// (header-only). It is the ground truth of every test: the host's built-in `reference` backend, the
// `reference_plugin` backend plugin and every fast kernel's tests run this very code. Accumulation
// order is sequential (as llama2.c's run.c), so results are reproducible. A third-party backend may
// use it as the fallback for ops it does not implement, or as the definition of each op.
#pragma once

#include "loom/sdk/error.hpp"
#include "loom/sdk/executor.hpp"
#include "loom/sdk/graph.hpp"
#include "loom/sdk/rope.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace loom {

namespace attention {

// The plain attention kernel every backend's kernel is tested against (the `naive` strategy).
// Standard (causal) and sliding-window variants, attention sinks and soft-capping; MHA/MQA/GQA
// follow from n_head_kv. For each batch row t (its sequence kv.seq_of(t), at position pos[t]) and head h:
//   out[t][h] = softmax_j( cap(scale · q[t][h] · K[seq, j][h / n_gqa]) ) · V[seq, j][h / n_gqa]
// over the cached positions j of key_span(p, pos[t]): [max(0, pos − window + 1), pos] (window 0 = all
// j ≤ pos) and, with a window, [0, sinks) besides; cap(s) = softcap · tanh(s / softcap) when softcap > 0.
// Scores are materialized per row, in f32 with a max-subtracted softmax. Rows outside the span are
// never read (a paged store may have released them).
//   q   [n_tokens][n_head][head_dim]
//   out [n_tokens][n_head][head_dim]
// Token-tree rows (rope, tree_base, tree_mask non-null; BatchView): row t attends the slots tree_attends()
// allows, the window taken at its rope position. sink_logits (non-null: the node's sink_logits as f32, n_head
// values) add e^(s_h − max) to head h's softmax denominator (attn_denominator).
inline void reference_attention(const AttentionParams& p, const float* q, int32_t n_tokens, const Pos* pos,
                                const KVRows& kv, float* out, const Pos* rope = nullptr,
                                const Pos* tree_base = nullptr, const uint64_t* tree_mask = nullptr,
                                const float* sink_logits = nullptr) {
  LOOM_ASSERT(p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0, "bad head grouping");
  const int32_t D = p.head_dim;
  const int32_t n_gqa = p.n_head / p.n_head_kv;
  std::vector<float> scores;
  // Rows stored in another type than f32 are read through kv_load (a head's slice at a time).
  const DType dt = kv.kv_dtype();
  std::vector<float> kbuf(static_cast<size_t>(D)), vbuf(static_cast<size_t>(D));
  const auto head = [&](void* row, int32_t hk, float* buf) -> const float* {
    if (dt == DType::f32)
      return static_cast<const float*>(row) + static_cast<size_t>(hk) * static_cast<size_t>(D);
    kv_load(dt, row, static_cast<int64_t>(hk) * D, D, buf);
    return buf;
  };
  std::vector<Pos> keys;
  for (int32_t t = 0; t < n_tokens; ++t) {
    keys.clear();
    if (tree_base) {
      const KeySpan span = key_span(p, rope[t]);
      for (Pos j = 0; j <= pos[t]; ++j)
        if (tree_attends(span, pos[t], tree_base[t], tree_mask[t], j)) keys.push_back(j);
    } else {
      const KeySpan span = key_span(p, pos[t]);
      for (Pos j = 0; j < span.sink_end; ++j)
        keys.push_back(j);
      for (Pos j = span.first; j <= span.last; ++j)
        keys.push_back(j);
    }
    scores.resize(keys.size());
    for (int32_t h = 0; h < p.n_head; ++h) {
      const int32_t hk = h / n_gqa;
      const float* qh =
          q + (static_cast<size_t>(t) * static_cast<size_t>(p.n_head) + static_cast<size_t>(h)) *
                  static_cast<size_t>(D);
      float max_s = -INFINITY;
      for (size_t i = 0; i < keys.size(); ++i) {
        const float* k = head(kv.k_at(p.layer, kv.seq_of(static_cast<size_t>(t)), keys[i]), hk, kbuf.data());
        float s = 0.0f;
        for (int32_t d = 0; d < D; ++d)
          s += qh[d] * k[d];
        s *= p.scale;
        if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
        scores[i] = s;
        max_s = std::max(max_s, s);
      }
      float sum = 0.0f;
      for (auto& s : scores) {
        s = std::exp(s - max_s);
        sum += s;
      }
      sum = attn_denominator(sink_logits, h, max_s, sum);
      float* o = out + (static_cast<size_t>(t) * static_cast<size_t>(p.n_head) + static_cast<size_t>(h)) *
                           static_cast<size_t>(D);
      std::fill(o, o + D, 0.0f);
      for (size_t i = 0; i < keys.size(); ++i) {
        const float w = scores[i] / sum;
        const float* v = head(kv.v_at(p.layer, kv.seq_of(static_cast<size_t>(t)), keys[i]), hk, vbuf.data());
        for (int32_t d = 0; d < D; ++d)
          o[d] += w * v[d];
      }
    }
  }
}

} // namespace attention

// Runs every op of the graph (weights of any dequantizable type, a row at a time).
class ReferenceBackend final : public Backend {
public:
  std::string_view name() const noexcept override { return "reference"; }
  bool supports_kv_dtype(DType t) const noexcept override { return kv_dtype_valid(t); }
  // Every variant, with materialized scores (the naive strategy) only; it reads only each query's span.
  bool supports_attention(AttnKernel k, uint32_t) const noexcept override { return k != AttnKernel::flash; }

  bool supports(const Graph& g, const Node& n) const noexcept override { return weights_dequantizable(g, n); }

  void compute(const Graph& g, const BatchView& batch, const KVRows& kv, std::span<float> logits) override {
    check_batch(g, batch);
    act_.resize(g.tensors.size());
    size_t ws = 0;
    for (size_t i = 0; i < g.tensors.size(); ++i) {
      const TensorDesc& t = g.tensors[i];
      if (t.kind == TensorKind::activation) {
        act_[i].resize(static_cast<size_t>(t.n_elements()));
        ws += act_[i].size() * sizeof(float);
      }
    }
    workspace_ = ws;
    for (const Node& n : g.nodes)
      run(g, n, batch, kv);
    const auto& out = act_[static_cast<size_t>(g.out_logits)];
    LOOM_ASSERT(logits.size() >= out.size(), "logits buffer too small");
    std::copy(out.begin(), out.end(), logits.begin());
  }

  size_t workspace_bytes() const noexcept override { return workspace_; }

private:
  float* f32(int32_t id) { return act_[static_cast<size_t>(id)].data(); }

  std::span<const int32_t> ints(const Graph& g, int32_t id, const BatchView& b) const {
    if (id == g.in_tokens) return b.tokens;
    if (id == g.in_positions) return b.rope_positions.empty() ? b.positions : b.rope_positions;
    if (id == g.in_out_ids) return b.output_rows;
    LOOM_ASSERT(false, "integer tensor that is not a graph input");
    return {};
  }

  // Row r of tensor id as f32 (dequantized into `tmp` for weights).
  const float* row(const Graph& g, int32_t id, int64_t r, std::vector<float>& tmp) {
    const TensorDesc& t = g.tensors[static_cast<size_t>(id)];
    if (t.kind == TensorKind::weight) {
      const auto* base = static_cast<const uint8_t*>(t.data);
      const size_t rb = row_bytes(t.dtype, t.ne[0]);
      if (t.dtype == DType::f32) return reinterpret_cast<const float*>(base + static_cast<size_t>(r) * rb);
      tmp.resize(static_cast<size_t>(t.ne[0]));
      dequantize_row(t.dtype, base + static_cast<size_t>(r) * rb, tmp.data(), t.ne[0]);
      return tmp.data();
    }
    return act_[static_cast<size_t>(id)].data() + r * t.ne[0];
  }

  // One function: a switch over the ops (a dispatch table in all but name), each case one op in plain loops.
  void run(const Graph& g, const Node& n, const BatchView& b, const KVRows& kv) {
    const TensorDesc& d = g.tensors[static_cast<size_t>(n.dst)];
    float* dst = f32(n.dst);
    switch (n.op) {
    case OpKind::get_rows: {
      const auto idx = ints(g, n.src[1], b);
      const TensorDesc& s = g.tensors[static_cast<size_t>(n.src[0])];
      std::vector<float> tmp;
      for (size_t r = 0; r < idx.size(); ++r) {
        LOOM_ASSERT(idx[r] >= 0 && idx[r] < s.n_rows(), "get_rows index out of range");
        const float* src = row(g, n.src[0], idx[r], tmp);
        std::copy(src, src + s.ne[0], dst + static_cast<int64_t>(r) * s.ne[0]);
      }
      return;
    }
    case OpKind::rms_norm: {
      const TensorDesc& s = g.tensors[static_cast<size_t>(n.src[0])];
      const int64_t len = s.ne[0];
      std::vector<float> tmp;
      const float* w = n.src[1] >= 0 ? row(g, n.src[1], 0, tmp) : nullptr;
      for (int64_t r = 0; r < s.n_rows(); ++r) {
        const float* x = f32(n.src[0]) + r * len;
        float ss = 0.0f;
        for (int64_t i = 0; i < len; ++i)
          ss += x[i] * x[i];
        ss /= static_cast<float>(len);
        ss += n.eps;
        ss = 1.0f / std::sqrt(ss);
        float* y = dst + r * len;
        for (int64_t i = 0; i < len; ++i)
          y[i] = (w ? w[i] : 1.0f) * (ss * x[i]);
      }
      return;
    }
    case OpKind::matmul: {
      const TensorDesc& w = g.tensors[static_cast<size_t>(n.src[0])];
      const TensorDesc& x = g.tensors[static_cast<size_t>(n.src[1])];
      const int64_t K = w.ne[0], N = w.ne[1], T = x.n_rows();
      LOOM_ASSERT(x.ne[0] == K, "matmul inner dimensions differ");
      const float* xs = f32(n.src[1]);
      std::vector<float> tmp;
      for (int64_t j = 0; j < N; ++j) {
        const float* wr = row(g, n.src[0], j, tmp);
        for (int64_t t = 0; t < T; ++t) {
          const float* xr = xs + t * K;
          float v = 0.0f;
          for (int64_t k = 0; k < K; ++k)
            v += wr[k] * xr[k];
          dst[t * N + j] = v;
        }
      }
      return;
    }
    case OpKind::rope: {
      const TensorDesc& s = g.tensors[static_cast<size_t>(n.src[0])];
      const auto pos = ints(g, n.src[1], b);
      const int64_t D = s.ne[0], H = s.ne[1], T = s.ne[2];
      const float* x = f32(n.src[0]);
      std::copy(x, x + s.n_elements(), dst);
      std::vector<float> cs(static_cast<size_t>(n.rope.n_dims / 2)), sn(cs.size()), ff_tmp;
      const float* ff = n.src[2] >= 0 ? row(g, n.src[2], 0, ff_tmp) : nullptr; // frequency divisors
      for (int64_t t = 0; t < T; ++t) {
        rope_table(n.rope, pos[static_cast<size_t>(t)], cs.data(), sn.data(), ff);
        for (int64_t h = 0; h < H; ++h)
          rope_rotate(n.rope, cs.data(), sn.data(), dst + (t * H + h) * D);
      }
      return;
    }
    case OpKind::attention: {
      const TensorDesc& q = g.tensors[static_cast<size_t>(n.src[0])];
      const AttentionParams& p = n.attn;
      const int64_t T = q.ne[2];
      const auto row_elems = static_cast<size_t>(p.n_head_kv) * static_cast<size_t>(p.head_dim);
      const float* k = f32(n.src[1]);
      const float* v = f32(n.src[2]);
      for (int64_t t = 0; t < T; ++t) { // store this batch's K/V rows at their slots first
        kv_store(kv.kv_dtype(), k + static_cast<size_t>(t) * row_elems,
                 kv.k_new(p.layer, static_cast<size_t>(t)), static_cast<int64_t>(row_elems));
        kv_store(kv.kv_dtype(), v + static_cast<size_t>(t) * row_elems,
                 kv.v_new(p.layer, static_cast<size_t>(t)), static_cast<int64_t>(row_elems));
      }
      std::vector<float> sink_tmp;
      const float* sink_logits = p.sink_logits >= 0 ? row(g, p.sink_logits, 0, sink_tmp) : nullptr;
      if (b.has_tree())
        attention::reference_attention(p, f32(n.src[0]), static_cast<int32_t>(T), b.positions.data(), kv, dst,
                                       b.rope_positions.data(), b.tree_base.data(), b.tree_mask.data(),
                                       sink_logits);
      else
        attention::reference_attention(p, f32(n.src[0]), static_cast<int32_t>(T), b.positions.data(), kv, dst,
                                       nullptr, nullptr, nullptr, sink_logits);
      return;
    }
    case OpKind::swiglu: {
      const float* a = f32(n.src[0]);
      const float* c = f32(n.src[1]);
      for (int64_t i = 0; i < d.n_elements(); ++i) {
        const float v = a[i];
        dst[i] = v * (1.0f / (1.0f + std::exp(-v))) * c[i];
      }
      return;
    }
    case OpKind::add: { // a smaller src1 repeats (a bias over each token's q, k or v)
      const float* a = f32(n.src[0]);
      const TensorDesc& c = g.tensors[static_cast<size_t>(n.src[1])];
      std::vector<float> cv(static_cast<size_t>(c.n_elements())), tmp;
      for (int64_t r = 0; r < c.n_rows(); ++r) {
        const float* cr = row(g, n.src[1], r, tmp);
        std::copy(cr, cr + c.ne[0], cv.begin() + r * c.ne[0]);
      }
      for (int64_t i = 0; i < d.n_elements(); ++i)
        dst[i] = a[i] + cv[static_cast<size_t>(i % c.n_elements())];
      return;
    }
    case OpKind::geglu: {
      const float* a = f32(n.src[0]);
      const float* c = f32(n.src[1]);
      for (int64_t i = 0; i < d.n_elements(); ++i)
        dst[i] = gelu_tanh(a[i]) * c[i];
      return;
    }
    case OpKind::softcap: {
      const float* a = f32(n.src[0]);
      for (int64_t i = 0; i < d.n_elements(); ++i)
        dst[i] = n.scale * std::tanh(a[i] / n.scale);
      return;
    }
    case OpKind::mul: {
      const float* a = f32(n.src[0]);
      const TensorDesc& c = g.tensors[static_cast<size_t>(n.src[1])];
      std::vector<float> tmp;
      for (int64_t r = 0; r < d.n_rows(); ++r) {
        const float* cr = row(g, n.src[1], c.n_rows() == 1 ? 0 : r, tmp);
        for (int64_t i = 0; i < d.ne[0]; ++i)
          dst[r * d.ne[0] + i] = a[r * d.ne[0] + i] * cr[i];
      }
      return;
    }
    case OpKind::scale: {
      const float* a = f32(n.src[0]);
      for (int64_t i = 0; i < d.n_elements(); ++i)
        dst[i] = a[i] * n.scale;
      return;
    }
    case OpKind::softmax: {
      const float* a = f32(n.src[0]);
      for (int64_t r = 0; r < d.n_rows(); ++r)
        softmax_row(a + r * d.ne[0], dst + r * d.ne[0], d.ne[0]);
      return;
    }
    case OpKind::moe_route: {
      const TensorDesc& lg = g.tensors[static_cast<size_t>(n.src[0])];
      const auto E = static_cast<int32_t>(lg.ne[0]);
      const int64_t k = d.ne[0];
      LOOM_ASSERT(k == n.moe.n_used && k <= E && d.ne[1] == 2, "moe_route: the route's shape");
      std::vector<float> tmp;
      const float* bias = n.src[1] >= 0 ? row(g, n.src[1], 0, tmp) : nullptr;
      MoeScratch scratch;
      for (int64_t t = 0; t < lg.n_rows(); ++t)
        moe_route_token(n.moe, f32(n.src[0]) + t * E, bias, E, dst + t * 2 * k, dst + t * 2 * k + k, scratch);
      return;
    }
    case OpKind::matmul_id: {
      const TensorDesc& w = g.tensors[static_cast<size_t>(n.src[0])];
      const TensorDesc& x = g.tensors[static_cast<size_t>(n.src[1])];
      const int64_t K = w.ne[0], N = w.ne[1], E = w.ne[2], k = d.ne[1], T = d.ne[2];
      LOOM_ASSERT(x.ne[0] == K && (x.ne[1] == 1 || x.ne[1] == k), "matmul_id: operand shapes");
      const float* route = f32(n.src[2]);
      std::vector<float> tmp;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < k; ++i) {
          const auto e = static_cast<int64_t>(route[t * 2 * k + i]);
          LOOM_ASSERT(e >= 0 && e < E, "matmul_id: an expert id outside the weights");
          const float* xr = f32(n.src[1]) + (t * x.ne[1] + (x.ne[1] == 1 ? 0 : i)) * K;
          for (int64_t j = 0; j < N; ++j) {
            const float* wr = row(g, n.src[0], e * N + j, tmp);
            float v = 0.0f;
            for (int64_t c = 0; c < K; ++c)
              v += wr[c] * xr[c];
            dst[(t * k + i) * N + j] = v;
          }
        }
      return;
    }
    case OpKind::add_id: {
      const TensorDesc& y = g.tensors[static_cast<size_t>(n.src[0])];
      const TensorDesc& bias = g.tensors[static_cast<size_t>(n.src[1])];
      const int64_t N = y.ne[0], k = y.ne[1], T = y.ne[2];
      LOOM_ASSERT(bias.ne[0] == N, "add_id: the biases' rows");
      const float* route = f32(n.src[2]);
      std::vector<float> tmp;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < k; ++i) {
          const auto e = static_cast<int64_t>(route[t * 2 * k + i]);
          LOOM_ASSERT(e >= 0 && e < bias.n_rows(), "add_id: an expert id outside the biases");
          const float* br = row(g, n.src[1], e, tmp);
          const float* yr = f32(n.src[0]) + (t * k + i) * N;
          for (int64_t j = 0; j < N; ++j)
            dst[(t * k + i) * N + j] = yr[j] + br[j];
        }
      return;
    }
    case OpKind::swiglu_oai: {
      const float* a = f32(n.src[0]);
      const float* c = f32(n.src[1]);
      for (int64_t i = 0; i < d.n_elements(); ++i)
        dst[i] = swiglu_oai(n.glu, a[i], c[i]);
      return;
    }
    case OpKind::moe_combine: {
      const TensorDesc& y = g.tensors[static_cast<size_t>(n.src[0])];
      const int64_t N = y.ne[0], k = y.ne[1], T = y.ne[2];
      const float* route = f32(n.src[1]);
      for (int64_t t = 0; t < T; ++t) {
        const float* yt = f32(n.src[0]) + t * k * N;
        const float* wt = route + t * 2 * k + k;
        for (int64_t j = 0; j < N; ++j) {
          float v = 0.0f;
          for (int64_t i = 0; i < k; ++i)
            v += wt[i] * yt[i * N + j];
          dst[t * N + j] = v;
        }
      }
      return;
    }
    case OpKind::copy: {
      std::vector<float> tmp;
      for (int64_t r = 0; r < d.n_rows(); ++r) {
        const float* s = row(g, n.src[0], r, tmp);
        std::copy(s, s + d.ne[0], dst + r * d.ne[0]);
      }
      return;
    }
    }
    fail(Errc::unsupported, "reference", std::string("op ") + op_name(n.op) + " is not implemented");
  }

  std::vector<std::vector<float>> act_;
  size_t workspace_ = 0;
};

} // namespace loom
