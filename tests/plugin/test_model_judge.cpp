// The built-in model_judge verifier: a model's p(yes) / (p(yes) + p(no)) after a judge template — equal to
// a forward written out here on the reference backend; candidates of one prompt reuse the prompt's KV
// and score as they do alone; it runs inside step_search with the pipeline's own model; bad keys are
// one-line errors.
#include "loom/eval/model_judge.hpp"
#include "loom/model/model.hpp"
#include "loom/model/reference_backend.hpp"
#include "loom/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using namespace loom;
namespace fs = std::filesystem;

fs::path write_tasks(const std::string& name, const std::vector<nlohmann::json>& lines) {
  const fs::path p = fs::temp_directory_path() / ("loom-judge-" + std::to_string(::getpid()) + "-" + name);
  std::ofstream f(p);
  for (const auto& l : lines)
    f << l.dump() << "\n";
  return p;
}

// yes = "happy", no = "big": one token each in stories260K's vocabulary.
std::string judge_keys(const fs::path& model) {
  return " --set 'verifier.model=\"" + model.string() +
         "\"' --set 'verifier.template=\"{prompt} {candidate} The girl was\"'"
         " --set 'verifier.yes=\"happy\"' --set 'verifier.no=\"big\"' --set 'backend.name=\"reference\"'";
}

double expected_score(const fs::path& model, const std::string& text) {
  auto m = Model::load(model.string());
  auto tok = Tokenizer::from_gguf(m->file());
  auto be = make_reference_backend();
  EncodeOptions o;
  o.parse_special = true;
  const auto toks = tok->encode(text, o);
  auto kv = make_contiguous_kv_cache(m->kv_shape(256, 1));
  std::vector<Pos> pos(toks.size());
  std::vector<SeqId> seqs(toks.size(), 0);
  for (size_t i = 0; i < toks.size(); ++i)
    pos[i] = static_cast<Pos>(i);
  const std::vector<int32_t> out{static_cast<int32_t>(toks.size()) - 1};
  EXPECT_TRUE(kv->allocate(0, static_cast<int32_t>(toks.size())));
  std::vector<float> logits(static_cast<size_t>(m->config().n_vocab));
  m->forward(*be, BatchView{toks, pos, seqs, out}, *kv, logits);
  EncodeOptions one;
  one.add_bos = false;
  const TokenId yes = tok->encode("happy", one).at(0), no = tok->encode("big", one).at(0);
  return 1.0 / (1.0 + std::exp(static_cast<double>(logits[static_cast<size_t>(no)]) -
                               static_cast<double>(logits[static_cast<size_t>(yes)])));
}

TEST(ModelJudge, ScoresTheYesProbabilityOfAWrittenOutForward) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::vector<std::string> cands = {"Lily found a puppy.", "The dog was sad and cried.",
                                          "Tom ate a cake."};
  std::vector<nlohmann::json> lines;
  for (const auto& c : cands)
    lines.push_back({{"prompt", "Once upon a time"}, {"candidate", c}});
  const fs::path f = write_tasks("judge.jsonl", lines);
  const auto r = test::run_loom(
      "verify --verifier model_judge --tasks " + f.string() + " --json" + judge_keys(model), false, 120);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), cands.size());
  for (size_t i = 0; i < cands.size(); ++i) {
    // The three share the prompt's KV in one run; the reference forward here sees each alone.
    const double want = expected_score(model, "Once upon a time " + cands[i] + " The girl was");
    EXPECT_NEAR(j["results"][i]["score"].get<double>(), want, 1e-5) << cands[i];
    EXPECT_GT(want, 0.0);
    EXPECT_LT(want, 1.0);
  }
  // One prompt: its shared prefix in one forward, the three candidates together in another.
  EXPECT_EQ(j["summary"]["judge_forwards"].get<int>(), 2) << j["summary"].dump();
  fs::remove(f);
}

TEST(ModelJudge, ScoresStepSearchCandidatesWithThePipelinesOwnModel) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto r = test::run_loom(
      "run -m " + model.string() +
          " -p 'Once upon a time' -n 60 --seed 3 --temp 0.8 --json --decoder step_search"
          " --set decoder.beam_width=2 --set decoder.expansions=2 --set 'decoder.step_delimiter=\".\"'"
          " --set 'verifier.name=\"model_judge\"' --set 'verifier.model=\"self\"'"
          " --set 'verifier.template=\"{prompt}{candidate} The girl was\"' --set 'verifier.yes=\"happy\"'"
          " --set 'verifier.no=\"big\"' --plugin-path " LOOM_BUILD_BIN_DIR,
      false, 120);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("search"));
  size_t scored = 0;
  for (const auto& n : j["search"]["nodes"])
    if (n["score"].is_number()) {
      ++scored;
      EXPECT_GT(n["score"].get<double>(), 0.0);
      EXPECT_LT(n["score"].get<double>(), 1.0);
    }
  EXPECT_GE(scored, 4u);
  EXPECT_EQ(j["metrics"]["verifier_calls"].get<double>(), static_cast<double>(scored));
  // The candidates of a round go to the judge together (one batched forward), not one by one.
  EXPECT_LT(j["metrics"]["verifier_batches"].get<double>(), j["metrics"]["verifier_calls"].get<double>());
  EXPECT_GE(j["metrics"]["verifier_batches"].get<double>(), 1.0);
  // The judge's compute is the request's too (loom ab counts it in tokens_evaluated): at least one row
  // per candidate judged.
  ASSERT_TRUE(j["metrics"].contains("verifier_tokens_evaluated")) << j["metrics"].dump();
  EXPECT_GE(j["metrics"]["verifier_tokens_evaluated"].get<double>(),
            j["metrics"]["verifier_calls"].get<double>());
}

// score_many: a prompt's candidates in batched forwards (their shared prefix once, then up to `batch`
// forked sequences per forward) score as each does alone, a candidate longer than the judge's context
// fails alone, and the forked sequences are released (a second and third round score the same).
TEST(ModelJudge, ScoresManyCandidatesInBatchedForwardsAsEachDoesAlone) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  ModelJudgeOptions o;
  o.model = "self";
  o.templ = "{prompt} {candidate} The girl was";
  o.yes = "happy";
  o.no = "big";
  o.n_ctx = 64;
  const auto make = [&] {
    std::shared_ptr<Model> m = Model::load(model.string());
    auto tok = Tokenizer::from_gguf(m->file());
    return std::make_unique<ModelJudge>(m, std::move(tok), make_reference_backend(), o, "test");
  };
  std::vector<std::string> cands;
  for (int i = 0; i < 11; ++i)
    cands.push_back("Lily had " + std::to_string(i + 2) + " red balls and a " + (i % 2 ? "cat." : "dog."));
  std::string long_one;
  for (int i = 0; i < 40; ++i)
    long_one += "and then the dog ran ";
  cands.insert(cands.begin() + 5, long_one); // 12 in all, one too long
  const std::vector<std::string_view> views(cands.begin(), cands.end());

  auto alone = make();
  std::vector<double> want;
  for (size_t i = 0; i < cands.size(); ++i) {
    if (i == 5) {
      EXPECT_THROW(alone->score("Once upon a time", cands[i], ""), Error);
      want.push_back(-1);
      continue;
    }
    want.push_back(alone->score("Once upon a time", cands[i], ""));
  }
  auto batched = make();
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const size_t f0 = batched->forwards();
    const auto got = batched->score_many("Once upon a time", views, {});
    ASSERT_EQ(got.size(), cands.size());
    for (size_t i = 0; i < cands.size(); ++i) {
      if (i == 5) {
        EXPECT_NE(got[i].error.find("the judge's context 64"), std::string::npos) << got[i].error;
        continue;
      }
      EXPECT_TRUE(got[i].error.empty()) << got[i].error;
      EXPECT_NEAR(got[i].score, want[i], 1e-6) << cands[i];
    }
    // 11 candidates: the prefix (first round only: later rounds keep it), then 8 + 3 forked sequences.
    EXPECT_EQ(batched->forwards() - f0, round == 0 ? 3u : 2u);
  }
  EXPECT_EQ(batched->calls(), 33u);
  // batch = 3: the same scores in ⌈11 / 3⌉ = 4 candidate forwards after the prefix's.
  o.batch = 3;
  auto threes = make();
  const auto got = threes->score_many("Once upon a time", views, {});
  for (size_t i = 0; i < cands.size(); ++i)
    if (i != 5) {
      EXPECT_NEAR(got[i].score, want[i], 1e-6) << cands[i];
    }
  EXPECT_EQ(threes->forwards(), 5u);
}

TEST(ModelJudge, BadKeysAreOneLineErrors) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const fs::path f = write_tasks("bad.jsonl", {{{"candidate", "x"}}});
  const auto one_line = [&](const std::string& keys, const std::string& has) {
    SCOPED_TRACE(keys);
    const auto r = test::run_loom("verify --verifier model_judge --tasks " + f.string() + keys, false, 60);
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find(has), std::string::npos) << r.err;
    EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;
  };
  const std::string m = " --set 'verifier.model=\"" + model.string() + "\"'";
  one_line("", "model_judge needs model");
  one_line(m + " --set 'verifier.template=\"no slot\"'", "must contain {candidate}");
  one_line(m + " --set 'verifier.yes=\"yes\"' --set 'verifier.no=\"big\"'", "is 2 tokens");
  one_line(m + " --set verifier.colour=1", "model_judge has no key 'colour'");
  one_line(m + " --set verifier.batch=0", "model_judge.batch must be an integer in [1, 64]");
  one_line(" --set 'verifier.model=\"/nonexistent/judge.gguf\"'", "no such file");
  fs::remove(f);
}

} // namespace
