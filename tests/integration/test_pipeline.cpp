// Pipeline behaviour around the edges: prompts that do not fit, bad parameters, stop rules end to end.
#include "loom/error.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>

namespace {

using namespace loom;

PipelineConfig config_for(const std::filesystem::path& model) {
  PipelineConfig c;
  c.model.path = model.string();
  c.model.n_ctx = 64;
  c.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
  return c;
}

TEST(Pipeline, PromptLongerThanContextIsACleanStop) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto p = Pipeline::create(config_for(model));
  std::string prompt;
  for (int i = 0; i < 100; ++i)
    prompt += "Once upon a time ";
  GenerationRequest req;
  req.prompt = prompt;
  const auto r = p->generate(req);
  EXPECT_EQ(r.stop_reason, StopReason::max_context);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_NE(r.message.find("context holds 64"), std::string::npos) << r.message;
  // The pipeline goes on: the next request works.
  req.prompt = "Once upon a time";
  req.max_new_tokens = 5;
  EXPECT_EQ(p->generate(req).tokens.size(), 5u);
}

TEST(Pipeline, ContextFillsUpWithMaxContext) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto cfg = config_for(model);
  cfg.model.n_ctx = 20;
  cfg.stop.max_tokens = -1;
  cfg.stop.eos = false;
  auto p = Pipeline::create(cfg);
  GenerationRequest req;
  req.prompt = "Once upon a time";
  const auto r = p->generate(req);
  EXPECT_EQ(r.stop_reason, StopReason::max_context);
  EXPECT_EQ(r.prompt_tokens.size() + r.tokens.size(), 21u); // the last sampled token needs no KV slot
}

TEST(Pipeline, StopStringEndsTheRunAndIsNotStreamed) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto cfg = config_for(model);
  cfg.stop.strings = {"Lily"};
  cfg.stop.max_tokens = 100;
  auto p = Pipeline::create(cfg);
  std::string streamed;
  GenerationRequest req;
  req.prompt = "Once upon a time";
  const auto r = p->generate(req, [&](std::string_view s) { streamed += s; });
  EXPECT_EQ(r.stop_reason, StopReason::stop_string);
  EXPECT_EQ(r.stop_string, "Lily");
  EXPECT_EQ(streamed, ", there was a little girl named ");
  EXPECT_EQ(r.text, streamed);
}

TEST(Pipeline, StopTokenAndZeroBudget) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto cfg = config_for(model);
  cfg.stop.token_ids = {13}; // "\n": greedy reaches it after "... too high."
  cfg.stop.max_tokens = 100;
  auto p = Pipeline::create(cfg);
  GenerationRequest req;
  req.prompt = "Once upon a time";
  auto r = p->generate(req);
  EXPECT_EQ(r.stop_reason, StopReason::stop_token);
  EXPECT_EQ(r.tokens.back(), 13);
  EXPECT_EQ(r.text.find('\n'), std::string::npos);
  req.max_new_tokens = 0;
  r = p->generate(req);
  EXPECT_EQ(r.stop_reason, StopReason::max_tokens);
  EXPECT_TRUE(r.tokens.empty());
}

TEST(Pipeline, SeededSamplingIsReproducible) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto cfg = config_for(model);
  cfg.samplers = {SamplerSpec{"top_k", {{"k", int64_t{40}}}}, SamplerSpec{"temperature", {{"value", 1.0}}}};
  auto p = Pipeline::create(cfg);
  GenerationRequest req;
  req.prompt = "The little dog";
  req.max_new_tokens = 30;
  req.seed = 11;
  const auto a = p->generate(req);
  const auto b = p->generate(req);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.seed, 11u);
  req.seed = 12;
  const auto c = p->generate(req);
  EXPECT_NE(a.tokens, c.tokens);
}

TEST(Pipeline, UnavailableComponentsAreClearErrors) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto cfg = config_for(model);
  cfg.backend.name = "cuda";
  EXPECT_THROW(Pipeline::create(cfg), Error);
  cfg = config_for(model);
  cfg.decoder.name = "beam_search";
  EXPECT_THROW(Pipeline::create(cfg), Error);
  cfg = config_for(model);
  cfg.model.path = "/nonexistent.gguf";
  try {
    (void)Pipeline::create(cfg);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
  }
  cfg = config_for(model);
  cfg.samplers = {SamplerSpec{"temperature", {{"value", -1.0}}}};
  EXPECT_THROW(Pipeline::create(cfg), Error);
}

// [backend] name = "auto" (the default): the cpu plugin when one is found and runs the model, else the
// reference backend with one line saying why; keys meant for the cpu backend without it are an error.
TEST(Pipeline, AutoBackendIsTheCpuPluginElseTheReferenceWithAReason) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto cfg = config_for(model);
  EXPECT_EQ(cfg.backend.name, "auto");
  cfg.plugins.paths = {"/nonexistent-plugin-dir"}; // (this test's own directory has no plugins either)
  auto p = Pipeline::create(cfg);
  EXPECT_EQ(p->backend_name(), "reference");
  EXPECT_NE(p->backend_note().find("no cpu backend plugin in ["), std::string::npos) << p->backend_note();
  cfg.backend.params = {{"repack", false}};
  try {
    (void)Pipeline::create(cfg);
    FAIL() << "cpu keys without the cpu backend";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("keys for the cpu backend were given (repack"), std::string::npos)
        << e.what();
  }
  LOOM_REQUIRE_BIN();
  cfg.plugins.paths = {std::filesystem::path(std::getenv("LOOM_BIN")).parent_path().string()};
  p = Pipeline::create(cfg);
  EXPECT_EQ(p->backend_name(), "cpu");
  EXPECT_EQ(p->backend_note(), "");
  EXPECT_NE(std::string(p->backend().describe()).find("exact f32 products"), std::string::npos);
}

TEST(Pipeline, SlidingWindowOfFullLengthEqualsStandard) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto cfg = config_for(model);
  auto std_p = Pipeline::create(cfg);
  cfg.attention.variant = "sliding_window";
  cfg.attention.window = 64;
  auto win_p = Pipeline::create(cfg);
  cfg.attention.window = 4;
  auto small_p = Pipeline::create(cfg);
  GenerationRequest req;
  req.prompt = "Once upon a time";
  req.max_new_tokens = 30;
  const auto a = std_p->generate(req);
  EXPECT_EQ(a.tokens, win_p->generate(req).tokens);
  EXPECT_NE(a.tokens, small_p->generate(req).tokens);
}

} // namespace
