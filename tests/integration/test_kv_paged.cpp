// The paged KV store in whole pipelines on stories260K: every decoder (greedy, beam search, speculative
// decoding, self-consistency) gives the same tokens on either store, the paged one holding the prompt's KV
// once for all forks; the prefix cache cuts a repeated prompt's prefill; the KV budget `loom inspect`
// reports is what the store allocates. (The store alone: tests/unit/test_kv_paged.cpp.)
#include "loom/kv/kv_cache.hpp"
#include "loom/model/model.hpp"
#include "test_util.hpp"

#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sstream>

namespace {

using namespace loom;

nlohmann::json run_json(const std::string& args) {
  const auto r = test::run_loom("run " + args + " --json", false, 120);
  EXPECT_EQ(r.code, 0) << r.err;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

TEST(PagedKvPipeline, EveryDecoderGivesTheSameTokensOnEitherStore) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string m = "-m " + model.string() + " -p 'Once upon a time' -n 40 --seed 4";
  const std::vector<std::string> decoders = {
      "--temp 0",
      "--temp 0.9",
      "--decoder beam_search --set decoder.beam_width=4 --set decoder.num_return=4",
      "--decoder speculative --set 'decoder.draft=\"" + model.string() + "\"' --temp 0.8",
      "--decoder speculative --set 'decoder.drafter=\"ngram\"' --temp 0",
      "--decoder self_consistency --set decoder.samples=4 --temp 1.0",
  };
  for (const auto& d : decoders)
    for (const char* backend : {"reference", "cpu"}) {
      SCOPED_TRACE(d + " on " + backend);
      const std::string b = std::string(" --set backend.name='\"") + backend + "\"'";
      const auto flat = run_json(m + b + " " + d);
      for (int bs : {1, 16}) {
        const auto paged =
            run_json(m + b + " " + d +
                     " --set 'kv_cache.store=\"paged\"' --set kv_cache.block_size=" + std::to_string(bs));
        EXPECT_EQ(paged["tokens"], flat["tokens"]) << "block_size " << bs;
        if (flat.contains("hypotheses")) {
          EXPECT_EQ(paged["hypotheses"], flat["hypotheses"]);
        }
      }
    }
}

// A repeated prompt finds its full blocks in the prefix cache: fewer tokens evaluated, the same
// output (greedy and seeded sampling), and the cache off evaluates everything.
TEST(PagedKvPipeline, PrefixReuseCutsThePrefillOfARepeatedPrompt) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string file = testing::TempDir() + "/loom_prefix_prompts.txt";
  {
    std::ofstream f(file);
    const std::string p = "Once upon a time there was a little girl named Lily who loved to play in the park";
    f << p << "\n" << p << "\n" << p << " with her dog\n";
  }
  for (const char* sampling : {"--temp 0", "--temp 0.9"}) {
    SCOPED_TRACE(sampling);
    const std::string common = "run -m " + model.string() + " --prompts " + file + " -n 24 --seed 5 --json " +
                               sampling + " --set 'kv_cache.store=\"paged\"' --set kv_cache.block_size=4";
    std::vector<nlohmann::json> on, off;
    for (auto [flag, out] : {std::pair{"true", &on}, std::pair{"false", &off}}) {
      const auto r = test::run_loom(common + " --set kv_cache.prefix_cache=" + flag, false, 60);
      ASSERT_EQ(r.code, 0) << r.err;
      std::istringstream in(r.out);
      for (std::string l; std::getline(in, l);)
        out->push_back(nlohmann::json::parse(l));
    }
    ASSERT_EQ(on.size(), 3u);
    ASSERT_EQ(off.size(), 3u);
    const int n_prompt = on[0]["metrics"]["n_prompt"].get<int>();
    EXPECT_EQ(on[0]["metrics"]["cached_prompt_tokens"], 0);
    // all but the last position (its logits are evaluated), the part-filled last block's positions included
    EXPECT_EQ(on[1]["metrics"]["cached_prompt_tokens"].get<int>(), n_prompt - 1);
    EXPECT_GE(on[2]["metrics"]["cached_prompt_tokens"].get<int>(), (n_prompt - 1) / 4 * 4);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(on[i]["tokens"], off[i]["tokens"]) << i;
      EXPECT_EQ(off[i]["metrics"]["cached_prompt_tokens"], 0);
      EXPECT_EQ(on[i]["metrics"]["tokens_evaluated"].get<int>() +
                    on[i]["metrics"]["cached_prompt_tokens"].get<int>(),
                off[i]["metrics"]["tokens_evaluated"].get<int>())
          << i;
    }
  }
}

TEST(PagedKvPipeline, SamplesHoldThePromptOnceAndGrowByTheirOwnTokens) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  // A long prompt, 4 samples of 8 tokens, blocks of one position: the paged store's peak is the
  // prompt once plus each sample's own tokens (the contiguous store holds a slab per sample).
  const std::string prompt =
      "Once upon a time there was a little girl named Lily who loved to play in the park with her friends";
  const std::string common = "-m " + model.string() + " -p '" + prompt +
                             "' -n 8 --ignore-eos --seed 2 --ctx-size 128 --decoder self_consistency "
                             "--set decoder.samples=4 --temp 1.0 --set 'kv_cache.store=\"paged\"' "
                             "--set kv_cache.block_size=1";
  const auto j = run_json(common);
  ASSERT_TRUE(j.contains("metrics"));
  const size_t n_prompt = j["prompt_tokens"].size();
  const size_t per_pos = 2 * 5 * 32 * 4; // stories260K: 5 layers, 32 K/V values per layer, f32
  const size_t peak = j["metrics"]["kv_reserved_peak_bytes"].get<size_t>();
  EXPECT_LE(peak, (n_prompt + 4 * 8) * per_pos) << "prompt once + 4 × 8 own tokens at most";
  EXPECT_GE(peak, (n_prompt + 4 * 6) * per_pos);
}

// The KV budget `loom inspect --kv-memory` reports (2·L·H_kv·D·b per token, whole blocks) is what a
// store of that many blocks allocates once full, and its capacity in positions.
TEST(KvBudget, InspectsFormulaIsWhatTheStoreAllocates) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto r = test::run_loom("inspect " + model.string() +
                                    " --kv-memory 1MiB --kv-dtype f32 --block-size 16 "
                                    "--ctx-size 128 --json",
                                false, 60);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto b = nlohmann::json::parse(r.out)["kv_budget"];
  const auto m = Model::load(model.string());
  const uint64_t per_token = m->config().kv_bytes_per_token(DType::f32);
  EXPECT_EQ(b["bytes_per_token"].get<uint64_t>(), per_token);
  const auto blocks = b["blocks"].get<int64_t>();
  EXPECT_EQ(static_cast<uint64_t>(blocks), (1u << 20) / (per_token * 16));
  EXPECT_EQ(b["full_context_sequences"].get<int64_t>(), blocks * 16 / 128);
  KVShape shape = m->kv_shape(128, 4096);
  shape.n_blocks = blocks;
  const auto kv = make_paged_kv_cache(shape);
  EXPECT_EQ(kv->capacity_positions(), b["tokens"].get<int64_t>());
  EXPECT_EQ(kv->stats().bytes_capacity, b["bytes_used"].get<uint64_t>());
  // Fill it: sequences of the full context until no block is left.
  SeqId seq = 0;
  while (kv->allocate(seq, 128))
    ++seq;
  while (kv->allocate(seq, 16)) {
  }
  EXPECT_EQ(kv->free_positions(), 0);
  EXPECT_EQ(kv->stats().bytes_allocated, b["bytes_used"].get<uint64_t>());
  EXPECT_EQ(kv->stats().bytes_used, static_cast<size_t>(b["tokens"].get<int64_t>()) * per_token);
  // The contiguous store: slabs of n_ctx positions by the same formula.
  const auto flat = make_contiguous_kv_cache(m->kv_shape(128, 3));
  EXPECT_EQ(flat->stats().bytes_capacity, 3u * 128u * per_token);
  EXPECT_EQ(flat->capacity_positions(), 3 * 128);
}

} // namespace
