// The engine's contract as decoders and callers rely on it (issue 9), on stories260K: graph caches that
// survive hundreds of batch shapes on every backend, requests that wait for KV room instead of being
// dropped, a fork that fails recoverably, a truncate that restores a sequence exactly, a free that
// releases everything, custom stops and plugin hold-back that never lose text, and failures that end a
// request with a reason and a message — never a hang. (A fork copies only the used positions:
// tests/unit/test_engine_contract.cpp, on a KV store alone.)
#include "loom/engine/engine.hpp"
#include "loom/error.hpp"
#include "loom/model/reference_backend.hpp"
#include "loom/model/synth.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "loom/sample/logprobs.hpp"
#include "test_util.hpp"

#include <filesystem>
#include <gtest/gtest.h>
#include <random>

namespace {

using namespace loom;

// The directory of the built plugins (next to the `loom` executable).
std::string plugin_dir() {
  const char* bin = std::getenv("LOOM_BIN");
  return bin ? std::filesystem::path(bin).parent_path().string() : std::string();
}

// A model, tokenizer, backend and KV store driven through an Engine with a decoder of the test's.
struct Rig {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<KVCacheStore> kv;
  std::unique_ptr<Model> draft_model;
  std::unique_ptr<Backend> draft_backend;
  std::unique_ptr<KVCacheStore> draft_kv;
  std::unique_ptr<Engine> engine;
  int32_t n_ctx;

  Rig(const std::filesystem::path& path, int32_t ctx, int32_t n_seq,
      std::function<std::unique_ptr<Decoder>()> dec,
      std::vector<SamplerSpec> chain = {SamplerSpec{"greedy", {}}}, StopConfig stop = {},
      std::function<std::vector<std::unique_ptr<StopCriterion>>()> plugins = {},
      std::unique_ptr<Backend> be = nullptr, std::unique_ptr<Backend> draft_be = nullptr)
      : n_ctx(ctx) {
    model = Model::load(path.string());
    tok = Tokenizer::from_gguf(model->file());
    backend = be ? std::move(be) : make_reference_backend();
    kv = make_contiguous_kv_cache(model->kv_shape(ctx, n_seq));
    std::optional<DraftModel> draft;
    if (draft_be) { // the same file as a draft model, on its own backend and KV store
      draft_model = Model::load(path.string());
      draft_backend = std::move(draft_be);
      draft_kv = make_contiguous_kv_cache(draft_model->kv_shape(ctx, n_seq));
      draft.emplace(DraftModel{*draft_model, *draft_backend, *draft_kv});
    }
    RequestTemplate t;
    t.make_decoder = std::move(dec);
    t.make_chain = [chain] {
      auto c = std::make_unique<SamplerChain>();
      for (const auto& s : chain)
        c->add(create_sampler(s));
      return c;
    };
    t.make_stop_criteria = std::move(plugins);
    stop.eog_tokens = tok->eog_tokens();
    t.stop = stop;
    engine = std::make_unique<Engine>(*model, *tok, *backend, *kv, ctx, std::move(t), draft);
  }

  std::vector<TokenId> prompt(const std::string& text) const {
    EncodeOptions o;
    o.add_bos = true;
    return tok->encode(text, o);
  }

  // Steps until every request finished (at most max_steps: a hang fails the test, not the run).
  std::map<RequestId, GenerationResult> run(int max_steps = 2000) {
    std::map<RequestId, GenerationResult> out;
    for (int i = 0; i < max_steps && !engine->idle(); ++i)
      for (auto& [id, r] : engine->step())
        out[id] = std::move(r);
    EXPECT_TRUE(engine->idle()) << "the engine did not finish within " << max_steps << " steps";
    return out;
  }
};

// The store TenThousandForksWithFreesReuseKvIds watches, and whether it holds no id outside `ids`.
KVCacheStore* kv_for_ids = nullptr;
bool rig_kv_holds_only(const DecodeSession&, std::initializer_list<SeqId> ids) {
  int held = 0;
  for (SeqId id : ids)
    held += kv_for_ids->contains(id) ? 1 : 0;
  return held == kv_for_ids->shape().n_seq_max - kv_for_ids->free_sequences();
}

// A decoder given as lambdas over the request's DecodeSession (plan / update / done); results: sequence 0.
struct LambdaDecoder final : Decoder {
  std::function<void(DecodeSession&)> on_plan = [](DecodeSession& s) { // sequence 0 while it is live
    if (s.finished(0) == StopReason::none) s.plan(0);
  };
  std::function<void(DecodeSession&)> on_update;
  std::function<bool(const DecodeSession&)> on_done;
  std::string_view name() const noexcept override { return "test"; }
  // Host code: past the session table to the request (DecodeSession::of), as `loom explain` does.
  void plan(Session& h) override { on_plan(DecodeSession::of(h)); }
  void update(Session& h) override { on_update(DecodeSession::of(h)); }
  bool done(const Session& h) const override { return on_done(DecodeSession::of(h)); }
  std::function<void(DecodeSession&)> on_results;
  void results(Session& h) override {
    DecodeSession& s = DecodeSession::of(h);
    s.add_result(0, s.score(0));
    if (on_results) on_results(s);
  }
};

// ---- 1. graph identity: hundreds of distinct batch shapes through every backend ----------------

class DistinctShapes : public ::testing::TestWithParam<const char*> {};

TEST_P(DistinctShapes, FiveHundredPromptLengths) {
  LOOM_REQUIRE_MODEL(vocab, "stories260K.gguf");
  const std::string backend = GetParam();
  if (backend != "reference" && plugin_dir().empty())
    GTEST_SKIP() << "LOOM_BIN is not set (run through ctest)";
  // A one-layer model with stories260K's vocabulary: 500 prompts of 1..500 tokens cost seconds.
  const auto model =
      std::filesystem::temp_directory_path() / ("loom-tiny-gqa-" + std::to_string(::getpid()) + ".gguf");
  SynthOptions so;
  so.shape = "tiny-gqa";
  so.vocab_from = vocab.string();
  so.out = model.string();
  synth_model(so);
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.model.n_ctx = 512;
  cfg.backend.name = backend;
  cfg.backend.threads = 1;
  cfg.plugins.paths = {plugin_dir()};
  cfg.samplers = {SamplerSpec{"greedy", {}}};
  cfg.stop.eos = false; // random weights: EOS may well be the greedy choice
  auto p = Pipeline::create(cfg);
  std::mt19937 rng(7);
  const int32_t V = p->model().config().n_vocab;
  std::vector<GenerationRequest> reqs;
  std::vector<int> lengths(500);
  for (int i = 0; i < 500; ++i)
    lengths[static_cast<size_t>(i)] = i + 1;
  std::shuffle(lengths.begin(), lengths.end(), rng); // shapes come back in no particular order
  for (int len : lengths) {
    GenerationRequest r;
    std::vector<TokenId> toks(static_cast<size_t>(len));
    for (auto& t : toks)
      t = static_cast<TokenId>(3 + rng() % static_cast<uint32_t>(V - 3));
    r.prompt_tokens = toks;
    r.max_new_tokens = 2;
    reqs.push_back(std::move(r));
  }
  const auto results = p->generate_all(reqs, 1);
  ASSERT_EQ(results.size(), reqs.size());
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].message.empty())
        << "prompt of " << lengths[i] << " tokens: " << results[i].message;
    ASSERT_EQ(results[i].tokens.size(), 2u) << "prompt of " << lengths[i] << " tokens";
  }
  // The same prompt alone gives the same tokens (no stale graph of another shape was used).
  for (size_t i : {size_t{0}, size_t{250}, size_t{499}})
    EXPECT_EQ(p->generate(reqs[i]).tokens, results[i].tokens) << "prompt of " << lengths[i] << " tokens";
  std::filesystem::remove(model);
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, DistinctShapes,
                         ::testing::Values("reference", "reference_plugin", "cpu"));

// ---- 2. KV room: requests wait, never dropped ---------------------------------------------------

TEST(EngineContract, RequestsWaitForKvRoomInsteadOfEndingEmpty) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.model.n_ctx = 256;
  cfg.kv_cache.max_tokens = 512; // two sequences
  cfg.samplers = {SamplerSpec{"greedy", {}}};
  auto p = Pipeline::create(cfg);
  std::vector<GenerationRequest> reqs;
  for (const char* s : {"Once upon a time", "The dog", "Lily and Tom", "One day", "A cat", "The sun"}) {
    GenerationRequest r;
    r.prompt = s;
    r.max_new_tokens = 12;
    reqs.push_back(r);
  }
  const auto alone = p->generate_all(reqs, 1);
  const auto four = p->generate_all(reqs, 4);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(reqs[i].prompt);
    EXPECT_TRUE(four[i].message.empty()) << four[i].message;
    EXPECT_EQ(four[i].stop_reason, StopReason::max_tokens);
    EXPECT_EQ(four[i].tokens.size(), 12u);
    EXPECT_EQ(four[i].tokens, alone[i].tokens);
  }
}

TEST(EngineContract, AForkWithoutKvRoomIsRecoverable) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  std::vector<LocalSeq> forks;
  Rig rig(model, 128, 2, [&] {
    auto d = std::make_unique<LambdaDecoder>();
    d->on_plan = [](DecodeSession& s) {
      for (LocalSeq q : {0, 1, 2, 3})
        if (s.exists(q) && s.finished(q) == StopReason::none) s.plan(q);
    };
    d->on_update = [&forks](DecodeSession& s) {
      if (forks.empty() && s.logits(0))
        for (int i = 0; i < 3; ++i)
          forks.push_back(s.fork(0)); // room for one more sequence only
      for (LocalSeq q : {0, 1, 2, 3})
        if (s.exists(q) && s.finished(q) == StopReason::none && s.logits(q)) s.append(q, s.sample(q));
    };
    d->on_done = [](const DecodeSession& s) {
      return s.n_generated(0) >= 5 || s.finished(0) != StopReason::none;
    };
    return d;
  });
  rig.engine->submit({rig.prompt("Once upon a time"), 1, 20, {}, {}, {}, {}});
  auto out = rig.run();
  ASSERT_EQ(out.size(), 1u);
  const auto& r = out.begin()->second;
  EXPECT_TRUE(r.message.empty()) << r.message;
  EXPECT_EQ(r.tokens.size(), 5u);
  ASSERT_EQ(forks.size(), 3u);
  EXPECT_EQ(forks[0], 1);
  EXPECT_EQ(forks[1], -1);
  EXPECT_EQ(forks[2], -1);
  EXPECT_EQ(rig.kv->free_sequences(), 2) << "every sequence is released when the request ends";
}

// 10 000 forks, each freed at once, in one request: the KV store never runs out, and the ids the engine
// gives the store stay those of the sequences alive (an id goes back when its sequence ends for good), so
// a long-running engine's int32 ids never wrap. Before: each fork took the next id for ever.
TEST(EngineContract, TenThousandForksWithFreesReuseKvIds) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  int forked = 0;
  bool small_ids = true;
  Rig rig(model, 64, 3, [&] {
    auto d = std::make_unique<LambdaDecoder>();
    d->on_update = [&](DecodeSession& s) {
      if (s.logits(0) && forked == 0)
        for (; forked < 10000; ++forked) {
          const LocalSeq a = s.fork(0), b = s.fork(0);
          if (a < 0 || b < 0) {
            ADD_FAILURE() << "fork " << forked << " found no KV room";
            return;
          }
          // request 0's sequence holds id 0; the two forks alive now hold two of 1 and 2
          small_ids = small_ids && rig_kv_holds_only(s, {0, 1, 2});
          s.free(b);
          s.free(a);
        }
      if (s.finished(0) == StopReason::none && s.logits(0)) s.append(0, s.sample(0));
    };
    d->on_done = [](const DecodeSession& s) {
      return s.n_generated(0) >= 3 || s.finished(0) != StopReason::none;
    };
    return d;
  });
  kv_for_ids = rig.kv.get();
  rig.engine->submit({rig.prompt("Once upon a time"), 1, 20, {}, {}, {}, {}});
  auto out = rig.run();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out.begin()->second.message.empty()) << out.begin()->second.message;
  EXPECT_EQ(out.begin()->second.tokens.size(), 3u);
  EXPECT_EQ(forked, 10000);
  EXPECT_TRUE(small_ids) << "a fork got an id no live sequence had freed";
  EXPECT_EQ(rig.kv->free_sequences(), 3) << "every sequence is released when the request ends";
  // A second request after all that: the ids of the first are used again.
  forked = 10000; // (no more forks)
  rig.engine->submit({rig.prompt("Once upon a time"), 1, 20, {}, {}, {}, {}});
  out = rig.run();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out.begin()->second.tokens.size(), 3u);
  kv_for_ids = nullptr;
}

// ---- 7. truncate -------------------------------------------------------------------------------

// Generates 12 greedy tokens with a repetition penalty (sampler state) and a stop string that holds
// text back, truncates to 5 generated tokens, and generates again: the same tokens, log-probs and
// text — the penalty's history, stop and detokenizer state were rolled back with the tokens.
TEST(EngineContract, TruncateRestoresTheSequenceExactly) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  struct Seen {
    std::vector<TokenId> tokens;
    std::vector<float> logprobs;
    std::string text;
  } first, second;
  int phase = 0;
  size_t n_prompt = 0;
  StopConfig stop;
  stop.strings = {"e@", "a@"}; // never matched, but every 'e' and 'a' is held back until the next token
  Rig rig(
      model, 128, 4,
      [&] {
        auto d = std::make_unique<LambdaDecoder>();
        d->on_update = [&](DecodeSession& s) {
          n_prompt = s.n_prompt();
          if (!s.logits(0)) return;
          s.append(0, s.sample(0));
          if (s.n_generated(0) == 12 && phase == 0) {
            first.tokens = s.tokens(0);
            phase = 1;
            s.truncate(0, n_prompt + 5);
            EXPECT_EQ(s.tokens(0).size(), n_prompt + 5);
            EXPECT_EQ(s.logits(0), nullptr) << "logits of the new last token come after a re-plan";
            EXPECT_EQ(s.finished(0), StopReason::none);
          }
        };
        d->on_done = [&](const DecodeSession& s) { return phase == 1 && s.n_generated(0) >= 12; };
        return d;
      },
      {SamplerSpec{"penalties", {{"repeat", 1.5}, {"last_n", int64_t{64}}}}, SamplerSpec{"greedy", {}}},
      stop);
  rig.engine->submit({rig.prompt("Once upon a time"), 1, 40, {}, {}, {}, {}});
  auto out = rig.run(200);
  ASSERT_EQ(out.size(), 1u);
  const auto& r = out.begin()->second;
  EXPECT_TRUE(r.message.empty()) << r.message;
  ASSERT_EQ(phase, 1);
  std::vector<TokenId> gen(first.tokens.begin() + static_cast<std::ptrdiff_t>(n_prompt), first.tokens.end());
  EXPECT_EQ(r.tokens, gen);

  // The reference: the same 12 tokens without a truncate, text and log-probs included.
  Rig ref(
      model, 128, 4,
      [] {
        auto d = std::make_unique<LambdaDecoder>();
        d->on_update = [](DecodeSession& s) {
          if (s.logits(0)) s.append(0, s.sample(0));
        };
        d->on_done = [](const DecodeSession& s) { return s.n_generated(0) >= 12; };
        return d;
      },
      {SamplerSpec{"penalties", {{"repeat", 1.5}, {"last_n", int64_t{64}}}}, SamplerSpec{"greedy", {}}},
      stop);
  ref.engine->submit({ref.prompt("Once upon a time"), 1, 40, {}, {}, {}, {}});
  auto want = ref.run(200).begin()->second;
  EXPECT_EQ(r.tokens, want.tokens);
  EXPECT_EQ(r.text, want.text);
  ASSERT_EQ(r.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < r.logprobs.size(); ++i)
    EXPECT_NEAR(r.logprobs[i], want.logprobs[i], 1e-5) << i;
}

TEST(EngineContract, TruncateOfAFinishedSequenceMakesItLiveAgain) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  bool truncated = false;
  Rig rig(model, 128, 4, [&] {
    auto d = std::make_unique<LambdaDecoder>();
    d->on_update = [&](DecodeSession& s) {
      if (!s.logits(0)) return;
      const StopReason why = s.append(0, s.sample(0));
      if (why != StopReason::none && !truncated) { // max_tokens = 4 ended it: roll back 2
        truncated = true;
        EXPECT_EQ(why, StopReason::max_tokens);
        s.truncate(0, s.n_prompt() + 2);
        EXPECT_EQ(s.finished(0), StopReason::none);
      }
    };
    d->on_done = [](const DecodeSession& s) { return s.finished(0) != StopReason::none; };
    return d;
  });
  rig.engine->submit({rig.prompt("The dog"), 1, 4, {}, {}, {}, {}});
  auto r = rig.run(100).begin()->second;
  EXPECT_TRUE(truncated);
  EXPECT_EQ(r.stop_reason, StopReason::max_tokens);
  EXPECT_EQ(r.tokens.size(), 4u) << "the stop tracker's token count was rolled back too";
}

TEST(EngineContract, TruncateToItsOwnLengthRevivesAFinishedSequence) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  int phase = 0;
  Rig rig(model, 128, 4, [&] {
    auto d = std::make_unique<LambdaDecoder>();
    d->on_update = [&](DecodeSession& s) {
      if (phase == 1) { // live again at 4 tokens: end it another way
        s.finish(0, StopReason::custom, 0.0);
        phase = 2;
        return;
      }
      if (!s.logits(0)) return;
      if (s.append(0, s.sample(0)) != StopReason::none) { // max_tokens = 4 ended it
        s.truncate(0, s.tokens(0).size());
        EXPECT_EQ(s.finished(0), StopReason::none) << "truncate promises a live sequence, whatever n";
        phase = 1;
      }
    };
    d->on_plan = [&](DecodeSession& s) {
      if (phase == 0 && s.finished(0) == StopReason::none) s.plan(0);
    };
    d->on_done = [&](const DecodeSession&) { return phase == 2; };
    return d;
  });
  rig.engine->submit({rig.prompt("The dog"), 1, 4, {}, {}, {}, {}});
  auto r = rig.run(100).begin()->second;
  EXPECT_EQ(r.stop_reason, StopReason::custom);
  EXPECT_EQ(r.tokens.size(), 4u);
}

TEST(EngineContract, ADecoderThatMakesNoProgressFailsItsRequest) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  Rig rig(model, 128, 4, [] {
    auto d = std::make_unique<LambdaDecoder>();
    d->on_plan = [](DecodeSession&) {}; // plans nothing, never done
    d->on_update = [](DecodeSession&) {};
    d->on_done = [](const DecodeSession&) { return false; };
    return d;
  });
  rig.engine->submit({rig.prompt("Hello"), 1, 10, {}, {}, {}, {}});
  auto out = rig.run(50);
  ASSERT_EQ(out.size(), 1u);
  const auto& r = out.begin()->second;
  EXPECT_EQ(r.stop_reason, StopReason::error);
  EXPECT_NE(r.message.find("made no progress"), std::string::npos) << r.message;
}

// ---- 8. free releases everything ---------------------------------------------------------------

TEST(EngineContract, FreeReleasesTheSequence) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  LocalSeq child = -1;
  bool checked = false;
  KVCacheStore* kvp = nullptr;
  Rig rig(model, 128, 4, [&] {
    auto d = std::make_unique<LambdaDecoder>();
    d->on_update = [&](DecodeSession& s) {
      if (!s.logits(0)) return;
      if (child < 0) {
        child = s.fork(0);
        ASSERT_GE(child, 0);
        ASSERT_NE(s.logits(child), nullptr);
        EXPECT_EQ(kvp->free_sequences(), 2);
        s.free(child);
        EXPECT_FALSE(s.exists(child));
        EXPECT_EQ(kvp->free_sequences(), 3);
        checked = true;
      }
      s.append(0, s.sample(0));
    };
    d->on_done = [](const DecodeSession& s) { return s.n_generated(0) >= 3; };
    return d;
  });
  kvp = rig.kv.get();
  rig.engine->submit({rig.prompt("Hello"), 1, 10, {}, {}, {}, {}});
  rig.run(50);
  EXPECT_TRUE(checked);
  EXPECT_EQ(rig.kv->free_sequences(), 4);
}

// ---- 9. custom stops and plugin hold-back never lose text --------------------------------------

struct StopAfter final : StopCriterion {
  size_t n;
  size_t hold;
  StopAfter(size_t n_, size_t hold_) : n(n_), hold(hold_) {}
  std::string_view name() const noexcept override { return "stop_after"; }
  StopVerdict check(const StopInput& in) override {
    return in.generated.size() >= n ? StopVerdict{StopReason::custom, 0, {}} : StopVerdict{};
  }
  size_t holdback_bytes() const override { return hold; }
  std::unique_ptr<StopCriterion> clone() const override { return std::make_unique<StopAfter>(*this); }
};

std::unique_ptr<Decoder> greedy_decoder() {
  return make_sample_decoder();
}

TEST(EngineContract, ACustomStopReleasesTheHeldBackText) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  Rig plain(model, 128, 2, greedy_decoder);
  plain.engine->submit({plain.prompt("Once upon a time"), 1, 6, {}, {}, {}, {}});
  const auto want = plain.run(50).begin()->second;
  ASSERT_EQ(want.tokens.size(), 6u);

  StopConfig stop; // every printable character is the start of a stop string: the last one is held
  for (char c = ' '; c <= '~'; ++c)
    stop.strings.push_back(std::string(1, c) + "\x01");
  Rig rig(model, 128, 2, greedy_decoder, {SamplerSpec{"greedy", {}}}, stop, [] {
    std::vector<std::unique_ptr<StopCriterion>> v;
    v.push_back(std::make_unique<StopAfter>(6, 0));
    return v;
  });
  std::string streamed;
  rig.engine->submit(
      {rig.prompt("Once upon a time"), 1, 40, [&](std::string_view t) { streamed += t; }, {}, {}, {}});
  const auto r = rig.run(50).begin()->second;
  EXPECT_EQ(r.stop_reason, StopReason::custom);
  EXPECT_EQ(r.tokens, want.tokens);
  EXPECT_EQ(r.text, want.text);
  EXPECT_EQ(streamed, want.text);
}

TEST(EngineContract, PluginHoldbackIsHonouredWhileStreaming) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  Rig rig(model, 128, 2, greedy_decoder, {SamplerSpec{"greedy", {}}}, {}, [] {
    std::vector<std::unique_ptr<StopCriterion>> v;
    v.push_back(std::make_unique<StopAfter>(1000, size_t{1} << 30)); // holds everything back
    return v;
  });
  std::vector<std::string> chunks;
  rig.engine->submit({rig.prompt("Once upon a time"),
                      1,
                      10,
                      [&](std::string_view t) { chunks.emplace_back(t); },
                      {},
                      {},
                      {}});
  const auto r = rig.run(50).begin()->second;
  EXPECT_EQ(r.stop_reason, StopReason::max_tokens);
  ASSERT_EQ(chunks.size(), 1u) << "nothing may be streamed while the plugin holds it back";
  EXPECT_EQ(chunks[0], r.text);
}

// ---- 4. a forward failure after some tokens ends the request with a reason and a message ---------

struct FailAfter final : Backend {
  std::unique_ptr<Backend> inner = make_reference_backend();
  int left;
  explicit FailAfter(int n) : left(n) {}
  std::string_view name() const noexcept override { return "fail_after"; }
  bool supports(const Graph& g, const Node& n) const noexcept override { return inner->supports(g, n); }
  void compute(const Graph& g, const BatchView& b, const KVRows& kv, std::span<float> logits) override {
    if (left-- <= 0) fail(Errc::internal, "fail_after", "device lost");
    inner->compute(g, b, kv, logits);
  }
};

TEST(EngineContract, AForwardFailureAfterSomeTokensIsAnError) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  Rig rig(model, 128, 2, greedy_decoder, {SamplerSpec{"greedy", {}}}, {}, {}, std::make_unique<FailAfter>(4));
  rig.engine->submit({rig.prompt("Once upon a time"), 1, 20, {}, {}, {}, {}});
  const auto r = rig.run(50).begin()->second;
  EXPECT_EQ(r.stop_reason, StopReason::error);
  EXPECT_EQ(r.tokens.size(), 4u);
  EXPECT_NE(r.message.find("device lost"), std::string::npos) << r.message;
}

// A forward that fails on a prefill chunk with no logits row (the prompt in chunks of 2) fails that
// request too: its later chunks would otherwise attend over K/V that were never written.
struct FailOnce final : Backend { // the n-th forward fails, the others run
  std::unique_ptr<Backend> inner = make_reference_backend();
  int n;
  explicit FailOnce(int k) : n(k) {}
  std::string_view name() const noexcept override { return "fail_once"; }
  bool supports(const Graph& g, const Node& nd) const noexcept override { return inner->supports(g, nd); }
  void compute(const Graph& g, const BatchView& b, const KVRows& kv, std::span<float> logits) override {
    if (n-- == 0) fail(Errc::internal, "fail_once", "device lost");
    inner->compute(g, b, kv, logits);
  }
};

TEST(EngineContract, AForwardFailureInAMiddlePrefillChunkIsAnError) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  Rig rig(model, 128, 2, greedy_decoder, {SamplerSpec{"greedy", {}}}, {}, {}, std::make_unique<FailOnce>(1));
  rig.engine->set_max_batch_tokens(2);
  rig.engine->submit({rig.prompt("Once upon a time there was a dog"), 1, 20, {}, {}, {}, {}});
  const auto r = rig.run(50).begin()->second;
  EXPECT_EQ(r.stop_reason, StopReason::error);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_NE(r.message.find("device lost"), std::string::npos) << r.message;
}

// ---- decoder outputs (ABI 1.2 session_set_output) ------------------------------------------------

TEST(EngineContract, DecoderOutputsAreValidatedJsonUnderTheirOwnKeys) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  Rig rig(model, 128, 2, [] {
    auto d = std::make_unique<LambdaDecoder>();
    d->on_update = [](DecodeSession& s) {
      if (s.logits(0)) s.append(0, s.sample(0));
    };
    d->on_done = [](const DecodeSession& s) { return s.n_generated(0) >= 2; };
    d->on_results = [](DecodeSession& s) {
      EXPECT_THROW(s.set_output("tokens", "[1]"), Error) << "a field of the result itself";
      EXPECT_THROW(s.set_output("answer", "{not json"), Error);
      EXPECT_THROW(s.set_output("answer", "1 2"), Error) << "one value";
      s.set_output("answer", "\"first\"");
      s.set_output("votes", "[{\"answer\": \"x\", \"count\": 2}]");
      s.set_output("answer", "\"42\""); // replaces
    };
    return d;
  });
  rig.engine->submit({rig.prompt("Hello"), 1, 10, {}, {}, {}, {}});
  const auto r = rig.run(20).begin()->second;
  EXPECT_TRUE(r.message.empty()) << r.message;
  ASSERT_EQ(r.outputs.size(), 2u);
  EXPECT_EQ(r.outputs[0], (std::pair<std::string, std::string>{"answer", "\"42\""}));
  EXPECT_EQ(r.outputs[1].first, "votes");
}

// ---- ABI 1.3: draft tokens, rows of logits, commit, rollback, a draft model ------------------------

// Greedy decoding of n tokens with the logits seen before each token.
struct GreedyTrace {
  std::vector<TokenId> tokens;
  std::vector<std::vector<float>> logits; // [i]: before tokens[i]
};
GreedyTrace greedy_trace(const std::filesystem::path& model, size_t n, StopConfig stop = {}) {
  GreedyTrace tr;
  Rig ref(
      model, 128, 2,
      [&] {
        auto d = std::make_unique<LambdaDecoder>();
        d->on_update = [&](DecodeSession& s) {
          const float* l = s.logits(0);
          if (!l) return;
          tr.logits.emplace_back(l, l + s.n_vocab());
          const TokenId t = s.sample(0);
          tr.tokens.push_back(t);
          s.append(0, t);
        };
        d->on_done = [n](const DecodeSession& s) {
          return s.n_generated(0) >= n || s.finished(0) != StopReason::none;
        };
        return d;
      },
      {SamplerSpec{"greedy", {}}}, stop);
  ref.engine->submit({ref.prompt("Once upon a time"), 1, 64, {}, {}, {}, {}});
  (void)ref.run(200);
  return tr;
}

void expect_rows_equal(const float* got, const std::vector<float>& want, const char* what) {
  ASSERT_NE(got, nullptr) << what;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
  EXPECT_LT(worst, 1e-4) << what;
}

TEST(EngineContract, DraftRowsEqualOneTokenAtATimeAndRejectedDraftsRollBack) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const GreedyTrace ref = greedy_trace(model, 6);
  ASSERT_EQ(ref.tokens.size(), 6u);
  int phase = 0;
  std::string streamed;
  std::string streamed_before_commit = "unset";
  Rig rig(model, 128, 2, [&] {
    auto d = std::make_unique<LambdaDecoder>();
    d->on_update = [&](DecodeSession& s) {
      const int32_t V = s.n_vocab();
      if (phase == 0) { // the prompt's row; then r0 r1 and two wrong tokens as a draft
        expect_rows_equal(s.logits(0), ref.logits[0], "prompt row");
        const TokenId w = (ref.tokens[2] + 1) % V, w2 = (ref.tokens[3] + 7) % V;
        EXPECT_EQ(s.set_draft(0, std::vector<TokenId>{ref.tokens[0], ref.tokens[1], w, w2}), 4u);
        EXPECT_EQ(s.n_draft(0), 4u);
        EXPECT_EQ(s.n_generated(0), 0u) << "drafts are not committed";
        phase = 1;
      } else if (phase == 1) { // one forward gave a row after each draft token
        ASSERT_NE(s.logits_at(0, 4), nullptr);
        EXPECT_EQ(s.logits_at(0, 5), nullptr);
        expect_rows_equal(s.logits_at(0, 0), ref.logits[0], "row 0");
        expect_rows_equal(s.logits_at(0, 1), ref.logits[1], "row 1 (after r0)");
        expect_rows_equal(s.logits_at(0, 2), ref.logits[2], "row 2 (after r0 r1)");
        streamed_before_commit = streamed;
        EXPECT_EQ(s.commit(0, 2), StopReason::none);
        EXPECT_EQ(s.n_generated(0), 2u);
        EXPECT_EQ(s.n_draft(0), 2u);
        expect_rows_equal(s.logits(0), ref.logits[2], "row 2 is row 0 after two commits");
        s.append(0, ref.tokens[2]); // the correction: w and w2 are dropped, their K/V rolled back
        EXPECT_EQ(s.n_draft(0), 0u);
        EXPECT_EQ(s.logits(0), nullptr);
        phase = 2;
      } else if (phase == 2) { // attends over r0 r1 r2 only: w2's stale position must be gone
        expect_rows_equal(s.logits(0), ref.logits[3], "after the rollback");
        s.append(0, s.sample(0));
        phase = 3;
      }
    };
    d->on_done = [&](const DecodeSession&) { return phase == 3; };
    return d;
  });
  rig.engine->submit(
      {rig.prompt("Once upon a time"), 1, 64, [&](std::string_view t) { streamed += t; }, {}, {}, {}});
  auto out = rig.run(50);
  ASSERT_EQ(out.size(), 1u);
  const auto& r = out.begin()->second;
  EXPECT_TRUE(r.message.empty()) << r.message;
  EXPECT_EQ(streamed_before_commit, "") << "uncommitted tokens are never streamed";
  EXPECT_EQ(r.tokens, std::vector<TokenId>(ref.tokens.begin(), ref.tokens.begin() + 4));
  EXPECT_EQ(streamed, r.text);
  ASSERT_EQ(r.logprobs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) // committed drafts get their log-prob from their own row
    EXPECT_NEAR(r.logprobs[i], token_logprob(ref.logits[i], ref.tokens[i]), 1e-4) << i;
}

TEST(EngineContract, CommitRunsTheStopRulesAndDropsTheRest) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const GreedyTrace ref = greedy_trace(model, 4);
  StopConfig stop;
  stop.stop_tokens = {ref.tokens[1]};
  bool checked = false;
  Rig rig(
      model, 128, 2,
      [&] {
        auto d = std::make_unique<LambdaDecoder>();
        d->on_update = [&](DecodeSession& s) {
          if (s.n_draft(0) == 0) {
            s.set_draft(0, std::vector<TokenId>{ref.tokens[0], ref.tokens[1], ref.tokens[2]});
            return;
          }
          EXPECT_EQ(s.commit(0, 3), StopReason::stop_token);
          EXPECT_EQ(s.n_generated(0), 2u) << "the token after the stop is not committed";
          EXPECT_EQ(s.n_draft(0), 0u);
          EXPECT_EQ(s.finished(0), StopReason::stop_token);
          checked = true;
        };
        d->on_done = [](const DecodeSession& s) { return s.finished(0) != StopReason::none; };
        return d;
      },
      {SamplerSpec{"greedy", {}}}, stop);
  rig.engine->submit({rig.prompt("Once upon a time"), 1, 64, {}, {}, {}, {}});
  auto out = rig.run(50);
  ASSERT_TRUE(checked);
  EXPECT_EQ(out.begin()->second.stop_reason, StopReason::stop_token);
}

TEST(EngineContract, DraftContextRoomIsReportedNotOverrun) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  size_t kept = 99;
  Rig rig(model, 16, 2, [&] {
    auto d = std::make_unique<LambdaDecoder>();
    d->on_update = [&](DecodeSession& s) {
      if (!s.logits(0)) return;
      if (s.n_generated(0) == 8 && kept == 99)
        kept = s.set_draft(0, std::vector<TokenId>(10, 300));
      else
        s.append(0, s.sample(0));
    };
    d->on_done = [](const DecodeSession& s) { return s.finished(0) != StopReason::none; };
    return d;
  });
  const auto prompt = rig.prompt("Once upon a time");
  rig.engine->submit({prompt, 1, -1, {}, {}, {}, {}});
  auto out = rig.run(100);
  EXPECT_EQ(kept, 16 - (prompt.size() + 8)) << "the draft keeps what the context has room for";
  EXPECT_EQ(out.begin()->second.stop_reason, StopReason::max_context);
}

// A backend that counts its forward passes (the draft model's, here).
class CountingBackend final : public Backend {
public:
  explicit CountingBackend(int* calls) : inner_(make_reference_backend()), calls_(calls) {}
  std::string_view name() const noexcept override { return "counting"; }
  bool supports(const Graph& g, const Node& n) const noexcept override { return inner_->supports(g, n); }
  void compute(const Graph& g, const BatchView& b, const KVRows& kv, std::span<float> logits) override {
    ++*calls_;
    inner_->compute(g, b, kv, logits);
  }

private:
  std::unique_ptr<Backend> inner_;
  int* calls_;
};

TEST(EngineContract, DraftSequencesOfAllRequestsShareOneDraftForwardPerStep) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  int draft_calls = 0, steps_with_draft_work = 0;
  Rig rig(
      model, 128, 8,
      [&] {
        auto d = std::make_unique<LambdaDecoder>();
        auto draft = std::make_shared<LocalSeq>(-1);
        d->on_plan = [draft](DecodeSession& s) {
          if (*draft < 0) {
            *draft = s.fork_draft(0);
            EXPECT_EQ(s.role_of(*draft), ModelRole::draft);
          }
          if (s.finished(0) == StopReason::none) {
            s.plan(0);
            s.plan(*draft);
          }
        };
        d->on_update = [draft](DecodeSession& s) {
          if (!s.logits(0) || !s.logits(*draft)) return;
          // The draft is the same file: the same logits on its own backend and KV.
          for (int32_t i = 0; i < s.n_vocab(); ++i)
            ASSERT_NEAR(s.logits(0)[i], s.logits(*draft)[i], 1e-4);
          const TokenId t = s.sample(0);
          s.append(0, t);
          s.append(*draft, t);
        };
        d->on_done = [](const DecodeSession& s) { return s.finished(0) != StopReason::none; };
        return d;
      },
      {SamplerSpec{"greedy", {}}}, {}, {}, nullptr, std::make_unique<CountingBackend>(&draft_calls));
  rig.engine->set_max_running(4);
  for (const char* p : {"Once upon a time", "The dog", "Lily", "One day"})
    rig.engine->submit({rig.prompt(p), 1, 10, {}, {}, {}, {}});
  while (!rig.engine->idle()) {
    const int before = draft_calls;
    auto done = rig.engine->step();
    for (auto& [id, r] : done) {
      EXPECT_TRUE(r.message.empty()) << r.message;
      EXPECT_EQ(r.tokens.size(), 10u);
    }
    EXPECT_LE(draft_calls - before, 1) << "one draft forward per step, whatever the number of requests";
    steps_with_draft_work += draft_calls - before;
  }
  EXPECT_EQ(steps_with_draft_work, 10) << "4 requests × 10 tokens in 10 draft forwards";
}

} // namespace
