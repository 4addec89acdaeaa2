// synth.cpp — `loom synth` (loom/model/synth.hpp): random-weight models of named shapes and families, with a
// vocabulary (synthetic, or copied from another GGUF), written tensor by tensor. `loom quantize` is
// quantize.cpp.
#include "loom/model/synth.hpp"

#include "format/gguf_file_type.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>

namespace loom {

const std::vector<SynthShape>& synth_shapes() {
  static const std::vector<SynthShape> shapes = {
      // name, n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx, θ, tied, head_dim, experts, used,
      // width
      {"tiny-gqa", 32, 1, 4, 2, 64, 512, 1024, 10000.0f, false, 0, 0, 0,
       0}, // tests: cheap, GQA, long context
      {"tiny-d64", 128, 2, 2, 1, 256, 512, 1024, 10000.0f, false, 0, 0, 0, 0},   // tests: head_dim 64, MQA
      {"tiny-moe", 128, 2, 2, 1, 256, 512, 1024, 10000.0f, false, 0, 8, 3, 64},  // tests: 3 of 8 experts
      {"tiny-d64x4", 128, 4, 2, 1, 256, 512, 1024, 10000.0f, false, 0, 0, 0, 0}, // tests: 4 layers (SmolLM3)
      {"stories15m", 288, 6, 6, 6, 768, 32000, 256, 10000.0f, false, 0, 0, 0, 0},
      {"stories110m", 768, 12, 12, 12, 2048, 32000, 1024, 10000.0f, false, 0, 0, 0, 0},
      {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 32000, 2048, 10000.0f, false, 0, 0, 0, 0},
      {"llama-3.2-1b-like", 2048, 16, 32, 8, 8192, 128256, 8192, 500000.0f, true, 0, 0, 0, 0},
      {"llama-2-7b", 4096, 32, 32, 32, 11008, 32000, 4096, 10000.0f, false, 0, 0, 0, 0},
      {"llama-3-8b", 4096, 32, 32, 8, 14336, 128256, 8192, 500000.0f, false, 0, 0, 0, 0}, // (gpu-check.sh)
      {"qwen3-30b-a3b", 2048, 48, 32, 4, 6144, 151936, 40960, 1000000.0f, false, 128, 128, 8, 768},
      {"tiny-oss", 128, 2, 4, 2, 256, 512, 1024, 150000.0f, false, 64, 8, 3, 64}, // tests: gpt-oss's graph
      {"gpt-oss-20b", 2880, 24, 64, 8, 2880, 201088, 131072, 150000.0f, false, 64, 32, 4, 2880},
  };
  return shapes;
}

namespace {

struct XorShift {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float uniform(float a) { // in [-a, a)
    return (static_cast<float>(next() >> 40) * 0x1.0p-24f * 2.0f - 1.0f) * a;
  }
};

// ---- the steps of synth_model -----------------------------------------------------------------------

const SynthShape& find_shape(const std::string& name) {
  const SynthShape* shape = nullptr;
  std::string names;
  for (const auto& s : synth_shapes()) {
    names += (names.empty() ? "" : ", ") + s.name;
    if (s.name == name) shape = &s;
  }
  if (!shape) fail(Errc::invalid_argument, "synth", "unknown shape '" + name + "' (known: " + names + ")");
  return *shape;
}

// The tokenizer.* keys of o.vocab_from (but its chat template when o.chat_template replaces it).
// Returns the vocabulary's size.
int32_t add_copied_vocab(GgufWriter& w, const SynthOptions& o) {
  const GgufFile v = GgufFile::open(o.vocab_from);
  const GgufValue* toks = v.get_array("tokenizer.ggml.tokens", GgufType::string);
  if (!toks) fail(Errc::invalid_argument, "synth", o.vocab_from + ": has no tokenizer.ggml.tokens to copy");
  for (const auto& kv : v.metadata())
    if (kv.key.rfind("tokenizer.", 0) == 0 &&
        !(kv.key == "tokenizer.chat_template" && !o.chat_template.empty()))
      w.add(kv.key, kv.value);
  return static_cast<int32_t>(toks->items.size());
}

// A SentencePiece-style vocabulary of n_vocab tokens: <unk>, <s>, </s>, the 256 byte tokens, then
// "▁t<id>" pieces.
void add_synthetic_vocab(GgufWriter& w, int32_t n_vocab) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  GgufValue scores, types;
  scores.type = types.type = GgufType::array;
  scores.elem_type = GgufType::f32;
  types.elem_type = GgufType::i32;
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.push_back(buf);
  }
  while (static_cast<int32_t>(tokens.size()) < n_vocab)
    tokens.push_back("\xE2\x96\x81t" + std::to_string(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i) {
    GgufValue sc, ty;
    sc.type = GgufType::f32;
    sc.f = i < 259 ? 0.0 : -static_cast<double>(i);
    ty.type = GgufType::i32;
    ty.i = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    scores.items.push_back(sc);
    types.items.push_back(ty);
  }
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add("tokenizer.ggml.scores", scores);
  w.add("tokenizer.ggml.token_type", types);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
}

// The families synth writes, and whether each is a mixture of experts (whose shape must have experts).
void check_arch(const std::string& arch, const SynthShape& sh) {
  static const char* archs[] = {"llama",  "llama3", "mistral", "qwen2",    "qwen3",
                                "gemma2", "phi3",   "smollm3", "qwen3moe", "gpt-oss"};
  if (std::find(std::begin(archs), std::end(archs), arch) == std::end(archs))
    fail(Errc::invalid_argument, "synth",
         "unknown arch '" + arch +
             "' (known: llama, llama3, mistral, qwen2, qwen3, gemma2, phi3, smollm3, qwen3moe, gpt-oss)");
  if ((arch == "qwen3moe" || arch == "gpt-oss") && sh.n_expert == 0)
    fail(Errc::invalid_argument, "synth",
         "shape '" + sh.name + "' has no experts; " + arch +
             " needs one that has (tiny-moe, qwen3-30b-a3b, tiny-oss, gpt-oss-20b)");
}

int64_t head_dim(const SynthShape& sh) {
  return sh.head_dim > 0 ? sh.head_dim : sh.n_embd / sh.n_head;
}

// general.* and the {arch}.* hyperparameters (`arch`: the GGUF architecture).
void add_model_keys(GgufWriter& w, const SynthOptions& o, const SynthShape& sh, const std::string& arch) {
  const std::string k = arch + "."; // key prefix
  if (!o.chat_template.empty()) w.add_string("tokenizer.chat_template", o.chat_template);
  w.add_string("general.architecture", arch);
  w.add_string("general.name", "loom-synth " + (o.arch == "llama" ? "" : o.arch + " ") + sh.name + " " +
                                   std::string(dtype_name(o.type)));
  w.add_u32("general.file_type", file_type(o.type));
  if (is_quantized(o.type)) w.add_u32("general.quantization_version", 2);
  w.add_u32(k + "context_length", static_cast<uint32_t>(sh.n_ctx));
  w.add_u32(k + "embedding_length", static_cast<uint32_t>(sh.n_embd));
  w.add_u32(k + "block_count", static_cast<uint32_t>(sh.n_layer));
  w.add_u32(k + "feed_forward_length", static_cast<uint32_t>(sh.n_ff));
  w.add_u32(k + "attention.head_count", static_cast<uint32_t>(sh.n_head));
  w.add_u32(k + "attention.head_count_kv", static_cast<uint32_t>(sh.n_head_kv));
  w.add_u32(k + "rope.dimension_count", static_cast<uint32_t>(head_dim(sh)));
  if (sh.head_dim > 0) {
    w.add_u32(k + "attention.key_length", static_cast<uint32_t>(sh.head_dim));
    w.add_u32(k + "attention.value_length", static_cast<uint32_t>(sh.head_dim));
  }
  if (o.arch == "gpt-oss") { // a window of 128 on every other layer; YaRN: 32× the first 1/32 of the context
    w.add_u32(k + "attention.sliding_window", 128);
    w.add_string(k + "rope.scaling.type", "yarn");
    w.add_f32(k + "rope.scaling.factor", 32.0f);
    w.add_u32(k + "rope.scaling.original_context_length", static_cast<uint32_t>(sh.n_ctx / 32));
  }
  if (sh.n_expert > 0) {
    w.add_u32(k + "expert_count", static_cast<uint32_t>(sh.n_expert));
    w.add_u32(k + "expert_used_count", static_cast<uint32_t>(sh.n_used));
    w.add_u32(k + "expert_feed_forward_length", static_cast<uint32_t>(sh.n_ff_exp));
  }
  w.add_f32(k + "rope.freq_base", sh.rope_theta);
  w.add_f32(k + "attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_u32(k + "vocab_size", static_cast<uint32_t>(sh.n_vocab));
  if (o.arch == "gemma2") {
    w.add_f32(k + "attn_logit_softcapping", 50.0f);
    w.add_f32(k + "final_logit_softcapping", 30.0f);
  }
  if (o.arch == "gemma2" || o.arch == "mistral") // a quarter of the context: windows that matter in tests
    w.add_u32(k + "attention.sliding_window", static_cast<uint32_t>(std::max(16, sh.n_ctx / 4)));
}

// The tensors of layer l in the family's layout.
void add_layer_specs(std::vector<GgufWriter::TensorSpec>& specs, const SynthOptions& o, const SynthShape& sh,
                     int32_t l) {
  const int64_t E = sh.n_embd, F = sh.n_ff, D = head_dim(sh);
  const int64_t KV = D * sh.n_head_kv, Q = D * sh.n_head;
  const std::string p = "blk." + std::to_string(l) + ".";
  specs.push_back({p + "attn_norm.weight", DType::f32, {E}});
  if (o.arch == "phi3") {
    specs.push_back({p + "attn_qkv.weight", o.type, {E, E + 2 * KV}});
  } else {
    specs.push_back({p + "attn_q.weight", o.type, {E, Q}});
    specs.push_back({p + "attn_k.weight", o.type, {E, KV}});
    specs.push_back({p + "attn_v.weight", o.type, {E, KV}});
  }
  if (o.arch == "qwen2" || o.arch == "gpt-oss") {
    specs.push_back({p + "attn_q.bias", DType::f32, {Q}});
    specs.push_back({p + "attn_k.bias", DType::f32, {KV}});
    specs.push_back({p + "attn_v.bias", DType::f32, {KV}});
  }
  if (o.arch == "qwen3" || o.arch == "qwen3moe") {
    specs.push_back({p + "attn_q_norm.weight", DType::f32, {D}});
    specs.push_back({p + "attn_k_norm.weight", DType::f32, {D}});
  }
  specs.push_back({p + "attn_output.weight", o.type, {Q, E}});
  if (o.arch == "gpt-oss") {
    specs.push_back({p + "attn_output.bias", DType::f32, {E}});
    specs.push_back({p + "attn_sinks.weight", DType::f32, {sh.n_head}});
  }
  if (o.arch == "gemma2" || o.arch == "gpt-oss")
    specs.push_back({p + "post_attention_norm.weight", DType::f32, {E}});
  if (o.arch != "gpt-oss") specs.push_back({p + "ffn_norm.weight", DType::f32, {E}});
  if (sh.n_expert > 0) { // the router stays f32 (its top-k decides which experts run), the experts `type`
    const int64_t NE = sh.n_expert, FE = sh.n_ff_exp;
    const bool biased = o.arch == "gpt-oss";
    specs.push_back({p + "ffn_gate_inp.weight", DType::f32, {E, NE}});
    if (biased) specs.push_back({p + "ffn_gate_inp.bias", DType::f32, {NE}});
    for (const std::string w : {"gate", "up", "down"}) {
      const bool down = w == "down";
      specs.push_back({p + "ffn_" + w + "_exps.weight",
                       o.expert_type.value_or(o.type),
                       {down ? FE : E, down ? E : FE, NE}});
      if (biased) specs.push_back({p + "ffn_" + w + "_exps.bias", DType::f32, {down ? E : FE, NE}});
    }
    return;
  }
  if (o.arch == "phi3") {
    specs.push_back({p + "ffn_up.weight", o.type, {E, 2 * F}});
  } else {
    specs.push_back({p + "ffn_gate.weight", o.type, {E, F}});
    specs.push_back({p + "ffn_up.weight", o.type, {E, F}});
  }
  specs.push_back({p + "ffn_down.weight", o.type, {F, E}});
  if (o.arch == "gemma2") specs.push_back({p + "post_ffw_norm.weight", DType::f32, {E}});
}

// Every tensor of the model, in GGUF order.
std::vector<GgufWriter::TensorSpec> tensor_specs(const SynthOptions& o, const SynthShape& sh) {
  const int64_t E = sh.n_embd, V = sh.n_vocab, D = sh.n_embd / sh.n_head;
  std::vector<GgufWriter::TensorSpec> specs;
  specs.push_back({"token_embd.weight", o.type, {E, V}});
  if (o.arch == "llama3") specs.push_back({"rope_freqs.weight", DType::f32, {D / 2}});
  for (int32_t l = 0; l < sh.n_layer; ++l)
    add_layer_specs(specs, o, sh, l);
  specs.push_back({"output_norm.weight", DType::f32, {E}});
  if (!sh.tied_output) specs.push_back({"output.weight", o.type, {E, V}});
  return specs;
}

// Llama 3.1's RoPE frequency divisor for column c of `cols` (factor 8 over the original 8192
// positions).
float llama3_rope_divisor(double theta, int64_t c, int64_t cols) {
  const double wavelen =
      2.0 * M_PI * std::pow(theta, 2.0 * static_cast<double>(c) / static_cast<double>(2 * cols));
  const double lo = 8192.0 / 1.0, hi = 8192.0 / 4.0; // low/high frequency wavelengths
  return wavelen < hi   ? 1.0f
         : wavelen > lo ? 8.0f
                        : static_cast<float>(1.0 / ((1.0 - (8192.0 / wavelen - 1.0) / 3.0) / 8.0 +
                                                    (8192.0 / wavelen - 1.0) / 3.0));
}

// The random weights, tensor by tensor: uniform with std 0.02 (a = 0.02·√3), so activations stay
// finite through every layer. 1-D: norms are 1 (the families that are new here: 1 ± 0.25, so a norm's
// weight matters), biases random, rope_freqs Llama 3.1's divisors.
class WeightFiller {
public:
  WeightFiller(const SynthOptions& o, const SynthShape& sh, const std::vector<GgufWriter::TensorSpec>& specs)
      : o_(o), sh_(sh), specs_(specs), rng_{o.seed * 0x9E3779B97F4A7C15ull + 1} {
    for (const auto& s : specs)
      total_ += s.ne[0] * rows_of(s);
  }

  void fill(size_t i, std::vector<uint8_t>& bytes) {
    const auto& s = specs_[i];
    const int64_t cols = s.ne[0], rows = rows_of(s);
    const size_t rb = row_bytes(s.type, cols);
    bytes.resize(rb * static_cast<size_t>(rows));
    std::vector<float> row(static_cast<size_t>(cols));
    const Kind kind = kind_of(s);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c)
        row[static_cast<size_t>(c)] = value(kind, c, cols);
      quantize_row(s.type, row.data(), bytes.data() + static_cast<size_t>(r) * rb, cols);
    }
    done_ += cols * rows;
    if (o_.progress) o_.progress(static_cast<double>(done_) / static_cast<double>(total_));
  }

private:
  enum class Kind { freqs, norm, bias, router, sink, weight };

  static int64_t rows_of(const GgufWriter::TensorSpec& s) {
    int64_t rows = 1;
    for (size_t k = 1; k < s.ne.size(); ++k)
      rows *= s.ne[k];
    return rows;
  }

  Kind kind_of(const GgufWriter::TensorSpec& s) const {
    if (s.name == "rope_freqs.weight") return Kind::freqs;
    if (s.name.find("attn_sinks") != std::string::npos) return Kind::sink;
    if (s.name.find("ffn_gate_inp") != std::string::npos) return Kind::router;
    if (s.ne.size() == 1 && s.name.find("norm") != std::string::npos) return Kind::norm;
    // (gpt-oss's many biases as small as the products they are added to, or they drown them: every token's
    // hidden state the same)
    if (s.name.size() > 5 && s.name.compare(s.name.size() - 5, 5, ".bias") == 0)
      return o_.arch == "gpt-oss" ? Kind::weight : Kind::bias;
    return Kind::weight;
  }

  float value(Kind kind, int64_t c, int64_t cols) {
    switch (kind) {
    case Kind::freqs:
      return llama3_rope_divisor(static_cast<double>(sh_.rope_theta), c, cols);
    case Kind::norm:
      return plain_norms_ ? 1.0f : 1.0f + rng_.uniform(0.25f);
    case Kind::bias:
      return rng_.uniform(0.5f);
    case Kind::router: // logits a few units apart: a token's k-th and (k+1)-th experts are no near-tie
      return rng_.uniform(0.5f);
    case Kind::sink: // a learned sink logit: e^3 ≈ 20 keys' worth, so it matters hundreds of keys in
      return rng_.uniform(3.0f);
    case Kind::weight:
      break;
    }
    return rng_.uniform(k_weight_bound);
  }

  static inline const float k_weight_bound = 0.02f * std::sqrt(3.0f);

  const SynthOptions& o_;
  const SynthShape& sh_;
  const std::vector<GgufWriter::TensorSpec>& specs_;
  const bool plain_norms_ = o_.arch == "llama" || o_.arch == "llama3" || o_.arch == "mistral";
  XorShift rng_;
  int64_t total_ = 0, done_ = 0;
};

} // namespace

void synth_model(const SynthOptions& o) {
  SynthShape sh = find_shape(o.shape);
  for (const DType t : {o.type, o.expert_type.value_or(o.type)})
    if (t != DType::f32 && t != DType::f16 && t != DType::bf16 && t != DType::q8_0 && t != DType::q4_0 &&
        t != DType::mxfp4)
      fail(Errc::invalid_argument, "synth",
           "type " + std::string(dtype_name(t)) + " is not offered; use f32, f16, bf16, q8_0, q4_0 or mxfp4");

  GgufWriter w;
  // Vocabulary first: it fixes n_vocab.
  if (!o.vocab_from.empty())
    sh.n_vocab = add_copied_vocab(w, o);
  else
    add_synthetic_vocab(w, sh.n_vocab);
  check_arch(o.arch, sh);
  if (o.layers > 0) sh.n_layer = std::min(o.layers, sh.n_layer);
  // The GGUF architecture: Llama 3 and Mistral are llama files.
  const std::string arch = o.arch == "llama3" || o.arch == "mistral" ? "llama" : o.arch;
  if (o.arch == "llama3") sh.rope_theta = 500000.0f;
  if (o.arch == "gemma2" || o.arch == "llama3") sh.tied_output = true;
  add_model_keys(w, o, sh, arch);

  const std::vector<GgufWriter::TensorSpec> specs = tensor_specs(o, sh);
  WeightFiller filler(o, sh, specs);
  w.write_streaming(o.out, specs, [&](size_t i, std::vector<uint8_t>& bytes) { filler.fill(i, bytes); });
}

} // namespace loom
