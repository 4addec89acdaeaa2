// The engine's step loop: batched results equal unbatched results, requests are independent.
#include "loom/pipeline/pipeline.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>
#include <map>

namespace {

using namespace loom;

std::vector<GenerationRequest> six_requests() {
  const char* prompts[] = {"Once upon a time", "The little dog", "",
                           "Lily wanted to",   "One day, a big", "Tom and"};
  std::vector<GenerationRequest> reqs;
  int i = 0;
  for (const char* p : prompts) {
    GenerationRequest r;
    r.prompt = p;
    r.max_new_tokens = 20 + 7 * i; // different lengths: requests finish at different steps
    r.seed = 100 + static_cast<uint64_t>(i);
    reqs.push_back(r);
    ++i;
  }
  return reqs;
}

void expect_same(const std::vector<GenerationResult>& a, const std::vector<GenerationResult>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(a[i].prompt_tokens, b[i].prompt_tokens);
    EXPECT_EQ(a[i].tokens, b[i].tokens);
    EXPECT_EQ(a[i].text, b[i].text);
    EXPECT_EQ(a[i].stop_reason, b[i].stop_reason);
    ASSERT_EQ(a[i].logprobs.size(), b[i].logprobs.size());
    for (size_t k = 0; k < a[i].logprobs.size(); ++k)
      EXPECT_FLOAT_EQ(a[i].logprobs[k], b[i].logprobs[k]);
  }
}

class EngineBatching : public ::testing::TestWithParam<bool> {};

TEST_P(EngineBatching, SixAtATimeEqualsOneAtATime) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.model.n_ctx = 256;
  if (GetParam()) { // seeded sampling
    cfg.samplers = {SamplerSpec{"penalties", {{"repeat", 1.1}}}, SamplerSpec{"top_k", {{"k", int64_t{20}}}},
                    SamplerSpec{"temperature", {{"value", 0.9}}}};
  } else { // greedy
    cfg.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
  }
  auto p = Pipeline::create(cfg);
  const auto reqs = six_requests();
  const auto alone = p->generate_all(reqs, 1);
  const auto batched = p->generate_all(reqs, 6);
  const auto pairs = p->generate_all(reqs, 2);
  expect_same(alone, batched);
  expect_same(alone, pairs);
  for (const auto& r : alone)
    EXPECT_FALSE(r.tokens.empty());
  // Each request alone in a fresh call gives the same again (nothing leaks between requests).
  for (size_t i = 0; i < reqs.size(); ++i)
    expect_same({alone[i]}, {p->generate(reqs[i])});
}

INSTANTIATE_TEST_SUITE_P(GreedyAndSampling, EngineBatching, ::testing::Values(false, true));

// stories260K, greedy, a context of n_ctx.
std::unique_ptr<Pipeline> greedy_pipeline(const std::filesystem::path& model, int32_t n_ctx) {
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.model.n_ctx = n_ctx;
  cfg.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
  return Pipeline::create(cfg);
}

TEST(Engine, CancelEndsOneRequestOthersGoOn) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto p = greedy_pipeline(model, 128);
  GenerationRequest a, b;
  a.prompt = "Once upon a time";
  a.max_new_tokens = 40;
  b.prompt = "The little dog";
  b.max_new_tokens = 40;
  Engine& e = p->engine();
  const RequestId ia = p->submit(a);
  const RequestId ib = p->submit(b);
  std::map<RequestId, GenerationResult> done;
  int steps = 0;
  while (done.size() < 2) {
    if (++steps == 5) e.cancel(ia);
    for (auto& [id, r] : e.step())
      done[id] = std::move(r);
  }
  EXPECT_EQ(done[ia].stop_reason, StopReason::cancelled);
  EXPECT_LT(done[ia].tokens.size(), 40u);
  EXPECT_EQ(done[ib].stop_reason, StopReason::max_tokens);
  EXPECT_EQ(done[ib].tokens.size(), 40u);
  EXPECT_TRUE(e.idle());
}

TEST(Engine, PromptTooLongInABatchEndsOnlyThatRequest) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto p = greedy_pipeline(model, 32);
  GenerationRequest ok, big;
  ok.prompt = "Once upon a time";
  ok.max_new_tokens = 8;
  for (int i = 0; i < 20; ++i)
    big.prompt += "Once upon a time ";
  const auto rs = p->generate_all({big, ok}, 2);
  EXPECT_EQ(rs[0].stop_reason, StopReason::max_context);
  EXPECT_FALSE(rs[0].message.empty());
  EXPECT_EQ(rs[1].tokens.size(), 8u);
}

// A bad request from the C++ API fails alone, at submit, with a message; the engine is not wedged: the
// next request completes (before, max_new_tokens = -5 threw inside admission, escaped step(), kept its KV
// sequence and stayed at the head of the queue, so every later step threw again).
TEST(Engine, BadMaxTokensFailsAloneAndTheNextRequestCompletes) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto p = greedy_pipeline(model, 64);
  Engine& e = p->engine();
  EngineRequest bad;
  bad.prompt = {1, 400, 500};
  bad.max_new_tokens = -5;
  try {
    (void)e.submit(bad);
    ADD_FAILURE() << "max_new_tokens = -5 was accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(err.what()).find("max_new_tokens"), std::string::npos) << err.what();
  }
  GenerationRequest bad2;
  bad2.prompt = "Once upon a time";
  bad2.max_new_tokens = -2;
  EXPECT_THROW((void)p->submit(bad2), Error);
  GenerationRequest ok;
  ok.prompt = "Once upon a time";
  ok.max_new_tokens = 6;
  const RequestId id = p->submit(ok);
  std::map<RequestId, GenerationResult> done;
  for (int steps = 0; done.empty() && steps < 100; ++steps)
    for (auto& [rid, r] : e.step())
      done[rid] = std::move(r);
  ASSERT_EQ(done.count(id), 1u);
  EXPECT_EQ(done[id].tokens.size(), 6u);
  EXPECT_EQ(done[id].stop_reason, StopReason::max_tokens);
  EXPECT_TRUE(e.idle());
}

} // namespace
