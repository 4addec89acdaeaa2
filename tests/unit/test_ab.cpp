// `loom ab`'s statistics against known values, and the experiment library's plan and aggregates on
// hand-made rows — no model. (`loom ab` and `loom explain` on a model: tests/integration/test_ab.cpp.)
#include "loom/error.hpp"
#include "loom/eval/ab_experiment.hpp"
#include "loom/eval/ab_stats.hpp"

#include <cmath>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

namespace {

using namespace loom;

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

// ---- the experiment as a library (loom/eval/ab_experiment.hpp) ------------------------------------------

TEST(AbExperiment, PlanNamesTheVariantsAndPairsTheRuns) {
  ab::Options o;
  o.configs = {"a/greedy.toml", "b/greedy.toml", "sampling.toml"};
  const auto v = ab::expand_variants(o);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].name, "greedy");
  EXPECT_EQ(v[1].name, "greedy#2");
  EXPECT_EQ(v[2].name, "sampling");
  EXPECT_EQ(v[1].config, "b/greedy.toml");
  // A sweep: a variant per config and value, config-major.
  o.configs = {"x.toml", "y.toml"};
  o.sweep = {"decoder.expansions", {"1", "2", "4"}};
  const auto s = ab::expand_variants(o);
  ASSERT_EQ(s.size(), 6u);
  EXPECT_EQ(s[0].name, "x expansions=1");
  EXPECT_EQ(s[5].name, "y expansions=4");
  EXPECT_EQ(s[4].config_index, 1u);
  EXPECT_EQ(s[4].sweep_index, 1u);

  // 3 variants × 2 prompts × 2 runs: per prompt, per run, every variant, the order rotated.
  const auto runs = ab::list_runs(3, 2, 2, 10);
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
    EXPECT_STREQ(
        e.what(),
        "bad.jsonl:2: not a JSON object (JSONL: one {\"prompt\": …} or {\"messages\": …} a line, as the "
        "first line is)");
  }
  EXPECT_THROW((void)ab::parse_prompts("\n\n", "empty.txt"), Error);
}

// A JSONL line may be a conversation: rendered later with each variant's template; the reports show its
// last user turn. A bad one is one line naming the file and line.
TEST(AbExperiment, ParsesConversations) {
  const auto p = ab::parse_prompts(
      R"({"prompt": "raw", "answer": 1})"
      "\n"
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}], "answer": 5, "id": "c"})"
      "\n"
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "tools": []})"
      "\n",
      "c.jsonl");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_FALSE(p[0].chat.has_value());
  ASSERT_TRUE(p[1].chat.has_value());
  EXPECT_EQ(p[1].prompt, "What is 2+3?");
  EXPECT_EQ(p[1].chat->messages.size(), 2u);
  EXPECT_EQ(p[1].chat->messages[0]["role"], "system") << "the order kept";
  EXPECT_EQ(p[1].expected, "5");
  EXPECT_EQ(p[1].id, "c");
  EXPECT_EQ(p[2].prompt, "a\nb");
  EXPECT_TRUE(p[2].chat->tools.is_array());
  const auto error_of = [](const std::string& text) {
    try {
      (void)ab::parse_prompts(text, "m.jsonl");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(error_of("{\"prompt\": \"x\"}\n{\"messages\": [{\"content\": \"no role\"}]}\n"),
            "m.jsonl:2: message 0 is not an object with a string \"role\"");
  EXPECT_EQ(error_of("{\"messages\": []}\n"),
            "m.jsonl:1: \"messages\" must be a non-empty array of {role, content}, found an empty array");
  EXPECT_EQ(error_of("{\"messages\": [{\"role\": \"user\", \"content\": 3}]}\n"),
            "m.jsonl:1: message 0: \"content\" must be a string, null or an array of {type, text} parts");
  EXPECT_NE(
      error_of("{\"prompt\": \"x\", \"messages\": [{\"role\": \"user\"}]}\n").find("m.jsonl:1: expected"),
      std::string::npos);
  EXPECT_EQ(error_of("{\"prompt\": \"x\", \"tools\": []}\n"), "m.jsonl:1: \"tools\" goes with \"messages\"");
  EXPECT_EQ(error_of("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": 1}\n"),
            "m.jsonl:1: \"tools\" must be an array of {type, function}");
  for (const char* bad :
       {"{\"messages\": 1}\n", "{\"messages\": [[]]}\n", "{\"messages\": [{\"role\": 1}]}\n"})
    EXPECT_EQ(error_of(bad).find('\n'), std::string::npos) << "one line: " << error_of(bad);
}

// --chat: a raw prompt becomes one user turn; --system goes first where a conversation has none.
TEST(AbExperiment, ChatWrapsRawPrompts) {
  auto p = ab::parse_prompts(
      "{\"prompt\": \"hi\"}\n{\"messages\": [{\"role\": \"system\", \"content\": \"own\"}, {\"role\": "
      "\"user\", \"content\": \"q\"}]}\n",
      "c.jsonl");
  auto only_system = p;
  ab::apply_chat(only_system, false, std::string("S"));
  EXPECT_FALSE(only_system[0].chat.has_value()) << "without --chat a raw prompt stays raw";
  ab::apply_chat(p, true, std::string("S"));
  ASSERT_TRUE(p[0].chat.has_value());
  EXPECT_EQ(p[0].chat->messages.dump(),
            R"([{"role":"system","content":"S"},{"role":"user","content":"hi"}])");
  EXPECT_EQ(p[0].prompt, "hi");
  EXPECT_EQ(p[1].chat->messages.size(), 2u) << "its own system turn is kept, no second one";
  EXPECT_EQ(p[1].chat->messages[0]["content"], "own");
}

// Two greedy variants on six tasks, one run each, rows made by hand: B is always right and two tokens
// longer, A always wrong; every aggregate follows from that.
TEST(AbExperiment, AggregatesHandMadeRows) {
  ab::Result r;
  r.options.configs = {"a.toml", "b.toml"};
  r.variants = ab::expand_variants(r.options);
  r.variants[0].greedy = r.variants[1].greedy = true;
  for (int i = 0; i < 6; ++i)
    r.prompts.push_back({"t" + std::to_string(i), "q", std::string("1"), "", std::nullopt});
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

  // The same rows as if B's model had another vocabulary: only time and exact match compare.
  r.variants[1].vocabulary = 1;
  const auto other = ab::aggregate(r.options, r.variants, r.prompts, r.rows).pairs[0];
  EXPECT_FALSE(other.same_vocabulary);
  EXPECT_FALSE(other.metrics.contains("tokens"));
  EXPECT_FALSE(other.metrics.contains("mean_logprob"));
  EXPECT_EQ(other.metrics.at("exact_match").verdict, "better");
  EXPECT_EQ(other.wins + other.ties + other.losses, 0);
  EXPECT_FALSE(other.greedy_identical.has_value());
  EXPECT_EQ(other.b_only_correct, 6);
  EXPECT_EQ(text.find("ttft_ms"), std::string::npos) << "no variant has it: left out of the table";
  const std::string html = ab::report_html(r, doc);
  EXPECT_NE(html.find("<table id='summary'>"), std::string::npos);
  EXPECT_NE(html.find("class='right'>✓ 1"), std::string::npos);
}

} // namespace
