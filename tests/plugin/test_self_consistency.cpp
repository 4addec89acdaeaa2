// decoders/self_consistency through `loom run --json`: answers extracted from every sample, votes
// that add up, the winner's candidate as the answer text, the same result inside a batch, and bad
// keys as one-line errors.
#include "test_util.hpp"

#include <cctype>
#include <cmath>
#include <fstream>
#include <gtest/gtest.h>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

namespace {

loom::test::CliResult loom_run(const std::string& args) {
  return loom::test::run_loom("run " + args + " --plugin-path " LOOM_BUILD_BIN_DIR, false, 120);
}

// The sample's first word: stories260K continues these prompts differently across samples.
// first_word() is the same rule, written out (the decoder's regex engine is not used to check it).
const char* k_regex = "^\\\\s*([A-Za-z]+)";

std::optional<std::string> first_word(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i])))
    ++i;
  size_t j = i;
  while (j < text.size() && std::isalpha(static_cast<unsigned char>(text[j])))
    ++j;
  if (j == i) return std::nullopt;
  return text.substr(i, j - i);
}

std::string base(const std::string& model, const std::string& prompt = "Once upon a time, there was a") {
  return "-m " + model + " -p '" + prompt + "' -n 12 --seed 11 --temp 1.0" +
         " --decoder self_consistency --set decoder.samples=8 --set 'decoder.answer_regex=\"" + k_regex +
         "\"'";
}

TEST(SelfConsistency, VotesCountTheExtractedAnswers) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto r = loom_run(base(model.string()) + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["candidates"].size(), 8u) << r.out;
  std::map<std::string, int> counts;
  int voters = 0;
  for (const auto& c : j["candidates"]) {
    const std::string text = c["text"];
    if (const auto w = first_word(text)) {
      EXPECT_EQ(c["answer"], *w) << text;
      ++counts[*w];
      ++voters;
    } else {
      EXPECT_TRUE(c["answer"].is_null()) << text;
    }
  }
  ASSERT_GT(voters, 0);
  int best = 0;
  double share = 0;
  for (const auto& v : j["votes"]) {
    EXPECT_EQ(v["count"].get<int>(), counts[v["answer"].get<std::string>()]) << v;
    best = std::max(best, v["count"].get<int>());
    share += v["share"].get<double>();
  }
  EXPECT_NEAR(share, 1.0, 1e-4);
  EXPECT_EQ(counts[j["answer"].get<std::string>()], best) << "the answer has the most votes";
  EXPECT_EQ(j["votes"][0]["answer"], j["answer"]);
  // The top-level text is a candidate that gave the winning answer; hypotheses list every sample.
  ASSERT_EQ(j["hypotheses"].size(), 8u);
  const auto w = first_word(j["text"].get<std::string>());
  ASSERT_TRUE(w) << j["text"];
  EXPECT_EQ(*w, j["answer"]);
}

TEST(SelfConsistency, SameInABatchAsAlone) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto alone = loom_run(base(model.string()) + " --json");
  ASSERT_EQ(alone.code, 0) << alone.err;
  const auto prompts = std::filesystem::temp_directory_path() / ("loom-sc-" + std::to_string(::getpid()));
  {
    std::ofstream f(prompts);
    for (int i = 0; i < 4; ++i)
      f << "Once upon a time, there was a\n";
  }
  std::string args = base(model.string());
  args.replace(args.find("-p '"), std::string("-p 'Once upon a time, there was a'").size(),
               "--prompts " + prompts.string() + " --parallel 4");
  const auto batch = loom_run(args + " --json");
  ASSERT_EQ(batch.code, 0) << batch.err;
  const auto a = nlohmann::json::parse(alone.out);
  std::istringstream in(batch.out);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    const auto b = nlohmann::json::parse(line);
    EXPECT_EQ(a["answer"], b["answer"]);
    EXPECT_EQ(a["votes"], b["votes"]);
    EXPECT_EQ(a["tokens"], b["tokens"]);
    ++n;
  }
  EXPECT_EQ(n, 4);
  std::filesystem::remove(prompts);
}

// Per answer: votes, summed exp(mean log-prob), and the mean of its candidates' mean log-probs.
struct Tally {
  int count = 0;
  double weight = 0, lp = 0;
};
std::map<std::string, Tally> tally(const nlohmann::json& j) {
  std::map<std::string, Tally> t;
  for (const auto& c : j["candidates"])
    if (!c["answer"].is_null()) {
      Tally& x = t[c["answer"].get<std::string>()];
      ++x.count;
      x.weight += std::exp(c["mean_logprob"].get<double>());
      x.lp += c["mean_logprob"].get<double>();
    }
  return t;
}

TEST(SelfConsistency, TiesGoToTheHigherMeanLogprobAndWeightingByLogprob) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  // Seed 11 on this prompt splits the eight samples 4 "boy" / 4 "girl".
  const auto r = loom_run(base(model.string(), "One day, a little") + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto t = tally(j);
  ASSERT_EQ(j["votes"].size(), 2u) << r.out;
  ASSERT_EQ(j["votes"][0]["count"], j["votes"][1]["count"]) << "the case needs a tie: " << j["votes"];
  const std::string a = j["votes"][0]["answer"], b = j["votes"][1]["answer"];
  EXPECT_GT(t.at(a).lp / t.at(a).count, t.at(b).lp / t.at(b).count) << "the tie goes to the likelier answer";
  EXPECT_EQ(j["answer"], a);

  const auto w =
      loom_run(base(model.string(), "One day, a little") + " --set 'decoder.weighting=\"logprob\"' --json");
  ASSERT_EQ(w.code, 0) << w.err;
  const auto jw = nlohmann::json::parse(w.out);
  std::string best;
  for (const auto& [ans, x] : tally(jw))
    if (best.empty() || x.weight > tally(jw).at(best).weight) best = ans;
  EXPECT_EQ(jw["answer"], best) << "weighted by exp(mean log-prob)";
}

TEST(SelfConsistency, NoAnswerMeansNoVote) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto r = loom_run("-m " + model.string() +
                          " -p 'Once upon a time' -n 8 --seed 3 --decoder self_consistency"
                          " --set decoder.samples=4 --set 'decoder.answer_regex=\"(QQQ)\"' --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["answer"].is_null());
  EXPECT_TRUE(j["votes"].empty());
  EXPECT_EQ(j["candidates"].size(), 4u);
}

TEST(SelfConsistency, BadKeysAreOneLineErrors) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string b = "-m " + model.string() + " -p hi -n 4 --decoder self_consistency ";
  for (const auto& [set, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--set decoder.samples=0", "samples must be an integer in [1, 256]"},
           {"--set 'decoder.answer_regex=\"(unclosed\"'", "answer_regex does not compile"},
           {"--set 'decoder.answer_regex=\"no group\"'", "exactly one capture group"},
           {"--set 'decoder.weighting=\"loud\"'", "weighting must be"}}) {
    SCOPED_TRACE(set);
    const auto r = loom_run(b + set);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;
  }
}

// The prompt is evaluated once for all samples (they are forks of it), and each sample's KV holds
// the prompt's positions plus its own tokens. With the contiguous store a fork copies the prompt's
// positions, so written KV is N × (prompt + generated) positions; the paged store (issue 12) shares
// them. Both counts are exact.
TEST(SelfConsistency, ThePromptIsEvaluatedOnceAndForkedToEverySample) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const size_t n = 10;
  for (size_t samples : {1, 4, 8}) {
    SCOPED_TRACE(samples);
    const auto r =
        loom_run("-m " + model.string() + " -p 'Once upon a time' -n " + std::to_string(n) +
                 " --ignore-eos --seed 3 --json --decoder self_consistency --set decoder.samples=" +
                 std::to_string(samples));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    const auto& m = j["metrics"];
    const size_t n_prompt = j["prompt_tokens"].size();
    // Every sample generated n tokens: the prompt once, then each sample's tokens but its last.
    EXPECT_EQ(m["tokens_evaluated"].get<size_t>(), n_prompt + samples * (n - 1));
    const size_t bytes_per_position = 2 * 5 * 32 * 4; // stories260K: 5 layers, n_head_kv·head_dim = 32, f32
    EXPECT_EQ(m["kv_used_peak_bytes"].get<size_t>(), samples * (n_prompt + n - 1) * bytes_per_position);
  }
}

} // namespace
