// Hugging Face checkpoint directories (config.json, *.safetensors, tokenizer.json) as models: a tiny
// crafted checkpoint loads with the metadata, tensor names and q/k row order GGUF has; `loom synth`
// models of each supported family written out in HF layout give the GGUF's logits; and hostile
// checkpoints (truncated or oversized headers, overlapping or mis-sized tensors, bad dtypes, missing
// tensors, shard names escaping the directory) are one-line loom::Errors, never crashes.
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/format/hf_checkpoint.hpp"
#include "loom/kv/kv_cache.hpp"
#include "loom/model/model.hpp"
#include "loom/model/model_config.hpp"
#include "loom/model/reference_backend.hpp"
#include "loom/model/synth.hpp"
#include "loom/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

namespace {

using namespace loom;
namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- crafting checkpoints --------------------------------------------------------------------------

fs::path temp_root() {
  struct Dir {
    fs::path path = fs::temp_directory_path() / ("loom-hf-test-" + std::to_string(::getpid()));
    Dir() { fs::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Dir d;
  return d.path;
}

// A fresh, empty directory.
fs::path fresh_dir(const std::string& name) {
  const fs::path d = temp_root() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

struct StTensor {
  std::string name;
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

size_t st_size(const std::string& dtype) {
  return dtype == "F32" || dtype == "I32" ? 4 : dtype == "I64" || dtype == "F64" ? 8 : 2;
}

// The 8-byte little-endian length of `header`, then `header`.
std::vector<uint8_t> with_length(const std::string& header) {
  std::string b;
  for (int k = 0; k < 8; ++k)
    b.push_back(static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * k)));
  b += header;
  return std::vector<uint8_t>(b.begin(), b.end());
}

// A safetensors file: the 8-byte header length, the JSON header padded with spaces to a multiple of
// 8, the tensors back to back. `edit` may change the header before it is written.
std::vector<uint8_t> safetensors(const std::vector<StTensor>& ts,
                                 const std::function<void(json&)>& edit = {}) {
  json h = json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const auto& t : ts) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  if (edit) edit(h);
  std::string s = h.dump();
  s.resize((s.size() + 7) / 8 * 8, ' ');
  std::vector<uint8_t> out = with_length(s);
  for (const auto& t : ts)
    out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  return out;
}

// Values as `dtype` (F32, F16 or BF16).
std::vector<uint8_t> encode(const std::vector<float>& x, const std::string& dtype) {
  std::vector<uint8_t> b(x.size() * st_size(dtype));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == "F32") {
      std::memcpy(b.data() + 4 * i, &x[i], 4);
    } else {
      const uint16_t h = dtype == "F16" ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto e : s)
    n *= e;
  return n;
}

// A complete tiny Llama checkpoint: n_embd 8, one layer, 2 heads of 4, 1 KV head (GQA), n_ff 16,
// an 8-token SentencePiece-style vocabulary ("▁a" and "ab" made by merges). Weights: row r of every
// matrix holds 0.01·(r + 1) (so a row permutation shows), norms 1.
struct Ckpt {
  json config = {{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", "llama"},
                 {"hidden_size", 8},
                 {"intermediate_size", 16},
                 {"num_hidden_layers", 1},
                 {"num_attention_heads", 2},
                 {"num_key_value_heads", 1},
                 {"vocab_size", 8},
                 {"max_position_embeddings", 64},
                 {"rms_norm_eps", 1e-5},
                 {"rope_theta", 10000.0},
                 {"hidden_act", "silu"},
                 {"tie_word_embeddings", true},
                 {"bos_token_id", 1},
                 {"eos_token_id", 2}};
  json tokenizer = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}}},
      {"decoder", {{"type", "Sequence"}, {"decoders", json::array()}}},
      {"model",
       {{"type", "BPE"},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"vocab",
         {{"<unk>", 0},
          {"<s>", 1},
          {"</s>", 2},
          {"\xE2\x96\x81", 3},
          {"a", 4},
          {"b", 5},
          {"\xE2\x96\x81"
           "a",
           6},
          {"ab", 7}}},
        {"merges", {"\xE2\x96\x81 a", "a b"}}}}};
  json tokenizer_config = {{"add_bos_token", true},
                           {"add_eos_token", false},
                           {"bos_token", "<s>"},
                           {"eos_token", {{"content", "</s>"}, {"special", true}}},
                           {"chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}"}};
  std::vector<StTensor> tensors;
  std::string dtype = "F32";

  Ckpt() {
    auto t = [&](const std::string& name, std::vector<int64_t> shape, bool norm = false) {
      std::vector<float> x(static_cast<size_t>(numel(shape)));
      const int64_t cols = shape.size() == 2 ? shape[1] : 1;
      for (size_t i = 0; i < x.size(); ++i)
        x[i] = norm ? 1.0f : 0.01f * static_cast<float>(static_cast<int64_t>(i) / cols + 1);
      tensors.push_back({name, "F32", shape, encode(x, "F32")});
    };
    t("model.embed_tokens.weight", {8, 8});
    t("model.layers.0.input_layernorm.weight", {8}, true);
    t("model.layers.0.self_attn.q_proj.weight", {8, 8});
    t("model.layers.0.self_attn.k_proj.weight", {4, 8});
    t("model.layers.0.self_attn.v_proj.weight", {4, 8});
    t("model.layers.0.self_attn.o_proj.weight", {8, 8});
    t("model.layers.0.post_attention_layernorm.weight", {8}, true);
    t("model.layers.0.mlp.gate_proj.weight", {16, 8});
    t("model.layers.0.mlp.up_proj.weight", {16, 8});
    t("model.layers.0.mlp.down_proj.weight", {8, 16});
    t("model.norm.weight", {8}, true);
  }
  StTensor* find(const std::string& name) {
    for (auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  void remove(const std::string& name) {
    std::erase_if(tensors, [&](const StTensor& t) { return t.name == name; });
  }
  // Writes the checkpoint into a fresh directory `name` (one model.safetensors).
  fs::path write(const std::string& name, const std::function<void(json&)>& edit_header = {}) const {
    const fs::path d = fresh_dir(name);
    write_text(d / "config.json", config.dump(2));
    write_text(d / "tokenizer.json", tokenizer.dump(2));
    write_text(d / "tokenizer_config.json", tokenizer_config.dump(2));
    write_bytes(d / "model.safetensors", safetensors(tensors, edit_header));
    return d;
  }
};

size_t lines(const std::string& s) {
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

template <class F> std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a loom::Error";
  return "";
}

// Loading the directory as a model (file, config and tokenizer) throws a one-line error holding
// `needle`; so does `loom inspect DIR` (exit 1, at most two lines) when LOOM_BIN is set.
void expect_refused(const fs::path& dir, const std::string& needle) {
  const std::string msg = error_of([&] {
    const GgufFile f = GgufFile::open(dir.string());
    (void)ModelConfig::from_gguf(f);
    (void)Tokenizer::from_gguf(f);
  });
  EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line: " << msg;
  if (!std::getenv("LOOM_BIN")) return;
  const auto r = test::run_loom("inspect '" + dir.string() + "'", true, 20);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << r.out;
  EXPECT_LE(lines(r.out), 2u) << r.out;
}

// ---- a tiny checkpoint ------------------------------------------------------------------------------

TEST(HfCheckpoint, TinyLlamaLoadsAsGgufMetadataAndTensors) {
  const fs::path d = Ckpt().write("tiny");
  const GgufFile f = GgufFile::open(d.string());
  EXPECT_EQ(f.version(), 0u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 1);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 8);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 2);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 1);
  EXPECT_EQ(f.get_int("llama.feed_forward_length"), 16);
  EXPECT_EQ(f.get_int("llama.context_length"), 64);
  EXPECT_NEAR(f.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(f.get_int("tokenizer.ggml.unknown_token_id"), 0);
  EXPECT_EQ(f.get_string("tokenizer.chat_template"), "{% for m in messages %}{{ m['content'] }}{% endfor %}");

  const ModelConfig c = ModelConfig::from_gguf(f);
  EXPECT_EQ(c.n_vocab, 8);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_TRUE(c.tied_output);
  EXPECT_FALSE(c.rope.neox);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  const GgufTensor* ffn = f.find_tensor("blk.0.ffn_down.weight");
  ASSERT_NE(ffn, nullptr);
  EXPECT_EQ(ffn->ne, (std::vector<int64_t>{16, 8})); // HF [out, in] → GGUF ne [in, out]

  // q rows (2 heads of 4) and k rows (1 head): rotate-half halves → interleaved pairs, per head.
  const int expect_q[] = {0, 2, 1, 3, 4, 6, 5, 7}, expect_k[] = {0, 2, 1, 3};
  for (const auto& [name, expect, rows] :
       {std::tuple{"blk.0.attn_q.weight", expect_q, 8}, std::tuple{"blk.0.attn_k.weight", expect_k, 4}}) {
    const GgufTensor* t = f.find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    const auto* x = reinterpret_cast<const float*>(t->data);
    for (int r = 0; r < rows; ++r)
      for (int col = 0; col < 8; ++col)
        EXPECT_FLOAT_EQ(x[r * 8 + col], 0.01f * static_cast<float>(expect[r] + 1)) << name << " row " << r;
  }
  // The other tensors stay in the mapped file: v's rows unchanged.
  const auto* v = reinterpret_cast<const float*>(f.find_tensor("blk.0.attn_v.weight")->data);
  for (int r = 0; r < 4; ++r)
    EXPECT_FLOAT_EQ(v[r * 8], 0.01f * static_cast<float>(r + 1));

  const auto tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok->vocab_size(), 8);
  EXPECT_EQ(tok->encode("a ab"), (std::vector<TokenId>{1, 6, 6, 5})); // BOS ▁a ▁a b
  EXPECT_EQ(tok->encode("bab"), (std::vector<TokenId>{1, 3, 5, 7}));  // BOS ▁ b ab
  EXPECT_EQ(tok->decode(std::vector<TokenId>{6, 3, 7}), "a ab");

  // A model of it runs.
  auto m = Model::load(d.string());
  auto be = make_reference_backend();
  auto kv = make_contiguous_kv_cache(m->kv_shape(16, 1));
  const std::vector<TokenId> ids = {1, 6, 7};
  const std::vector<Pos> pos = {0, 1, 2};
  const std::vector<SeqId> seq = {0, 0, 0};
  const std::vector<int32_t> rows = {2};
  ASSERT_TRUE(kv->allocate(0, 3));
  std::vector<float> logits(8);
  m->forward(*be, {ids, pos, seq, rows}, *kv, logits);
  for (float x : logits)
    EXPECT_TRUE(std::isfinite(x));
}

TEST(HfCheckpoint, HalfPrecisionAndShardsWithIndex) {
  for (const char* dt : {"F16", "BF16"}) {
    SCOPED_TRACE(dt);
    Ckpt c;
    for (auto& t : c.tensors) { // the same values in the half type
      std::vector<float> x(static_cast<size_t>(numel(t.shape)));
      std::memcpy(x.data(), t.bytes.data(), t.bytes.size());
      t.dtype = dt;
      t.bytes = encode(x, dt);
    }
    const fs::path d = c.write(std::string("half-") + dt);
    const GgufFile f = GgufFile::open(d.string());
    const DType want = std::string(dt) == "F16" ? DType::f16 : DType::bf16;
    EXPECT_EQ(ModelConfig::from_gguf(f).weight_type, want);
    const GgufTensor* q = f.find_tensor("blk.0.attn_q.weight");
    ASSERT_EQ(q->type, want);
    const auto* h = reinterpret_cast<const uint16_t*>(q->data);
    const float row1 = want == DType::f16 ? fp16_to_fp32(h[8]) : bf16_to_fp32(h[8]);
    EXPECT_NEAR(row1, 0.03f, 1e-3f); // GGUF row 1 = HF row 2
  }

  // Two shards and their index.
  Ckpt c;
  const fs::path d = fresh_dir("sharded");
  write_text(d / "config.json", c.config.dump());
  write_text(d / "tokenizer.json", c.tokenizer.dump());
  std::vector<StTensor> a(c.tensors.begin(), c.tensors.begin() + 5),
      b(c.tensors.begin() + 5, c.tensors.end());
  write_bytes(d / "model-00001-of-00002.safetensors", safetensors(a));
  write_bytes(d / "model-00002-of-00002.safetensors", safetensors(b));
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  for (const auto& t : a)
    index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : b)
    index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  write_text(d / "model.safetensors.index.json", index.dump());
  const GgufFile f = GgufFile::open(d.string());
  EXPECT_EQ(f.tensors().size(), c.tensors.size());
  EXPECT_NO_THROW((void)ModelConfig::from_gguf(f));
  EXPECT_NO_THROW((void)Tokenizer::from_gguf(f)); // no tokenizer_config.json: BOS from the template

  // A shard that is missing, and one the index lists a tensor in that is not there.
  fs::remove(d / "model-00002-of-00002.safetensors");
  expect_refused(d, "model-00002-of-00002.safetensors");
  write_bytes(d / "model-00002-of-00002.safetensors", safetensors({b.begin(), b.end() - 1}));
  expect_refused(d, "has no tensor 'model.norm.weight'");
}

// Byte-level BPE: the pre-tokenizer is recognized by its regex (Llama 3's, Qwen2's) or GPT-2's
// ByteLevel; another regex is refused.
TEST(HfCheckpoint, ByteLevelPreTokenizerFromItsRegex) {
  const std::string llama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::string qwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  auto byte_level = [](const json& pre) {
    Ckpt c;
    c.tokenizer = {{"added_tokens", {{{"id", 5}, {"content", "<|endoftext|>"}, {"special", true}}}},
                   {"pre_tokenizer", pre},
                   {"post_processor", {{"type", "ByteLevel"}}},
                   {"decoder", {{"type", "ByteLevel"}}},
                   {"model",
                    {{"type", "BPE"},
                     {"vocab",
                      {{"a", 0},
                       {"b", 1},
                       {"ab", 2},
                       {"\xC4\xA0", 3},
                       {"\xC4\xA0"
                        "a",
                        4},
                       {"c", 6},
                       {"d", 7}}},
                     {"merges", json::array()}}}};
    // appended one pair at a time: a braced list of string pairs would be read as an object
    json pair1 = json::array(), pair2 = json::array();
    pair1.push_back("a");
    pair1.push_back("b");
    pair2.push_back("\xC4\xA0");
    pair2.push_back("a");
    c.tokenizer["model"]["merges"].push_back(pair1);
    c.tokenizer["model"]["merges"].push_back(pair2);
    c.tokenizer_config = {{"eos_token", "<|endoftext|>"}, {"bos_token", nullptr}};
    c.config.erase("bos_token_id"); // else BOS comes from config.json, as llama.cpp's converter takes it
    return c;
  };
  auto split = [](const std::string& re) {
    return json{{"type", "Sequence"},
                {"pretokenizers",
                 {{{"type", "Split"}, {"pattern", {{"Regex", re}}}, {"behavior", "Isolated"}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  };
  const std::pair<json, std::string> cases[] = {
      {split(llama3), "llama-bpe"},
      {split(qwen2), "qwen2"},
      {{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}, "gpt-2"}};
  for (const auto& [pre, name] : cases) {
    SCOPED_TRACE(name);
    const fs::path d = byte_level(pre).write("byte-level-" + name);
    const GgufFile f = GgufFile::open(d.string());
    EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), name);
    EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 5);
    EXPECT_EQ(f.find("tokenizer.ggml.bos_token_id"), nullptr);
    const auto tok = Tokenizer::from_gguf(f);
    EXPECT_EQ(tok->encode("ab a"), (std::vector<TokenId>{2, 4})); // no BOS: the post-processor adds none
    EXPECT_EQ(tok->token_type(5), TokenType::control);
  }
  expect_refused(byte_level(split("\\s+|\\w+")).write("byte-level-other"), "is not one Loom recognizes");
}

// ---- `loom synth` families in HF layout give the GGUF's logits ---------------------------------------

// The GGUF tensors of `f` in HF names and row-major shapes (llama: q/k rows back to rotate-half order).
std::vector<StTensor> to_hf_tensors(const GgufFile& f, bool permute, int64_t n_head, int64_t n_head_kv,
                                    bool& has_rope_freqs) {
  const std::pair<const char*, const char*> names[] = {{"attn_norm.weight", "input_layernorm.weight"},
                                                       {"attn_q.weight", "self_attn.q_proj.weight"},
                                                       {"attn_k.weight", "self_attn.k_proj.weight"},
                                                       {"attn_v.weight", "self_attn.v_proj.weight"},
                                                       {"attn_q.bias", "self_attn.q_proj.bias"},
                                                       {"attn_k.bias", "self_attn.k_proj.bias"},
                                                       {"attn_v.bias", "self_attn.v_proj.bias"},
                                                       {"attn_q_norm.weight", "self_attn.q_norm.weight"},
                                                       {"attn_k_norm.weight", "self_attn.k_norm.weight"},
                                                       {"attn_output.weight", "self_attn.o_proj.weight"},
                                                       {"ffn_norm.weight", "post_attention_layernorm.weight"},
                                                       {"ffn_gate.weight", "mlp.gate_proj.weight"},
                                                       {"ffn_up.weight", "mlp.up_proj.weight"},
                                                       {"ffn_down.weight", "mlp.down_proj.weight"}};
  std::vector<StTensor> out;
  has_rope_freqs = false;
  for (const auto& t : f.tensors()) {
    std::string hf;
    if (t.name == "token_embd.weight") hf = "model.embed_tokens.weight";
    if (t.name == "output_norm.weight") hf = "model.norm.weight";
    if (t.name == "output.weight") hf = "lm_head.weight";
    if (t.name == "rope_freqs.weight") {
      has_rope_freqs = true;
      continue;
    }
    std::string suffix;
    if (t.name.rfind("blk.", 0) == 0) {
      const size_t dot = t.name.find('.', 4);
      suffix = t.name.substr(dot + 1);
      for (const auto& [g, h] : names)
        if (suffix == g) hf = "model.layers." + t.name.substr(4, dot - 4) + "." + h;
    }
    EXPECT_FALSE(hf.empty()) << t.name;
    StTensor s;
    s.name = hf;
    s.dtype = t.type == DType::f32 ? "F32" : t.type == DType::f16 ? "F16" : "BF16";
    s.shape.assign(t.ne.rbegin(), t.ne.rend());
    s.bytes.assign(t.data, t.data + t.n_bytes);
    const bool q = suffix == "attn_q.weight", k = suffix == "attn_k.weight";
    if (permute && (q || k)) { // GGUF row h·D + 2i + j was HF row h·D + j·D/2 + i
      const int64_t heads = q ? n_head : n_head_kv, rows = s.shape[0], hd = rows / heads;
      const size_t rb = t.n_bytes / static_cast<size_t>(rows);
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < hd / 2; ++i)
          for (int64_t j = 0; j < 2; ++j)
            std::memcpy(s.bytes.data() + static_cast<size_t>(h * hd + j * (hd / 2) + i) * rb,
                        t.data + static_cast<size_t>(h * hd + 2 * i + j) * rb, rb);
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The logits of every position of `ids` in one forward on the reference backend.
std::vector<float> logits_of(const std::string& path, const std::vector<TokenId>& ids) {
  auto m = Model::load(path);
  auto be = make_reference_backend();
  auto kv = make_contiguous_kv_cache(m->kv_shape(64, 1));
  const auto n = static_cast<int32_t>(ids.size());
  std::vector<Pos> pos(ids.size());
  std::vector<SeqId> seq(ids.size(), 0);
  std::vector<int32_t> rows(ids.size());
  for (int32_t i = 0; i < n; ++i)
    pos[static_cast<size_t>(i)] = rows[static_cast<size_t>(i)] = i;
  EXPECT_TRUE(kv->allocate(0, n));
  std::vector<float> logits(ids.size() * static_cast<size_t>(m->config().n_vocab));
  m->forward(*be, {ids, pos, seq, rows}, *kv, logits);
  return logits;
}

TEST(HfCheckpoint, SynthFamiliesInHfLayoutGiveTheGgufLogits) {
  struct Case {
    const char* arch;
    const char* hf;
    DType type;
  };
  const Case cases[] = {
      {"llama", "LlamaForCausalLM", DType::f32},  {"llama", "LlamaForCausalLM", DType::bf16},
      {"llama3", "LlamaForCausalLM", DType::f16}, {"mistral", "MistralForCausalLM", DType::f32},
      {"qwen2", "Qwen2ForCausalLM", DType::f32},  {"qwen3", "Qwen3ForCausalLM", DType::bf16}};
  for (const auto& cs : cases) {
    SCOPED_TRACE(std::string(cs.arch) + " " + std::string(dtype_name(cs.type)));
    const fs::path d = fresh_dir(std::string("synth-") + cs.arch + "-" + std::string(dtype_name(cs.type)));
    SynthOptions o;
    o.shape = "tiny-gqa";
    o.arch = cs.arch;
    o.type = cs.type;
    o.out = (d / "model.gguf").string();
    synth_model(o);
    const GgufFile g = GgufFile::open(o.out);
    const ModelConfig c = ModelConfig::from_gguf(g);
    const std::string a = c.arch + ".";

    const fs::path hf = d / "hf";
    fs::create_directories(hf);
    bool freqs = false;
    const bool permute = c.arch == "llama";
    write_bytes(hf / "model.safetensors",
                safetensors(to_hf_tensors(g, permute, c.n_head, c.n_head_kv, freqs)));
    json cfg = {{"architectures", {cs.hf}},
                {"hidden_size", c.n_embd},
                {"intermediate_size", c.n_ff},
                {"num_hidden_layers", c.n_layer},
                {"num_attention_heads", c.n_head},
                {"num_key_value_heads", c.n_head_kv},
                {"vocab_size", c.n_vocab},
                {"max_position_embeddings", c.n_ctx_train},
                {"rms_norm_eps", c.norm_eps},
                {"rope_theta", c.rope.theta},
                {"hidden_act", "silu"},
                {"tie_word_embeddings", c.tied_output}};
    if (c.sliding_window > 0) cfg["sliding_window"] = c.sliding_window;
    if (std::string(cs.arch) == "qwen3") cfg["head_dim"] = c.head_dim;
    if (freqs)
      cfg["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", 8.0},
                             {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0},
                             {"original_max_position_embeddings", 8192}};
    write_text(hf / "config.json", cfg.dump(2));
    // The vocabulary as a byte-fallback BPE without merges (logits do not depend on merges).
    json vocab = json::object();
    const GgufValue* toks = g.get_array("tokenizer.ggml.tokens", GgufType::string);
    for (size_t i = 0; i < toks->items.size(); ++i)
      vocab[std::string(toks->items.str(i))] = i;
    json tj = Ckpt().tokenizer;
    tj["model"]["vocab"] = vocab;
    tj["model"]["merges"] = json::array();
    write_text(hf / "tokenizer.json", tj.dump());

    const GgufFile h = GgufFile::open(hf.string());
    const ModelConfig hc = ModelConfig::from_gguf(h);
    EXPECT_EQ(hc.arch, c.arch);
    EXPECT_EQ(hc.head_dim, c.head_dim);
    EXPECT_EQ(hc.sliding_window, c.sliding_window);
    EXPECT_EQ(hc.rope_freqs, c.rope_freqs);
    EXPECT_EQ(hc.qkv_bias, c.qkv_bias);
    EXPECT_EQ(hc.qk_norm, c.qk_norm);
    EXPECT_EQ(hc.tied_output, c.tied_output);
    EXPECT_EQ(hc.n_params, c.n_params);
    EXPECT_EQ(hc.weight_type, c.weight_type);
    if (freqs) {
      const auto* x = reinterpret_cast<const float*>(g.find_tensor("rope_freqs.weight")->data);
      const auto* y = reinterpret_cast<const float*>(h.find_tensor("rope_freqs.weight")->data);
      for (int i = 0; i < c.head_dim / 2; ++i)
        EXPECT_NEAR(y[i], x[i], 1e-5f * x[i]) << "rope_freqs " << i;
    }
    const std::vector<TokenId> ids = {1, 300, 301, 17, 420, 5, 299, 511};
    const auto want = logits_of(o.out, ids), got = logits_of(hf.string(), ids);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5f * std::max(1.0f, std::abs(want[i]))) << "logit " << i;
  }
}

// ---- hostile safetensors headers ----------------------------------------------------------------

TEST(HfCheckpointHostile, SafetensorsHeaders) {
  const std::vector<StTensor> ts = {{"a", "F32", {2, 2}, std::vector<uint8_t>(16)},
                                    {"b", "BF16", {4}, std::vector<uint8_t>(8)}};
  const auto good = safetensors(ts);
  const SafetensorsHeader h = parse_safetensors(good, "good.safetensors");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[1].type, DType::bf16);
  EXPECT_EQ(h.tensors[1].begin, 16u);

  auto refused = [](const std::vector<uint8_t>& b, const std::string& needle) {
    const std::string msg = error_of([&] { (void)parse_safetensors(b, "bad.safetensors"); });
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line: " << msg;
  };
  // Truncated: fewer than 8 bytes, the header cut short, a tensor's bytes missing.
  refused({good.begin(), good.begin() + 5}, "fewer than the 8-byte header length");
  refused({good.begin(), good.begin() + 40}, "runs past the end of the file");
  refused({good.begin(), good.end() - 1}, "not a range within");
  // A header length past the file, and one over the 100 MiB limit.
  auto b = good;
  const uint64_t past = good.size();
  std::memcpy(b.data(), &past, 8);
  refused(b, "runs past the end of the file");
  const uint64_t huge = 1ull << 40;
  std::memcpy(b.data(), &huge, 8);
  refused(b, "over the limit of 100.0 MiB");
  // Not JSON, not an object, too deep.
  const auto raw = with_length;
  refused(raw("{\"a\": {\"dtype\": \"F32\", "), "invalid JSON");
  refused(raw("[1, 2]"), "should be a JSON object");
  refused(raw(std::string(100, '[') + std::string(100, ']')), "nested deeper than");
  refused(raw("{\"a\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}, "
              "\"a\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}}    "),
          "appears twice");
  // Overlapping offsets, shape × element size ≠ span, unknown dtype, negative or overflowing shapes.
  refused(safetensors(ts, [](json& j) { j["b"]["data_offsets"] = {12, 20}; }), "overlap");
  refused(safetensors(ts,
                      [](json& j) {
                        j["a"]["shape"] = {2, 3};
                      }),
          "needs 24 bytes but data_offsets span 16");
  refused(safetensors(ts, [](json& j) { j["a"]["dtype"] = "F33"; }), "unknown dtype 'F33'");
  refused(safetensors(ts, [](json& j) { j["a"]["dtype"] = 4; }), "'dtype' should be a string");
  refused(safetensors(ts, [](json& j) { j["a"]["shape"] = {-1, 4}; }), "non-negative integer");
  refused(safetensors(ts, [](json& j) { j["a"]["shape"] = {1ll << 40, 1ll << 40}; }), "overflow");
  refused(safetensors(ts, [](json& j) { j["a"]["shape"] = {1, 1, 1, 1, 4}; }), "more than the 4");
  refused(safetensors(ts, [](json& j) { j["a"]["data_offsets"] = {16, 0}; }), "not a range within");
  refused(safetensors(ts, [](json& j) { j["a"]["data_offsets"] = {0}; }),
          "'data_offsets' should be [begin, end]");
  refused(safetensors(ts, [](json& j) { j["a"] = "x"; }), "should be an object with dtype");
  // Every prefix of a good file is refused or parses (never crashes); so is every flipped byte.
  for (size_t n = 0; n < good.size(); ++n)
    try {
      (void)parse_safetensors({good.begin(), good.begin() + static_cast<ptrdiff_t>(n)}, "cut.safetensors");
    } catch (const Error&) {
    }
  for (size_t i = 0; i < good.size(); ++i) {
    auto f = good;
    f[i] ^= 0x5A;
    try {
      (void)parse_safetensors(f, "flip.safetensors");
    } catch (const Error&) {
    }
  }
}

// ---- hostile checkpoints ---------------------------------------------------------------------------

TEST(HfCheckpointHostile, TensorsThatDoNotFitTheConfig) {
  { // a tensor the architecture needs is missing
    Ckpt c;
    c.remove("model.layers.0.mlp.down_proj.weight");
    expect_refused(c.write("missing"),
                   "tensor 'model.layers.0.mlp.down_proj.weight' (shape [8, 16]) is missing");
  }
  { // the shape disagrees with config.json
    Ckpt c;
    c.find("model.layers.0.self_attn.k_proj.weight")->shape = {8, 4};
    expect_refused(c.write("shape"), "has shape [8, 4], expected [4, 8]");
  }
  { // a dtype Loom does not compute with
    Ckpt c;
    auto* t = c.find("model.layers.0.mlp.up_proj.weight");
    t->dtype = "I32";
    expect_refused(c.write("dtype"), "is stored as I32");
  }
  { // an unknown dtype in the header
    Ckpt c;
    expect_refused(c.write("unknown-dtype", [](json& j) { j["model.norm.weight"]["dtype"] = "Q4"; }),
                   "unknown dtype 'Q4'");
  }
  { // overlapping tensors in a real file
    Ckpt c;
    expect_refused(c.write("overlap",
                           [](json& j) {
                             j["model.norm.weight"]["data_offsets"] =
                                 j["model.embed_tokens.weight"]["data_offsets"];
                             j["model.norm.weight"]["shape"] = {64};
                           }),
                   "overlap");
  }
  { // a tensor of another layer or architecture
    Ckpt c;
    c.tensors.push_back({"model.layers.1.mlp.up_proj.weight", "F32", {16, 8}, std::vector<uint8_t>(512)});
    expect_refused(c.write("extra"), "'model.layers.1.mlp.up_proj.weight' is not part of LlamaForCausalLM");
  }
  { // no lm_head and embeddings not tied
    Ckpt c;
    c.config["tie_word_embeddings"] = false;
    expect_refused(c.write("untied"), "lm_head.weight' is missing");
  }
  { // the header length runs past the end of the file
    Ckpt c;
    const fs::path d = c.write("truncated");
    const auto bytes = safetensors(c.tensors);
    write_bytes(d / "model.safetensors", {bytes.begin(), bytes.begin() + 100});
    expect_refused(d, "runs past the end of the file");
  }
}

TEST(HfCheckpointHostile, ConfigAndTokenizer) {
  {
    Ckpt c;
    c.config["architectures"] = {"GPT2LMHeadModel"};
    expect_refused(c.write("arch"), "architecture 'GPT2LMHeadModel' is not supported");
  }
  {
    Ckpt c;
    c.config["num_attention_heads"] = "two";
    expect_refused(c.write("heads"), "'num_attention_heads' should be an integer");
  }
  {
    Ckpt c;
    c.config.erase("hidden_size");
    expect_refused(c.write("no-hidden"), "'hidden_size' is missing");
  }
  {
    Ckpt c;
    c.config["quantization_config"] = {{"quant_method", "gptq"}};
    expect_refused(c.write("quantized"), "quantized checkpoints are not supported");
  }
  {
    Ckpt c;
    c.config["rope_scaling"] = {{"rope_type", "longrope"}};
    expect_refused(c.write("rope"), "rope type 'longrope' is not supported");
  }
  {
    const fs::path d = Ckpt().write("config-not-json");
    write_text(d / "config.json", "{\"architectures\": [\"LlamaForCausalLM\"],\n \"hidden_size\": 8");
    expect_refused(d, "invalid JSON");
  }
  {
    Ckpt c;
    c.tokenizer["model"]["type"] = "Unigram";
    expect_refused(c.write("unigram"), "tokenizer model type 'Unigram' is not supported");
  }
  { // a field of another JSON type
    Ckpt c;
    c.tokenizer["model"]["byte_fallback"] = "yes";
    expect_refused(c.write("byte-fallback"), "'byte_fallback' should be true or false, found \"yes\"");
    c = Ckpt();
    c.tokenizer["normalizer"]["normalizers"][0]["type"] = 5;
    expect_refused(c.write("normalizer-type"), "'type' should be a string, found 5");
    c = Ckpt();
    c.tokenizer["added_tokens"][1]["id"] = "one";
    expect_refused(c.write("added-id"), "added token '<s>' should be a token id");
  }
  {
    Ckpt c;
    c.tokenizer["model"]["vocab"]["b"] = 4; // two tokens with id 4
    expect_refused(c.write("dup-id"), "token id 4 is used by both");
  }
  {
    Ckpt c;
    c.tokenizer["model"]["vocab"]["z"] = 9; // beyond vocab_size 8
    expect_refused(c.write("big-vocab"), "the id of 'z' is 9, not below config.json's vocab_size 8");
  }
  {
    Ckpt c;
    c.tokenizer_config["eos_token"] = "<eos>";
    expect_refused(c.write("eos"), "eos_token '<eos>' is not a token of tokenizer.json");
  }
  {
    const fs::path d = Ckpt().write("no-tokenizer");
    fs::remove(d / "tokenizer.json");
    expect_refused(d, "tokenizer.json is missing");
  }
  {
    const fs::path d = Ckpt().write("no-weights");
    fs::remove(d / "model.safetensors");
    expect_refused(d, "no model.safetensors");
  }
  { // the empty directory: neither a GGUF file nor a checkpoint
    const fs::path d = fresh_dir("empty");
    expect_refused(d, "directory without config.json");
  }
}

TEST(HfCheckpointHostile, ShardNamesStayInTheDirectory) {
  Ckpt c;
  for (const char* shard : {"../model.safetensors", "sub/model.safetensors", "/etc/passwd", "..", "a\\b"}) {
    SCOPED_TRACE(shard);
    const fs::path d = c.write("escape");
    json index = {{"weight_map", json::object()}};
    for (const auto& t : c.tensors)
      index["weight_map"][t.name] = "model.safetensors";
    index["weight_map"]["model.norm.weight"] = shard;
    write_text(d / "model.safetensors.index.json", index.dump());
    expect_refused(d, "is not a plain file name");
  }
  const fs::path d = c.write("index-not-object");
  write_text(d / "model.safetensors.index.json", "{\"weight_map\": [\"model.safetensors\"]}");
  expect_refused(d, "'weight_map' should be a non-empty object");
}

} // namespace
