// The built-in model_judge verifier: a model's p(yes) / (p(yes) + p(no)) after a judge template — equal to
// a forward written out here on the reference backend; candidates of one prompt reuse the prompt's KV
// and score as they do alone; it runs inside step_search with the pipeline's own model; bad keys are
// one-line errors.
#include "loom/backend.hpp"
#include "loom/model.hpp"
#include "loom/tokenizer.hpp"
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
  one_line(" --set 'verifier.model=\"/nonexistent/judge.gguf\"'", "no such file");
  fs::remove(f);
}

} // namespace
