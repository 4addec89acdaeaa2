// Golden tests: Loom's reference backend against llama2.c run.c and llama.cpp on real models
// (../shared/models/reference). Missing models are SKIPPED with the reason, never passed.
#include "loom/model/model.hpp"
#include "loom/model/reference_backend.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "test_util.hpp"

#include <cmath>
#include <cstdio>
#include <gtest/gtest.h>
#include <sstream>

namespace {

using namespace loom;

struct GoldenRun {
  std::string prompt;
  int n = 0;
  std::vector<TokenId> ids; // BOS + prompt + generated
};

std::vector<GoldenRun> read_token_ids(const std::filesystem::path& p) {
  std::vector<GoldenRun> runs;
  std::istringstream in(test::read_file(p));
  std::string line;
  const std::string tag = "## -n ";
  while (std::getline(in, line)) {
    if (line.rfind(tag, 0) != 0) continue; // ## -n 64 -i "Once upon a time"
    GoldenRun r;
    const auto i_pos = line.find(" -i \"");
    r.n = std::stoi(line.substr(tag.size(), i_pos - tag.size()));
    r.prompt = line.substr(i_pos + 5, line.size() - (i_pos + 5) - 1);
    std::string ids;
    std::getline(in, ids);
    std::istringstream is(ids.substr(ids.find("):") + 2));
    TokenId t;
    while (is >> t)
      r.ids.push_back(t);
    runs.push_back(std::move(r));
  }
  return runs;
}

PipelineConfig greedy_config(const std::string& model) {
  PipelineConfig cfg;
  cfg.model.path = model;
  cfg.model.n_ctx = 512;
  cfg.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
  cfg.run.seed = 1;
  return cfg;
}

TEST(Golden, GreedyTokenSequencesMatchRunC) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto runs = read_token_ids(test::models_dir() / "reference" / "token_ids.txt");
  ASSERT_EQ(runs.size(), 6u) << "token_ids.txt should hold six runs";
  auto p = Pipeline::create(greedy_config(model.string()));
  for (const auto& r : runs) {
    SCOPED_TRACE("-n " + std::to_string(r.n) + " -i \"" + r.prompt + "\"");
    GenerationRequest req;
    req.prompt = r.prompt;
    const auto prompt_ids = p->tokenize(r.prompt);
    ASSERT_LE(prompt_ids.size(), r.ids.size());
    ASSERT_TRUE(std::equal(prompt_ids.begin(), prompt_ids.end(), r.ids.begin()))
        << "prompt encodes differently";
    req.max_new_tokens = static_cast<int32_t>(r.ids.size() - prompt_ids.size());
    const auto res = p->generate(req);
    std::vector<TokenId> all = res.prompt_tokens;
    all.insert(all.end(), res.tokens.begin(), res.tokens.end());
    EXPECT_EQ(all, r.ids);
    EXPECT_EQ(res.stop_reason, StopReason::max_tokens);
    ASSERT_EQ(res.logprobs.size(), res.tokens.size());
    for (float lp : res.logprobs)
      EXPECT_LE(lp, 0.0f);
  }
}

TEST(Golden, GreedyTextMatchesRunCAndLlamaCpp) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto p = Pipeline::create(greedy_config(model.string()));
  const auto ref = test::models_dir() / "reference";
  for (const char* name : {"once_upon_a_time", "the_little_dog", "empty"}) {
    for (int n : {64, 200}) {
      SCOPED_TRACE(std::string(name) + ".n" + std::to_string(n));
      const std::string prompt = std::string(name) == "once_upon_a_time" ? "Once upon a time"
                                 : std::string(name) == "the_little_dog" ? "The little dog"
                                                                         : "";
      GenerationRequest req;
      req.prompt = prompt;
      // run.c's -n counts positions: BOS + prompt + generated = n + 1 tokens in its output.
      req.max_new_tokens = n + 1 - static_cast<int32_t>(p->tokenize(prompt).size());
      const auto res = p->generate(req);
      const std::string expected =
          test::read_file(ref / (std::string(name) + ".n" + std::to_string(n) + ".txt"));
      EXPECT_EQ(prompt + res.text + "\n", expected);
      const auto cpp = ref / "llamacpp" / (std::string(name) + ".n" + std::to_string(n) + ".txt");
      if (std::filesystem::exists(cpp)) { // llama-simple prints "<s> " + prompt + generation
        const std::string lc = test::read_file(cpp);
        EXPECT_NE(lc.find(res.text.substr(0, std::min<size_t>(res.text.size(), 200))), std::string::npos);
      }
    }
  }
}

TEST(Golden, LogitsAtPositions0To6MatchRunC) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  std::istringstream in(
      test::read_file(test::models_dir() / "reference" / "logits_full_once_upon_a_time.txt"));
  std::vector<TokenId> tokens;
  std::vector<std::vector<float>> expected;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("pos ", 0) != 0) continue;
    std::istringstream ls(line);
    std::string w;
    int pos;
    TokenId tok;
    ls >> w >> pos >> w >> tok >> w;
    ASSERT_EQ(pos, static_cast<int>(tokens.size()));
    tokens.push_back(tok);
    std::vector<float> l;
    float x;
    while (ls >> x)
      l.push_back(x);
    expected.push_back(std::move(l));
  }
  ASSERT_EQ(tokens.size(), 7u);
  auto m = Model::load(model.string());
  const int32_t V = m->config().n_vocab;
  ASSERT_EQ(expected[0].size(), static_cast<size_t>(V));
  auto be = make_reference_backend();

  // Prefill: all seven positions in one forward, every row producing logits.
  {
    auto kv = make_contiguous_kv_cache(m->kv_shape(64, 1));
    const auto n = static_cast<int32_t>(tokens.size());
    std::vector<Pos> pos(tokens.size());
    std::vector<SeqId> seq(tokens.size(), 0);
    std::vector<int32_t> rows(tokens.size());
    for (int32_t i = 0; i < n; ++i)
      pos[static_cast<size_t>(i)] = rows[static_cast<size_t>(i)] = i;
    ASSERT_TRUE(kv->allocate(0, n));
    std::vector<float> logits(static_cast<size_t>(n) * static_cast<size_t>(V));
    m->forward(*be, {tokens, pos, seq, rows}, *kv, logits);
    for (int32_t p = 0; p < n; ++p)
      for (int32_t v = 0; v < V; ++v)
        ASSERT_NEAR(logits[static_cast<size_t>(p * V + v)],
                    expected[static_cast<size_t>(p)][static_cast<size_t>(v)], 1e-4)
            << "prefill pos " << p << " token " << v;
  }
  // Decode: one position per forward through the KV cache gives the same logits.
  {
    auto kv = make_contiguous_kv_cache(m->kv_shape(64, 1));
    std::vector<float> logits(static_cast<size_t>(V));
    for (int32_t p = 0; p < static_cast<int32_t>(tokens.size()); ++p) {
      ASSERT_TRUE(kv->allocate(0, 1));
      const SeqId s = 0;
      const int32_t row = 0;
      m->forward(*be,
                 {std::span(&tokens[static_cast<size_t>(p)], 1), std::span(&p, 1), std::span(&s, 1),
                  std::span(&row, 1)},
                 *kv, logits);
      for (int32_t v = 0; v < V; ++v)
        ASSERT_NEAR(logits[static_cast<size_t>(v)], expected[static_cast<size_t>(p)][static_cast<size_t>(v)],
                    1e-4)
            << "decode pos " << p << " token " << v;
    }
  }
}

TEST(Golden, TinyRandomLlama2F16LoadsAndGenerates) {
  LOOM_REQUIRE_MODEL(model, "llama-2-tiny-random.gguf");
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.model.n_ctx = 128;
  cfg.run.seed = 7;
  auto p = Pipeline::create(cfg);
  EXPECT_EQ(p->model().config().n_vocab, 32000);
  EXPECT_EQ(p->tokenizer().vocab_size(), 32000);
  GenerationRequest req;
  req.prompt = "Hello world";
  req.max_new_tokens = 16;
  const auto r = p->generate(req);
  EXPECT_EQ(r.prompt_tokens.front(), 1);
  EXPECT_FALSE(r.tokens.empty());
  for (TokenId t : r.tokens)
    EXPECT_TRUE(t >= 0 && t < 32000);
  for (float lp : r.logprobs)
    EXPECT_TRUE(std::isfinite(lp));
  // Seeded sampling is reproducible.
  const auto r2 = p->generate(req);
  EXPECT_EQ(r.tokens, r2.tokens);
}

TEST(Golden, ExtraModelsNotTunedToStories260K) {
  for (const char* rel : {"extra/babyllama-tok105.gguf", "extra/aidreams260K.gguf"}) {
    const auto path = test::models_dir() / rel;
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "model file missing: " << path.string();
    PipelineConfig cfg = greedy_config(path.string());
    cfg.model.n_ctx = 0; // the model's own context
    auto p = Pipeline::create(cfg);
    GenerationRequest req;
    req.prompt = "Once upon a time";
    req.max_new_tokens = 24;
    const auto r = p->generate(req);
    EXPECT_FALSE(r.tokens.empty()) << rel;
    EXPECT_FALSE(r.text.empty()) << rel;
  }
}

// The CLI command of the issue prints llama2.c's text.
TEST(Golden, CliRunPrintsRunCText) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const char* bin = std::getenv("LOOM_BIN");
  if (!bin || !std::filesystem::exists(bin)) GTEST_SKIP() << "LOOM_BIN not set to the loom executable";
  const std::string cmd =
      std::string(bin) + " run -m '" + model.string() + "' -p 'Once upon a time' -n 60 --temp 0 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0)
    out.append(buf, n);
  EXPECT_EQ(pclose(f), 0);
  EXPECT_EQ(out, test::read_file(test::models_dir() / "reference" / "once_upon_a_time.n64.txt"));
}

} // namespace

namespace {

// The same golden runs through the reference backend built as a plugin (backend ABI): identical
// tokens and logits.
TEST(GoldenPluginBackend, IdenticalToBuiltInReference) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const char* bin = std::getenv("LOOM_BIN");
  if (!bin || !std::filesystem::exists(bin))
    GTEST_SKIP() << "LOOM_BIN not set: cannot find the plugin directory";
  const std::string plugin_dir = std::filesystem::path(bin).parent_path().string();
  auto builtin_cfg = greedy_config(model.string());
  auto plugin_cfg = builtin_cfg;
  plugin_cfg.backend.name = "reference_plugin";
  plugin_cfg.plugins.paths = {plugin_dir};
  auto a = Pipeline::create(builtin_cfg);
  auto b = Pipeline::create(plugin_cfg);
  const auto runs = read_token_ids(test::models_dir() / "reference" / "token_ids.txt");
  for (const auto& r : runs) {
    SCOPED_TRACE(r.prompt);
    GenerationRequest req;
    req.prompt = r.prompt;
    req.max_new_tokens = static_cast<int32_t>(r.ids.size() - a->tokenize(r.prompt).size());
    const auto ra = a->generate(req);
    const auto rb = b->generate(req);
    std::vector<TokenId> all = rb.prompt_tokens;
    all.insert(all.end(), rb.tokens.begin(), rb.tokens.end());
    EXPECT_EQ(all, r.ids);
    EXPECT_EQ(ra.tokens, rb.tokens);
    ASSERT_EQ(ra.logprobs.size(), rb.logprobs.size());
    for (size_t i = 0; i < ra.logprobs.size(); ++i)
      EXPECT_EQ(ra.logprobs[i], rb.logprobs[i]) << "token " << i;
  }
  // Six requests batched through the plugin backend equal the built-in backend's.
  std::vector<GenerationRequest> reqs;
  for (const char* p : {"Once upon a time", "The little dog", "", "Lily", "Tom and Sue", "One day"}) {
    GenerationRequest q;
    q.prompt = p;
    q.max_new_tokens = 24;
    reqs.push_back(q);
  }
  const auto ba = a->generate_all(reqs, 6);
  const auto bb = b->generate_all(reqs, 6);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(ba[i].tokens, bb[i].tokens) << reqs[i].prompt;
}

} // namespace
