// Attention variants on stories260K: the model's metadata chooses the variant per layer and it reaches the
// graph; a sliding window releases the KV blocks it no longer reads, so a long generation holds a bounded
// KV cache and still gives the tokens of a store that keeps everything; a backend asked for a kernel it
// does not run is one clear line. (The kernel against its mask and the variants' rules without a model:
// tests/unit/test_attention.cpp.)
#include "loom/attention.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/kv/kv_cache.hpp"
#include "loom/model/model.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "test_util.hpp"

#include <cstdlib>
#include <filesystem>
#include <gtest/gtest.h>
#include <unistd.h>

namespace {

using namespace loom;

// stories260K with attention metadata added (a sliding window, its layer pattern, a soft-cap).
std::filesystem::path with_attention_metadata(const std::filesystem::path& model, const std::string& name,
                                              const std::vector<bool>& pattern, int32_t window,
                                              float softcap) {
  const GgufFile f = GgufFile::open(model.string());
  GgufWriter w;
  for (const auto& kv : f.metadata())
    w.add(kv.key, kv.value);
  w.add_u32("llama.attention.sliding_window", static_cast<uint32_t>(window));
  if (!pattern.empty()) {
    GgufValue a;
    a.type = GgufType::array;
    a.elem_type = GgufType::boolean;
    for (bool b : pattern) {
      GgufValue e;
      e.type = GgufType::boolean;
      e.u = b ? 1 : 0;
      a.items.push_back(e);
    }
    w.add("llama.attention.sliding_window_pattern", a);
  }
  w.add_f32("llama.attn_logit_softcapping", softcap);
  for (const auto& t : f.tensors())
    w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  const auto out = std::filesystem::temp_directory_path() /
                   ("loom-attn-" + std::to_string(::getpid()) + "-" + name + ".gguf");
  w.write(out.string());
  return out;
}

TEST(Attention, TheModelsMetadataChoosesTheVariantPerLayer) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto path = with_attention_metadata(model, "pattern", {true, true, false, true, false}, 8, 30.0f);
  auto m = Model::load(path.string());
  EXPECT_EQ(m->config().sliding_window, 8);
  EXPECT_EQ(m->config().sliding_layers, (std::vector<bool>{true, true, false, true, false}));
  EXPECT_FLOAT_EQ(m->config().attn_softcap, 30.0f);
  // The variant reaches the graph: every attention node carries its layer's window and soft-cap.
  m->set_attention(make_attention_variant(m->config(), {}));
  const auto graph = m->graph(1, 1);
  const Graph& g = *graph;
  int32_t seen = 0;
  for (const Node& n : g.nodes)
    if (n.op == OpKind::attention) {
      EXPECT_EQ(n.attn.window, n.attn.layer == 2 || n.attn.layer == 4 ? 0 : 8) << n.attn.layer;
      EXPECT_FLOAT_EQ(n.attn.softcap, 30.0f);
      ++seen;
    }
  EXPECT_EQ(seen, 5);

  // Greedy text on the reference backend and on the cpu plugin (flash and naive kernels) agree.
  PipelineConfig cfg;
  cfg.model.path = path.string();
  cfg.model.n_ctx = 128;
  cfg.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
  GenerationRequest req;
  req.prompt = "Once upon a time";
  req.max_new_tokens = 40;
  const auto ref = Pipeline::create(cfg)->generate(req);
  LOOM_REQUIRE_BIN(); // the cpu plugin lies next to it
  cfg.plugins.paths = {std::filesystem::path(std::getenv("LOOM_BIN")).parent_path().string()};
  cfg.backend.name = "cpu";
  cfg.backend.threads = 1;
  for (const char* k : {"flash", "naive"}) {
    cfg.attention.kernel = k;
    EXPECT_EQ(Pipeline::create(cfg)->generate(req).tokens, ref.tokens) << k;
  }
  cfg.attention.variant = "standard"; // the pipeline overrides the file: another text
  EXPECT_NE(Pipeline::create(cfg)->generate(req).tokens, ref.tokens);

  // A pattern of the wrong length is a clear error naming the key.
  const auto bad = with_attention_metadata(model, "bad", {true, false}, 8, 0.0f);
  try {
    (void)Model::load(bad.string());
    ADD_FAILURE() << "a 2-entry pattern for 5 layers was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window_pattern' must be 5 bools"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
  std::filesystem::remove(bad);
}

PipelineConfig window_config(const std::filesystem::path& model, const std::string& store) {
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.model.n_ctx = 2100;
  cfg.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
  cfg.stop.eos = false; // generate the whole budget
  cfg.attention.variant = "sliding_window";
  cfg.attention.window = 64;
  cfg.attention.sinks = 4;
  cfg.kv_cache.store = store;
  cfg.kv_cache.block_size = 16;
  return cfg;
}

TEST(Attention, SlidingWindowKVStaysBoundedOverTwoThousandTokens) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  GenerationRequest req;
  req.prompt = "Once upon a time";
  req.max_new_tokens = 2000;
  auto paged = Pipeline::create(window_config(model, "paged"));
  const auto a = paged->generate(req);
  ASSERT_EQ(a.tokens.size(), 2000u) << a.message;
  // sinks (one block) + the window and its slack (96 positions: 6 blocks, 7 when not aligned) + the
  // block being written: at most 9 blocks of 16, whatever the length — not the 126 of 2,005 positions.
  EXPECT_LE(paged->engine().stats().peak_kv_units, 9);
  EXPECT_EQ(paged->engine().stats().schedule_misses, 0u)
      << "released blocks are counted as the store counts them";
  EXPECT_LE(paged->engine().stats().peak_kv_units * 16, (KVRetention{4, 64}.bound_positions(16)));
  EXPECT_LE(paged->kv_store().units_in_use(), 0) << "all given back at the end";
  // The same tokens as a contiguous store that keeps every position (nothing released was needed).
  auto whole = Pipeline::create(window_config(model, "contiguous"));
  const auto b = whole->generate(req);
  EXPECT_EQ(a.tokens, b.tokens);
  // And a standard (full) attention run would need them all.
  auto full_cfg = window_config(model, "paged");
  full_cfg.attention = {};
  auto full = Pipeline::create(full_cfg);
  req.max_new_tokens = 300;
  (void)full->generate(req);
  EXPECT_GE(full->engine().stats().peak_kv_units, 19) << "305 positions in blocks of 16";
}

// A hybrid model (Gemma 2/3's shape: some layers attend a sliding window, the others every position) on
// a paged store: the window layers keep their rows in layer groups of their own, released past the window,
// while the full layers keep every position — the same tokens as a store that keeps everything, in less
// memory; and so under preemption, where a restored request finds its prefix again only where every group
// still holds what its next query reads.
PipelineConfig hybrid_config(const std::filesystem::path& model, bool swa_full, int32_t max_tokens = 0) {
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.model.n_ctx = 700;
  cfg.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
  cfg.stop.eos = false;
  cfg.kv_cache.store = "paged";
  cfg.kv_cache.block_size = 16;
  cfg.kv_cache.max_tokens = max_tokens;
  cfg.kv_cache.swa_full = swa_full;
  cfg.scheduler.max_batch_tokens = 64; // prompts in chunks; a window's blocks grow by a chunk before retiring
  return cfg;
}

TEST(Attention, AHybridModelsWindowLayersKeepOnlyTheirWindow) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  // Layers 0, 2 and 4 attend a window of 16; 1 and 3 every position.
  const auto path = with_attention_metadata(model, "hybrid", {true, false, true, false, true}, 16, 0.0f);
  GenerationRequest req;
  req.prompt = "Once upon a time";
  req.max_new_tokens = 600;
  auto hybrid = Pipeline::create(hybrid_config(path, false));
  auto full = Pipeline::create(hybrid_config(path, true));
  const KVLayout& l = hybrid->kv_store().memory().layout();
  ASSERT_EQ(l.n_groups(), 3) << "the full layers, then the window layers two to a group";
  EXPECT_EQ(l.n_slots(), 2);
  EXPECT_EQ(full->kv_store().memory().layout().n_groups(), 1);
  const auto a = hybrid->generate(req);
  const auto b = full->generate(req);
  ASSERT_EQ(a.tokens.size(), 600u) << a.message;
  EXPECT_EQ(a.tokens, b.tokens) << "greedy, 600 tokens past a window of 16";
  EXPECT_EQ(hybrid->engine().stats().schedule_misses, 0u);
  // 2 of 5 layers in full and a window of the rest: well under half the bytes of full KV (2/5 + the
  // window groups' few blocks), and the one-sequence figure the pipeline reports says as much.
  const auto peak_bytes = [](Pipeline& p) {
    const KVCacheStore& kv = p.kv_store();
    return static_cast<size_t>(p.engine().stats().peak_kv_units) *
           (kv.memory().layout().bytes() / static_cast<size_t>(kv.n_units()));
  };
  const size_t ha = peak_bytes(*hybrid), fa = peak_bytes(*full);
  EXPECT_LT(static_cast<double>(ha), 0.5 * static_cast<double>(fa)) << ha << " vs " << fa;
  EXPECT_LT(hybrid->memory().kv, full->memory().kv);
  // The reference backend reads the same pool through the same KVRows: the same tokens.
  PipelineConfig rc = hybrid_config(path, false);
  rc.backend.name = "reference";
  auto on_reference = Pipeline::create(rc);
  ASSERT_EQ(on_reference->kv_store().memory().layout().n_groups(), 3);
  req.max_new_tokens = 200;
  const auto on_ref = on_reference->generate(req);
  EXPECT_EQ(on_ref.tokens, std::vector<TokenId>(b.tokens.begin(), b.tokens.begin() + 200));
  // Preempted and restored: eight requests on a store of 24 blocks' worth of every layer (each needs ~23).
  std::vector<GenerationRequest> reqs;
  for (const char* p : {"Once upon a time", "The little dog", "Lily and Ben", "Tom wanted to play",
                        "The sun was hot", "A big red ball", "Mom said", "One day"}) {
    GenerationRequest r;
    r.prompt = p;
    r.max_new_tokens = 300;
    reqs.push_back(std::move(r));
  }
  std::vector<GenerationResult> ref;
  for (const auto& r : reqs)
    ref.push_back(full->generate(r));
  for (bool cache : {true, false}) {
    SCOPED_TRACE(cache ? "prefix cache" : "no prefix cache");
    PipelineConfig c = hybrid_config(path, false, 24 * 16);
    c.kv_cache.prefix_cache = cache;
    auto tight = Pipeline::create(c);
    const auto got = tight->generate_all(reqs, 8);
    for (size_t i = 0; i < reqs.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      EXPECT_EQ(got[i].tokens, ref[i].tokens);
      EXPECT_TRUE(got[i].message.empty()) << got[i].message;
    }
    EXPECT_GT(tight->engine().stats().preemptions, 0u) << "the budget was meant to force preemption";
    EXPECT_EQ(tight->engine().stats().schedule_misses, 0u) << "every planned chunk got its KV room";
    EXPECT_EQ(tight->kv_store().units_in_use(), 0) << "all given back at the end";
  }
  std::filesystem::remove(path);
}

TEST(Attention, ABackendAskedForAKernelItDoesNotRunIsOneClearLine) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.attention.kernel = "flash"; // the reference backend materializes scores: naive only
  try {
    (void)Pipeline::create(cfg);
    ADD_FAILURE() << "flash on the reference backend was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), Errc::unsupported);
    EXPECT_NE(m.find("kernel = \"flash\""), std::string::npos) << m;
    EXPECT_NE(m.find("backend 'reference'"), std::string::npos) << m;
    EXPECT_NE(m.find("\"naive\""), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  cfg.attention.kernel = "naive";
  EXPECT_NO_THROW((void)Pipeline::create(cfg));
}

} // namespace
