// Every pipeline in configs/ parses, builds and runs. The configs name models/stories260K.gguf
// (what scripts/fetch-models.sh puts there); when that is absent the shared copy is used instead.
#include "loom/pipeline/pipeline.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using namespace loom;

std::vector<std::filesystem::path> config_files() {
  std::vector<std::filesystem::path> out;
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::path(LOOM_SOURCE_DIR) / "configs"))
    if (e.path().extension() == ".toml") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Configs, EveryConfigLoadsAndRuns) {
  const auto files = config_files();
  ASSERT_FALSE(files.empty());
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    PipelineConfig cfg = load_pipeline(f.string(), {parse_override("stop.max_tokens=12")});
    const std::filesystem::path in_repo = std::filesystem::path(LOOM_SOURCE_DIR) / cfg.model.path;
    if (!std::filesystem::exists(in_repo)) {
      const auto shared = test::models_dir() / std::filesystem::path(cfg.model.path).filename();
      if (!std::filesystem::exists(shared)) GTEST_SKIP() << "model missing: " << shared.string();
      cfg.model.path = shared.string();
    } else {
      cfg.model.path = in_repo.string();
    }
    if (!cfg.decoder.draft.empty()) { // a draft model, found the same way
      const std::filesystem::path d = std::filesystem::path(LOOM_SOURCE_DIR) / cfg.decoder.draft;
      cfg.decoder.draft =
          std::filesystem::exists(d)
              ? d.string()
              : (test::models_dir() / std::filesystem::path(cfg.decoder.draft).filename()).string();
    }
    auto p = Pipeline::create(cfg);
    GenerationRequest req;
    req.prompt = "Once upon a time";
    const auto r = p->generate(req);
    EXPECT_FALSE(r.tokens.empty());
    EXPECT_NE(r.stop_reason, StopReason::none);
    EXPECT_LE(r.tokens.size(), 12u);
  }
}

TEST(Configs, QuickstartIsGreedyAndReproducesRunC) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  PipelineConfig cfg =
      load_pipeline((std::filesystem::path(LOOM_SOURCE_DIR) / "configs" / "quickstart.toml").string());
  cfg.model.path = model.string();
  auto p = Pipeline::create(cfg);
  GenerationRequest req;
  req.prompt = "Once upon a time";
  const auto r = p->generate(req);
  EXPECT_EQ(req.prompt + r.text + "\n",
            test::read_file(test::models_dir() / "reference" / "once_upon_a_time.n64.txt"));
}

} // namespace

// configs/json_schema.toml: whatever the seed, the story model's output parses and has the schema's
// shape (the json_schema stage, from TOML).
TEST(Configs, JsonSchemaConfigAlwaysGivesJsonOfItsSchema) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  PipelineConfig cfg =
      load_pipeline((std::filesystem::path(LOOM_SOURCE_DIR) / "configs" / "json_schema.toml").string());
  cfg.model.path = model.string();
  auto p = Pipeline::create(cfg);
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    GenerationRequest req;
    req.prompt = seed % 2 ? "Once upon a time" : "Lily";
    req.seed = seed;
    const auto r = p->generate(req);
    const auto j = nlohmann::json::parse(r.text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "seed " << seed << ": " << r.text;
    ASSERT_TRUE(j.is_object() && j.size() == 3) << r.text;
    EXPECT_TRUE(j["hero"].is_string() && j["hero"].get<std::string>().size() <= 24) << r.text;
    EXPECT_TRUE(j["age"].is_number_integer()) << r.text;
    ASSERT_TRUE(j["friends"].is_array() && j["friends"].size() <= 3) << r.text;
    for (const auto& f : j["friends"])
      EXPECT_TRUE(f == "cat" || f == "dog" || f == "bird") << r.text;
    EXPECT_EQ(r.stop_reason, StopReason::eos) << r.text;
  }
}
