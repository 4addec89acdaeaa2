// The arith_check verifier (plugins/arith_check) through `loom verify`: each written equation is
// recomputed exactly; the score is the share that hold. Also `loom verify`'s labelled summary and its
// one-line errors.
#include "test_util.hpp"

#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

fs::path write_tasks(const std::string& name, const std::vector<nlohmann::json>& lines) {
  const fs::path p = fs::temp_directory_path() / ("loom-verify-" + std::to_string(::getpid()) + "-" + name);
  std::ofstream f(p);
  for (const auto& l : lines)
    f << l.dump() << "\n";
  return p;
}

loom::test::CliResult verify(const std::string& args) {
  return loom::test::run_loom("verify " + args + " --plugin-path " LOOM_BUILD_BIN_DIR, false, 60);
}

TEST(ArithCheck, ScoresTheShareOfEquationsThatHold) {
  LOOM_REQUIRE_BIN();
  struct Case {
    std::string text;
    double want;
  };
  const std::vector<Case> cases = {
      {"3 + 4 = 7", 1.0},
      {"3 + 4 = 8", 0.0},
      {"She buys 5 apples + 3 apples = 8 apples. Then 8 * 2 = 16.", 1.0}, // units, two equations
      {"12 + 3 = 15 + 5 = 20", 1.0},                                      // a running total
      {"2 * 3 + 4 = 6 + 4 = 10", 1.0},                                    // a chain, precedence
      {"2 + 3 * 4 = 20", 0.0},                                            // precedence: 14
      {"(2 + 3) * 4 = 20", 1.0},
      {"10 / 3 = 3.33", 1.0}, // rounded to the written decimals
      {"10 / 3 = 3.3", 1.0},
      {"10 / 3 = 3.34", 0.0},
      {"10 / 3 = 3", 0.0}, // an integer result must be exact
      {"7 / 2 = 3.5", 1.0},
      {"0.1 + 0.2 = 0.3", 1.0}, // exact decimals, not binary floating point
      {"1,200 + 300 = 1,500", 1.0},
      {"$4.50 x 2 = $9.00", 1.0},
      {"2 × (3 + 4) = 14\n14 ÷ 7 = 3", 0.5},
      {"14 ÷ 0 = 3", 0.0}, // division by zero: wrong
      {"-3 + 5 = 2 and 2 - 5 = -3", 1.0},
      {"5 − 7 = −2", 1.0}, // U+2212 minus
      {"max = 4 x 3 = 12", 1.0},
      {"Step 1: 6 * 7 = 42\nStep 2: 42 - 2 = 41\nStep 3: 40 / 4 = 10\nStep 4: 1 + 1 = 3", 0.5},
      {"no arithmetic at all", 1.0}, // no_equations (default 1)
      {"x = 5, a == b, 3 <= 4, 5 = 5", 1.0},
      {"123456789012345678901234567890 * 10 = 1234567890123456789012345678900", 1.0}, // exact big ints
  };
  std::vector<nlohmann::json> lines;
  for (const auto& c : cases)
    lines.push_back({{"prompt", "q"}, {"candidate", c.text}});
  const fs::path f = write_tasks("cases.jsonl", lines);
  const auto r = verify("--verifier arith_check --tasks " + f.string() + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_DOUBLE_EQ(j["results"][i]["score"].get<double>(), cases[i].want) << cases[i].text;
  EXPECT_EQ(j["summary"]["errors"], 0);

  // Keys: no_equations, rounding, scope.
  const auto keyed = [&](const std::string& sets, const std::string& text) {
    const fs::path g = write_tasks("one.jsonl", {{{"candidate", text}}});
    const auto k = verify("--verifier arith_check --tasks " + g.string() + " --json " + sets);
    EXPECT_EQ(k.code, 0) << k.err;
    return k.code == 0 ? nlohmann::json::parse(k.out)["results"][0]["score"].get<double>() : -1.0;
  };
  EXPECT_DOUBLE_EQ(keyed("--set verifier.no_equations=0.25", "nothing here"), 0.25);
  EXPECT_DOUBLE_EQ(keyed("--set verifier.rounding=false", "10 / 3 = 3.33"), 0.0);
  EXPECT_DOUBLE_EQ(keyed("--set 'verifier.scope=\"last_line\"'", "1 + 1 = 3\n2 + 2 = 4\n"), 1.0);
  EXPECT_DOUBLE_EQ(keyed("", "1 + 1 = 3\n2 + 2 = 4\n"), 0.5);
  const std::string fa = "--set 'verifier.final_answer=\"answer is\"'";
  EXPECT_DOUBLE_EQ(keyed(fa, "5 + 7 = 12\nThe answer is 12."), 1.0);
  EXPECT_DOUBLE_EQ(keyed(fa, "5 + 7 = 12\nThe answer is 13."), 0.5); // the stated answer is not the result
  EXPECT_DOUBLE_EQ(keyed(fa, "The answer is 13."), 1.0);             // no equation: nothing to compare
  EXPECT_DOUBLE_EQ(keyed("", "5 + 7 = 12\nThe answer is 13."), 1.0); // off by default
  fs::remove(f);
}

TEST(ArithCheck, GroundedEquationsTakeTheirOperandsFromTheQuestion) {
  LOOM_REQUIRE_BIN();
  const std::string q = "Question: 5 + 5 = 10.\nAnswer: 10\n\nQuestion: Tom has 9 marbles and gets 12 more.";
  const std::vector<std::pair<std::string, double>> cases = {
      {"9 + 12 = 21", 1.0},
      {"5 + 12 = 17", 0.0},              // 5 is another question's number (before the last marker)
      {"9 + 12 = 21\n21 + 9 = 30", 1.0}, // 21: an earlier result
      {"9 + 13 = 22", 0.0},              // 13 from nowhere
      {"9 + 12 = 20\n20 - 9 = 11", 0.5}, // the wrong result 20 counts once: later steps may use it
      {"9 + 12 = 21 + 1 = 22", 0.5},     // a running total: 21 known, 1 not
  };
  std::vector<nlohmann::json> lines;
  for (const auto& [text, want] : cases)
    lines.push_back({{"prompt", q}, {"candidate", text}});
  const fs::path f = write_tasks("grounded.jsonl", lines);
  const auto r =
      verify("--verifier arith_check --set verifier.grounded=true --tasks " + f.string() + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (size_t i = 0; i < cases.size(); ++i)
    EXPECT_DOUBLE_EQ(j["results"][i]["score"].get<double>(), cases[i].second) << cases[i].first;
  // Without grounding only the arithmetic counts.
  const auto u = verify("--verifier arith_check --tasks " + f.string() + " --json");
  ASSERT_EQ(u.code, 0) << u.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(u.out)["results"][1]["score"].get<double>(), 1.0);
  fs::remove(f);
  // A chat task: the candidate answers the conversation's last user turn (an earlier turn's numbers do
  // not ground it).
  const nlohmann::json messages = {
      {{"role", "user"}, {"content", "Question: 5 + 12 = 17."}},
      {{"role", "assistant"}, {"content", "17"}},
      {{"role", "user"}, {"content", "Question: Tom has 9 marbles and gets 12 more."}}};
  const fs::path c = write_tasks("chat.jsonl", {{{"messages", messages}, {"candidate", "9 + 12 = 21"}},
                                                {{"messages", messages}, {"candidate", "5 + 12 = 17"}}});
  const auto ch =
      verify("--verifier arith_check --set verifier.grounded=true --tasks " + c.string() + " --json");
  ASSERT_EQ(ch.code, 0) << ch.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(ch.out)["results"][0]["score"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(ch.out)["results"][1]["score"].get<double>(), 0.0);
  fs::remove(c);
}

TEST(ArithCheck, VerifyReportsAccuracyAndAucOnLabels) {
  LOOM_REQUIRE_BIN();
  const fs::path f = write_tasks("labels.jsonl", {{{"candidate", "2 + 2 = 4"}, {"label", true}},
                                                  {{"candidate", "2 + 2 = 5"}, {"label", false}},
                                                  {{"candidate", "2 + 2 = 4, 3 + 3 = 7"}, {"label", false}},
                                                  {{"candidate", "6 / 3 = 2"}, {"label", 1}}});
  const auto r = verify("--verifier arith_check --tasks " + f.string() + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto s = nlohmann::json::parse(r.out)["summary"];
  EXPECT_EQ(s["labelled"], 4);
  // Scores 1, 0, 0.5, 1 at threshold 0.5: the 0.5 one is accepted (wrongly).
  EXPECT_DOUBLE_EQ(s["accuracy"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(s["precision"].get<double>(), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(s["recall"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(s["auc"].get<double>(), 1.0);
  const auto t = verify("--verifier arith_check --tasks " + f.string() + " --threshold 0.75");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("accuracy 100"), std::string::npos) << t.out;
  fs::remove(f);
}

TEST(ArithCheck, BadKeysAndBadTasksAreOneLineErrors) {
  LOOM_REQUIRE_BIN();
  const fs::path ok = write_tasks("ok.jsonl", {{{"candidate", "1 + 1 = 2"}}});
  const auto one_line = [](const loom::test::CliResult& r, const std::string& has) {
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find(has), std::string::npos) << r.err;
    EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;
  };
  one_line(verify("--verifier arith_check --tasks " + ok.string() + " --set verifier.no_equations=2"),
           "no_equations must be a number in [0, 1]");
  one_line(verify("--verifier arith_check --tasks " + ok.string() + " --set 'verifier.scope=\"all_of_it\"'"),
           "scope must be");
  one_line(verify("--verifier arith_check --tasks " + ok.string() + " --set verifier.colour=1"), "colour");
  one_line(
      verify("--verifier arith_check --tasks " + ok.string() + " --set 'verifier.question_marker=\"Q:\"'"),
      "question_marker applies with grounded = true");
  one_line(verify("--verifier no_such_verifier --tasks " + ok.string()), "no_such_verifier");
  one_line(verify("--verifier arith_check"), "--tasks");
  one_line(verify("--verifier arith_check --tasks /nonexistent/t.jsonl"), "cannot read");
  const fs::path bad = write_tasks("bad.jsonl", {{{"candidate", "1 + 1 = 2"}}, {{"prompt", "no candidate"}}});
  one_line(verify("--verifier arith_check --tasks " + bad.string()), "line 2: no \"candidate\" string");
  const fs::path bad_chat = write_tasks(
      "bad_chat.jsonl", {{{"candidate", "1"}, {"messages", nlohmann::json::array({{{"content", "x"}}})}}});
  one_line(verify("--verifier arith_check --tasks " + bad_chat.string()),
           "line 1: \"messages\": message 0 is not an object with a string \"role\"");
  fs::remove(bad_chat);
  fs::remove(ok);
  fs::remove(bad);
}

} // namespace
