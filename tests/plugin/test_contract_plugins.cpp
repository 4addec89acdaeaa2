// The engine's contract seen from plugins built with the SDK alone (fixtures/contract.cpp): a
// decoder's truncate restores the sequence exactly, and a backend that fails after some tokens makes
// `loom run` exit 1 with its message (not 0 with a short answer).
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
      EXPECT_NE(err.find("ABI 2.0"), std::string::npos) << p;
      EXPECT_NE(err.find("rebuild"), std::string::npos) << p;
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

} // namespace
