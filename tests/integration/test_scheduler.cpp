// The serving scheduler (issue 12): a KV budget too small for every request at once forces
// preemption and every request still completes with the tokens it gets alone; chunked prefill, the
// concurrency and the arrival order change no seeded result; a prompt larger than the whole KV budget
// ends that request alone; 64 concurrent requests complete; submit and cancel from other threads
// (this test also runs under the tsan preset).
#include "loom/error.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "test_util.hpp"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

namespace {

using namespace loom;

const std::vector<std::string> k_prompts = {
    "Once upon a time",   "The little dog",  "Lily and Ben",   "One day, a girl named Sue",
    "Tom wanted to play", "The sun was hot", "A big red ball", "Mom said",
};

PipelineConfig paged_config(const std::filesystem::path& model, int32_t max_tokens) {
  PipelineConfig c;
  c.model.path = model.string();
  c.model.n_ctx = 128;
  c.kv_cache.store = "paged";
  c.kv_cache.block_size = 16;
  c.kv_cache.max_tokens = max_tokens;
  c.samplers = {SamplerSpec{"temperature", {{"value", 0.8}}}, SamplerSpec{"dist", {}}};
  c.stop.eos = false; // every request generates its full length (the most KV)
  return c;
}

std::vector<GenerationRequest> requests(size_t n, int32_t max_new) {
  std::vector<GenerationRequest> out;
  for (size_t i = 0; i < n; ++i) {
    GenerationRequest r;
    r.prompt = k_prompts[i % k_prompts.size()];
    r.seed = 100 + i;
    r.max_new_tokens = max_new;
    out.push_back(std::move(r));
  }
  return out;
}

// Each request alone, with room to spare.
std::vector<GenerationResult> alone(const std::filesystem::path& model,
                                    const std::vector<GenerationRequest>& reqs) {
  auto p = Pipeline::create(paged_config(model, 0));
  std::vector<GenerationResult> out;
  for (const auto& r : reqs)
    out.push_back(p->generate(r));
  return out;
}

TEST(Scheduler, PreemptionKeepsEveryRequestsTokens) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto reqs = requests(8, 60);
  const auto ref = alone(model, reqs);
  // 8 requests of ~66 positions need ~530; the store holds 160 (10 blocks). With the prefix cache a
  // preempted request finds what is left of its blocks; without it, it evaluates everything again.
  for (bool cache : {true, false}) {
    SCOPED_TRACE(cache ? "prefix cache" : "no prefix cache");
    PipelineConfig c = paged_config(model, 160);
    c.kv_cache.prefix_cache = cache;
    auto p = Pipeline::create(c);
    const auto got = p->generate_all(reqs, 8);
    int preemptions = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      EXPECT_EQ(got[i].tokens, ref[i].tokens);
      EXPECT_EQ(got[i].stop_reason, StopReason::max_tokens);
      EXPECT_TRUE(got[i].message.empty()) << got[i].message;
      preemptions += got[i].metrics.preemptions;
    }
    EXPECT_GT(preemptions, 0) << "the budget was meant to force preemption";
    EXPECT_EQ(static_cast<size_t>(preemptions), p->engine().stats().preemptions);
    EXPECT_EQ(p->engine().stats().schedule_misses, 0u) << "every planned chunk got its KV room";
    EXPECT_LE(p->engine().stats().peak_kv_units, 10);
  }
}

// Beam search forks share blocks (copy-on-write when a beam writes into a shared part-filled block):
// the plan's room arithmetic counts those copies, so on a store too small for every request each planned
// take still gets its KV, and preemption keeps every request's beams.
TEST(Scheduler, ForkedBeamsUnderPreemptionGetEveryPlannedTake) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  LOOM_REQUIRE_BIN(); // the decoder plugins lie next to it
  const char* bin = std::getenv("LOOM_BIN");
  auto cfg = [&](int32_t max_tokens) {
    PipelineConfig c = paged_config(model, max_tokens);
    c.plugins.paths = {std::filesystem::path(bin).parent_path().string()};
    c.decoder.name = "beam_search";
    c.decoder.params = {{"beam_width", int64_t{4}}};
    c.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
    return c;
  };
  const auto reqs = requests(6, 24);
  auto solo = Pipeline::create(cfg(0));
  std::vector<GenerationResult> ref;
  for (const auto& r : reqs)
    ref.push_back(solo->generate(r));
  auto p = Pipeline::create(cfg(320)); // 20 blocks for 6 requests × 4 beams
  const auto got = p->generate_all(reqs, 6);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(got[i].tokens, ref[i].tokens);
    EXPECT_TRUE(got[i].message.empty()) << got[i].message;
  }
  EXPECT_GT(p->engine().stats().preemptions, 0u) << "the budget was meant to force preemption";
  EXPECT_GT(p->engine().stats().block_copies, 0u) << "beams write into blocks they share";
  EXPECT_EQ(p->engine().stats().schedule_misses, 0u) << "every take got its KV; every copy made was listed";
}

TEST(Scheduler, ChunkSizeConcurrencyAndArrivalOrderChangeNoSeededResult) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto reqs = requests(6, 24);
  const auto ref = alone(model, reqs);
  for (int32_t budget : {1, 3, 7, 2048})
    for (size_t parallel : {1, 3, 6}) {
      SCOPED_TRACE("max_batch_tokens " + std::to_string(budget) + ", parallel " + std::to_string(parallel));
      PipelineConfig c = paged_config(model, 0);
      c.scheduler.max_batch_tokens = budget;
      auto p = Pipeline::create(c);
      const auto got = p->generate_all(reqs, parallel);
      for (size_t i = 0; i < reqs.size(); ++i)
        EXPECT_EQ(got[i].tokens, ref[i].tokens) << "request " << i;
      EXPECT_LE(p->engine().stats().peak_batch_tokens, static_cast<size_t>(budget));
      // Arrival order reversed: each request's tokens are its own still.
      std::vector<GenerationRequest> rev(reqs.rbegin(), reqs.rend());
      const auto got_rev = p->generate_all(rev, parallel);
      for (size_t i = 0; i < reqs.size(); ++i)
        EXPECT_EQ(got_rev[reqs.size() - 1 - i].tokens, ref[i].tokens) << "request " << i << " (reversed)";
    }
}

TEST(Scheduler, APromptLargerThanTheWholeBudgetEndsAloneWithAReason) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto reqs = requests(3, 8);
  std::string long_prompt;
  for (int i = 0; i < 12; ++i)
    long_prompt += "Once upon a time ";
  reqs[1].prompt = long_prompt; // > 32 tokens
  auto p = Pipeline::create(paged_config(model, 32));
  const auto got = p->generate_all(reqs, 3);
  EXPECT_EQ(got[1].stop_reason, StopReason::max_context);
  EXPECT_NE(got[1].message.find("KV cache holds 32 positions"), std::string::npos) << got[1].message;
  EXPECT_NE(got[1].message.find("max_tokens"), std::string::npos) << got[1].message;
  for (size_t i : {0u, 2u}) {
    EXPECT_EQ(got[i].stop_reason, StopReason::max_tokens) << got[i].message;
    EXPECT_EQ(got[i].tokens.size(), 8u);
  }
}

TEST(Scheduler, GenerationPastTheBudgetOfARequestAloneEndsWithMaxContext) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto p = Pipeline::create(paged_config(model, 32)); // 2 blocks: prompt + ~27 tokens
  const auto got = p->generate_all(requests(2, 60), 2);
  for (const auto& r : got) {
    EXPECT_EQ(r.stop_reason, StopReason::max_context);
    EXPECT_GT(r.tokens.size(), 20u);
    EXPECT_LT(r.tokens.size(), 32u);
  }
}

TEST(Scheduler, SixtyFourConcurrentRequestsComplete) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto reqs = requests(64, 16);
  const auto ref = alone(model, reqs);
  auto p = Pipeline::create(paged_config(model, 1024)); // ~22 positions each: 64 need ~1400
  const auto got = p->generate_all(reqs, 64);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[i].tokens, ref[i].tokens) << "request " << i;
  const EngineStats& st = p->engine().stats();
  EXPECT_EQ(st.finished, 64u);
  EXPECT_EQ(st.output_tokens, 64u * 16u);
  EXPECT_GT(st.running_ms_integral / st.busy_ms, 8.0) << "mean concurrency";
}

// Four threads submit and cancel while the test's thread steps the engine: every request ends
// exactly once (its finish callback), cancelled ones with `cancelled` or their own end, the others
// with the tokens they get alone.
TEST(Scheduler, SubmitAndCancelFromFourThreads) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  constexpr size_t k_threads = 4, k_each = 8;
  const auto reqs = requests(k_threads * k_each, 12);
  const auto ref = alone(model, reqs);
  auto p = Pipeline::create(paged_config(model, 256));
  Engine& e = p->engine();
  std::mutex mu;
  std::map<RequestId, GenerationResult> finished;
  std::map<RequestId, size_t> index;
  std::set<RequestId> cancelled;
  std::atomic<size_t> submitted{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < k_threads; ++t)
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < k_each; ++k) {
        const size_t i = t * k_each + k;
        EngineRequest er;
        er.prompt = p->tokenize(reqs[i].prompt);
        er.seed = *reqs[i].seed;
        er.max_new_tokens = *reqs[i].max_new_tokens;
        er.on_finish = [&](RequestId id, const GenerationResult& r) {
          std::lock_guard lock(mu);
          EXPECT_TRUE(finished.emplace(id, r).second) << "request " << id << " finished twice";
        };
        const RequestId id = e.submit(std::move(er));
        {
          std::lock_guard lock(mu);
          index[id] = i;
        }
        if (k % 3 == 1) {
          e.cancel(id);
          std::lock_guard lock(mu);
          cancelled.insert(id);
        }
        ++submitted;
        std::this_thread::yield();
      }
    });
  size_t n_done = 0;
  for (int guard = 0; guard < 100000 && (submitted < k_threads * k_each || !e.idle()); ++guard) {
    if (e.idle()) (void)e.wait_for_work(std::chrono::milliseconds(5));
    n_done += e.step().size();
  }
  for (auto& t : threads)
    t.join();
  while (!e.idle())
    n_done += e.step().size();
  EXPECT_EQ(n_done, k_threads * k_each);
  std::lock_guard lock(mu);
  ASSERT_EQ(finished.size(), k_threads * k_each);
  for (const auto& [id, r] : finished) {
    const size_t i = index.at(id);
    if (cancelled.count(id)) {
      EXPECT_TRUE(r.stop_reason == StopReason::cancelled || r.tokens == ref[i].tokens) << "request " << i;
    } else {
      EXPECT_EQ(r.tokens, ref[i].tokens) << "request " << i;
    }
  }
  EXPECT_EQ(p->kv_store().units_in_use(), 0) << "every block is back in the pool";
}

#ifndef LOOM_NO_CLI
// The Done-when command of issue 12 — `loom run --prompts F --parallel 8` on a 320-token paged store
// — and the same for every decoder (multi-sequence ones on 400 tokens, prefill in chunks of 16):
// preempted requests are recomputed to exactly the tokens they get alone.
TEST(Scheduler, RunPromptsParallelOnASmallPagedStoreMatchesEachAlone) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string prompts = std::string(LOOM_SOURCE_DIR) + "/tests/data/ab_prompts.txt";
  const std::string common = "run -m " + model.string() + " --prompts " + prompts +
                             " -n 60 --seed 7 --ignore-eos --json --set 'kv_cache.store=\"paged\"'";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "--set kv_cache.max_tokens=320"},
      {"--decoder beam_search --set decoder.beam_width=4",
       "--set kv_cache.max_tokens=400 --set scheduler.max_batch_tokens=16"},
      {"--decoder self_consistency --set decoder.samples=4 --temp 1.0",
       "--set kv_cache.max_tokens=400 --set scheduler.max_batch_tokens=16"},
      {"--decoder speculative --set 'decoder.draft=\"" + model.string() + "\"' --temp 0.8",
       "--set kv_cache.max_tokens=320 --set scheduler.max_batch_tokens=16"},
  };
  for (const auto& [dec, budget] : cases) {
    SCOPED_TRACE(dec.empty() ? "sample" : dec);
    const auto solo = test::run_loom(common + " " + dec + " --parallel 1", false, 120);
    const auto par = test::run_loom(common + " " + dec + " --parallel 8 " + budget, false, 120);
    ASSERT_EQ(solo.code, 0) << solo.err;
    ASSERT_EQ(par.code, 0) << par.err;
    std::istringstream a(solo.out), b(par.out);
    std::string la, lb;
    int n = 0, preemptions = 0;
    while (std::getline(a, la) && std::getline(b, lb)) {
      const auto ja = nlohmann::json::parse(la), jb = nlohmann::json::parse(lb);
      EXPECT_EQ(jb["tokens"], ja["tokens"]) << "prompt " << n;
      EXPECT_EQ(jb["stop_reason"], "max_tokens");
      preemptions += jb["metrics"]["preemptions"].get<int>();
      ++n;
    }
    EXPECT_EQ(n, 12);
    EXPECT_GT(preemptions, 0) << "the budget was meant to force preemption";
  }
}

#endif

} // namespace
