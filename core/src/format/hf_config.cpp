// format/hf_config.cpp — a checkpoint's config.json read into GGUF keys (format/hf_config.hpp).
#include "format/hf_config.hpp"

#include "loom/format/gguf.hpp"

#include <cmath>
#include <numbers>

namespace loom::hf {

namespace {

constexpr int64_t k_max_vocab = 1 << 22; // token ids (ModelConfig's bound on n_vocab)

constexpr HfArch k_archs[] = {
    {"LlamaForCausalLM", "llama", true, false, false},
    {"MistralForCausalLM", "llama", true, false, false},
    {"Qwen2ForCausalLM", "qwen2", false, true, false},
    {"Qwen3ForCausalLM", "qwen3", false, false, true},
};

std::string supported_archs() {
  std::string s;
  for (const auto& a : k_archs)
    s += (s.empty() ? "" : ", ") + std::string(a.hf);
  return s;
}

// architectures[0]: a model class Loom reads.
const HfArch& read_arch(const json& cfg, const std::string& shown) {
  std::string arch_name;
  if (const json* a = member(cfg, "architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      bad(shown, "'architectures' should be a list of class names, found " + describe(*a));
    arch_name = (*a)[0].get<std::string>();
  } else {
    bad(shown, "'architectures' is missing: expected the model class (" + supported_archs() + ")",
        Errc::not_found);
  }
  const HfArch* arch = nullptr;
  for (const auto& a : k_archs)
    if (a.hf == arch_name) arch = &a;
  if (!arch)
    bad(shown,
        "architecture '" + gguf_printable(arch_name) +
            "' is not supported from a Hugging Face checkpoint (supported: " + supported_archs() +
            "); convert it with llama.cpp's convert_hf_to_gguf.py and load the .gguf",
        Errc::unsupported);
  return *arch;
}

// What the family's config may switch on that Loom's graph does not have: refused by name.
void refuse_unsupported(const json& cfg, const Keys& k, const HfArch& arch, const std::string& shown) {
  const std::string an(arch.hf);
  if (const json* q = member(cfg, "quantization_config"))
    bad(shown,
        "quantized checkpoints are not supported (quantization_config: " + describe(*q) +
            "); use an F32, F16 or BF16 checkpoint, or a GGUF file",
        Errc::unsupported);
  if (auto act = k.str_opt("hidden_act"); act && *act != "silu")
    bad(shown, "hidden_act '" + gguf_printable(*act) + "' is not supported for " + an + " (expected silu)",
        Errc::unsupported);
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (k.bool_opt(key).value_or(false) && !(arch.qkv_bias && std::string_view(key) == "attention_bias"))
      bad(shown,
          std::string("'") + key + "': true is not supported for " + an +
              " (Loom's graph has no such biases)",
          Errc::unsupported);
  if (arch.gguf == "qwen2" && k.bool_opt("use_sliding_window").value_or(false))
    bad(shown, "use_sliding_window: true (sliding-window layers of Qwen2) is not supported",
        Errc::unsupported);
}

// The model's sizes, checked against each other.
void read_sizes(const Keys& k, HfConfig& h, const std::string& shown) {
  h.n_embd = k.int_req("hidden_size", 1, 1 << 20);
  h.n_layer = k.int_req("num_hidden_layers", 1, 4096);
  h.n_head = k.int_req("num_attention_heads", 1, 4096);
  h.n_head_kv = k.int_opt("num_key_value_heads", 1, 4096).value_or(h.n_head);
  h.n_ff = k.int_req("intermediate_size", 1, 1 << 22);
  h.n_vocab = k.int_req("vocab_size", 1, k_max_vocab);
  h.n_ctx = k.int_req("max_position_embeddings", 1, 1 << 24);
  if (auto hd = k.int_opt("head_dim", 1, 65536)) {
    h.head_dim = *hd;
    h.head_dim_explicit = true;
  } else {
    if (h.n_embd % h.n_head != 0)
      bad(shown, "hidden_size (" + std::to_string(h.n_embd) + ") is not a multiple of num_attention_heads (" +
                     std::to_string(h.n_head) + ") and there is no head_dim");
    h.head_dim = h.n_embd / h.n_head;
  }
  if (h.head_dim % 2 != 0)
    bad(shown, "the head dimension must be even for RoPE, found " + std::to_string(h.head_dim));
  if (h.n_head % h.n_head_kv != 0)
    bad(shown, "num_attention_heads (" + std::to_string(h.n_head) +
                   ") must be a multiple of num_key_value_heads (" + std::to_string(h.n_head_kv) + ")");
}

// general.name: _name_or_path, else the directory's last component.
std::string model_name(const Keys& k, const std::string& dir) {
  std::string name = k.str_opt("_name_or_path").value_or("");
  if (name.empty()) {
    std::string d = dir;
    while (d.size() > 1 && d.back() == '/')
      d.pop_back();
    name = d.substr(d.rfind('/') == std::string::npos ? 0 : d.rfind('/') + 1);
  }
  return name;
}

void add_hyperparameters(Meta& meta, const HfConfig& h, double theta, double eps) {
  const std::string a = std::string(h.arch->gguf) + ".";
  meta.add("general.architecture", v_str(std::string(h.arch->gguf)));
  meta.add("general.name", v_str(h.name));
  meta.add(a + "context_length", v_u32(h.n_ctx));
  meta.add(a + "embedding_length", v_u32(h.n_embd));
  meta.add(a + "block_count", v_u32(h.n_layer));
  meta.add(a + "feed_forward_length", v_u32(h.n_ff));
  meta.add(a + "attention.head_count", v_u32(h.n_head));
  meta.add(a + "attention.head_count_kv", v_u32(h.n_head_kv));
  meta.add(a + "rope.freq_base", v_f32(theta));
  meta.add(a + "attention.layer_norm_rms_epsilon", v_f32(eps));
  meta.add(a + "rope.dimension_count", v_u32(h.head_dim));
  if (h.head_dim_explicit) {
    meta.add(a + "attention.key_length", v_u32(h.head_dim));
    meta.add(a + "attention.value_length", v_u32(h.head_dim));
  }
  meta.add(a + "vocab_size", v_u32(h.n_vocab));
}

// Llama 3.1's rope_scaling as the frequency divisors llama.cpp's converter writes as rope_freqs.weight.
std::vector<float> llama3_rope_freqs(const Keys& r, const json& rs, double theta, int64_t head_dim) {
  const double factor = r.num_opt("factor").value_or(8.0);
  const double lo = r.num_opt("low_freq_factor").value_or(1.0);
  const double hi = r.num_opt("high_freq_factor").value_or(4.0);
  const double old_ctx =
      static_cast<double>(r.int_opt("original_max_position_embeddings", 1, 1 << 24).value_or(8192));
  if (!(factor >= 1.0) || !(lo > 0.0) || !(hi > lo))
    bad(r.shown(), "expected factor ≥ 1 and 0 < low_freq_factor < high_freq_factor, found " + describe(rs));
  std::vector<float> f;
  for (int64_t i = 0; i < head_dim; i += 2) {
    const double freq = 1.0 / std::pow(theta, static_cast<double>(i) / static_cast<double>(head_dim));
    const double wavelen = 2.0 * std::numbers::pi / freq;
    if (wavelen < old_ctx / hi) {
      f.push_back(1.0f);
    } else if (wavelen > old_ctx / lo) {
      f.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
      f.push_back(static_cast<float>(1.0 / ((1.0 - smooth) / factor + smooth)));
    }
  }
  return f;
}

// rope_scaling: linear and YaRN as GGUF keys, Llama 3.1's as rope_freqs (h.rope_freqs).
void read_rope_scaling(const json& rs, const std::string& shown, double theta, HfConfig& h, Meta& meta) {
  const std::string a = std::string(h.arch->gguf) + ".";
  const std::string rshown = shown + " rope_scaling";
  if (!rs.is_object()) bad(shown, "'rope_scaling' should be an object or null, found " + describe(rs));
  const Keys r(rs, rshown);
  const std::string type = r.str_opt("rope_type").value_or(r.str_opt("type").value_or("default"));
  if (type == "default") {
  } else if (type == "linear") {
    meta.add(a + "rope.scaling.type", v_str("linear"));
    meta.add(a + "rope.scaling.factor", v_f32(r.num_opt("factor").value_or(1.0)));
  } else if (type == "yarn") {
    if (r.num_opt("beta_fast").value_or(32.0) != 32.0 || r.num_opt("beta_slow").value_or(1.0) != 1.0 ||
        r.num_opt("attention_factor"))
      bad(rshown, "YaRN with beta_fast/beta_slow other than 32/1 or an attention_factor is not supported",
          Errc::unsupported);
    meta.add(a + "rope.scaling.type", v_str("yarn"));
    meta.add(a + "rope.scaling.factor", v_f32(r.num_opt("factor").value_or(1.0)));
    meta.add(a + "rope.scaling.original_context_length",
             v_u32(r.int_opt("original_max_position_embeddings", 1, 1 << 24).value_or(h.n_ctx)));
  } else if (type == "llama3" && h.arch->gguf == "llama") {
    h.rope_freqs = llama3_rope_freqs(r, rs, theta, h.head_dim);
  } else {
    bad(rshown,
        "rope type '" + gguf_printable(type) + "' is not supported for " + std::string(h.arch->hf) +
            " (supported: default, linear, yarn" + (h.arch->gguf == "llama" ? ", llama3" : "") + ")",
        Errc::unsupported);
  }
}

} // namespace

HfConfig read_config(const json& cfg, const std::string& dir, Meta& meta) {
  const std::string shown = gguf_printable(join(dir, "config.json"), 400);
  if (!cfg.is_object()) bad(shown, "expected a JSON object, found " + describe(cfg));
  const Keys k(cfg, shown);
  HfConfig h;
  h.arch = &read_arch(cfg, shown);
  refuse_unsupported(cfg, k, *h.arch, shown);
  read_sizes(k, h, shown);
  h.tied = k.bool_opt("tie_word_embeddings").value_or(false);
  const double eps = k.num_opt("rms_norm_eps").value_or(1e-6);
  const double theta = k.num_opt("rope_theta").value_or(10000.0);
  h.name = model_name(k, dir);
  add_hyperparameters(meta, h, theta, eps);
  if (const json* rs = member(cfg, "rope_scaling")) read_rope_scaling(*rs, shown, theta, h, meta);
  // Mistral's sliding window (v0.1: 4096; null in later versions).
  if (h.arch->hf == "MistralForCausalLM")
    if (auto sw = k.int_opt("sliding_window", 0, 1 << 24); sw && *sw > 0 && *sw < h.n_ctx)
      meta.add(std::string(h.arch->gguf) + ".attention.sliding_window", v_u32(*sw));
  return h;
}

} // namespace loom::hf
