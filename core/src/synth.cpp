#include "loom/synth.hpp"

#include "loom/error.hpp"
#include "loom/gguf.hpp"

#include <cmath>
#include <filesystem>

namespace loom {

const std::vector<SynthShape>& synth_shapes() {
  static const std::vector<SynthShape> shapes = {
      {"tiny-gqa", 32, 1, 4, 2, 64, 512, 1024, 10000.0f, false},   // tests: cheap tokens, GQA, long context
      {"tiny-d64", 128, 2, 2, 1, 256, 512, 1024, 10000.0f, false}, // tests: head_dim 64 kernels, MQA
      {"stories15m", 288, 6, 6, 6, 768, 32000, 256, 10000.0f, false},
      {"stories110m", 768, 12, 12, 12, 2048, 32000, 1024, 10000.0f, false},
      {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 32000, 2048, 10000.0f, false},
      {"llama-3.2-1b-like", 2048, 16, 32, 8, 8192, 128256, 8192, 500000.0f, true},
      {"llama-2-7b", 4096, 32, 32, 32, 11008, 32000, 4096, 10000.0f, false},
  };
  return shapes;
}

namespace {

bool fs_same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return std::filesystem::exists(b, ec) && std::filesystem::equivalent(a, b, ec);
}

// llama.cpp's llama_ftype for general.file_type.
uint32_t file_type(DType t) {
  switch (t) {
  case DType::f32:
    return 0;
  case DType::f16:
    return 1;
  case DType::q4_0:
    return 2;
  case DType::q8_0:
    return 7;
  case DType::bf16:
    return 32;
  default:
    return 0;
  }
}

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

} // namespace

void synth_model(const SynthOptions& o) {
  const SynthShape* shape = nullptr;
  std::string names;
  for (const auto& s : synth_shapes()) {
    names += (names.empty() ? "" : ", ") + s.name;
    if (s.name == o.shape) shape = &s;
  }
  if (!shape) fail(Errc::invalid_argument, "synth", "unknown shape '" + o.shape + "' (known: " + names + ")");
  if (o.type != DType::f32 && o.type != DType::f16 && o.type != DType::bf16 && o.type != DType::q8_0 &&
      o.type != DType::q4_0)
    fail(Errc::invalid_argument, "synth",
         "type " + std::string(dtype_name(o.type)) + " is not offered; use f32, f16, bf16, q8_0 or q4_0");
  SynthShape sh = *shape;

  GgufWriter w;
  // Vocabulary first: it fixes n_vocab.
  if (!o.vocab_from.empty()) {
    const GgufFile v = GgufFile::open(o.vocab_from);
    const GgufValue* toks = v.get_array("tokenizer.ggml.tokens", GgufType::string);
    if (!toks) fail(Errc::invalid_argument, "synth", o.vocab_from + ": has no tokenizer.ggml.tokens to copy");
    for (const auto& kv : v.metadata())
      if (kv.key.rfind("tokenizer.", 0) == 0 &&
          !(kv.key == "tokenizer.chat_template" && !o.chat_template.empty()))
        w.add(kv.key, kv.value);
    sh.n_vocab = static_cast<int32_t>(toks->items.size());
  } else {
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
    while (static_cast<int32_t>(tokens.size()) < sh.n_vocab)
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

  if (!o.chat_template.empty()) w.add_string("tokenizer.chat_template", o.chat_template);
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", "loom-synth " + sh.name + " " + std::string(dtype_name(o.type)));
  w.add_u32("general.file_type", file_type(o.type));
  if (o.type == DType::q8_0 || o.type == DType::q4_0) w.add_u32("general.quantization_version", 2);
  w.add_u32("llama.context_length", static_cast<uint32_t>(sh.n_ctx));
  w.add_u32("llama.embedding_length", static_cast<uint32_t>(sh.n_embd));
  w.add_u32("llama.block_count", static_cast<uint32_t>(sh.n_layer));
  w.add_u32("llama.feed_forward_length", static_cast<uint32_t>(sh.n_ff));
  w.add_u32("llama.attention.head_count", static_cast<uint32_t>(sh.n_head));
  w.add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(sh.n_head_kv));
  w.add_u32("llama.rope.dimension_count", static_cast<uint32_t>(sh.n_embd / sh.n_head));
  w.add_f32("llama.rope.freq_base", sh.rope_theta);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_u32("llama.vocab_size", static_cast<uint32_t>(sh.n_vocab));

  const int64_t E = sh.n_embd, F = sh.n_ff, V = sh.n_vocab, D = sh.n_embd / sh.n_head;
  const int64_t KV = D * sh.n_head_kv;
  std::vector<GgufWriter::TensorSpec> specs;
  specs.push_back({"token_embd.weight", o.type, {E, V}});
  for (int32_t l = 0; l < sh.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    specs.push_back({p + "attn_norm.weight", DType::f32, {E}});
    specs.push_back({p + "attn_q.weight", o.type, {E, E}});
    specs.push_back({p + "attn_k.weight", o.type, {E, KV}});
    specs.push_back({p + "attn_v.weight", o.type, {E, KV}});
    specs.push_back({p + "attn_output.weight", o.type, {E, E}});
    specs.push_back({p + "ffn_norm.weight", DType::f32, {E}});
    specs.push_back({p + "ffn_gate.weight", o.type, {E, F}});
    specs.push_back({p + "ffn_up.weight", o.type, {E, F}});
    specs.push_back({p + "ffn_down.weight", o.type, {F, E}});
  }
  specs.push_back({"output_norm.weight", DType::f32, {E}});
  if (!sh.tied_output) specs.push_back({"output.weight", o.type, {E, V}});

  int64_t total = 0, done = 0;
  for (const auto& s : specs)
    total += s.ne.size() > 1 ? s.ne[0] * s.ne[1] : s.ne[0];
  XorShift rng{o.seed * 0x9E3779B97F4A7C15ull + 1};
  // Uniform weights with std 0.02 (a = 0.02·√3): activations stay finite through every layer.
  const float a = 0.02f * std::sqrt(3.0f);
  w.write_streaming(o.out, specs, [&](size_t i, std::vector<uint8_t>& bytes) {
    const auto& s = specs[i];
    const int64_t cols = s.ne[0], rows = s.ne.size() > 1 ? s.ne[1] : 1;
    const size_t rb = row_bytes(s.type, cols);
    bytes.resize(rb * static_cast<size_t>(rows));
    std::vector<float> row(static_cast<size_t>(cols));
    const bool norm = s.ne.size() == 1;
    for (int64_t r = 0; r < rows; ++r) {
      for (auto& x : row)
        x = norm ? 1.0f : rng.uniform(a);
      quantize_row(s.type, row.data(), bytes.data() + static_cast<size_t>(r) * rb, cols);
    }
    done += cols * rows;
    if (o.progress) o.progress(static_cast<double>(done) / static_cast<double>(total));
  });
}

void quantize_model(const QuantizeOptions& o) {
  if (o.type != DType::f32 && o.type != DType::f16 && o.type != DType::bf16 && o.type != DType::q8_0 &&
      o.type != DType::q4_0)
    fail(Errc::invalid_argument, "quantize",
         "type " + std::string(dtype_name(o.type)) + " is not offered; use f32, f16, bf16, q8_0 or q4_0");
  const GgufFile in = GgufFile::open(o.in);
  GgufWriter w;
  for (const auto& kv : in.metadata()) {
    if (kv.key == "general.file_type" || kv.key == "general.quantization_version") continue;
    w.add(kv.key, kv.value);
  }
  w.add_u32("general.file_type", file_type(o.type));
  if (o.type == DType::q8_0 || o.type == DType::q4_0) w.add_u32("general.quantization_version", 2);
  std::vector<GgufWriter::TensorSpec> specs;
  uint64_t total = 0, done = 0;
  for (const auto& t : in.tensors()) {
    if (!dtype_traits(t.type).can_dequantize)
      fail(Errc::unsupported, "quantize",
           o.in + ": tensor " + t.name + " has type " + std::string(dtype_name(t.type)) +
               ", which loom cannot read");
    const bool matrix = t.ne.size() == 2 && t.ne[0] % dtype_traits(o.type).block_size == 0;
    specs.push_back({t.name, matrix ? o.type : t.type, t.ne});
    total += static_cast<uint64_t>(t.n_elements);
  }
  if (fs_same_file(o.in, o.out))
    fail(Errc::invalid_argument, "quantize", "the output " + o.out + " is the input; write to another file");
  w.write_streaming(o.out, specs, [&](size_t i, std::vector<uint8_t>& bytes) {
    const GgufTensor& t = in.tensors()[i];
    const DType to = specs[i].type;
    if (to == t.type) {
      bytes.assign(t.data, t.data + t.n_bytes);
    } else {
      const int64_t cols = t.ne[0], rows = t.rows();
      const size_t rb_in = row_bytes(t.type, cols), rb = row_bytes(to, cols);
      bytes.resize(rb * static_cast<size_t>(rows));
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        dequantize_row(t.type, t.data + static_cast<size_t>(r) * rb_in, row.data(), cols);
        quantize_row(to, row.data(), bytes.data() + static_cast<size_t>(r) * rb, cols);
      }
    }
    done += static_cast<uint64_t>(t.n_elements);
    if (o.progress) o.progress(static_cast<double>(done) / static_cast<double>(std::max<uint64_t>(total, 1)));
  });
}

} // namespace loom
