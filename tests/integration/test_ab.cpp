// `loom ab` and `loom explain` run on stories260K: identical variants that differ in nothing, a known
// difference (greedy vs a high temperature) that comes out significant, real pairing, bad input as one-line
// errors; explain's tokens equal `loom run`'s and its per-stage probabilities sum to 1. (The statistics
// and the experiment library without a model: tests/unit/test_ab.cpp; tests/ab/run_checks.sh recomputes
// a whole report in Python and renders its HTML in Chromium.)
#include "test_util.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using namespace loom;
namespace fs = std::filesystem;

// ---- the CLI ---------------------------------------------------------------------------------------

fs::path work_dir() {
  const fs::path d = fs::temp_directory_path() / ("loom-ab-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

std::string cfg(const std::string& name) {
  return (fs::path(LOOM_SOURCE_DIR) / "configs" / name).string();
}

nlohmann::json ab_json(const std::string& args, const fs::path& model) {
  const auto r =
      test::run_loom("ab " + args + " --json --set 'model.path=\"" + model.string() + "\"'", false, 300);
  EXPECT_EQ(r.code, 0) << r.err;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

TEST(AbCli, IdenticalVariantsDifferInNothingButTime) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string prompts = (fs::path(LOOM_SOURCE_DIR) / "tests" / "data" / "ab_prompts.txt").string();
  // Sampling, twice: the same seeds give the same outputs (pairing is real).
  const auto j = ab_json("-c " + cfg("sampling.toml") + " -c " + cfg("sampling.toml") + " --prompts " +
                             prompts + " --runs 2 -n 20",
                         model);
  ASSERT_TRUE(j.contains("pairs"));
  const auto& pr = j["pairs"][0];
  EXPECT_EQ(pr["agreement"].get<double>(), 1.0);
  for (const char* m : {"tokens", "mean_logprob", "distinct_1", "distinct_2", "repetition_4"}) {
    SCOPED_TRACE(m);
    EXPECT_EQ(pr["metrics"][m]["diff"].get<double>(), 0.0);
    EXPECT_EQ(pr["metrics"][m]["ci"][0].get<double>(), 0.0);
    EXPECT_EQ(pr["metrics"][m]["ci"][1].get<double>(), 0.0);
    EXPECT_EQ(pr["metrics"][m]["verdict"], "inconclusive");
  }
  EXPECT_EQ(j["variants"][1]["name"], "sampling#2");
  // Every row used the seed rule, in both variants.
  for (const auto& r : j["rows"])
    EXPECT_EQ(r["seed"].get<uint64_t>(), r["prompt"].get<uint64_t>() * 2 + r["run"].get<uint64_t>());
}

TEST(AbCli, AHighTemperatureIsSignificantlyMoreDiverse) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const fs::path d = work_dir();
  {
    std::ofstream f(d / "hot.toml");
    f << "[model]\npath = \"m.gguf\"\n[[sampler]]\nname = \"temperature\"\nvalue = 1.5\n[stop]\nmax_tokens = "
         "48\n";
  }
  const std::string prompts = (fs::path(LOOM_SOURCE_DIR) / "tests" / "data" / "ab_prompts.txt").string();
  const auto k = ab_json("-c " + cfg("greedy.toml") + " -c " + (d / "hot.toml").string() + " --prompts " +
                             prompts + " --seed 5",
                         model);
  ASSERT_TRUE(k.contains("pairs"));
  const auto& x = k["pairs"][0]["metrics"]["distinct_2"];
  EXPECT_GT(x["ci"][0].get<double>(), 0.0) << x.dump();
  EXPECT_EQ(x["verdict"], "better");
  EXPECT_LT(x["p"].get<double>(), 0.05);
  EXPECT_LT(k["pairs"][0]["agreement"].get<double>(), 0.5);
}

// Plain greedy against speculative decoding (n-gram trees, greedy): speed with intervals, and the outputs
// checked token for token — all identical; a sampled variant is not checked that way.
TEST(AbCli, PlainAgainstSpeculativeGreedyChecksTheOutputsAreIdentical) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const fs::path d = work_dir();
  {
    std::ofstream f(d / "spec.toml");
    f << "[model]\npath = \"m.gguf\"\n[[sampler]]\nname = \"temperature\"\nvalue = 0.0\n[stop]\nmax_tokens = "
         "48\n[decoder]\nname = \"speculative\"\ndrafter = \"ngram\"\nngram_min = 1\n";
  }
  const std::string prompts = (fs::path(LOOM_SOURCE_DIR) / "tests" / "data" / "ab_prompts.txt").string();
  const auto j = ab_json("-c " + cfg("greedy.toml") + " -c " + (d / "spec.toml").string() + " -c " +
                             cfg("sampling.toml") + " --prompts " + prompts,
                         model);
  ASSERT_TRUE(j.contains("pairs"));
  const auto& gi = j["pairs"][0]["greedy_identical"];
  EXPECT_GT(gi["runs"].get<int64_t>(), 0);
  EXPECT_EQ(gi["identical"], gi["runs"]) << gi.dump();
  EXPECT_TRUE(gi["differing_prompts"].empty());
  EXPECT_TRUE(j["pairs"][0]["metrics"].contains("tpot_ms")) << "speed is compared";
  EXPECT_FALSE(j["pairs"][1].contains("greedy_identical")) << "sampling is not held to identity";
  const auto r =
      test::run_loom("ab -c " + cfg("greedy.toml") + " -c " + (d / "spec.toml").string() + " --prompts " +
                         prompts + " --set 'model.path=\"" + model.string() + "\"'",
                     false, 300);
  EXPECT_NE(r.out.find("greedy outputs identical (tokens): "), std::string::npos) << r.out;
}

TEST(AbCli, BadInputIsAOneLineError) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const fs::path d = work_dir();
  { std::ofstream(d / "empty.txt") << "\n\n"; }
  { std::ofstream(d / "bad.jsonl") << "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"\n"; }
  { std::ofstream(d / "nokey.jsonl") << "{\"text\": \"a\"}\n"; }
  { std::ofstream(d / "ok.txt") << "Once upon a time\n"; }
  { std::ofstream(d / "a.toml") << "[model]\npath = \"" << model.string() << "\"\n"; }
  {
    std::ofstream(d / "other.toml") << "[model]\npath = \""
                                    << (test::models_dir() / "llama-2-tiny-random.gguf").string() << "\"\n";
  }
  const std::string m = " --set 'model.path=\"" + model.string() + "\"'";
  struct Case {
    std::string args, expect;
    int code;
  };
  std::vector<Case> cases = {
      {"-c " + cfg("greedy.toml") + " --prompts " + (d / "ok.txt").string(), "at least two pipelines", 2},
      {"-c " + cfg("greedy.toml") + " -c " + cfg("sampling.toml") + " --prompts " + (d / "ok.txt").string() +
           " --runs 0",
       "--runs must be in 1..1000", 2},
      {"-c " + cfg("greedy.toml") + " -c " + cfg("sampling.toml") + " --prompts " +
           (d / "empty.txt").string() + m,
       "no prompts", 2},
      {"-c " + cfg("greedy.toml") + " -c " + cfg("sampling.toml") + " --prompts " +
           (d / "bad.jsonl").string() + m,
       "bad.jsonl:2: not a JSON object", 2},
      {"-c " + cfg("greedy.toml") + " -c " + cfg("sampling.toml") + " --prompts " +
           (d / "nokey.jsonl").string() + m,
       "nokey.jsonl:1: expected an object with a string \"prompt\"", 2},
      {"-c " + cfg("greedy.toml") + " -c " + cfg("sampling.toml") + " --prompts " + (d / "ok.txt").string() +
           " --ci normal",
       "--ci must be percentile or bca", 2},
  };
  cases.push_back({"-c " + cfg("greedy.toml") + " -c " + cfg("sampling.toml") + " --prompts " +
                       (d / "ok.txt").string() + " --system 'Be brief.'" + m,
                   "--system goes with --chat", 2});
  {
    std::ofstream(d / "badmsg.jsonl")
        << "{\"prompt\": \"a\"}\n{\"messages\": [{\"role\": \"user\", \"content\": 7}]}\n";
  }
  cases.push_back({"-c " + cfg("greedy.toml") + " -c " + cfg("sampling.toml") + " --prompts " +
                       (d / "badmsg.jsonl").string() + m,
                   "badmsg.jsonl:2: message 0: \"content\" must be a string", 2});
  cases.push_back({"-c " + cfg("greedy.toml") + " -c " + cfg("sampling.toml") + " --prompts " +
                       (d / "ok.txt").string() + " --chat" + m,
                   "has no tokenizer.chat_template", 1}); // stories260K: no template, no turn tokens
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = test::run_loom("ab " + c.args, false, 120);
    EXPECT_EQ(r.code, c.code) << r.out << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos);
    EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  }
  // Models with different vocabularies compare (e.g. two chat models under their own templates): only
  // the metrics that do not count tokens.
  if (fs::exists(test::models_dir() / "llama-2-tiny-random.gguf")) {
    const auto r =
        test::run_loom("ab -c " + (d / "a.toml").string() + " -c " + (d / "other.toml").string() +
                           " --prompts " + (d / "ok.txt").string() + " --set 'model.n_ctx=64' -n 4",
                       false, 120);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("different vocabularies: only time and exact match are compared"), std::string::npos)
        << r.out;
  }
}

TEST(AbCli, AVariantThatFailsOnAPromptIsReportedAndTheOthersGoOn) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const fs::path d = work_dir();
  { std::ofstream(d / "short.toml") << "[model]\npath = \"m.gguf\"\nn_ctx = 12\n[stop]\nmax_tokens = 4\n"; }
  {
    std::ofstream f(d / "mixed.txt");
    f << "Hi\nOnce upon a time there was a little girl named Lily who loved to play\n";
  }
  const auto r = test::run_loom("ab -c " + cfg("greedy.toml") + " -c " + (d / "short.toml").string() +
                                    " --prompts " + (d / "mixed.txt").string() +
                                    " -n 4 --json --set 'model.path=\"" + model.string() + "\"'",
                                false, 120);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  int failed = 0, ok = 0;
  for (const auto& row : j["rows"])
    (row["ok"].get<bool>() ? ok : failed)++;
  EXPECT_EQ(failed, 1) << "the long prompt does not fit the 12-token context of one variant";
  EXPECT_EQ(ok, 3);
  EXPECT_NE(r.err.find("prompt 2"), std::string::npos) << r.err;
}

// ---- explain -----------------------------------------------------------------------------------

TEST(Explain, ChosenTokensAreRunsAndStageProbabilitiesSumToOne) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  for (const std::string& pipe :
       std::vector<std::string>{"-c " + cfg("sampling.toml"), "-c " + cfg("quickstart.toml")}) {
    SCOPED_TRACE(pipe);
    const std::string common =
        pipe + " --set 'model.path=\"" + model.string() + "\"' -p 'Once upon a time' --seed 9";
    const auto e = test::run_loom("explain " + common + " --steps 6 --top 512 --json", false, 60);
    ASSERT_EQ(e.code, 0) << e.err;
    const auto run = test::run_loom("run " + common + " -n 6 --json", false, 60);
    ASSERT_EQ(run.code, 0) << run.err;
    const auto je = nlohmann::json::parse(e.out), jr = nlohmann::json::parse(run.out);
    EXPECT_EQ(je["tokens"], jr["tokens"]);
    ASSERT_EQ(je["steps"].size(), jr["tokens"].size());
    for (const auto& st : je["steps"]) {
      const size_t n_stages = st["stages"].size();
      ASSERT_GE(n_stages, 1u);
      for (size_t k = 0; k < n_stages; ++k) {
        double sum = 0;
        for (const auto& c : st["candidates"])
          if (!c["after"][k].is_null()) sum += c["after"][k].get<double>();
        EXPECT_NEAR(sum, 1.0, 1e-6) << "step " << st["step"] << " stage " << st["stages"][k]["name"];
      }
      double raw = 0;
      for (const auto& c : st["candidates"])
        raw += c["p"].get<double>();
      EXPECT_NEAR(raw, 1.0, 1e-6);
      int chosen = 0;
      for (const auto& c : st["candidates"])
        if (c["chosen"].get<bool>()) {
          ++chosen;
          EXPECT_EQ(c["id"], st["chosen"]);
          EXPECT_TRUE(c["cut_by"].is_null()) << "the chosen token survives every stage";
        }
      EXPECT_EQ(chosen, 1);
    }
  }
}

TEST(Explain, PrintsThePerStageTable) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto e =
      test::run_loom("explain -m " + model.string() + " -p 'Once upon a time' --steps 3", false, 60);
  ASSERT_EQ(e.code, 0) << e.err;
  for (const char* s : {"step 1", "step 3", "top_k", "top_p", "min_p", "temperature", "cut"})
    EXPECT_NE(e.out.find(s), std::string::npos) << s << "\n" << e.out;
}

} // namespace
