// model.cpp — Model: the architecture (ModelConfig) and weights of a GGUF file, the forward graph of each
// batch shape (built by GraphBuilder, cached per shape), and forward() on a backend.
#include "loom/model/model.hpp"

#include "loom/error.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>

namespace loom {

namespace {
int64_t new_weight_id() noexcept {
  static std::atomic<int64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

Node make_node(OpKind op, int32_t a, int32_t b, int32_t dst) {
  Node n;
  n.op = op;
  n.src = {a, b, -1};
  n.dst = dst;
  return n;
}

// The RoPE of the model's (global) layers.
RopeParams global_rope(const ModelConfig& c) {
  RopeParams rope;
  rope.n_dims = c.rope.n_dims;
  rope.theta = c.rope.theta;
  rope.neox = c.rope.neox;
  rope.freq_scale = 1.0f / c.rope.factor;
  if (c.rope.scaling == RopeScaling::yarn) {
    rope.ext_factor = 1.0f;
    rope.orig_ctx = c.rope.orig_ctx;
  }
  return rope;
}

// The RoPE of Gemma 3's local (sliding-window) layers: their own base, no scaling; others: `rope`.
RopeParams local_rope(const ModelConfig& c, RopeParams rope) {
  if (c.rope.theta_swa > 0.0f) {
    rope.theta = c.rope.theta_swa;
    rope.freq_scale = 1.0f;
    rope.ext_factor = 0.0f;
  }
  return rope;
}

// Builds one forward graph of every family of ModelConfig. Tensors and nodes are added in a fixed
// order that backends and tests depend on: the inputs, Llama 3.1's rope divisors, the embeddings,
// per layer the attention block then the feed-forward block, the output head. A step's argument
// expressions that add tensors (weight(), add_activation()) are kept as they were written: the order
// in which C++ evaluates function arguments decides the order of those tensors.
class GraphBuilder {
public:
  GraphBuilder(const ModelConfig& c, const GgufFile& file, const AttentionVariant& attention, Graph& g)
      : c_(c), file_(file), attention_(attention), g_(g), T_(g.n_tokens), E_(c.n_embd), D_(c.head_dim),
        Hq_(c.n_head), Hkv_(c.n_head_kv), F_(c.n_ff), rope_(global_rope(c)), rope_swa_(local_rope(c, rope_)) {
  }

  // A tensor of the file as a weight of the graph.
  int32_t weight(const std::string& name) {
    const GgufTensor* t = file_.find_tensor(name);
    LOOM_ASSERT(t != nullptr, "tensor validated by ModelConfig is missing");
    std::array<int64_t, 4> ne{1, 1, 1, 1};
    for (size_t k = 0; k < t->ne.size(); ++k)
      ne[k] = t->ne[k];
    return g_.add_weight(name, t->type, ne, t->data);
  }

  // tokens and positions (one per batch token), out_ids (the rows whose logits are wanted).
  void add_inputs() {
    g_.in_tokens = input("tokens", T_);
    g_.in_positions = input("positions", T_);
    g_.in_out_ids = input("out_ids", g_.n_outputs);
  }

  void add_rope_freqs() {
    rope_freqs_ = c_.rope_freqs ? weight("rope_freqs.weight") : -1;
  } // Llama 3.1 divisors

  // The token embeddings' rows of the batch's tokens (Gemma: scaled by √n_embd).
  int32_t embeddings(int32_t tok_embd) {
    int32_t x = g_.add_node(
        make_node(OpKind::get_rows, tok_embd, g_.in_tokens, g_.add_activation("embd", {E_, T_, 1, 1})));
    if (c_.embd_scale > 0.0f) { // Gemma: embeddings × √n_embd
      Node sc = make_node(OpKind::scale, x, -1, g_.add_activation("embd_scaled", {E_, T_, 1, 1}));
      sc.scale = c_.embd_scale;
      x = g_.add_node(sc);
    }
    return x;
  }

  // Layer l's attention block on the residual stream x (p = "blk.<l>."): norm, q/k/v, RoPE, attention,
  // output projection (Gemma 2/3: post-norm), residual add.
  int32_t attention_block(int32_t l, const std::string& p, int32_t x) {
    const int32_t h = norm(x, weight(p + "attn_norm.weight"), p + "attn_in", {E_, T_, 1, 1});
    auto [q, k, v] = qkv(p, h);
    const bool local = c_.sliding_window > 0 && c_.sliding_layers[static_cast<size_t>(l)];
    q = rope_node(q, p + "q_rope", Hq_, local);
    k = rope_node(k, p + "k_rope", Hkv_, local);
    const int32_t a = attention(l, p, q, k, v);
    int32_t o = g_.add_node(make_node(OpKind::matmul, weight(p + "attn_output.weight"), a,
                                      g_.add_activation(p + "attn_proj", {E_, T_, 1, 1})));
    if (c_.post_norms) o = norm(o, weight(p + "post_attention_norm.weight"), p + "attn_post", {E_, T_, 1, 1});
    return bin(OpKind::add, x, o, p + "attn_res", {E_, T_, 1, 1});
  }

  // Layer p's feed-forward block on x: norm, gate and up, SwiGLU (Gemma: GeGLU), down (Gemma 2/3:
  // post-norm), residual add.
  int32_t ffn_block(const std::string& p, int32_t x) {
    const int32_t hf = norm(x, weight(p + "ffn_norm.weight"), p + "ffn_in", {E_, T_, 1, 1});
    const int32_t wg = c_.fused_gate_up ? rows(p + "ffn_up.weight", 0, F_) : weight(p + "ffn_gate.weight");
    const int32_t wu = c_.fused_gate_up ? rows(p + "ffn_up.weight", F_, F_) : weight(p + "ffn_up.weight");
    const int32_t gate =
        g_.add_node(make_node(OpKind::matmul, wg, hf, g_.add_activation(p + "ffn_gate", {F_, T_, 1, 1})));
    const int32_t up =
        g_.add_node(make_node(OpKind::matmul, wu, hf, g_.add_activation(p + "ffn_up", {F_, T_, 1, 1})));
    const int32_t act =
        bin(c_.geglu ? OpKind::geglu : OpKind::swiglu, gate, up, p + "ffn_act", {F_, T_, 1, 1});
    int32_t down = g_.add_node(make_node(OpKind::matmul, weight(p + "ffn_down.weight"), act,
                                         g_.add_activation(p + "ffn_out", {E_, T_, 1, 1})));
    if (c_.post_norms) down = norm(down, weight(p + "post_ffw_norm.weight"), p + "ffn_post", {E_, T_, 1, 1});
    return bin(OpKind::add, x, down, p + "ffn_res", {E_, T_, 1, 1});
  }

  // The output rows of x, the final norm, the logits (tied models: the token embeddings; Gemma 2:
  // soft-capped). Returns the logits tensor.
  int32_t output_head(int32_t x, int32_t tok_embd) {
    const int64_t O = g_.n_outputs;
    x = g_.add_node(
        make_node(OpKind::get_rows, x, g_.in_out_ids, g_.add_activation("out_rows", {E_, O, 1, 1})));
    x = norm(x, weight("output_norm.weight"), "out_norm", {E_, O, 1, 1});
    const int32_t head = c_.tied_output ? tok_embd : weight("output.weight");
    const int64_t V = c_.n_vocab;
    int32_t logits =
        g_.add_node(make_node(OpKind::matmul, head, x, g_.add_activation("logits", {V, O, 1, 1})));
    if (c_.final_softcap > 0.0f) { // Gemma 2
      Node sc = make_node(OpKind::softcap, logits, -1, g_.add_activation("logits_capped", {V, O, 1, 1}));
      sc.scale = c_.final_softcap;
      logits = g_.add_node(sc);
    }
    return logits;
  }

private:
  struct Qkv {
    int32_t q, k, v;
  };

  // q, k, v of the normed input h: one matmul after another, so that a backend may run them together
  // (they read the same h); Qwen2: plus biases; Qwen3, Gemma 3: q and k normed per head.
  Qkv qkv(const std::string& p, int32_t h) {
    const int32_t wq = c_.fused_qkv ? rows(p + "attn_qkv.weight", 0, D_ * Hq_) : weight(p + "attn_q.weight");
    const int32_t wk =
        c_.fused_qkv ? rows(p + "attn_qkv.weight", D_ * Hq_, D_ * Hkv_) : weight(p + "attn_k.weight");
    const int32_t wv = c_.fused_qkv ? rows(p + "attn_qkv.weight", D_ * (Hq_ + Hkv_), D_ * Hkv_)
                                    : weight(p + "attn_v.weight");
    int32_t q = g_.add_node(make_node(OpKind::matmul, wq, h, g_.add_activation(p + "q", {D_, Hq_, T_, 1})));
    int32_t k = g_.add_node(make_node(OpKind::matmul, wk, h, g_.add_activation(p + "k", {D_, Hkv_, T_, 1})));
    int32_t v = g_.add_node(make_node(OpKind::matmul, wv, h, g_.add_activation(p + "v", {D_, Hkv_, T_, 1})));
    if (c_.qkv_bias) { // Qwen2
      q = bin(OpKind::add, q, weight(p + "attn_q.bias"), p + "q_bias", {D_, Hq_, T_, 1});
      k = bin(OpKind::add, k, weight(p + "attn_k.bias"), p + "k_bias", {D_, Hkv_, T_, 1});
      v = bin(OpKind::add, v, weight(p + "attn_v.bias"), p + "v_bias", {D_, Hkv_, T_, 1});
    }
    if (c_.qk_norm) { // Qwen3, Gemma 3: each head of q and k normalized (rows of head_dim)
      q = norm(q, weight(p + "attn_q_norm.weight"), p + "q_norm", {D_, Hq_, T_, 1});
      k = norm(k, weight(p + "attn_k_norm.weight"), p + "k_norm", {D_, Hkv_, T_, 1});
    }
    return {q, k, v};
  }

  // The attention node of layer l; the attention variant sets this layer's window, sinks, soft-cap and
  // kernel.
  int32_t attention(int32_t l, const std::string& p, int32_t q, int32_t k, int32_t v) {
    Node at;
    at.op = OpKind::attention;
    at.src = {q, k, v};
    at.dst = g_.add_activation(p + "attn_out", {D_ * Hq_, T_, 1, 1});
    at.attn.layer = l;
    at.attn.n_head = c_.n_head;
    at.attn.n_head_kv = c_.n_head_kv;
    at.attn.head_dim = c_.head_dim;
    at.attn.scale = c_.attn_scale > 0.0f ? c_.attn_scale : 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
    attention_.apply(at.attn); // window, sinks, soft-cap, kernel of this layer
    return g_.add_node(at);
  }

  int32_t input(const char* name, int64_t n) {
    TensorDesc t;
    t.name = name;
    t.kind = TensorKind::input;
    t.dtype = DType::i32;
    t.ne = {n, 1, 1, 1};
    return g_.add_tensor(std::move(t));
  }

  // Rows [r0, r0 + n) of a matrix as a weight of its own (a view: fused q/k/v and gate/up matrices).
  int32_t rows(const std::string& name, int64_t r0, int64_t n) {
    const GgufTensor* t = file_.find_tensor(name);
    LOOM_ASSERT(t != nullptr && t->ne.size() == 2 && r0 + n <= t->ne[1],
                "fused tensor validated by ModelConfig");
    const size_t rb = row_bytes(t->type, t->ne[0]);
    return g_.add_weight(name + "[" + std::to_string(r0) + ":" + std::to_string(r0 + n) + "]", t->type,
                         {t->ne[0], n, 1, 1},
                         static_cast<const uint8_t*>(t->data) + static_cast<size_t>(r0) * rb);
  }

  int32_t norm(int32_t xin, int32_t w, const std::string& out, std::array<int64_t, 4> ne) {
    Node nn = make_node(OpKind::rms_norm, xin, w, g_.add_activation(out, ne));
    nn.eps = c_.norm_eps;
    return g_.add_node(nn);
  }

  int32_t bin(OpKind op, int32_t a, int32_t b, const std::string& out, std::array<int64_t, 4> ne) {
    return g_.add_node(make_node(op, a, b, g_.add_activation(out, ne)));
  }

  int32_t rope_node(int32_t xin, const std::string& out, int64_t H, bool local) {
    Node r = make_node(OpKind::rope, xin, g_.in_positions, g_.add_activation(out, {D_, H, T_, 1}));
    r.rope = local ? rope_swa_ : rope_;
    r.src[2] = rope_freqs_;
    return g_.add_node(r);
  }

  const ModelConfig& c_;
  const GgufFile& file_;
  const AttentionVariant& attention_;
  Graph& g_;
  const int64_t T_, E_, D_, Hq_, Hkv_, F_; // tokens, n_embd, head_dim, q heads, kv heads, n_ff
  const RopeParams rope_, rope_swa_;
  int32_t rope_freqs_ = -1;
};

} // namespace

Model::Model(GgufFile f, int32_t max_layers)
    : file_(std::move(f)), cfg_([&] {
        ModelConfig c = ModelConfig::from_gguf(file_);
        if (max_layers > 0 && max_layers < c.n_layer) { // the first layers: their per-layer facts too
          c.n_layer = max_layers;
          if (c.sliding_layers.size() > static_cast<size_t>(max_layers))
            c.sliding_layers.resize(static_cast<size_t>(max_layers));
        }
        return c;
      }()),
      attention_(make_attention_variant(cfg_, AttentionChoice{})) {
  // The weights a backend loads: those of a decode graph (every graph reads the same ones), each once,
  // with how the graph uses it; later graphs carry their ids.
  const Graph g = build_graph(1, 1);
  int32_t head = g.out_logits; // the matmul making the logits (before Gemma 2's final soft-cap)
  for (const Node& n : g.nodes)
    if (n.dst == g.out_logits && n.op == OpKind::softcap) head = n.src[0];
  std::map<std::string, size_t> at;
  for (const Node& n : g.nodes)
    for (size_t i = 0; i < n.src.size(); ++i) {
      if (n.src[i] < 0) continue;
      const TensorDesc& t = g.tensors[static_cast<size_t>(n.src[i])];
      if (t.kind != TensorKind::weight) continue;
      auto it = at.find(t.name);
      if (it == at.end()) {
        WeightDesc w;
        w.tensor = t;
        w.tensor.weight = new_weight_id();
        w.bytes = row_bytes(t.dtype, t.ne[0]) * static_cast<size_t>(t.n_rows());
        it = at.emplace(t.name, weights_.size()).first;
        weight_ids_.emplace(t.name, w.tensor.weight);
        weights_.push_back(std::move(w));
      }
      uint32_t& uses = weights_[it->second].uses;
      if (i == 0 && n.op == OpKind::matmul)
        uses |= n.dst == head ? weight_use_logits : weight_use_matmul;
      else if (i == 0 && n.op == OpKind::get_rows)
        uses |= weight_use_rows;
      else
        uses |= weight_use_vector;
    }
}

void Model::load_into(Backend& be) {
  std::lock_guard lock(mu_);
  if (std::find(loaded_.begin(), loaded_.end(), be.instance()) != loaded_.end()) return;
  be.load(weights_);
  loaded_.push_back(be.instance());
}

std::unique_ptr<Model> Model::load(const std::string& path) {
  return std::unique_ptr<Model>(new Model(GgufFile::open(path)));
}

std::unique_ptr<Model> Model::with_layers(int32_t n_layers) const {
  if (n_layers < 1 || n_layers > cfg_.n_layer)
    fail(Errc::invalid_argument, "model",
         "a draft of the first " + std::to_string(n_layers) + " layers: expected 1.." +
             std::to_string(cfg_.n_layer) + " (the model has " + std::to_string(cfg_.n_layer) + ")");
  return std::unique_ptr<Model>(new Model(file_.shared_copy(), n_layers));
}

KVShape Model::kv_shape(int32_t n_ctx, int32_t n_seq_max, const Backend* be) const {
  KVShape s;
  s.n_layer = cfg_.n_layer;
  s.n_head_kv = cfg_.n_head_kv;
  s.head_dim = cfg_.head_dim;
  s.n_ctx = n_ctx;
  s.n_seq_max = n_seq_max;
  s.dtype = DType::f32;
  const AttentionVariant& v = *attention_;
  uint32_t reads = 0;
  for (const uint32_t bit : {attn_span_only, attn_kv_groups})
    if (be && be->supports_attention(v.kernel(), v.features() | reads | bit)) reads |= bit;
  v.set_retention(s, reads);
  return s;
}

std::shared_ptr<Model::Shape> Model::shape(int32_t n_tokens, int32_t n_outputs) {
  return graphs_.get({n_tokens, n_outputs}, [&] {
    return std::make_shared<Shape>(Shape{build_graph(n_tokens, n_outputs), {}});
  });
}

std::shared_ptr<const Graph> Model::graph(int32_t n_tokens, int32_t n_outputs) {
  std::lock_guard lock(mu_);
  std::shared_ptr<Shape> s = shape(n_tokens, n_outputs);
  return {s, &s->graph};
}

double Model::forward(Backend& be, const BatchView& batch, KVCacheStore& kv, std::span<float> logits) {
  const auto n_tokens = static_cast<int32_t>(batch.tokens.size());
  const auto n_out = static_cast<int32_t>(batch.output_rows.size());
  LOOM_ASSERT(n_tokens > 0 && batch.positions.size() == batch.tokens.size() &&
                  batch.seq_ids.size() == batch.tokens.size(),
              "malformed batch");
  LOOM_ASSERT(logits.size() >= static_cast<size_t>(n_out) * static_cast<size_t>(cfg_.n_vocab),
              "logits buffer too small");
  for (TokenId t : batch.tokens)
    if (t < 0 || t >= cfg_.n_vocab)
      fail(Errc::invalid_argument, "model",
           "token id " + std::to_string(t) + " is outside the vocabulary (0.." +
               std::to_string(cfg_.n_vocab - 1) + ")");
  std::shared_ptr<Shape> s;
  {
    std::lock_guard lock(mu_);
    s = shape(n_tokens, n_out);
    if (std::find(s->runs_on.begin(), s->runs_on.end(), be.instance()) ==
        s->runs_on.end()) { // once per shape
      for (const Node& n : s->graph.nodes)
        if (!be.supports(s->graph, n))
          fail(Errc::unsupported, "model",
               std::string("backend '") + std::string(be.name()) + "' cannot run op " + op_name(n.op) +
                   " for this model");
      s->runs_on.push_back(be.instance());
    }
  }
  const Graph& g = s->graph;
  load_into(be);
  KVMemory& mem = kv.memory();
  if (!mem.buffer()) mem.attach(be.alloc(mem.layout().bytes(), BufferUsage::kv));
  LOOM_ASSERT(mem.buffer()->owner() == nullptr || mem.buffer()->owner() == be.instance_tag(),
              "a KV store whose memory belongs to another backend");
  const KVRows rows = kv.rows_for(batch);
  const auto t0 = std::chrono::steady_clock::now();
  be.compute(g, batch, rows, logits);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

Graph Model::build_graph(int32_t n_tokens, int32_t n_outputs) const {
  Graph g;
  g.id = new_graph_id();
  g.n_tokens = n_tokens;
  g.n_outputs = n_outputs;
  GraphBuilder b(cfg_, file_, *attention_, g);
  b.add_inputs();
  b.add_rope_freqs();
  const int32_t tok_embd = b.weight("token_embd.weight");
  int32_t x = b.embeddings(tok_embd);
  for (int32_t l = 0; l < cfg_.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    x = b.attention_block(l, p, x);
    x = b.ffn_block(p, x);
  }
  g.out_logits = b.output_head(x, tok_embd);
  for (TensorDesc& t : g.tensors) // the ids the backend loaded them under (none while the list is made)
    if (t.kind == TensorKind::weight)
      if (auto it = weight_ids_.find(t.name); it != weight_ids_.end()) t.weight = it->second;
  return g;
}

} // namespace loom
