// The engine's contract seen from plugins built with the SDK alone (fixtures/contract.cpp): a
// decoder's truncate restores the sequence exactly, and a backend that fails after some tokens makes
// `loom run` exit 1 with its message (not 0 with a short answer).
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "loom/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

loom::test::CliResult loom_run(const std::string& args) {
  return loom::test::run_loom("run " + args + " --plugin-path " LOOM_FIXTURE_DIR, false, 60); // a spin fails
}

TEST(ContractPlugins, TruncateFromADecoderPluginRegeneratesTheSameAnswer) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  // A repetition penalty makes the continuation depend on sampler state that truncate must roll back.
  const fs::path toml = fs::temp_directory_path() / ("loom-contract-" + std::to_string(::getpid()) + ".toml");
  std::ofstream(toml) << "[model]\npath = \"" << model.string()
                      << "\"\n[[sampler]]\nname = \"penalties\"\nrepeat = 1.5\nlast_n = 64\n"
                         "[[sampler]]\nname = \"temperature\"\nvalue = 0.0\n";
  const std::string base = "-c " + toml.string() + " -p 'Once upon a time' -n 24";
  const auto plain = loom_run(base + " --json");
  const auto trunc = loom_run(base + " --json --decoder fixture_truncate");
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(trunc.code, 0) << trunc.err;
  const auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(trunc.out);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(a["text"], b["text"]);
  EXPECT_EQ(a["stop_reason"], b["stop_reason"]);
  EXPECT_EQ(b["tokens"].size(), 24u);
  // Streamed: what was streamed before the truncate is not repeated after it.
  const auto plain_text = loom_run(base), trunc_text = loom_run(base + " --decoder fixture_truncate");
  EXPECT_EQ(trunc_text.code, 0) << trunc_text.err;
  EXPECT_EQ(plain_text.out, trunc_text.out);
  fs::remove(toml);
}

TEST(ContractPlugins, ABackendFailureAfterSomeTokensExitsOne) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto r =
      loom_run("-m " + model.string() +
               " -p 'Once upon a time' -n 10 --temp 0 --set backend.name=fixture_fail_after --json");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("device lost (fixture)"), std::string::npos) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["stop_reason"], "error");
  EXPECT_EQ(j["tokens"].size(), 3u) << "three forward passes succeeded";
  const auto text =
      loom_run("-m " + model.string() + " -p hi -n 10 --temp 0 --set backend.name=fixture_fail_after");
  EXPECT_EQ(text.code, 1) << text.err;
}

TEST(ContractPlugins, ABenchWhoseRequestFailsExitsOne) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  // The warm-up (prefill + 1 decode) passes; the first measured repetition fails.
  const auto r =
      loom::test::run_loom("bench -m " + model.string() +
                               " --pp 8 --tg 4 -r 2 --set backend.name=fixture_fail_after "
                               "--set backend.ok=2 --set 'plugins.paths=[\"" LOOM_FIXTURE_DIR "\"]'",
                           false, 60);
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("repetition 1 failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("device lost (fixture)"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("tok/s"), std::string::npos) << "no numbers for a failed benchmark: " << r.out;
}

TEST(ContractPlugins, AnAbi1PluginIsRefusedInOneLine) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto list = loom::test::run_loom("plugins --plugin-path " LOOM_FIXTURE_DIR " --json", false, 60);
  ASSERT_EQ(list.code, 0) << list.err;
  bool found = false;
  for (const auto& p : nlohmann::json::parse(list.out))
    if (p.value("path", "").find("libloom-fixture-abi10") != std::string::npos) {
      found = true;
      const std::string err = p.value("error", "");
      EXPECT_NE(err.find("ABI " + std::to_string(LOOM_ABI_MAJOR) + "."), std::string::npos)
          << p; // the host's
      EXPECT_NE(err.find("rebuild"), std::string::npos) << p;
      EXPECT_NE(err.find("host ABI major differs"), std::string::npos) << p; // the plugin's own line
    }
  EXPECT_TRUE(found) << list.out;
  const auto old = loom_run("-m " + model.string() + " -p hi -n 4 --decoder fixture_abi10_greedy");
  EXPECT_EQ(old.code, 1) << old.err;
  EXPECT_NE(old.err.find("fixture_abi10_greedy"), std::string::npos) << old.err;
}

TEST(ContractPlugins, AMinimalBackendGetsTheDocumentedDefaults) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  // Every optional entry NULL: it runs (weights read in place, all-zero logits: greedy picks token 0).
  const auto zeros = loom_run("-m " + model.string() + " -p hi -n 4 --temp 0 --ignore-eos --json" +
                              " --set backend.name=fixture_minimal_zeros");
  ASSERT_EQ(zeros.code, 0) << zeros.err;
  EXPECT_EQ(nlohmann::json::parse(zeros.out)["tokens"], (std::vector<int>{0, 0, 0, 0}));
  // No supports_kv_dtype: f32 KV only; f16 KV is refused in one line.
  const auto f16 = loom_run("-m " + model.string() + " -p hi -n 4 --set backend.name=fixture_minimal_zeros" +
                            " --set 'kv_cache.dtype=\"f16\"'");
  EXPECT_EQ(f16.code, 1) << f16.err;
  EXPECT_NE(f16.err.find("[kv_cache] dtype = 'f16' is not supported by backend 'fixture_minimal_zeros'"),
            std::string::npos)
      << f16.err;
  // No supports_attention: a sliding window runs (window and soft-cap are every backend's), attention
  // sinks or an explicit kernel are refused.
  const std::string win = "-m " + model.string() + " -p hi -n 4 --set backend.name=fixture_minimal_zeros" +
                          " --set 'attention.variant=\"sliding_window\"' --set attention.window=8";
  EXPECT_EQ(loom_run(win).code, 0);
  for (const std::string extra : {" --set attention.sinks=2", " --set 'attention.kernel=\"flash\"'"}) {
    const auto r = loom_run(win + extra);
    EXPECT_EQ(r.code, 1) << extra << ": " << r.err;
    EXPECT_NE(r.err.find("is not supported by backend 'fixture_minimal_zeros'"), std::string::npos) << r.err;
  }
}

// ABI 2.0's host entries a third-party plugin lacked: array config values, tokenize, a status's message.
TEST(ContractPlugins, ArrayKeysTokenizeAndStatusMessagesReachPlugins) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string base = "-m " + model.string() + " -p 'Once upon a time' -n 6 --ignore-eos --json";
  const auto greedy = loom_run(base + " --temp 0");
  ASSERT_EQ(greedy.code, 0) << greedy.err;
  const auto g = nlohmann::json::parse(greedy.out)["tokens"].get<std::vector<int>>();
  // An integer array: the greedy first token banned, so the first token differs; `scale` an integer array
  // read as numbers (a positive factor: the arg-max otherwise unchanged).
  const auto run_ban = [&](loom::ParamValue ban) {
    loom::PipelineConfig cfg;
    cfg.model.path = model.string();
    cfg.model.n_ctx = 64;
    cfg.backend.name = "reference";
    cfg.plugins.paths = {LOOM_FIXTURE_DIR};
    cfg.samplers = {
        loom::SamplerSpec{"fixture_ban", {{"ban", std::move(ban)}, {"scale", std::vector<int64_t>{2, 3}}}}};
    auto p = loom::Pipeline::create(cfg);
    loom::GenerationRequest r;
    r.prompt = "Once upon a time";
    r.max_new_tokens = 6;
    return p->generate(r).tokens;
  };
  const auto b = run_ban(std::vector<int64_t>{g[0]});
  ASSERT_FALSE(b.empty());
  EXPECT_NE(b[0], g[0]);
  EXPECT_EQ(run_ban(std::vector<int64_t>{})[0], g[0]) << "nothing banned: greedy";
  // A value of another type: one line naming the key.
  try {
    (void)run_ban(std::string("x"));
    ADD_FAILURE() << "a string for an integer array was accepted";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'ban': expected an array of integers"), std::string::npos)
        << e.what();
  }
  // tokenize: the decoder appends the tokens of its text — those of the model's tokenizer, without BOS.
  const auto forced =
      loom_run("-m " + model.string() +
               " -p 'Once' --json --decoder fixture_forced --set 'decoder.text=\"the cat sat\"'");
  ASSERT_EQ(forced.code, 0) << forced.err;
  auto tok = loom::Tokenizer::from_gguf(loom::GgufFile::open(model.string()));
  loom::EncodeOptions o;
  o.add_bos = false;
  o.add_eos = false;
  const std::vector<loom::TokenId> want = tok->encode("the cat sat", o);
  EXPECT_EQ(nlohmann::json::parse(forced.out)["tokens"].get<std::vector<int>>(),
            std::vector<int>(want.begin(), want.end()));
  // The status of a failed host call, read and released by the plugin: its message, not a placeholder.
  EXPECT_NE(forced.err.find("fixture_forced caught: "), std::string::npos) << forced.err;
  EXPECT_NE(forced.err.find("9999"), std::string::npos) << forced.err;
}

} // namespace
