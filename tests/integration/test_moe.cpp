// A mixture-of-experts model (loom synth's tiny-moe qwen3moe file, Q8_0 experts: 3 of 8 a token) through the
// decoders that batch several rows of one request, each row choosing its own experts: speculative decoding
// (the target's first layer as the draft; greedy, so exactly the target's greedy tokens) and beam search (4
// beams, the cpu plugin's hypotheses those of the reference backend: with exact products, so that the
// int8 routes' rounding cannot reorder near-tied beams). `loom serve` on the same file:
// tests/serve/test_serve.py.
#include "test_util.hpp"

#include <filesystem>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

namespace {

std::string synth_moe(const std::filesystem::path& vocab) {
  const auto out =
      std::filesystem::temp_directory_path() / ("loom-moe-" + std::to_string(::getpid()) + ".gguf");
  const auto r = loom::test::run_loom("synth --shape tiny-moe --arch qwen3moe --type q8_0 --vocab-from " +
                                          vocab.string() + " -o " + out.string(),
                                      false);
  EXPECT_EQ(r.code, 0) << r.err;
  return out.string();
}

nlohmann::json run_json(const std::string& model, const std::string& extra) {
  const auto r = loom::test::run_loom(
      "run -m " + model + " -p \"Once upon a time\" -n 24 --temp 0 --ignore-eos --json " + extra, false, 300);
  EXPECT_EQ(r.code, 0) << extra << ": " << r.err;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

TEST(MixtureOfExperts, SpeculativeDecodingGivesTheTargetsGreedyTokens) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(vocab, "stories260K.gguf");
  const std::string model = synth_moe(vocab);
  const auto greedy = run_json(model, "");
  const auto spec = run_json(model, "--decoder speculative --set decoder.draft_layers=1 --set decoder.k=4");
  ASSERT_EQ(greedy["tokens"].size(), 24u);
  EXPECT_EQ(spec["tokens"], greedy["tokens"]);
  std::filesystem::remove(model);
}

TEST(MixtureOfExperts, BeamSearchOnTheCpuPluginIsTheReferences) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(vocab, "stories260K.gguf");
  const std::string model = synth_moe(vocab);
  const std::string beams = "--decoder beam_search --set decoder.beam_width=4 --set decoder.num_return=4 ";
  const auto cpu = run_json(model, beams + "--set backend.name='\"cpu\"' --set backend.exact_matmul=true");
  const auto ref = run_json(model, beams + "--set backend.name='\"reference\"'");
  ASSERT_EQ(cpu["hypotheses"].size(), 4u);
  ASSERT_EQ(ref["hypotheses"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(cpu["hypotheses"][i]["tokens"], ref["hypotheses"][i]["tokens"]) << "hypothesis " << i;
    EXPECT_NEAR(cpu["hypotheses"][i]["score"].get<double>(), ref["hypotheses"][i]["score"].get<double>(),
                1e-3);
  }
  std::filesystem::remove(model);
}

} // namespace
