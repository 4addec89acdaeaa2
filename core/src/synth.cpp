#include "loom/synth.hpp"

#include "loom/error.hpp"
#include "loom/gguf.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <iterator>
#include <thread>

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
      {"llama-3-8b", 4096, 32, 32, 8, 14336, 128256, 8192, 500000.0f, false}, // (scripts/gpu-check.sh)
  };
  return shapes;
}

namespace {

bool fs_same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return std::filesystem::exists(b, ec) && std::filesystem::equivalent(a, b, ec);
}

// llama.cpp's llama_ftype for general.file_type (a k-quant alone: its "_S" mix).
uint32_t file_type(DType t) {
  switch (t) {
  case DType::f32:
    return 0;
  case DType::f16:
    return 1;
  case DType::q4_0:
    return 2;
  case DType::q4_1:
    return 3;
  case DType::q8_0:
    return 7;
  case DType::q5_0:
    return 8;
  case DType::q5_1:
    return 9;
  case DType::q2_k:
    return 10;
  case DType::q3_k:
    return 11; // Q3_K_S
  case DType::q4_k:
    return 14; // Q4_K_S
  case DType::q5_k:
    return 16; // Q5_K_S
  case DType::q6_k:
    return 18;
  case DType::iq4_nl:
    return 25;
  case DType::iq4_xs:
    return 30;
  case DType::bf16:
    return 32;
  default:
    return 0;
  }
}

bool is_quantized(DType t) {
  return t != DType::f32 && t != DType::f16 && t != DType::bf16;
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

  static const char* archs[] = {"llama", "llama3", "mistral", "qwen2", "qwen3", "gemma2", "phi3"};
  if (std::find(std::begin(archs), std::end(archs), o.arch) == std::end(archs))
    fail(Errc::invalid_argument, "synth",
         "unknown arch '" + o.arch + "' (known: llama, llama3, mistral, qwen2, qwen3, gemma2, phi3)");
  // The GGUF architecture and its key prefix: Llama 3 and Mistral are llama files.
  const std::string arch = o.arch == "llama3" || o.arch == "mistral" ? "llama" : o.arch;
  const std::string k = arch + "."; // key prefix
  if (o.arch == "llama3") sh.rope_theta = 500000.0f;
  if (o.arch == "gemma2" || o.arch == "llama3") sh.tied_output = true;

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
  w.add_u32(k + "rope.dimension_count", static_cast<uint32_t>(sh.n_embd / sh.n_head));
  w.add_f32(k + "rope.freq_base", sh.rope_theta);
  w.add_f32(k + "attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_u32(k + "vocab_size", static_cast<uint32_t>(sh.n_vocab));
  if (o.arch == "gemma2") {
    w.add_f32(k + "attn_logit_softcapping", 50.0f);
    w.add_f32(k + "final_logit_softcapping", 30.0f);
  }
  if (o.arch == "gemma2" || o.arch == "mistral") // a quarter of the context: windows that matter in tests
    w.add_u32(k + "attention.sliding_window", static_cast<uint32_t>(std::max(16, sh.n_ctx / 4)));

  const int64_t E = sh.n_embd, F = sh.n_ff, V = sh.n_vocab, D = sh.n_embd / sh.n_head;
  const int64_t KV = D * sh.n_head_kv;
  std::vector<GgufWriter::TensorSpec> specs;
  specs.push_back({"token_embd.weight", o.type, {E, V}});
  if (o.arch == "llama3") specs.push_back({"rope_freqs.weight", DType::f32, {D / 2}});
  for (int32_t l = 0; l < sh.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    specs.push_back({p + "attn_norm.weight", DType::f32, {E}});
    if (o.arch == "phi3") {
      specs.push_back({p + "attn_qkv.weight", o.type, {E, E + 2 * KV}});
    } else {
      specs.push_back({p + "attn_q.weight", o.type, {E, E}});
      specs.push_back({p + "attn_k.weight", o.type, {E, KV}});
      specs.push_back({p + "attn_v.weight", o.type, {E, KV}});
    }
    if (o.arch == "qwen2") {
      specs.push_back({p + "attn_q.bias", DType::f32, {E}});
      specs.push_back({p + "attn_k.bias", DType::f32, {KV}});
      specs.push_back({p + "attn_v.bias", DType::f32, {KV}});
    }
    if (o.arch == "qwen3") {
      specs.push_back({p + "attn_q_norm.weight", DType::f32, {D}});
      specs.push_back({p + "attn_k_norm.weight", DType::f32, {D}});
    }
    specs.push_back({p + "attn_output.weight", o.type, {E, E}});
    if (o.arch == "gemma2") specs.push_back({p + "post_attention_norm.weight", DType::f32, {E}});
    specs.push_back({p + "ffn_norm.weight", DType::f32, {E}});
    if (o.arch == "phi3") {
      specs.push_back({p + "ffn_up.weight", o.type, {E, 2 * F}});
    } else {
      specs.push_back({p + "ffn_gate.weight", o.type, {E, F}});
      specs.push_back({p + "ffn_up.weight", o.type, {E, F}});
    }
    specs.push_back({p + "ffn_down.weight", o.type, {F, E}});
    if (o.arch == "gemma2") specs.push_back({p + "post_ffw_norm.weight", DType::f32, {E}});
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
    // 1-D: norms are 1 (the families that are new here: 1 ± 0.25, so a norm's weight matters), biases
    // random, rope_freqs Llama 3.1's divisors (factor 8 over the original 8192 positions).
    const bool norm = s.ne.size() == 1 && s.name.find("norm") != std::string::npos;
    const bool bias = s.name.size() > 5 && s.name.compare(s.name.size() - 5, 5, ".bias") == 0;
    const bool freqs = s.name == "rope_freqs.weight";
    const bool plain_norms = o.arch == "llama" || o.arch == "llama3" || o.arch == "mistral";
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        float& x = row[static_cast<size_t>(c)];
        if (freqs) {
          const double wavelen = 2.0 * M_PI *
                                 std::pow(static_cast<double>(sh.rope_theta),
                                          2.0 * static_cast<double>(c) / static_cast<double>(2 * cols));
          const double lo = 8192.0 / 1.0, hi = 8192.0 / 4.0; // low/high frequency wavelengths
          x = wavelen < hi   ? 1.0f
              : wavelen > lo ? 8.0f
                             : static_cast<float>(1.0 / ((1.0 - (8192.0 / wavelen - 1.0) / 3.0) / 8.0 +
                                                         (8192.0 / wavelen - 1.0) / 3.0));
        } else if (norm) {
          x = plain_norms ? 1.0f : 1.0f + rng.uniform(0.25f);
        } else if (bias) {
          x = rng.uniform(0.5f);
        } else {
          x = rng.uniform(a);
        }
      }
      quantize_row(s.type, row.data(), bytes.data() + static_cast<size_t>(r) * rb, cols);
    }
    done += cols * rows;
    if (o.progress) o.progress(static_cast<double>(done) / static_cast<double>(total));
  });
}

std::optional<DType> quantize_target(DType want, int64_t cols) {
  if (cols % dtype_traits(want).block_size == 0) return want;
  DType fb;
  switch (want) {
  case DType::q2_k:
  case DType::q3_k:
  case DType::iq4_xs:
    fb = DType::iq4_nl;
    break;
  case DType::q4_k:
    fb = DType::q5_0;
    break;
  case DType::q5_k:
    fb = DType::q5_1;
    break;
  case DType::q6_k:
    fb = DType::q8_0;
    break;
  default:
    return std::nullopt;
  }
  return cols % dtype_traits(fb).block_size == 0 ? fb : DType::f16;
}

void quantize_model(const QuantizeOptions& o) {
  if (!dtype_traits(o.type).can_quantize)
    fail(Errc::invalid_argument, "quantize",
         "type " + std::string(dtype_name(o.type)) + " is not offered; use one of " + dtype_names(true));
  const GgufFile in = GgufFile::open(o.in);
  GgufWriter w;
  for (const auto& kv : in.metadata()) {
    if (kv.key == "general.file_type" || kv.key == "general.quantization_version") continue;
    w.add(kv.key, kv.value);
  }
  w.add_u32("general.file_type", file_type(o.type));
  if (is_quantized(o.type)) w.add_u32("general.quantization_version", 2);
  std::vector<GgufWriter::TensorSpec> specs;
  uint64_t total = 0, done = 0;
  for (const auto& t : in.tensors()) {
    if (!dtype_traits(t.type).can_dequantize)
      fail(Errc::unsupported, "quantize",
           o.in + ": tensor " + t.name + " has type " + std::string(dtype_name(t.type)) +
               ", which loom cannot read (it reads " + dtype_names(false) + ")");
    DType to = t.type;
    if (t.ne.size() == 2) {
      to = quantize_target(o.type, t.ne[0]).value_or(t.type);
      if (to != o.type && o.on_fallback) o.on_fallback(t.name, to);
    }
    specs.push_back({t.name, to, t.ne});
    total += static_cast<uint64_t>(t.n_elements);
  }
  if (fs_same_file(o.in, o.out))
    fail(Errc::invalid_argument, "quantize", "the output " + o.out + " is the input; write to another file");
  const unsigned n_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 64u);
  w.write_streaming(o.out, specs, [&](size_t i, std::vector<uint8_t>& bytes) {
    const GgufTensor& t = in.tensors()[i];
    const DType to = specs[i].type;
    if (to == t.type) {
      bytes.assign(t.data, t.data + t.n_bytes);
    } else {
      const int64_t cols = t.ne[0], rows = t.rows();
      const size_t rb_in = row_bytes(t.type, cols), rb = row_bytes(to, cols);
      bytes.resize(rb * static_cast<size_t>(rows));
      // Rows in contiguous ranges, one per thread (the k-quant searches cost ~100 ns a value).
      auto convert = [&](int64_t r0, int64_t r1) {
        std::vector<float> row(static_cast<size_t>(cols));
        for (int64_t r = r0; r < r1; ++r) {
          dequantize_row(t.type, t.data + static_cast<size_t>(r) * rb_in, row.data(), cols);
          quantize_row(to, row.data(), bytes.data() + static_cast<size_t>(r) * rb, cols);
        }
      };
      const auto nt = static_cast<int64_t>(
          std::min<uint64_t>(n_threads, std::max<uint64_t>(1, static_cast<uint64_t>(t.n_elements) >> 16)));
      if (nt <= 1) {
        convert(0, rows);
      } else {
        std::vector<std::thread> pool;
        std::vector<std::exception_ptr> errors(static_cast<size_t>(nt));
        for (int64_t k = 0; k < nt; ++k)
          pool.emplace_back([&, k] {
            try {
              convert(rows * k / nt, rows * (k + 1) / nt);
            } catch (...) {
              errors[static_cast<size_t>(k)] = std::current_exception();
            }
          });
        for (auto& th : pool)
          th.join();
        for (const auto& e : errors)
          if (e) std::rethrow_exception(e);
      }
    }
    done += static_cast<uint64_t>(t.n_elements);
    if (o.progress) o.progress(static_cast<double>(done) / static_cast<double>(std::max<uint64_t>(total, 1)));
  });
}

} // namespace loom
