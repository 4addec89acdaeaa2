// naive_backend — a minimal out-of-tree Loom backend, built against the installed SDK alone.
//
// Single-threaded f32: every weight is converted to f32 once, when the host loads the model
// (Backend::load; loom/sdk/dtype.hpp's dequantize_row), every op of the graph is a plain loop, the KV
// pool is host memory (the default Backend::alloc) read through the block tables of each batch. The SDK
// provides the rest: the graph as C++ (loom/sdk/graph.hpp), RoPE tables (loom/sdk/rope.hpp), the executor
// interface and the table that puts it behind the backend ABI (loom/sdk/executor.hpp,
// loom/sdk/executor_plugin.hpp).
//
//   [backend]
//   name = "naive"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <loom/sdk/dtype.hpp>
#include <loom/sdk/executor_plugin.hpp>
#include <loom/sdk/graph.hpp>
#include <loom/sdk/rope.hpp>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace {

using loom::BatchView;
using loom::Graph;
using loom::KVRows;
using loom::Node;
using loom::OpKind;
using loom::TensorDesc;
using loom::TensorKind;

class NaiveBackend final : public loom::Backend {
public:
  std::string_view name() const noexcept override { return "naive"; }

  // Every op, with weights of any type the SDK converts to f32.
  // Dense models without learned attention sinks: a mixture of experts' ops and sink logits are refused
  // (the model then says so in one line).
  bool supports(const Graph& g, const Node& n) const noexcept override {
    return n.op != OpKind::moe_route && n.op != OpKind::matmul_id && n.op != OpKind::moe_combine &&
           n.op != OpKind::add_id && n.op != OpKind::swiglu_oai &&
           !(n.op == OpKind::attention && n.attn.sink_logits >= 0) && loom::weights_dequantizable(g, n);
  }

  // The model's weights, once: each converted to f32 and kept under its id (what graph tensors carry).
  void load(std::span<const loom::WeightDesc> weights) override {
    for (const loom::WeightDesc& w : weights)
      (void)convert(w.tensor);
  }

  void compute(const Graph& g, const BatchView& b, const KVRows& kv, std::span<float> logits) override {
    loom::check_batch(g, b);
    g_ = &g;
    b_ = &b;
    values_.assign(g.tensors.size(), {});
    size_t bytes = 0;
    for (size_t i = 0; i < g.tensors.size(); ++i)
      if (g.tensors[i].kind == TensorKind::activation) {
        values_[i].assign(static_cast<size_t>(g.tensors[i].n_elements()), 0.0f);
        bytes += values_[i].size() * sizeof(float);
      }
    bytes_ = bytes;
    for (const Node& n : g.nodes)
      step(n, kv);
    const std::vector<float>& out = values_[static_cast<size_t>(g.out_logits)];
    if (logits.size() < out.size()) throw loom::sdk::Error("naive: logits buffer too small");
    std::copy(out.begin(), out.end(), logits.begin());
  }

  size_t workspace_bytes() const noexcept override { return bytes_; }

private:
  const TensorDesc& desc(int32_t id) const { return g_->tensors[static_cast<size_t>(id)]; }

  // A tensor as f32: an activation, or a weight as converted at load.
  const float* in(int32_t id) {
    const TensorDesc& t = desc(id);
    if (t.kind != TensorKind::weight) return values_[static_cast<size_t>(id)].data();
    return convert(t);
  }
  const float* convert(const TensorDesc& t) {
    std::vector<float>& w = weights_[t.weight];
    if (w.empty()) {
      w.resize(static_cast<size_t>(t.n_elements()));
      const size_t rb = loom::row_bytes(t.dtype, t.ne[0]);
      for (int64_t r = 0; r < t.n_rows(); ++r)
        loom::dequantize_row(t.dtype, static_cast<const uint8_t*>(t.data) + static_cast<size_t>(r) * rb,
                             w.data() + r * t.ne[0], t.ne[0]);
    }
    return w.data();
  }

  // An integer input of the graph, taken from the batch.
  std::span<const int32_t> ints(int32_t id) const {
    if (id == g_->in_tokens) return b_->tokens;
    if (id == g_->in_positions) return b_->positions;
    if (id == g_->in_out_ids) return b_->output_rows;
    throw loom::sdk::Error("naive: an integer tensor that is not a graph input");
  }

  void step(const Node& n, const KVRows& kv) {
    const TensorDesc& d = desc(n.dst);
    float* y = values_[static_cast<size_t>(n.dst)].data();
    const int64_t cols = d.ne[0], rows = d.n_rows(), total = d.n_elements();
    switch (n.op) {
    case OpKind::get_rows: { // y[r] = table[idx[r]]
      const float* table = in(n.src[0]);
      const auto idx = ints(n.src[1]);
      const int64_t width = desc(n.src[0]).ne[0], n_rows = desc(n.src[0]).n_rows();
      for (size_t r = 0; r < idx.size(); ++r) {
        if (idx[r] < 0 || idx[r] >= n_rows) throw loom::sdk::Error("naive: get_rows index out of range");
        std::memcpy(y + static_cast<int64_t>(r) * width, table + idx[r] * width,
                    static_cast<size_t>(width) * sizeof(float));
      }
      return;
    }
    case OpKind::rms_norm: { // y = x / rms(x) · w
      const float* x = in(n.src[0]);
      const float* w = n.src[1] >= 0 ? in(n.src[1]) : nullptr;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + r * cols;
        float sum_sq = 0.0f;
        for (int64_t i = 0; i < cols; ++i)
          sum_sq += xr[i] * xr[i];
        const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(cols) + n.eps);
        for (int64_t i = 0; i < cols; ++i)
          y[r * cols + i] = (w ? w[i] : 1.0f) * (inv * xr[i]);
      }
      return;
    }
    case OpKind::matmul: { // y[t][j] = Σ_k W[j][k] · x[t][k]
      const float* w = in(n.src[0]);
      const float* x = in(n.src[1]);
      const int64_t K = desc(n.src[0]).ne[0], N = desc(n.src[0]).ne[1], T = desc(n.src[1]).n_rows();
      if (desc(n.src[1]).ne[0] != K) throw loom::sdk::Error("naive: matmul inner dimensions differ");
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < N; ++j) {
          float acc = 0.0f;
          for (int64_t k = 0; k < K; ++k)
            acc += w[j * K + k] * x[t * K + k];
          y[t * N + j] = acc;
        }
      return;
    }
    case OpKind::rope: { // each head of token t rotated at positions[t]
      const float* x = in(n.src[0]);
      const auto pos = ints(n.src[1]);
      const int64_t D = d.ne[0], H = d.ne[1], T = d.ne[2];
      std::memcpy(y, x, static_cast<size_t>(total) * sizeof(float));
      std::vector<float> cs(static_cast<size_t>(n.rope.n_dims / 2)), sn(cs.size());
      const float* ff = n.src[2] >= 0 ? in(n.src[2]) : nullptr; // frequency divisors (Llama 3.1)
      for (int64_t t = 0; t < T; ++t) {
        loom::rope_table(n.rope, pos[static_cast<size_t>(t)], cs.data(), sn.data(), ff);
        for (int64_t h = 0; h < H; ++h)
          loom::rope_rotate(n.rope, cs.data(), sn.data(), y + (t * H + h) * D);
      }
      return;
    }
    case OpKind::attention:
      attend(n, kv, y);
      return;
    case OpKind::swiglu: {
      const float* gate = in(n.src[0]);
      const float* up = in(n.src[1]);
      for (int64_t i = 0; i < total; ++i)
        y[i] = gate[i] * (1.0f / (1.0f + std::exp(-gate[i]))) * up[i];
      return;
    }
    case OpKind::add: { // a smaller src1 repeats (a bias)
      const float* a = in(n.src[0]);
      const float* c = in(n.src[1]);
      const int64_t nc = desc(n.src[1]).n_elements();
      for (int64_t i = 0; i < total; ++i)
        y[i] = a[i] + c[i % nc];
      return;
    }
    case OpKind::geglu: {
      const float* gate = in(n.src[0]);
      const float* up = in(n.src[1]);
      for (int64_t i = 0; i < total; ++i)
        y[i] = loom::gelu_tanh(gate[i]) * up[i];
      return;
    }
    case OpKind::softcap: {
      const float* a = in(n.src[0]);
      for (int64_t i = 0; i < total; ++i)
        y[i] = n.scale * std::tanh(a[i] / n.scale);
      return;
    }
    case OpKind::mul: { // src1 broadcast along rows when it is one row
      const float* a = in(n.src[0]);
      const float* c = in(n.src[1]);
      const bool one_row = desc(n.src[1]).n_rows() == 1;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < cols; ++i)
          y[r * cols + i] = a[r * cols + i] * c[(one_row ? 0 : r) * cols + i];
      return;
    }
    case OpKind::scale: {
      const float* a = in(n.src[0]);
      for (int64_t i = 0; i < total; ++i)
        y[i] = a[i] * n.scale;
      return;
    }
    case OpKind::softmax: {
      const float* a = in(n.src[0]);
      for (int64_t r = 0; r < rows; ++r)
        softmax(a + r * cols, y + r * cols, cols);
      return;
    }
    case OpKind::copy: {
      const float* a = in(n.src[0]);
      std::memcpy(y, a, static_cast<size_t>(total) * sizeof(float));
      return;
    }
    case OpKind::moe_route: // (refused by supports)
    case OpKind::matmul_id:
    case OpKind::moe_combine:
    case OpKind::add_id:
    case OpKind::swiglu_oai:
      break;
    }
    throw loom::sdk::Error(std::string("naive: op ") + loom::op_name(n.op) + " is not implemented",
                           loom::Errc::unsupported);
  }

  static void softmax(const float* x, float* y, int64_t n) {
    float m = x[0];
    for (int64_t i = 1; i < n; ++i)
      m = std::max(m, x[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      y[i] = std::exp(x[i] - m);
      sum += y[i];
    }
    for (int64_t i = 0; i < n; ++i)
      y[i] /= sum;
  }

  // Writes the batch's K/V rows at their slots, then for each token and head attends causally over
  // positions [pos − window + 1, pos] of its sequence (window 0: from 0), read through its block table;
  // head h reads KV head h / (n_head / n_head_kv). f32 KV only (supports_kv_dtype's default).
  void attend(const Node& n, const KVRows& kv, float* y) {
    const loom::AttentionParams& p = n.attn;
    if (p.n_head <= 0 || p.n_head_kv <= 0 || p.n_head % p.n_head_kv != 0)
      throw loom::sdk::Error("naive: bad attention head grouping");
    const float* q = in(n.src[0]);
    const float* k = in(n.src[1]);
    const float* v = in(n.src[2]);
    const int64_t D = p.head_dim, row = static_cast<int64_t>(p.n_head_kv) * D;
    const int64_t T = desc(n.src[0]).ne[2];
    const int32_t group = p.n_head / p.n_head_kv;
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(kv.k_new(p.layer, static_cast<size_t>(t)), k + t * row,
                  static_cast<size_t>(row) * sizeof(float));
      std::memcpy(kv.v_new(p.layer, static_cast<size_t>(t)), v + t * row,
                  static_cast<size_t>(row) * sizeof(float));
    }
    std::vector<float> score, weight;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t s = kv.seq_of(static_cast<size_t>(t));
      const loom::Pos last = b_->positions[static_cast<size_t>(t)];
      const loom::Pos first = p.window > 0 ? std::max<loom::Pos>(0, last - p.window + 1) : 0;
      const auto n_keys = static_cast<int64_t>(last - first + 1);
      score.resize(static_cast<size_t>(n_keys));
      weight.resize(score.size());
      for (int32_t h = 0; h < p.n_head; ++h) {
        const int64_t kv_off = (h / group) * D;
        const float* qh = q + (t * p.n_head + h) * D;
        for (int64_t j = 0; j < n_keys; ++j) {
          const float* kr =
              reinterpret_cast<const float*>(kv.k_at(p.layer, s, first + static_cast<loom::Pos>(j))) + kv_off;
          float dot = 0.0f;
          for (int64_t i = 0; i < D; ++i)
            dot += qh[i] * kr[i];
          dot *= p.scale;
          score[static_cast<size_t>(j)] = p.softcap > 0.0f ? p.softcap * std::tanh(dot / p.softcap) : dot;
        }
        softmax(score.data(), weight.data(), n_keys);
        float* out = y + (t * p.n_head + h) * D;
        std::fill(out, out + D, 0.0f);
        for (int64_t j = 0; j < n_keys; ++j) {
          const float* vr =
              reinterpret_cast<const float*>(kv.v_at(p.layer, s, first + static_cast<loom::Pos>(j))) + kv_off;
          for (int64_t i = 0; i < D; ++i)
            out[i] += weight[static_cast<size_t>(j)] * vr[i];
        }
      }
    }
  }

  const Graph* g_ = nullptr;
  const BatchView* b_ = nullptr;
  std::vector<std::vector<float>> values_;        // activations, per tensor id
  std::map<int64_t, std::vector<float>> weights_; // weights as f32, by id
  size_t bytes_ = 0;
};

constexpr char k_name[] = "naive";

loom_status* create(const loom_config* cfg, void** out_self, const void** out_vtable) noexcept {
  LOOM_SDK_TRY
  const loom::sdk::Config c(cfg);
  if (c.get_i64("threads", 0) < 0)
    throw loom::sdk::Error("[backend] threads: expected ≥ 0 (naive is single-threaded)");
  auto* p = new loom::sdk::ExecutorPlugin();
  p->be = std::make_unique<NaiveBackend>();
  *out_self = p;
  *out_vtable = &loom::sdk::ExecutorTable<k_name>::table;
  LOOM_SDK_CATCH
}

} // namespace

LOOM_PLUGIN_DEFINE("naive", "1.0.0", loom_factory{sizeof(loom_factory), LOOM_KIND_BACKEND, "naive", &create})
