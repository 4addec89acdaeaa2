// graph_builder.cpp — GraphBuilder: the blocks of every family's graph (graph_builder.hpp).
#include "graph_builder.hpp"

#include "loom/error.hpp"

#include <cmath>
#include <string>

namespace loom {

namespace {

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
    rope.beta_fast = c.rope.yarn_beta_fast;
    rope.beta_slow = c.rope.yarn_beta_slow;
  }
  rope.attn_factor = c.rope.attn_factor;
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

std::string layer_prefix(int32_t l) {
  return "blk." + std::to_string(l) + ".";
}

} // namespace

GraphBuilder::GraphBuilder(const ModelConfig& c, const GgufFile& file, const AttentionVariant& attention,
                           Graph& g)
    : c_(c), file_(file), attention_(attention), g_(g), T_(g.n_tokens), E_(c.n_embd), D_(c.head_dim),
      Hq_(c.n_head), Hkv_(c.n_head_kv), F_(c.n_ff), rope_(global_rope(c)), rope_swa_(local_rope(c, rope_)) {}

int32_t GraphBuilder::weight(const std::string& name) {
  const GgufTensor* t = file_.find_tensor(name);
  LOOM_ASSERT(t != nullptr, "tensor validated by ModelConfig is missing");
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  for (size_t k = 0; k < t->ne.size(); ++k)
    ne[k] = t->ne[k];
  return g_.add_weight(name, t->type, ne, t->data);
}

void GraphBuilder::add_inputs() {
  g_.in_tokens = input("tokens", T_);
  g_.in_positions = input("positions", T_);
  g_.in_out_ids = input("out_ids", g_.n_outputs);
}

void GraphBuilder::add_rope_freqs() {
  rope_freqs_ = c_.rope_freqs ? weight("rope_freqs.weight") : -1;
}

int32_t GraphBuilder::embeddings(int32_t tok_embd) {
  int32_t x = g_.add_node(
      make_node(OpKind::get_rows, tok_embd, g_.in_tokens, g_.add_activation("embd", {E_, T_, 1, 1})));
  if (c_.embd_scale > 0.0f) { // Gemma: embeddings × √n_embd
    Node sc = make_node(OpKind::scale, x, -1, g_.add_activation("embd_scaled", {E_, T_, 1, 1}));
    sc.scale = c_.embd_scale;
    x = g_.add_node(sc);
  }
  return x;
}

int32_t GraphBuilder::attention_block(int32_t l, int32_t x) {
  const std::string p = layer_prefix(l);
  const int32_t h = norm(x, weight(p + "attn_norm.weight"), p + "attn_in", {E_, T_, 1, 1});
  auto [q, k, v] = qkv(p, h);
  const bool local = c_.sliding_window > 0 && c_.sliding_layers[static_cast<size_t>(l)];
  if (c_.rope_layers.empty() || c_.rope_layers[static_cast<size_t>(l)]) {
    q = rope_node(q, p + "q_rope", Hq_, local);
    k = rope_node(k, p + "k_rope", Hkv_, local);
  }
  const int32_t a = attention(l, p, q, k, v);
  int32_t o = g_.add_node(make_node(OpKind::matmul, weight(p + "attn_output.weight"), a,
                                    g_.add_activation(p + "attn_proj", {E_, T_, 1, 1})));
  if (c_.attn_out_bias)
    o = bin(OpKind::add, o, weight(p + "attn_output.bias"), p + "attn_proj_bias", {E_, T_, 1, 1});
  if (c_.post_norms) o = norm(o, weight(p + "post_attention_norm.weight"), p + "attn_post", {E_, T_, 1, 1});
  return bin(OpKind::add, x, o, p + "attn_res", {E_, T_, 1, 1});
}

int32_t GraphBuilder::ffn_block(int32_t l, int32_t x) {
  const std::string p = layer_prefix(l);
  const int32_t hf = norm(x, weight(p + "ffn_norm.weight"), p + "ffn_in", {E_, T_, 1, 1});
  const int32_t wg = c_.fused_gate_up ? rows(p + "ffn_up.weight", 0, F_) : weight(p + "ffn_gate.weight");
  const int32_t wu = c_.fused_gate_up ? rows(p + "ffn_up.weight", F_, F_) : weight(p + "ffn_up.weight");
  const int32_t gate =
      g_.add_node(make_node(OpKind::matmul, wg, hf, g_.add_activation(p + "ffn_gate", {F_, T_, 1, 1})));
  const int32_t up =
      g_.add_node(make_node(OpKind::matmul, wu, hf, g_.add_activation(p + "ffn_up", {F_, T_, 1, 1})));
  const int32_t act = bin(c_.geglu ? OpKind::geglu : OpKind::swiglu, gate, up, p + "ffn_act", {F_, T_, 1, 1});
  int32_t down = g_.add_node(make_node(OpKind::matmul, weight(p + "ffn_down.weight"), act,
                                       g_.add_activation(p + "ffn_out", {E_, T_, 1, 1})));
  if (c_.post_norms) down = norm(down, weight(p + "post_ffw_norm.weight"), p + "ffn_post", {E_, T_, 1, 1});
  return bin(OpKind::add, x, down, p + "ffn_res", {E_, T_, 1, 1});
}

int32_t GraphBuilder::moe_block(int32_t l, int32_t x) {
  const std::string p = layer_prefix(l);
  const MoeConfig& m = c_.moe;
  const int64_t NE = m.n_expert, k = m.n_used, F = m.n_ff_exp;
  // The normed input as [E, 1, T]: one row per token, shared by its k experts.
  const int32_t hf = norm(x, weight(p + c_.ffn_norm + ".weight"), p + "ffn_in", {E_, 1, T_, 1});
  int32_t logits = matmul(weight(p + "ffn_gate_inp.weight"), hf, p + "moe_logits", {NE, T_, 1, 1});
  if (m.router_bias)
    logits = bin(OpKind::add, logits, weight(p + "ffn_gate_inp.bias"), p + "moe_logits_b", {NE, T_, 1, 1});
  Node r = make_node(OpKind::moe_route, logits, m.selection_bias ? weight(p + "exp_probs_b.bias") : -1,
                     g_.add_activation(p + "moe_route", {k, 2, T_, 1}));
  r.moe = {m.n_used, m.gating, m.norm, m.weights_scale};
  const int32_t route = g_.add_node(r);
  // Each slot's expert's matrix `w` (ffn_<w>_exps) times `in`, plus that expert's bias where the file has
  // them.
  const auto by_experts = [&](const std::string& w, int32_t in, int64_t n_out) {
    Node e = make_node(OpKind::matmul_id, weight(p + "ffn_" + w + "_exps.weight"), in,
                       g_.add_activation(p + "moe_" + w, {n_out, k, T_, 1}));
    e.src[2] = route;
    int32_t y = g_.add_node(e);
    if (m.expert_biases) {
      Node b = make_node(OpKind::add_id, y, weight(p + "ffn_" + w + "_exps.bias"),
                         g_.add_activation(p + "moe_" + w + "_b", {n_out, k, T_, 1}));
      b.src[2] = route;
      y = g_.add_node(b);
    }
    return y;
  };
  const int32_t gate = by_experts("gate", hf, F);
  const int32_t up = by_experts("up", hf, F);
  const int32_t act =
      bin(m.oai_glu ? OpKind::swiglu_oai : OpKind::swiglu, gate, up, p + "moe_act", {F, k, T_, 1});
  const int32_t down = by_experts("down", act, E_);
  const int32_t out = bin(OpKind::moe_combine, down, route, p + "moe_out", {E_, T_, 1, 1});
  return bin(OpKind::add, x, out, p + "ffn_res", {E_, T_, 1, 1});
}

int32_t GraphBuilder::output_head(int32_t x, int32_t tok_embd) {
  const int64_t O = g_.n_outputs;
  x = g_.add_node(
      make_node(OpKind::get_rows, x, g_.in_out_ids, g_.add_activation("out_rows", {E_, O, 1, 1})));
  x = norm(x, weight("output_norm.weight"), "out_norm", {E_, O, 1, 1});
  const int32_t head = c_.tied_output ? tok_embd : weight("output.weight");
  const int64_t V = c_.n_vocab;
  int32_t logits = g_.add_node(make_node(OpKind::matmul, head, x, g_.add_activation("logits", {V, O, 1, 1})));
  if (c_.final_softcap > 0.0f) { // Gemma 2
    Node sc = make_node(OpKind::softcap, logits, -1, g_.add_activation("logits_capped", {V, O, 1, 1}));
    sc.scale = c_.final_softcap;
    logits = g_.add_node(sc);
  }
  return logits;
}

// q, k, v of the normed input h: one matmul after another, so that a backend may run them together
// (they read the same h); Qwen2: plus biases; Qwen3, Gemma 3: q and k normed per head.
GraphBuilder::Qkv GraphBuilder::qkv(const std::string& p, int32_t h) {
  const int32_t wq = c_.fused_qkv ? rows(p + "attn_qkv.weight", 0, D_ * Hq_) : weight(p + "attn_q.weight");
  const int32_t wk =
      c_.fused_qkv ? rows(p + "attn_qkv.weight", D_ * Hq_, D_ * Hkv_) : weight(p + "attn_k.weight");
  const int32_t wv =
      c_.fused_qkv ? rows(p + "attn_qkv.weight", D_ * (Hq_ + Hkv_), D_ * Hkv_) : weight(p + "attn_v.weight");
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
int32_t GraphBuilder::attention(int32_t l, const std::string& p, int32_t q, int32_t k, int32_t v) {
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
  if (c_.attn_sink_logits) at.attn.sink_logits = weight(p + "attn_sinks.weight");
  return g_.add_node(at);
}

int32_t GraphBuilder::input(const char* name, int64_t n) {
  TensorDesc t;
  t.name = name;
  t.kind = TensorKind::input;
  t.dtype = DType::i32;
  t.ne = {n, 1, 1, 1};
  return g_.add_tensor(std::move(t));
}

// Rows [r0, r0 + n) of a matrix as a weight of its own (a view: fused q/k/v and gate/up matrices).
int32_t GraphBuilder::rows(const std::string& name, int64_t r0, int64_t n) {
  const GgufTensor* t = file_.find_tensor(name);
  LOOM_ASSERT(t != nullptr && t->ne.size() == 2 && r0 + n <= t->ne[1],
              "fused tensor validated by ModelConfig");
  const size_t rb = row_bytes(t->type, t->ne[0]);
  return g_.add_weight(name + "[" + std::to_string(r0) + ":" + std::to_string(r0 + n) + "]", t->type,
                       {t->ne[0], n, 1, 1},
                       static_cast<const uint8_t*>(t->data) + static_cast<size_t>(r0) * rb);
}

int32_t GraphBuilder::norm(int32_t xin, int32_t w, const std::string& out, std::array<int64_t, 4> ne) {
  Node nn = make_node(OpKind::rms_norm, xin, w, g_.add_activation(out, ne));
  nn.eps = c_.norm_eps;
  return g_.add_node(nn);
}

int32_t GraphBuilder::bin(OpKind op, int32_t a, int32_t b, const std::string& out,
                          std::array<int64_t, 4> ne) {
  return g_.add_node(make_node(op, a, b, g_.add_activation(out, ne)));
}

int32_t GraphBuilder::matmul(int32_t w, int32_t x, const std::string& out, std::array<int64_t, 4> ne) {
  return g_.add_node(make_node(OpKind::matmul, w, x, g_.add_activation(out, ne)));
}

int32_t GraphBuilder::rope_node(int32_t xin, const std::string& out, int64_t H, bool local) {
  Node r = make_node(OpKind::rope, xin, g_.in_positions, g_.add_activation(out, {D_, H, T_, 1}));
  r.rope = local ? rope_swa_ : rope_;
  r.src[2] = rope_freqs_;
  return g_.add_node(r);
}

} // namespace loom
