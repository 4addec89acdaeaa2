// What every AttentionVariant derives from its layers (loom/attention.hpp), and the factory.
#include "loom/attention.hpp"
#include "loom/error.hpp"
#include "loom/kv/kv_cache.hpp"
#include "loom/model/model_config.hpp"

#include <cstdio>

namespace loom {

void AttentionVariant::apply(AttentionParams& p) const noexcept {
  const LayerAttention l = layer(p.layer);
  p.window = l.window;
  p.sinks = l.window > 0 ? l.sinks : 0;
  p.softcap = l.softcap;
  p.kernel = kernel_;
}

uint32_t AttentionVariant::features() const noexcept {
  uint32_t f = 0;
  for (int32_t il = 0; il < n_layer(); ++il) {
    AttentionParams p;
    p.layer = il;
    apply(p);
    f |= p.features();
  }
  return f;
}

KVRetention AttentionVariant::retention() const noexcept {
  KVRetention r;
  for (int32_t il = 0; il < n_layer(); ++il) {
    const LayerAttention l = layer(il);
    if (l.window <= 0) return {}; // a layer attends in full: every position stays
    r.window = std::max(r.window, l.window);
    r.sinks = std::max(r.sinks, l.sinks);
  }
  return r;
}

void AttentionVariant::set_retention(KVShape& s, uint32_t reads) const {
  s.retention = {};
  s.window_layers.clear();
  s.window_retention = {};
  if (!(reads & attn_span_only) || n_layer() != s.n_layer) return;
  if (retention().bounded()) {
    s.retention = retention();
    return;
  }
  if (!(reads & attn_kv_groups)) return;
  for (int32_t il = 0; il < n_layer(); ++il) {
    const LayerAttention l = layer(il);
    s.window_layers.push_back(l.window > 0);
    s.window_retention.window = std::max(s.window_retention.window, l.window);
    s.window_retention.sinks = std::max(s.window_retention.sinks, l.window > 0 ? l.sinks : 0);
  }
  if (!s.window_retention.bounded()) s.window_layers.clear(); // every layer attends in full
}

namespace {
std::string num(float v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", static_cast<double>(v));
  return b;
}
} // namespace

std::string AttentionVariant::describe() const {
  int32_t sliding = 0;
  LayerAttention w;
  float cap = 0.0f;
  for (int32_t il = 0; il < n_layer(); ++il) {
    const LayerAttention l = layer(il);
    if (l.window > 0) {
      ++sliding;
      w = l;
    }
    cap = std::max(cap, l.softcap);
  }
  std::string s(name());
  if (sliding == 0) s += " (causal)";
  if (sliding > 0) {
    s += " (window " + std::to_string(w.window);
    if (w.sinks > 0) s += ", sinks " + std::to_string(w.sinks);
    s += ")";
    if (sliding < n_layer())
      s += " on " + std::to_string(sliding) + " of " + std::to_string(n_layer()) + " layers";
  }
  if (cap > 0.0f) s += ", softcap " + num(cap);
  s += ", kernel ";
  s += attn_kernel_name(kernel_);
  return s;
}

std::optional<AttnKernel> attn_kernel_from_name(std::string_view name) noexcept {
  if (name == "auto") return AttnKernel::auto_;
  if (name == "naive") return AttnKernel::naive;
  if (name == "flash") return AttnKernel::flash;
  return std::nullopt;
}

std::unique_ptr<AttentionVariant> make_attention_variant(const ModelConfig& mc, const AttentionChoice& c) {
  const auto k = attn_kernel_from_name(c.kernel);
  if (!k)
    fail(Errc::invalid_argument, "attention",
         "unknown attention kernel '" + c.kernel + "' (expected auto, naive or flash)");
  const float cap = c.softcap.value_or(mc.attn_softcap);
  if (c.variant == "standard") return make_standard_attention(mc.n_layer, cap, *k);
  if (c.variant == "sliding_window") {
    if (c.window <= 0)
      fail(Errc::invalid_argument, "attention", "variant \"sliding_window\" needs a window > 0");
    return make_sliding_window_attention(mc.n_layer, c.window, c.sinks, {}, cap, *k);
  }
  if (c.variant == "model") {
    const int32_t window = c.window > 0 ? c.window : mc.sliding_window;
    if (window <= 0) {
      if (c.sinks > 0)
        fail(Errc::invalid_argument, "attention",
             "sinks = " + std::to_string(c.sinks) +
                 " needs a sliding window, and the model has none: set variant = \"sliding_window\" and a "
                 "window");
      return make_standard_attention(mc.n_layer, cap, *k);
    }
    return make_sliding_window_attention(mc.n_layer, window, c.sinks, mc.sliding_layers, cap, *k);
  }
  fail(Errc::invalid_argument, "attention",
       "unknown attention variant '" + c.variant + "' (expected model, standard or sliding_window)");
}

} // namespace loom
