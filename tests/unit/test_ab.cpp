// `loom ab` and `loom explain`: the statistics against known values, the experiment library's plan
// and aggregates on hand-made rows (no model), identical variants that differ in nothing, a known difference
// (greedy vs a high temperature) that comes out significant, real pairing, bad input as one-line errors;
// explain's tokens equal `loom run`'s and its per-stage probabilities sum to 1. (tests/ab/run_checks.sh
// recomputes a whole report in Python and renders its HTML in Chromium.)
#include "loom/ab_experiment.hpp"
#include "loom/ab_stats.hpp"
#include "loom/error.hpp"
#include "test_util.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

namespace {

using namespace loom;
namespace fs = std::filesystem;

TEST(AbStats, McNemarExactMatchesTheBinomial) {
  EXPECT_DOUBLE_EQ(ab::mcnemar_exact_p(0, 0), 1.0);
  EXPECT_NEAR(ab::mcnemar_exact_p(0, 5), 2.0 / 32, 1e-12); // 2 · 0.5^5
  EXPECT_NEAR(ab::mcnemar_exact_p(1, 9), 2.0 * 11 / 1024, 1e-12);
  EXPECT_DOUBLE_EQ(ab::mcnemar_exact_p(5, 5), 1.0);
}

TEST(AbStats, SignFlipIsExactForFewPrompts) {
  // Five positive differences: only the two all-same-sign patterns are as extreme: p = 2/32.
  const std::vector<double> d{1, 2, 3, 4, 5};
  EXPECT_NEAR(ab::sign_flip_p(d, 1000, 1), 2.0 / 32, 1e-12);
  EXPECT_DOUBLE_EQ(ab::sign_flip_p(std::vector<double>{0, 0}, 1000, 1), 1.0);
}

TEST(AbStats, BootstrapIntervals) {
  const std::vector<double> same{0.5, 0.5, 0.5};
  const auto iv = ab::bootstrap_mean_ci(same, 1000, 1);
  EXPECT_EQ(iv.lo, 0.5);
  EXPECT_EQ(iv.hi, 0.5);
  std::vector<double> d;
  for (int i = 0; i < 200; ++i)
    d.push_back(std::sin(i * 1.7) + 0.3); // mean ≈ 0.3, sd ≈ 0.7
  const auto p = ab::bootstrap_mean_ci(d, 2000, 7);
  const auto b = ab::bootstrap_mean_ci(d, 2000, 7, 0.95, ab::CiMethod::bca);
  const double se = ab::stddev(d) / std::sqrt(200.0);
  EXPECT_NEAR(p.hi - p.lo, 2 * 1.96 * se, 0.2 * 2 * 1.96 * se); // the normal-theory width, within 20%
  EXPECT_TRUE(p.covers(ab::mean(d)));
  EXPECT_NEAR(b.lo, p.lo, se); // a near-symmetric case: BCa close to percentile
  EXPECT_NEAR(b.hi, p.hi, se);
  EXPECT_NEAR(ab::normal_quantile(0.975), 1.959964, 1e-6);
  EXPECT_EQ(ab::prompts_to_resolve(1.0, 0.196), 100);
}

TEST(AbStats, TextMetrics) {
  const std::vector<TokenId> t{1, 2, 1, 2, 1, 2};
  EXPECT_DOUBLE_EQ(ab::distinct_n(t, 1), 2.0 / 6);
  EXPECT_DOUBLE_EQ(ab::distinct_n(t, 2), 2.0 / 5);
  EXPECT_DOUBLE_EQ(ab::repetition_rate(t, 4), 1.0 / 3); // 1212, 2121, then 1212 again
  EXPECT_EQ(ab::extract_answer("so 3 apples, then 12.5", "last_number"), "12.5");
  EXPECT_EQ(ab::extract_answer("answer: 7.", "answer: (\\d+)"), "7");
  EXPECT_THROW((void)ab::extract_answer("x", "(a)(b)"), Error);
}

// ---- the experiment as a library (loom/ab_experiment.hpp) ------------------------------------------

TEST(AbExperiment, PlanNamesTheVariantsAndPairsTheRuns) {
  ab::Options o;
  o.configs = {"a/greedy.toml", "b/greedy.toml", "sampling.toml"};
  const auto v = ab::plan_variants(o);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].name, "greedy");
  EXPECT_EQ(v[1].name, "greedy#2");
  EXPECT_EQ(v[2].name, "sampling");
  EXPECT_EQ(v[1].config, "b/greedy.toml");
  // A sweep: a variant per config and value, config-major.
  o.configs = {"x.toml", "y.toml"};
  o.sweep = {"decoder.expansions", {"1", "2", "4"}};
  const auto s = ab::plan_variants(o);
  ASSERT_EQ(s.size(), 6u);
  EXPECT_EQ(s[0].name, "x expansions=1");
  EXPECT_EQ(s[5].name, "y expansions=4");
  EXPECT_EQ(s[4].config_index, 1u);
  EXPECT_EQ(s[4].sweep_index, 1u);

  // 3 variants × 2 prompts × 2 runs: per prompt, per run, every variant, the order rotated.
  const auto runs = ab::plan_runs(3, 2, 2, 10);
  ASSERT_EQ(runs.size(), 12u);
  const size_t order[] = {0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2};
  std::set<std::tuple<size_t, size_t, size_t>> seen;
  for (size_t k = 0; k < runs.size(); ++k) {
    SCOPED_TRACE(k);
    EXPECT_EQ(runs[k].variant, order[k]);
    EXPECT_EQ(runs[k].prompt, k / 6);
    EXPECT_EQ(runs[k].run, k / 3 % 2);
    EXPECT_EQ(runs[k].seed, 10 + runs[k].prompt * 2 + runs[k].run); // the same in every variant
    seen.insert({runs[k].variant, runs[k].prompt, runs[k].run});
  }
  EXPECT_EQ(seen.size(), 12u) << "every (variant, prompt, run) once";
}

TEST(AbExperiment, ParsesPromptsAndTasks) {
  const auto plain = ab::parse_prompts("\xEF\xBB\xBFOnce upon a time\r\n\n  \nThe dog\n", "p.txt");
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(plain[0].prompt, "Once upon a time");
  EXPECT_EQ(plain[1].id, "2");
  const auto tasks = ab::parse_prompts("{\"prompt\": \"1+2\", \"answer\": 3.0, \"id\": 7}\n", "t.jsonl");
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].expected, "3");
  EXPECT_EQ(tasks[0].id, "7");
  try {
    (void)ab::parse_prompts("{\"prompt\": \"a\"}\n{\"prompt\": \"b\"\n", "bad.jsonl");
    FAIL() << "a line that is not JSON";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "bad.jsonl:2: not a JSON object (JSONL: one {\"prompt\": …} a line, as the first line is)");
  }
  EXPECT_THROW((void)ab::parse_prompts("\n\n", "empty.txt"), Error);
}

// Two greedy variants on six tasks, one run each, rows made by hand: B is always right and two tokens
// longer, A always wrong; every aggregate follows from that.
TEST(AbExperiment, AggregatesHandMadeRows) {
  ab::Result r;
  r.options.configs = {"a.toml", "b.toml"};
  r.variants = ab::plan_variants(r.options);
  r.variants[0].greedy = r.variants[1].greedy = true;
  for (int i = 0; i < 6; ++i)
    r.prompts.push_back({"t" + std::to_string(i), "q", std::string("1"), ""});
  for (size_t i = 0; i < 6; ++i)
    for (size_t v = 0; v < 2; ++v) {
      ab::Row row;
      row.variant = v, row.prompt = i, row.seed = i;
      row.ok = true;
      row.result.tokens.assign(10 + 2 * v, static_cast<TokenId>(i));
      row.result.text = v ? "one" : "two";
      row.result.stop_reason = StopReason::eos;
      row.answer = v ? "1" : "2";
      row.correct = v == 1;
      row.metrics = {{"tokens", 10.0 + 2 * v},
                     {"exact_match", v ? 1.0 : 0.0},
                     {"mean_logprob", v ? -1.0 : -2.0 + (i == 0 ? 1.0 : 0.0)}};
      r.rows.push_back(row);
    }
  r.aggregates = ab::aggregate(r.options, r.variants, r.prompts, r.rows);
  const auto& a = r.aggregates;
  EXPECT_EQ(a.per_prompt.at("tokens")[1][3], 12.0);
  EXPECT_TRUE(std::isnan(a.per_prompt.at("ttft_ms")[0][0])) << "a metric no row has";
  EXPECT_EQ(a.variants[0].metrics.at("exact_match").mean, 0.0);
  EXPECT_FALSE(a.variants[0].metrics.at("ttft_ms").mean.has_value());
  EXPECT_EQ(a.variants[1].stop_reasons.at("eos"), 6);
  ASSERT_EQ(a.pairs.size(), 1u);
  const ab::Pair& p = a.pairs[0];
  EXPECT_EQ(p.prompts_paired, 6u);
  const ab::MetricDiff& tokens = p.metrics.at("tokens");
  EXPECT_EQ(tokens.diff, 2.0);
  EXPECT_EQ(tokens.ci.lo, 2.0);
  EXPECT_EQ(tokens.ci.hi, 2.0);
  EXPECT_NEAR(tokens.p, 2.0 / 64, 1e-12); // six same-sign differences: exact sign-flip p
  EXPECT_EQ(tokens.verdict, "higher");    // tokens: neither better nor worse
  EXPECT_EQ(p.metrics.at("exact_match").verdict, "better");
  EXPECT_FALSE(p.metrics.contains("ttft_ms"));
  EXPECT_EQ(p.b_only_correct, 6);
  EXPECT_NEAR(p.mcnemar_p, 2.0 / 64, 1e-12);
  EXPECT_EQ(p.agreement, 0.0);
  EXPECT_EQ(p.answer_agreement, 0.0);
  EXPECT_EQ(p.wins, 5);
  EXPECT_EQ(p.ties, 1);
  ASSERT_TRUE(p.greedy_identical.has_value());
  EXPECT_EQ(p.greedy_identical->identical, 0);
  EXPECT_EQ(p.greedy_identical->differing_prompts.size(), 6u);

  const auto doc = ab::report_json(r);
  EXPECT_EQ(doc["pairs"][0]["metrics"]["tokens"]["diff"].get<double>(), 2.0);
  EXPECT_EQ(doc["rows"].size(), 12u);
  EXPECT_TRUE(doc["aggregates"][0]["metrics"]["ttft_ms"]["mean"].is_null());
  const std::string text = ab::report_text(r, doc);
  EXPECT_NE(text.find("greedy outputs identical (tokens): 0 of 6 runs; differing: t0, t1"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("ttft_ms"), std::string::npos) << "no variant has it: left out of the table";
  const std::string html = ab::report_html(r, doc);
  EXPECT_NE(html.find("<table id='summary'>"), std::string::npos);
  EXPECT_NE(html.find("class='right'>✓ 1"), std::string::npos);
}

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
  if (fs::exists(test::models_dir() / "llama-2-tiny-random.gguf"))
    cases.push_back({"-c " + (d / "a.toml").string() + " -c " + (d / "other.toml").string() + " --prompts " +
                         (d / "ok.txt").string() + " --set 'model.n_ctx=64'",
                     "vocabulary differs", 1});
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = test::run_loom("ab " + c.args, false, 120);
    EXPECT_EQ(r.code, c.code) << r.out << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos);
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
