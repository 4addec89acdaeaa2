// loom/sdk/graph.hpp — the node list a model builds once per batch shape and a backend executes
// (header-only: the host builds it, backend plugins get it back from the ABI's loom_graph).
//
// Tensors are described, not allocated: weights point at their bytes in the model file, inputs are
// filled from the batch, activations are f32 and owned by the backend that runs the graph.
// Shapes use GGML's order: ne[0] is the fastest-varying dimension (a row).
#pragma once

#include "loom/sdk/dtype.hpp"
#include "loom/sdk/error.hpp"
#include "loom/sdk/types.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace loom {

// Append-only: values are part of the backend ABI.
enum class OpKind : int32_t {
  get_rows = 0, // dst[:, r] = src0[:, src1[r]] (dequantizing)   src0 [n, rows] any, src1 [k] i32 → [n, k]
  rms_norm = 1, // dst = src0 / rms(src0) * src1                   src0 [n, T], src1 [n] → [n, T]   (eps)
  matmul = 2, // dst = src0ᵀ · src1                              src0 [K, N] weights, src1 [K, T] → [N, T]
  rope = 3,   // rotary embedding at positions src1              src0 [D, H, T], src1 [T] i32 → [D, H, T]
              //   src2 (optional): f32 [n_dims/2] frequency divisors (Llama 3.1's rope_freqs)
  attention = 4, // causal attention over the KV cache              q [D, Hq, T], k,v [D, Hkv, T] → [D·Hq, T]
  swiglu = 5,    // dst = silu(src0) ⊙ src1                         [n, T] × [n, T] → [n, T]
  add = 6,       // dst = src0 + src1; a smaller src1 repeats: dst[i] = src0[i] + src1[i mod n1] (a bias)
  scale = 7,     // dst = src0 · scale
  softmax = 8,   // row-wise softmax
  copy = 9,      // dst = src0 (dtype conversion)
  mul = 10,      // dst = src0 ⊙ src1 (src1 broadcast along rows when [n])
  geglu = 11,    // dst = gelu(src0) ⊙ src1, gelu's tanh form [n, T] × [n, T] → [n, T]
  softcap = 12, // dst = scale · tanh(src0 / scale) (Gemma 2's final logits)
  // Mixture of experts (MoeParams; ABI 3.2). A route is [k, 2, T]: for token t, row (0, t) holds the ids of
  // the k experts it uses (as exact floats, highest selection score first) and row (1, t) their weights.
  moe_route = 13,   // the route of router logits src0 [E, T]; src1 (optional): a selection bias [E] that
                    //   chooses experts but does not weigh them → [k, 2, T]
  matmul_id = 14,   // dst[:, i, t] = src0[id(i, t)]ᵀ · src1[:, i or 0, t] (llama.cpp's mul_mat_id)
                    //   src0 [K, N, E] weights, src1 [K, k or 1, T], src2 route [k, 2, T] → [N, k, T]
  moe_combine = 15, // dst[:, t] = Σ_i weight(i, t) · src0[:, i, t], i = 0..k-1 in order
                    //   src0 [N, k, T], src1 route [k, 2, T] → [N, T]
  add_id = 16,      // dst[:, i, t] = src0[:, i, t] + src1[:, id(i, t)] (each slot's expert's bias)
                    //   src0 [N, k, T], src1 weight [N, E], src2 route [k, 2, T] → [N, k, T]
  swiglu_oai = 17, // dst = x·σ(α·x) ⊙ (clamp(src1, −L, L) + 1), x = min(src0, L) (gpt-oss; GluParams α, L)
};
inline const char* op_name(OpKind op) noexcept {
  switch (op) {
  case OpKind::get_rows:
    return "get_rows";
  case OpKind::rms_norm:
    return "rms_norm";
  case OpKind::matmul:
    return "matmul";
  case OpKind::rope:
    return "rope";
  case OpKind::attention:
    return "attention";
  case OpKind::swiglu:
    return "swiglu";
  case OpKind::add:
    return "add";
  case OpKind::scale:
    return "scale";
  case OpKind::softmax:
    return "softmax";
  case OpKind::copy:
    return "copy";
  case OpKind::mul:
    return "mul";
  case OpKind::geglu:
    return "geglu";
  case OpKind::softcap:
    return "softcap";
  case OpKind::moe_route:
    return "moe_route";
  case OpKind::matmul_id:
    return "matmul_id";
  case OpKind::moe_combine:
    return "moe_combine";
  case OpKind::add_id:
    return "add_id";
  case OpKind::swiglu_oai:
    return "swiglu_oai";
  }
  return "unknown";
}

// GELU in its tanh form, as ggml and Gemma compute it: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
inline float gelu_tanh(float x) noexcept {
  constexpr float k_sqrt_2_over_pi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(k_sqrt_2_over_pi * x * (1.0f + 0.044715f * x * x)));
}

enum class TensorKind : uint8_t { weight, input, activation };

struct TensorDesc {
  std::string name;
  TensorKind kind = TensorKind::activation;
  DType dtype = DType::f32;
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  const void* data = nullptr; // weight: bytes as stored (row_bytes(dtype, ne[0]) per row), host memory
  int64_t weight = -1;        // weight: the id Backend::load gave it to the backend (-1: none)

  int64_t n_elements() const noexcept { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t n_rows() const noexcept { return ne[1] * ne[2] * ne[3]; }
};

struct RopeParams {
  int32_t n_dims = 0; // rotated dims per head
  float theta = 10000.0f;
  bool neox = false;
  float freq_scale = 1.0f; // 1 / linear factor
  float ext_factor = 0.0f; // YaRN: 1 enables the ramp mix
  float attn_factor = 1.0f;
  int32_t orig_ctx = 0;
  float beta_fast = 32.0f, beta_slow = 1.0f;
};

// How attention is computed: `naive` materializes a row's scores (the reference kernel), `flash`
// tiles the keys with an online softmax (no scores matrix); `auto` is the backend's choice.
enum class AttnKernel : int32_t { auto_ = 0, naive = 1, flash = 2 };
inline const char* attn_kernel_name(AttnKernel k) noexcept {
  return k == AttnKernel::naive ? "naive" : k == AttnKernel::flash ? "flash" : "auto";
}
// What an attention node needs of a backend beyond causal attention (bit set; the ABI's
// LOOM_ATTN_FEATURE_*). attn_span_only is asked of the backend, not of a node: that its kernels read
// only the rows of each query's key_span, so that the host may release the others (sliding window).
// attn_tree is asked of the backend as well: that it runs token-tree rows (BatchView::tree_base); and
// attn_kv_groups: that it reads a KV pool of layer groups (KVLayout::layer_group, KVRows' group tables).
// attn_sink_logits: a node's AttentionParams::sink_logits (learned per-head logits in every softmax).
enum AttnFeature : uint32_t {
  attn_window = 1u,
  attn_softcap = 2u,
  attn_sinks = 4u,
  attn_span_only = 8u,
  attn_tree = 16u,
  attn_kv_groups = 32u,
  attn_sink_logits = 64u
};

struct AttentionParams {
  int32_t layer = 0;
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f;   // usually 1/sqrt(head_dim)
  int32_t window = 0;   // sliding window in tokens, the current one included (0 = full causal)
  float softcap = 0.0f; // tanh soft-capping of scores (0 = off)
  int32_t sinks = 0;    // with a window: the first `sinks` positions are attended as well
  AttnKernel kernel = AttnKernel::auto_; // the strategy the pipeline asked for
  // A weight [n_head] (−1: none): each head's learned sink logit s_h, a key that every query sees and that
  // carries no value (gpt-oss): out = Σ_j e^(x_j − m) v_j / (Σ_j e^(x_j − m) + e^(s_h − m)).
  int32_t sink_logits = -1;

  uint32_t features() const noexcept {
    return (window > 0 ? attn_window : 0u) | (softcap > 0.0f ? attn_softcap : 0u) |
           (window > 0 && sinks > 0 ? attn_sinks : 0u) | (sink_logits >= 0 ? attn_sink_logits : 0u);
  }
};

// The softmax denominator of head h whose scores' running maximum is m and sum of e^(x − m) is l: l, plus
// e^(s_h − m) with learned sink logits (sink_logits: the node's sink_logits weight as f32, or null).
inline float attn_denominator(const float* sink_logits, int32_t h, float m, float l) noexcept {
  return sink_logits ? l + std::exp(sink_logits[h] - m) : l;
}

// The cached positions a query at `pos` attends: [0, sink_end) ∪ [first, pos] (sink_end ≤ first). Causal:
// [0, pos]. Sliding window: the last `window` positions, plus the first `sinks` (attention sinks, kept
// however long the sequence grows).
struct KeySpan {
  Pos sink_end = 0;
  Pos first = 0;
  Pos last = 0;
  bool contains(Pos j) const noexcept { return j <= last && (j >= first || j < sink_end); }
  Pos count() const noexcept { return sink_end + (last - first + 1); }
};
inline KeySpan key_span(const AttentionParams& p, Pos pos) noexcept {
  KeySpan k;
  k.last = pos;
  k.first = p.window > 0 ? std::max<Pos>(0, pos - p.window + 1) : 0;
  k.sink_end = p.window > 0 ? std::min<Pos>(std::max(p.sinks, 0), k.first) : 0;
  return k;
}

// How a moe_route node turns router logits into k experts and their weights (llama.cpp's build_moe_ffn):
//   softmax:          p = softmax(logits) over every expert; choose the k highest p (+ bias); weights p
//   sigmoid:          p = sigmoid(logits); the same
//   softmax_selected: choose the k highest logits (+ bias); weights = softmax over those k logits (gpt-oss)
// then, with `norm`, the k weights divided by their sum (at least 2⁻¹⁴), then multiplied by weights_scale.
enum class MoeGating : int32_t { softmax = 0, sigmoid = 1, softmax_selected = 2 };
// A gated unit's constants (swiglu_oai): the sigmoid's slope α and the clamp limit L.
struct GluParams {
  float alpha = 1.702f;
  float limit = 7.0f;
};

// swiglu_oai of one element (gate a, up b): as ggml's.
inline float swiglu_oai(const GluParams& p, float a, float b) noexcept {
  const float x = std::min(a, p.limit);
  const float y = std::clamp(b, -p.limit, p.limit);
  return x / (1.0f + std::exp(p.alpha * -x)) * (y + 1.0f);
}

struct MoeParams {
  int32_t n_used = 0; // k: experts a token uses
  MoeGating gating = MoeGating::softmax;
  bool norm = false;
  float weights_scale = 1.0f;
};

// y = softmax(x) over n values (max-subtracted; y may be x).
inline void softmax_row(const float* x, float* y, int64_t n) noexcept {
  const float m = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i)
    sum += (y[i] = std::exp(x[i] - m));
  for (int64_t i = 0; i < n; ++i)
    y[i] /= sum;
}

// The smallest sum of weights a normalized route divides by (llama.cpp's clamp, f16's smallest normal).
inline constexpr float k_moe_min_weight_sum = 6.103515625e-5f;

// The route of one token (moe_route): `logits` [n_expert], `bias` [n_expert] or null, → ids[k] (as exact
// floats, highest selection score first; ties: the lower id first; NaN scores last) and weights[k].
// `scratch` is reused between calls. Plain code: the definition every backend's route is checked against.
struct MoeScratch {
  std::vector<float> probs, keys;
  std::vector<int32_t> order;
};
inline void moe_route_token(const MoeParams& m, const float* logits, const float* bias, int32_t n_expert,
                            float* ids, float* weights, MoeScratch& s) {
  const auto E = static_cast<size_t>(n_expert);
  s.probs.assign(logits, logits + E);
  if (m.gating == MoeGating::softmax) {
    softmax_row(s.probs.data(), s.probs.data(), n_expert);
  } else if (m.gating == MoeGating::sigmoid) {
    for (float& p : s.probs)
      p = 1.0f / (1.0f + std::exp(-p));
  }
  s.keys.resize(E);
  s.order.resize(E);
  for (size_t e = 0; e < E; ++e) {
    const float key = s.probs[e] + (bias ? bias[e] : 0.0f);
    s.keys[e] = key == key ? key : -INFINITY;
    s.order[e] = static_cast<int32_t>(e);
  }
  const int32_t k = std::min(m.n_used, n_expert);
  std::partial_sort(s.order.begin(), s.order.begin() + k, s.order.end(), [&](int32_t a, int32_t b) {
    const float ka = s.keys[static_cast<size_t>(a)], kb = s.keys[static_cast<size_t>(b)];
    return ka > kb || (ka == kb && a < b);
  });
  for (int32_t i = 0; i < k; ++i) {
    ids[i] = static_cast<float>(s.order[static_cast<size_t>(i)]);
    weights[i] = s.probs[static_cast<size_t>(s.order[static_cast<size_t>(i)])];
  }
  if (m.gating == MoeGating::softmax_selected) softmax_row(weights, weights, k);
  if (m.norm) {
    float sum = 0.0f;
    for (int32_t i = 0; i < k; ++i)
      sum += weights[i];
    sum = std::max(sum, k_moe_min_weight_sum);
    for (int32_t i = 0; i < k; ++i)
      weights[i] /= sum;
  }
  if (m.weights_scale != 0.0f && m.weights_scale != 1.0f)
    for (int32_t i = 0; i < k; ++i)
      weights[i] *= m.weights_scale;
}

struct Node {
  OpKind op = OpKind::copy;
  std::array<int32_t, 3> src{-1, -1, -1};
  int32_t dst = -1;
  float eps = 0.0f;   // rms_norm
  float scale = 1.0f; // scale
  RopeParams rope;
  AttentionParams attn;
  MoeParams moe; // moe_route
  GluParams glu; // swiglu_oai
};

struct Graph {
  // Unique over the process's life (the host's new_graph_id(); 0: none): caches of converted or planned
  // graphs key on it, never on the Graph's address (a freed graph's address comes back holding another
  // shape).
  uint64_t id = 0;
  std::vector<TensorDesc> tensors;
  std::vector<Node> nodes;
  int32_t n_tokens = 0;                                       // batch rows
  int32_t n_outputs = 0;                                      // rows whose logits are produced
  int32_t in_tokens = -1, in_positions = -1, in_out_ids = -1; // input tensors (i32)
  int32_t out_logits = -1;                                    // [n_vocab, n_outputs]

  int32_t add_tensor(TensorDesc t) {
    tensors.push_back(std::move(t));
    return static_cast<int32_t>(tensors.size() - 1);
  }
  int32_t add_weight(std::string name, DType dtype, std::array<int64_t, 4> ne, const void* data) {
    TensorDesc t;
    t.name = std::move(name);
    t.kind = TensorKind::weight;
    t.dtype = dtype;
    t.ne = ne;
    t.data = data;
    return add_tensor(std::move(t));
  }
  int32_t add_activation(std::string name, std::array<int64_t, 4> ne) {
    TensorDesc t;
    t.name = std::move(name);
    t.kind = TensorKind::activation;
    t.ne = ne;
    return add_tensor(std::move(t));
  }
  int32_t add_node(Node n) { // returns n.dst
    LOOM_ASSERT(n.dst >= 0 && n.dst < static_cast<int32_t>(tensors.size()), "node without a valid dst");
    for (int32_t s : n.src)
      LOOM_ASSERT(s < static_cast<int32_t>(tensors.size()), "node src out of range");
    nodes.push_back(n);
    return n.dst;
  }
};

// Whether every weight operand of n can be dequantized to f32 (what host-memory backends need).
inline bool weights_dequantizable(const Graph& g, const Node& n) noexcept {
  for (int32_t s : n.src) {
    if (s < 0) continue;
    const TensorDesc& t = g.tensors[static_cast<size_t>(s)];
    if (t.kind == TensorKind::weight && !dtype_traits(t.dtype).can_dequantize) return false;
  }
  return true;
}

// The tokens evaluated by one forward pass. Rows of different sequences may be mixed.
//
// Token trees (speculative decoding verifies several continuations in one forward): a row's
// position is the KV slot its K/V are written to and read from; rope_positions, when given, is the
// position it is rotated at (its depth in the text), and tree_base / tree_mask say which slots it
// attends: every slot j < tree_base[t] that causal attention (or the window, taken at the rope position)
// allows, and the slots tree_base[t] + i ≤ positions[t] whose bit i of tree_mask[t] is set (its
// ancestors in the tree, and itself). A row outside any tree has rope position = position, tree_base =
// position + 1, mask 0: plain causal attention. The three spans are empty (every row plain) or all
// n_tokens long; a backend runs them only if it declared attn_tree.
struct BatchView {
  std::span<const TokenId> tokens;          // [n_tokens]
  std::span<const Pos> positions;           // [n_tokens]
  std::span<const SeqId> seq_ids;           // [n_tokens]
  std::span<const int32_t> output_rows;     // indices into tokens whose logits are wanted, ascending
  std::span<const Pos> rope_positions = {}; // [n_tokens] or empty (= positions)
  std::span<const Pos> tree_base = {};      // [n_tokens] or empty (no tree rows)
  std::span<const uint64_t> tree_mask = {}; // [n_tokens] or empty
  bool has_tree() const noexcept { return !tree_base.empty(); }
  // The position row t is rotated at.
  Pos rope_pos(size_t t) const noexcept { return rope_positions.empty() ? positions[t] : rope_positions[t]; }
};

// The most nodes a token tree may have (one mask bit each).
inline constexpr int32_t k_max_tree_nodes = 64;

// Whether a row (slot pos, rotated at rope, tree base and mask) attends slot j, given the key span of its
// rope position (key_span(p, rope)): the causal / window rule below the tree, its mask inside it.
inline bool tree_attends(const KeySpan& span, Pos pos, Pos base, uint64_t mask, Pos j) noexcept {
  if (j < base) return span.contains(j);
  return j <= pos && j - base < 64 && ((mask >> (j - base)) & 1u) != 0;
}

// Asserts that a batch fits the graph built for it (token and output counts).
inline void check_batch(const Graph& g, const BatchView& batch) {
  LOOM_ASSERT(static_cast<int32_t>(batch.tokens.size()) == g.n_tokens, "batch size differs from the graph's");
  LOOM_ASSERT(static_cast<int32_t>(batch.output_rows.size()) == g.n_outputs,
              "output rows differ from the graph's");
}

} // namespace loom
