// `loom synth` files without a model file: a synthetic vocabulary and bad input; each family's file loads
// with its features and contradictions name the keys. (Every type with stories260K's vocabulary, loaded
// and generating: tests/integration/test_synth.cpp.)
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/model/model_config.hpp"
#include "loom/model/synth.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <filesystem>
#include <gtest/gtest.h>

namespace {

using namespace loom;

TEST(Synth, SyntheticVocabularyAndBadInput) {
  const auto out = (std::filesystem::temp_directory_path() / "loom_synth_vocab.gguf").string();
  SynthOptions o;
  o.shape = "stories15m";
  o.type = DType::q8_0;
  o.out = out;
  synth_model(o);
  const auto f = GgufFile::open(out);
  EXPECT_EQ(ModelConfig::from_gguf(f).n_vocab, 32000);
  const auto tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_FALSE(tok->encode("hello", {}).empty()); // byte fallback covers any text
  std::filesystem::remove(out);
  o.shape = "gpt-5";
  EXPECT_THROW(synth_model(o), Error);
  o.shape = "stories15m";
  o.type = DType::q6_k;
  EXPECT_THROW(synth_model(o), Error);
}

} // namespace

namespace {

// Each family's synth file loads with its features; a file whose metadata contradicts a tensor's shape
// is one line naming the tensor, both shapes and the metadata values the expectation comes from; an
// unknown architecture lists the supported ones.
TEST(Synth, FamiliesLoadAndContradictionsNameTheKeys) {
  const auto dir = std::filesystem::temp_directory_path() / "loom_synth_families";
  std::filesystem::create_directories(dir);
  const std::pair<const char*, bool (*)(const ModelConfig&)> families[] = {
      {"qwen2", [](const ModelConfig& c) { return c.qkv_bias && c.rope.neox; }},
      {"qwen3", [](const ModelConfig& c) { return c.qk_norm; }},
      {"gemma2", [](const ModelConfig& c) { return c.geglu && c.post_norms && c.final_softcap == 30.0f; }},
      {"phi3", [](const ModelConfig& c) { return c.fused_qkv && c.fused_gate_up; }},
      {"llama3", [](const ModelConfig& c) { return c.rope_freqs && c.tied_output; }}};
  for (const auto& [arch, check] : families) {
    SynthOptions o;
    o.shape = "tiny-d64";
    o.arch = arch;
    o.out = (dir / (std::string(arch) + ".gguf")).string();
    synth_model(o);
    const auto c = ModelConfig::from_gguf(GgufFile::open(o.out));
    EXPECT_TRUE(check(c)) << arch;
  }
  // head_count_kv 1 → 2: attn_k.weight no longer fits.
  const auto in = GgufFile::open((dir / "qwen2.gguf").string());
  GgufWriter w;
  for (const auto& kv : in.metadata())
    if (kv.key != "qwen2.attention.head_count_kv") w.add(kv.key, kv.value);
  w.add_u32("qwen2.attention.head_count_kv", 2);
  std::vector<GgufWriter::TensorSpec> specs;
  for (const auto& t : in.tensors())
    specs.push_back({t.name, t.type, t.ne});
  const std::string bad = (dir / "bad.gguf").string();
  w.write_streaming(bad, specs, [&](size_t i, std::vector<uint8_t>& bytes) {
    const GgufTensor& t = in.tensors()[i];
    bytes.assign(t.data, t.data + t.n_bytes);
  });
  try {
    (void)ModelConfig::from_gguf(GgufFile::open(bad));
    FAIL() << "a contradicting file loaded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tensor 'blk.0.attn_k.weight' has shape [128, 64], expected [128, 128]"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("qwen2.attention.head_count_kv 2"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  // An architecture Loom does not know: the supported ones listed.
  GgufWriter u;
  for (const auto& kv : in.metadata())
    if (kv.key != "general.architecture") u.add(kv.key, kv.value);
  u.add_string("general.architecture", "mamba");
  const std::string unk = (dir / "unknown.gguf").string();
  u.write_streaming(unk, specs, [&](size_t i, std::vector<uint8_t>& bytes) {
    const GgufTensor& t = in.tensors()[i];
    bytes.assign(t.data, t.data + t.n_bytes);
  });
  try {
    (void)ModelConfig::from_gguf(GgufFile::open(unk));
    FAIL() << "an unknown architecture loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "architecture 'mamba' is not supported (supported: llama, qwen2, qwen3, qwen3moe, "
                  "gemma2, gemma3, phi3, smollm3, gpt-oss)"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

// The mixtures of experts and SmolLM3 load with their features; a MoE file whose expert keys are missing,
// out of range or contradict the tensors is one line naming the key or tensor.
TEST(Synth, MixturesOfExpertsLoadAndBadExpertKeysAreOneLine) {
  const auto dir = std::filesystem::temp_directory_path() / "loom_synth_moe";
  std::filesystem::create_directories(dir);
  const auto make = [&](const char* arch, const char* shape) {
    SynthOptions o;
    o.shape = shape;
    o.arch = arch;
    o.out = (dir / (std::string(arch) + ".gguf")).string();
    synth_model(o);
    return o.out;
  };
  const std::string moe = make("qwen3moe", "tiny-moe"), oss = make("gpt-oss", "tiny-oss");
  const ModelConfig q = ModelConfig::from_gguf(GgufFile::open(moe));
  EXPECT_TRUE(q.moe.n_expert == 8 && q.moe.n_used == 3 && q.moe.n_ff_exp == 64 && q.moe.norm && q.qk_norm);
  const ModelConfig g = ModelConfig::from_gguf(GgufFile::open(oss));
  EXPECT_TRUE(g.attn_sink_logits && g.attn_out_bias && g.moe.router_bias && g.moe.expert_biases &&
              g.moe.oai_glu && g.moe.gating == MoeGating::softmax_selected &&
              g.sliding_layers == std::vector<bool>({true, false}) && g.rope.scaling == RopeScaling::yarn &&
              g.ffn_norm == "post_attention_norm");
  const ModelConfig sm = ModelConfig::from_gguf(GgufFile::open(make("smollm3", "tiny-d64x4")));
  EXPECT_EQ(sm.rope_layers, std::vector<bool>({true, true, true, false}));
  // A copy of `src` with key `key` replaced by a u32 (or dropped: value < 0), and tensor `drop` left out.
  const auto rewrite = [&](const std::string& src, const std::string& key, int64_t value,
                           const std::string& drop) {
    const auto in = GgufFile::open(src);
    GgufWriter w;
    for (const auto& kv : in.metadata())
      if (kv.key != key) w.add(kv.key, kv.value);
    if (value >= 0) w.add_u32(key, static_cast<uint32_t>(value));
    std::vector<GgufWriter::TensorSpec> specs;
    std::vector<const GgufTensor*> kept;
    for (const auto& t : in.tensors())
      if (t.name != drop) {
        specs.push_back({t.name, t.type, t.ne});
        kept.push_back(&t);
      }
    const std::string out = (dir / "bad.gguf").string();
    w.write_streaming(out, specs, [&](size_t i, std::vector<uint8_t>& bytes) {
      bytes.assign(kept[i]->data, kept[i]->data + kept[i]->n_bytes);
    });
    return out;
  };
  const auto refused = [&](const std::string& file, const std::string& want) {
    try {
      (void)ModelConfig::from_gguf(GgufFile::open(file));
      ADD_FAILURE() << "loaded: " << want;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(want), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  };
  refused(rewrite(moe, "qwen3moe.expert_count", -1, ""), "'qwen3moe.expert_count' is missing");
  refused(rewrite(moe, "qwen3moe.expert_used_count", 9, ""),
          "'qwen3moe.expert_used_count' must be in 1..8, found 9");
  refused(rewrite(moe, "qwen3moe.expert_gating_func", 7, ""), "expert_gating_func' must be 1 (softmax), 2");
  refused(rewrite(moe, "qwen3moe.expert_feed_forward_length", 32, ""),
          "tensor 'blk.0.ffn_gate_exps.weight' has shape [128, 64, 8], expected [128, 32, 8]");
  refused(rewrite(oss, "", -1, "blk.1.attn_sinks.weight"), "tensor 'blk.1.attn_sinks.weight' is missing");
  std::filesystem::remove_all(dir);
}

} // namespace
