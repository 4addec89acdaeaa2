// The `loom` executable on stories260K: tokenize and inspect --json, every field of run --json, quantize
// to every type (with the fallbacks llama-quantize makes), the load benchmark and bench at depth, a prompt
// longer than the context. (Exit codes and errors without a model: tests/unit/test_cli.cpp.)
#include "test_util.hpp"

#include <filesystem>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using loom::test::run_loom_merged;

TEST(Cli, TokenizeJsonAndPlain) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto r = run_loom_merged("tokenize -m " + model.string() + " --text 'Once upon a time' --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json({1, 403, 407, 261, 378}));
  r = run_loom_merged("tokenize -m " + model.string() + " --text 'Once upon a time' --no-bos");
  EXPECT_EQ(r.out, "403 407 261 378\n");
  // Special-token text is parsed only with --special.
  r = run_loom_merged("tokenize -m " + model.string() + " --text '<s>' --no-bos --special --json");
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json({1}));
  r = run_loom_merged("tokenize -m " + model.string() + " --text '<s>' --no-bos --json");
  EXPECT_NE(nlohmann::json::parse(r.out), nlohmann::json({1}));
}

TEST(Cli, InspectReportsKvBytes) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto r = run_loom_merged("inspect " + model.string() + " --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["n_layer"], 5);
  EXPECT_EQ(j["kv"]["f32_bytes_per_token"], 2 * 5 * 4 * 8 * 4);
  EXPECT_EQ(j["kv"]["f16_bytes"], 2 * 5 * 4 * 8 * 2 * 2048);
  EXPECT_GT(j["n_params"].get<int64_t>(), 250000);
  EXPECT_TRUE(j["tensor_types"].contains("f32"));
  r = run_loom_merged("inspect " + model.string());
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("GQA"), std::string::npos) << r.out;
}

TEST(Cli, RunJsonHasEveryField) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto r = run_loom_merged("run -m " + model.string() + " -p 'Once upon a time' -n 8 --temp 0 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], nlohmann::json({1, 403, 407, 261, 378}));
  EXPECT_EQ(j["tokens"], nlohmann::json({432, 383, 286, 261, 376, 298, 315, 421}));
  EXPECT_EQ(j["text"], ", there was a little girl");
  EXPECT_EQ(j["logprobs"].size(), 8u);
  EXPECT_EQ(j["stop_reason"], "max_tokens");
  for (const char* k : {"ttft_ms", "tpot_ms", "prefill_tok_s", "decode_tok_s"})
    EXPECT_TRUE(j["metrics"].contains(k)) << k;
  // Seeded sampling through the CLI is reproducible.
  const std::string cmd = "run -m " + model.string() + " -p 'The little dog' -n 20 --temp 1 --seed 5 --json";
  EXPECT_EQ(nlohmann::json::parse(run_loom_merged(cmd).out)["tokens"],
            nlohmann::json::parse(run_loom_merged(cmd).out)["tokens"]);
}

// `loom quantize --type T` for every type quantize_row writes. stories260K's rows are 64 (and 172) wide,
// so the types with blocks of 256 fall back as llama-quantize's do (and say so on stderr); a synth model
// with 256-wide ffn_down rows gets real k-quant and iq4_xs matrices next to the fallbacks. Every output
// runs.
TEST(Cli, QuantizeEveryTypeWithFallbacks) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto dir = std::filesystem::temp_directory_path() / "loom_cli_quantize";
  std::filesystem::create_directories(dir);
  auto r = run_loom_merged("quantize --help");
  EXPECT_EQ(r.code, 0);
  for (const char* s : {"q2_k", "q3_k", "q5_k", "iq4_nl", "iq4_xs", "q4_k → q5_0"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " not in: " << r.out;
  r = run_loom_merged("quantize " + model.string() + " --type q8_k -o " + (dir / "x.gguf").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("iq4_xs"), std::string::npos) << r.out;
  const std::string synth = (dir / "tiny-d64.gguf").string();
  r = run_loom_merged("synth --shape tiny-d64 --vocab-from " + model.string() + " -o " + synth);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::pair<const char*, const char*> types[] = {
      {"f16", nullptr},  {"bf16", nullptr}, {"q8_0", nullptr},   {"q4_0", nullptr},    {"q4_1", nullptr},
      {"q5_0", nullptr}, {"q5_1", nullptr}, {"iq4_nl", nullptr}, {"q2_k", "iq4_nl"},   {"q3_k", "iq4_nl"},
      {"q4_k", "q5_0"},  {"q5_k", "q5_1"},  {"q6_k", "q8_0"},    {"iq4_xs", "iq4_nl"},
  };
  for (const auto& [type, fallback] : types) {
    SCOPED_TRACE(type);
    for (const std::string& in : {model.string(), synth}) {
      const std::string out = (dir / (std::string(type) + ".gguf")).string();
      r = run_loom_merged("quantize " + in + " --type " + type + " -o " + out);
      ASSERT_EQ(r.code, 0) << r.out;
      // stories260K's ffn_down rows are 172 wide: no block of 32 fits them (they stay f32, or f16 after a
      // k-quant's fallback); f16 and bf16 fit every matrix
      const bool plain = std::string(type) == "f16" || std::string(type) == "bf16";
      if (fallback) {
        EXPECT_NE(r.out.find(" not in " + std::string(type) + " (rows not a multiple of its block): "),
                  std::string::npos)
            << r.out;
        EXPECT_NE(r.out.find(std::string(" ") + fallback), std::string::npos) << r.out;
      } else if (plain) {
        EXPECT_EQ(r.out.find("not in"), std::string::npos) << r.out;
      }
      const auto j = run_loom_merged("inspect " + out + " --json");
      ASSERT_EQ(j.code, 0) << j.out;
      const auto types_in_file = nlohmann::json::parse(j.out)["tensor_types"];
      // stories260K: every matrix fell back; the synth model's ffn_down rows (256) did not
      EXPECT_EQ(types_in_file.contains(type), !fallback || in == synth) << types_in_file.dump();
      const auto run = run_loom_merged("run -m " + out + " -p 'Once upon a time' -n 8 --temp 0 --json");
      ASSERT_EQ(run.code, 0) << run.out;
      EXPECT_EQ(nlohmann::json::parse(run.out)["tokens"].size(), 8u);
    }
  }
  std::filesystem::remove_all(dir);
}

// `loom bench --requests`: the load benchmark's numbers are there and add up — every request
// finished with its tokens, percentiles ordered, throughput = tokens / wall time, the prefix cache hit
// on a shared prefix, preemptions on a tight paged store; Poisson arrivals run too.
TEST(Cli, LoadBenchReportsPercentilesAndThroughput) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string base = "bench -m " + model.string() +
                           " --requests 12 --concurrency 4 --prompt-len 40 --gen-len 10 --json --set "
                           "'kv_cache.store=\"paged\"' ";
  auto r = run_loom_merged(base + "--shared-prefix 32");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["requests"], 12);
  for (const char* k : {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms"}) {
    EXPECT_LE(j[k]["p50"].get<double>(), j[k]["p90"].get<double>()) << k;
    EXPECT_LE(j[k]["p90"].get<double>(), j[k]["p99"].get<double>()) << k;
  }
  EXPECT_NEAR(j["output_tok_s"].get<double>(), 120.0 / j["wall_s"].get<double>(), 1e-6);
  EXPECT_NEAR(j["total_tok_s"].get<double>(), (120.0 + 12 * 40) / j["wall_s"].get<double>(), 1e-6);
  EXPECT_GT(j["mean_concurrency"].get<double>(), 1.0);
  EXPECT_LE(j["mean_concurrency"].get<double>(), 4.0 + 1e-9);
  EXPECT_GT(j["prefix_cache_hit_rate"].get<double>(), 0.3) << "32 of 40 prompt tokens are shared";
  EXPECT_GT(j["memory"]["accounted_bytes"].get<uint64_t>(), 0u);
  // A store of 96 positions for 4 requests of 50: preemption, and every request still completes.
  r = run_loom_merged(
      base + "--set kv_cache.max_tokens=96 --set kv_cache.block_size=8 --set kv_cache.prefix_cache=false");
  ASSERT_EQ(r.code, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["preemptions"].get<int>(), 0);
  EXPECT_EQ(j["kv_capacity_tokens"], 96);
  // Poisson arrivals.
  r = run_loom_merged(base + "--rate 200 --seed 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["rate"], 200.0);
  // Bad load parameters: a usage error.
  EXPECT_EQ(run_loom_merged(base + "--concurrency 0").code, 2);
  EXPECT_EQ(run_loom_merged(base + "--shared-prefix 41").code, 2);
}

// `loom bench -d N`: prefill and decode timed after N positions that the prefix cache holds (as
// llama-bench -d); the JSON says the depth; a negative depth is a usage error.
TEST(Cli, BenchAtDepth) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string base = "bench -m " + model.string() + " --pp 16 --tg 8 -r 2 --json ";
  const auto r = run_loom_merged(base + "-d 64");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["depth"], 64);
  EXPECT_GT(j["prefill_tok_s"].get<double>(), 0.0);
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0.0);
  EXPECT_EQ(j["prefill_tok_s_runs"].size(), 2u);
  EXPECT_EQ(run_loom_merged(base + "-d -1").code, 2);
}

TEST(Cli, PromptLongerThanContextExitsOne) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto r =
      run_loom_merged("run -m " + model.string() + " -p 'Once upon a time there was a dog' --ctx-size 4");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("context holds 4"), std::string::npos) << r.out;
}

} // namespace
