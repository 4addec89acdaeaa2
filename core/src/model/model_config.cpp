#include "loom/model/model_config.hpp"

#include "family.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

namespace loom {

namespace keys {

void bad(const GgufFile& f, const std::string& msg) {
  fail(Errc::parse_error, "model", gguf_printable(f.path(), 400) + ": " + msg);
}

namespace {
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
} // namespace

std::optional<float> finite_at_least(const GgufFile& f, const std::string& key, double min,
                                     const char* what) {
  const std::optional<double> v = f.get_float_opt(key);
  if (!v) return std::nullopt;
  if (!std::isfinite(*v) || *v < min || *v > static_cast<double>(std::numeric_limits<float>::max()))
    bad(f, "metadata '" + key + "' must be " + what + ", found " + number(*v) +
               "; the file is corrupt — re-convert it");
  return static_cast<float>(*v);
}

int32_t positive(const GgufFile& f, const std::string& key, int64_t v, int64_t max) {
  if (v <= 0 || v > max)
    bad(f, "metadata '" + key + "' must be in 1.." + std::to_string(max) + ", found " + std::to_string(v));
  return static_cast<int32_t>(v);
}

// A NaN, infinite or non-positive base would turn every rotated query and key into NaN.
float rope_base(const GgufFile& f, const std::string& key) {
  const float theta =
      finite_at_least(f, key, 0.0, "a finite number > 1 (typically 10000)").value_or(10000.0f);
  if (!(theta > 1.0f))
    bad(f, "metadata '" + key + "' must be a finite number > 1 (typically 10000), found " +
               number(static_cast<double>(theta)) + "; the file is corrupt — re-convert it");
  return theta;
}

void window_pattern(ModelConfig& c, const GgufFile& f, const std::string& a, int32_t n) {
  if (c.sliding_window == 0 || f.find(a + "attention.sliding_window_pattern")) return;
  for (int32_t l = 0; l < c.n_layer; ++l)
    c.sliding_layers[static_cast<size_t>(l)] = l % n < n - 1;
}

} // namespace keys

namespace {

using keys::bad;
using keys::finite_at_least;
using keys::positive;
using keys::rope_base;

// `dims`: the metadata keys and values the expected shape comes from (named in the message).
void expect_shape(const GgufFile& f, const std::string& name, std::initializer_list<int64_t> ne,
                  bool required = true, const std::string& dims = "") {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) {
    if (required)
      bad(f, "tensor '" + name + "' is missing; the file is not a complete model of this architecture");
    return;
  }
  std::vector<int64_t> want(ne);
  bool ok = t->ne.size() == want.size() || (t->ne.size() == 2 && want.size() == 1 && t->ne[1] == 1);
  if (ok)
    for (size_t k = 0; k < want.size(); ++k)
      ok = ok && t->ne[k] == want[k];
  if (!ok) {
    auto fmt = [](const std::vector<int64_t>& v) {
      std::string s = "[";
      for (size_t k = 0; k < v.size(); ++k)
        s += (k ? ", " : "") + std::to_string(v[k]);
      return s + "]";
    };
    bad(f, "tensor '" + name + "' has shape " + fmt(t->ne) + ", expected " + fmt(want) +
               " from the metadata (ne[0] first" + (dims.empty() ? std::string() : "; " + dims) +
               "): the file is inconsistent — re-convert it");
  }
  if (!dtype_traits(t->type).can_dequantize)
    fail(Errc::unsupported, "model",
         gguf_printable(f.path(), 400) + ": tensor '" + name + "' is stored as " +
             std::string(dtype_name(t->type)) +
             ", which Loom cannot compute with yet (supported: " + dtype_names(false) + ")");
}

// ---- the steps of from_gguf ------------------------------------------------------------------------

// general.architecture: one of the families Loom runs.
const Family& read_arch(ModelConfig& c, const GgufFile& f) {
  c.arch = f.get_string("general.architecture");
  const Family* family = find_family(c.arch);
  if (!family)
    fail(Errc::unsupported, "model",
         gguf_printable(f.path(), 400) + ": architecture '" + gguf_printable(c.arch) +
             "' is not supported (supported: " + supported_archs() + ")");
  c.name = f.get_string_opt("general.name").value_or("");
  return *family;
}

// The sizes (a: the key prefix, "llama."), the head grouping and the head dimension, and the norm's
// epsilon.
void read_sizes(ModelConfig& c, const GgufFile& f, const std::string& a) {
  auto req = [&](const std::string& k) { return f.get_int(a + k); };
  c.n_embd = positive(f, a + "embedding_length", req("embedding_length"));
  c.n_layer = positive(f, a + "block_count", req("block_count"), 4096);
  // (a mixture of experts may have none: the experts' width is expert_feed_forward_length; checked after)
  if (const auto ff = f.get_int_opt(a + "feed_forward_length"))
    c.n_ff = positive(f, a + "feed_forward_length", *ff);
  c.n_head = positive(f, a + "attention.head_count", req("attention.head_count"), 4096);
  c.n_head_kv = positive(f, a + "attention.head_count_kv",
                         f.get_int_opt(a + "attention.head_count_kv").value_or(c.n_head), 4096);
  c.n_ctx_train = positive(f, a + "context_length", req("context_length"), 1 << 24);
  if (c.n_head % c.n_head_kv != 0)
    bad(f, "attention.head_count (" + std::to_string(c.n_head) + ") must be a multiple of head_count_kv (" +
               std::to_string(c.n_head_kv) + ")");
  if (auto kl = f.get_int_opt(a + "attention.key_length")) {
    c.head_dim = positive(f, a + "attention.key_length", *kl, 65536);
    if (auto vl = f.get_int_opt(a + "attention.value_length"); vl && *vl != *kl)
      fail(Errc::unsupported, "model",
           gguf_printable(f.path(), 400) + ": key_length != value_length is not supported");
  } else {
    if (c.n_embd % c.n_head != 0)
      bad(f, "embedding_length (" + std::to_string(c.n_embd) + ") is not a multiple of head_count (" +
                 std::to_string(c.n_head) + ")");
    c.head_dim = c.n_embd / c.n_head;
  }
  c.norm_eps = static_cast<float>(f.get_float_opt(a + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (!(c.norm_eps > 0.0f) || c.norm_eps > 1.0f)
    bad(f, "attention.layer_norm_rms_epsilon must be in (0, 1], found " + std::to_string(c.norm_eps));
}

// RoPE: dimensions, base, scaling (none, linear, YaRN) and the context it was trained for.
void read_rope(ModelConfig& c, const GgufFile& f, const std::string& a) {
  c.rope.n_dims = positive(f, a + "rope.dimension_count",
                           f.get_int_opt(a + "rope.dimension_count").value_or(c.head_dim), c.head_dim);
  if (c.rope.n_dims % 2 != 0)
    bad(f, "rope.dimension_count must be even, found " + std::to_string(c.rope.n_dims));
  c.rope.theta = rope_base(f, a + "rope.freq_base");
  const std::string scaling = f.get_string_opt(a + "rope.scaling.type").value_or("none");
  // The factor: rope.scaling.factor, else the older rope.scale_linear; 1 is no scaling.
  std::optional<float> factor =
      finite_at_least(f, a + "rope.scaling.factor", 1.0, "a finite number ≥ 1 (1: no scaling)");
  if (!factor)
    factor = finite_at_least(f, a + "rope.scale_linear", 1.0, "a finite number ≥ 1 (1: no scaling)");
  if (scaling == "none" || (scaling.empty())) {
    c.rope.scaling = (factor && *factor > 1.0f ? RopeScaling::linear : RopeScaling::none);
  } else if (scaling == "linear") {
    c.rope.scaling = RopeScaling::linear;
  } else if (scaling == "yarn") {
    c.rope.scaling = RopeScaling::yarn;
  } else {
    fail(Errc::unsupported, "model",
         gguf_printable(f.path(), 400) + ": rope.scaling.type '" + gguf_printable(scaling) +
             "' is not supported (none, linear, yarn)");
  }
  c.rope.factor = factor.value_or(1.0f);
  c.rope.yarn_beta_fast =
      finite_at_least(f, a + "rope.scaling.yarn_beta_fast", 0.0, "a finite number ≥ 0").value_or(32.0f);
  c.rope.yarn_beta_slow =
      finite_at_least(f, a + "rope.scaling.yarn_beta_slow", 0.0, "a finite number ≥ 0").value_or(1.0f);
  c.rope.attn_factor =
      finite_at_least(f, a + "rope.scaling.attn_factor", 0.0, "a finite number ≥ 0 (1: unscaled)")
          .value_or(1.0f);
  if (f.find(a + "rope.scaling.yarn_log_multiplier"))
    fail(Errc::unsupported, "model",
         gguf_printable(f.path(), 400) +
             ": rope.scaling.yarn_log_multiplier (DeepSeek's YaRN magnitude) is not "
             "supported yet");
  c.rope.orig_ctx = c.n_ctx_train;
  if (auto oc = f.get_int_opt(a + "rope.scaling.original_context_length"))
    c.rope.orig_ctx = positive(f, a + "rope.scaling.original_context_length", *oc, 1 << 24);
}

// attention.sliding_window and which layers use it: every layer, or as the pattern says (one bool per
// layer, or a period: every period-th layer attends in full).
void read_sliding_window(ModelConfig& c, const GgufFile& f, const std::string& a) {
  auto sw = f.get_int_opt(a + "attention.sliding_window");
  if (!sw || *sw == 0) return;
  c.sliding_window = positive(f, a + "attention.sliding_window", *sw, 1 << 24);
  c.sliding_layers.assign(static_cast<size_t>(c.n_layer), true);
  const std::string pk = a + "attention.sliding_window_pattern";
  const GgufValue* pv = f.find(pk);
  if (!pv) return;
  if (pv->type == GgufType::array) {
    if (pv->elem_type != GgufType::boolean || pv->items.size() != static_cast<size_t>(c.n_layer))
      bad(f, "metadata '" + pk + "' must be " + std::to_string(c.n_layer) +
                 " bools (one per layer, true = sliding window), found " + pv->to_string());
    for (size_t i = 0; i < pv->items.size(); ++i)
      c.sliding_layers[i] = pv->items[i].u != 0;
  } else {
    const int32_t period = positive(f, pk, pv->as_int().value_or(0), 1 << 16);
    for (int32_t l = 0; l < c.n_layer; ++l) // every period-th layer attends in full (gemma3: 6)
      c.sliding_layers[static_cast<size_t>(l)] = (l + 1) % period != 0;
  }
}

// Mixture of experts ({arch}.expert_count > 0): how many experts, how many a token uses, their width
// (expert_feed_forward_length, else n_ff / n_used), and how their weights are made (expert_gating_func:
// 1 softmax, 2 sigmoid, 3 softmax over the selected; expert_weights_norm; expert_weights_scale) where the
// file says; the family's configure may override them after.
void read_moe(ModelConfig& c, const GgufFile& f, const std::string& a) {
  const std::optional<int64_t> n = f.get_int_opt(a + "expert_count");
  if (!n || *n == 0) return;
  MoeConfig& m = c.moe;
  m.n_expert = positive(f, a + "expert_count", *n, 1 << 16);
  m.n_used = positive(f, a + "expert_used_count", f.get_int(a + "expert_used_count"), m.n_expert);
  m.n_ff_exp = positive(f, a + "expert_feed_forward_length",
                        f.get_int_opt(a + "expert_feed_forward_length").value_or(c.n_ff / m.n_used));
  if (const auto g = f.get_int_opt(a + "expert_gating_func")) {
    if (*g < 1 || *g > 3)
      bad(f, "metadata '" + a + "expert_gating_func' must be 1 (softmax), 2 (sigmoid) or 3 (softmax of the " +
                 "selected), found " + std::to_string(*g));
    m.gating = *g == 1 ? MoeGating::softmax : *g == 2 ? MoeGating::sigmoid : MoeGating::softmax_selected;
  }
  if (const GgufValue* v = f.find(a + "expert_weights_norm")) m.norm = v->as_int().value_or(0) != 0;
  const float scale =
      finite_at_least(f, a + "expert_weights_scale", 0.0, "a finite number ≥ 0 (0: not scaled)")
          .value_or(0.0f);
  if (scale > 0.0f) m.weights_scale = scale;
}

// n_vocab from token_embd.weight's rows, checked against {arch}.vocab_size. Returns the embedding.
const GgufTensor& read_vocab_size(ModelConfig& c, const GgufFile& f, const std::string& a) {
  const GgufTensor* emb = f.find_tensor("token_embd.weight");
  if (!emb) bad(f, "tensor 'token_embd.weight' is missing");
  if (emb->ne.size() != 2 || emb->ne[0] != c.n_embd)
    bad(f, "tensor 'token_embd.weight' must be [" + std::to_string(c.n_embd) + ", n_vocab]");
  c.n_vocab = positive(f, "token_embd.weight ne[1] (n_vocab)", emb->ne[1], 1 << 22);
  if (auto vs = f.get_int_opt(a + "vocab_size"); vs && *vs != c.n_vocab)
    bad(f, a + "vocab_size (" + std::to_string(*vs) + ") disagrees with token_embd.weight (" +
               std::to_string(c.n_vocab) + " rows)");
  return *emb;
}

// Every tensor's shape as the metadata implies it (messages name the sizes it came from).
class ShapeCheck {
public:
  ShapeCheck(const ModelConfig& c, const GgufFile& f, const std::string& a)
      : c_(c), f_(f),
        dims_(a + "embedding_length " + std::to_string(c.n_embd) + ", " + a + "attention.head_count " +
              std::to_string(c.n_head) + ", " + a + "attention.head_count_kv " + std::to_string(c.n_head_kv) +
              ", head_dim " + std::to_string(c.head_dim) + ", " + a + "feed_forward_length " +
              std::to_string(c.n_ff)) {}

  void operator()(const std::string& tensor, std::initializer_list<int64_t> ne) const {
    expect_shape(f_, tensor, ne, true, dims_);
  }

  void layer(int32_t l) const {
    const auto& c = c_;
    const auto& shape = *this;
    const int64_t q_dim = static_cast<int64_t>(c.n_head) * c.head_dim;
    const int64_t kv_dim = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
    const std::string p = "blk." + std::to_string(l) + ".";
    shape(p + "attn_norm.weight", {c.n_embd});
    if (c.fused_qkv) {
      shape(p + "attn_qkv.weight", {c.n_embd, q_dim + 2 * kv_dim});
    } else {
      shape(p + "attn_q.weight", {c.n_embd, q_dim});
      shape(p + "attn_k.weight", {c.n_embd, kv_dim});
      shape(p + "attn_v.weight", {c.n_embd, kv_dim});
    }
    if (c.qkv_bias) {
      shape(p + "attn_q.bias", {q_dim});
      shape(p + "attn_k.bias", {kv_dim});
      shape(p + "attn_v.bias", {kv_dim});
    }
    if (c.qk_norm) {
      shape(p + "attn_q_norm.weight", {c.head_dim});
      shape(p + "attn_k_norm.weight", {c.head_dim});
    }
    shape(p + "attn_output.weight", {q_dim, c.n_embd});
    if (c.attn_out_bias) shape(p + "attn_output.bias", {c.n_embd});
    if (c.attn_sink_logits) shape(p + "attn_sinks.weight", {c.n_head});
    shape(p + c.ffn_norm + ".weight", {c.n_embd});
    if (c.post_norms) {
      shape(p + "post_attention_norm.weight", {c.n_embd});
      shape(p + "post_ffw_norm.weight", {c.n_embd});
    }
    if (c.moe.n_expert > 0) {
      experts(p);
    } else if (c.fused_gate_up) {
      shape(p + "ffn_up.weight", {c.n_embd, 2 * static_cast<int64_t>(c.n_ff)});
    } else {
      shape(p + "ffn_gate.weight", {c.n_embd, c.n_ff});
      shape(p + "ffn_up.weight", {c.n_embd, c.n_ff});
    }
    if (c.moe.n_expert == 0) shape(p + "ffn_down.weight", {c.n_ff, c.n_embd});
  }

  // A mixture-of-experts layer's router and stacked experts (p = "blk.<l>.").
  void experts(const std::string& p) const {
    const MoeConfig& m = c_.moe;
    const std::string moe_dims = dims_ + ", expert_count " + std::to_string(m.n_expert) +
                                 ", expert_feed_forward_length " + std::to_string(m.n_ff_exp);
    const auto shape = [&](const std::string& t, std::initializer_list<int64_t> ne) {
      expect_shape(f_, t, ne, true, moe_dims);
    };
    shape(p + "ffn_gate_inp.weight", {c_.n_embd, m.n_expert});
    if (m.router_bias) shape(p + "ffn_gate_inp.bias", {m.n_expert});
    if (m.selection_bias) shape(p + "exp_probs_b.bias", {m.n_expert});
    shape(p + "ffn_gate_exps.weight", {c_.n_embd, m.n_ff_exp, m.n_expert});
    shape(p + "ffn_up_exps.weight", {c_.n_embd, m.n_ff_exp, m.n_expert});
    shape(p + "ffn_down_exps.weight", {m.n_ff_exp, c_.n_embd, m.n_expert});
    if (m.expert_biases) {
      shape(p + "ffn_gate_exps.bias", {m.n_ff_exp, m.n_expert});
      shape(p + "ffn_up_exps.bias", {m.n_ff_exp, m.n_expert});
      shape(p + "ffn_down_exps.bias", {c_.n_embd, m.n_expert});
    }
  }

private:
  const ModelConfig& c_;
  const GgufFile& f_;
  std::string dims_;
};

// The layers' tensors, rope_freqs (Llama 3.1), the embedding, the final norm and the head (absent:
// tied to the embedding).
void check_tensors(ModelConfig& c, const GgufFile& f, const std::string& a) {
  const ShapeCheck shape(c, f, a);
  for (int32_t l = 0; l < c.n_layer; ++l)
    shape.layer(l);
  if (f.find_tensor("rope_freqs.weight")) {
    shape("rope_freqs.weight", {c.rope.n_dims / 2});
    if (f.find_tensor("rope_freqs.weight")->type != DType::f32)
      bad(f, "tensor 'rope_freqs.weight' must be f32");
    c.rope_freqs = true;
  }
  for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"})
    if (f.find_tensor(t))
      fail(Errc::unsupported, "model",
           gguf_printable(f.path(), 400) + ": '" + t +
               "' (Phi-3's long-context RoPE scaling, longrope) is not supported; use a 4k-context variant");
  shape("token_embd.weight", {c.n_embd, c.n_vocab});
  shape("output_norm.weight", {c.n_embd});
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  if (!c.tied_output) shape("output.weight", {c.n_embd, c.n_vocab});
}

} // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  const Family& family = read_arch(c, f);
  const std::string a = c.arch + ".";
  read_sizes(c, f, a);
  read_rope(c, f, a);
  read_sliding_window(c, f, a);
  c.attn_softcap =
      finite_at_least(f, a + "attn_logit_softcapping", 0.0, "a finite number ≥ 0 (0: off)").value_or(0.0f);
  c.final_softcap =
      finite_at_least(f, a + "final_logit_softcapping", 0.0, "a finite number ≥ 0 (0: off)").value_or(0.0f);
  read_moe(c, f, a);
  family.configure(c, f, a);
  if (c.n_ff == 0 && c.moe.n_expert == 0)
    bad(f, "metadata '" + a + "feed_forward_length' is missing (a dense model's FFN width)");
  const GgufTensor& emb = read_vocab_size(c, f, a);
  check_tensors(c, f, a);

  for (const auto& t : f.tensors()) {
    c.n_params += t.n_elements;
    c.weight_bytes += t.n_bytes;
  }
  const GgufTensor* q0 = f.find_tensor(c.fused_qkv ? "blk.0.attn_qkv.weight" : "blk.0.attn_q.weight");
  c.weight_type = q0 ? q0->type : emb.type;
  return c;
}

uint64_t ModelConfig::kv_bytes_per_token(DType kv_type) const noexcept {
  const auto tr = dtype_traits(kv_type);
  const uint64_t elems = 2ull * static_cast<uint64_t>(n_layer) * static_cast<uint64_t>(n_head_kv) *
                         static_cast<uint64_t>(head_dim);
  return elems * tr.block_bytes / static_cast<uint64_t>(tr.block_size);
}

} // namespace loom
