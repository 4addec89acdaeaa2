// The verifier kind (ABI 1.2) and its first user: the pipeline's [verifier] (here plugins/regex_match)
// scores self_consistency's candidates; "filter" keeps low scorers from voting, "weight" scales their
// votes; every misuse is a one-line error.
#include "test_util.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

loom::test::CliResult loom_run(const std::string& args) {
  return loom::test::run_loom("run " + args + " --plugin-path " LOOM_BUILD_BIN_DIR, false, 120);
}

// Eight samples whose first word is the answer ("boy" or "girl" with seed 11, see
// test_self_consistency.cpp); the verifier accepts only candidates that name a Tim or a Tom.
std::string base(const std::string& model, const std::string& mode) {
  return "-m " + model +
         " -p 'One day, a little' -n 12 --seed 11 --temp 1.0 --json --decoder self_consistency"
         " --set decoder.samples=8 --set 'decoder.answer_regex=\"^\\\\s*([A-Za-z]+)\"'"
         " --set 'decoder.verifier=\"" +
         mode + "\"' --set 'verifier.name=\"regex_match\"' --set 'verifier.pattern=\"T[io]m\"'";
}

TEST(Verifier, FilterKeepsRejectedCandidatesFromVoting) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto r = loom_run(base(model.string(), "filter"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  int accepted = 0, voted = 0;
  std::map<std::string, int> counts;
  for (const auto& c : j["candidates"]) {
    ASSERT_TRUE(c.contains("verifier_score")) << c;
    const std::string text = c["text"];
    const double v = c["verifier_score"];
    EXPECT_EQ(v, text.find("Tim") != std::string::npos || text.find("Tom") != std::string::npos ? 1.0 : 0.0)
        << text;
    if (v == 1.0 && !c["answer"].is_null()) {
      ++accepted;
      ++counts[c["answer"].get<std::string>()];
    }
  }
  for (const auto& v : j["votes"]) {
    EXPECT_EQ(v["count"].get<int>(), counts[v["answer"].get<std::string>()]) << v;
    voted += v["count"].get<int>();
  }
  EXPECT_EQ(voted, accepted) << "only candidates the verifier accepts vote";
}

TEST(Verifier, WeightScalesVotesAndNoneIgnoresIt) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto w = loom_run(base(model.string(), "weight"));
  ASSERT_EQ(w.code, 0) << w.err;
  const auto jw = nlohmann::json::parse(w.out);
  std::map<std::string, double> weight;
  for (const auto& c : jw["candidates"])
    if (!c["answer"].is_null()) weight[c["answer"].get<std::string>()] += c["verifier_score"].get<double>();
  std::string best;
  for (const auto& [a, x] : weight)
    if (best.empty() || x > weight[best]) best = a;
  ASSERT_GT(weight[best], 0.0) << "the case needs candidates the verifier accepts";
  EXPECT_EQ(jw["answer"], best);
  const auto n = loom_run(base(model.string(), "none"));
  ASSERT_EQ(n.code, 0) << n.err;
  EXPECT_FALSE(nlohmann::json::parse(n.out)["candidates"][0].contains("verifier_score"));
}

TEST(Verifier, MisuseIsAOneLineError) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string m = "-m " + model.string() + " -p hi -n 4 --decoder self_consistency ";
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--set 'decoder.verifier=\"filter\"'", "needs a verifier in the pipeline"},
           {"--set 'decoder.verifier=\"sometimes\"'", "verifier must be"},
           {"--set 'verifier.name=\"regex_match\"'", "'pattern' is required"},
           {"--set 'verifier.name=\"regex_match\"' --set 'verifier.pattern=\"(\"'",
            "pattern does not compile"},
           {"--set 'verifier.name=\"no_such_verifier\"'", "verifier 'no_such_verifier'"},
           {"--set 'verifier.name=\"beam_search\"'", "verifier 'beam_search'"}}) {
    SCOPED_TRACE(args);
    const auto r = loom_run(m + args);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  }
}

} // namespace
