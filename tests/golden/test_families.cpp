// Every model family against llama.cpp: a `loom synth` file of each (llama, llama3, mistral, qwen2, qwen3,
// gemma2, phi3; smollm3, whose fourth layer has no RoPE; qwen3moe, 3 of 8 experts a token, and with its
// experts in MXFP4 — the same deterministic file llama.cpp was given) gives llama.cpp's logits at several
// positions of a 300-token prompt (within 1e-3 of their scale, 5e-3 for MXFP4 experts, which llama.cpp
// multiplies on activations rounded to q8_0; one forward, so the rows of a mixture of experts choose
// different experts) and its 32 greedy tokens, on the reference backend and on the cpu plugin
// at every ISA level this CPU runs. llama.cpp's numbers are in tests/data/families/reference.json
// (make_reference.py wrote them with llama-cpp-python); no Python runs here.
#include "loom/kv/kv_cache.hpp"
#include "loom/model/model.hpp"
#include "loom/model/reference_backend.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

namespace {

using namespace loom;

nlohmann::json reference() {
  std::ifstream f(std::string(LOOM_SOURCE_DIR) + "/tests/data/families/reference.json");
  return nlohmann::json::parse(f);
}

// The family's file (`extra`: more synth options, e.g. the experts' type).
std::string synth(const std::string& arch, const std::string& shape, const std::string& extra,
                  const std::filesystem::path& vocab) {
  const auto out = std::filesystem::temp_directory_path() /
                   ("loom-family-" + std::to_string(::getpid()) + "-" + arch + ".gguf");
  const auto r = test::run_loom("synth --shape " + shape + " --arch " + arch + " --type f32 " + extra +
                                    " --vocab-from " + vocab.string() + " -o " + out.string(),
                                false);
  EXPECT_EQ(r.code, 0) << r.err;
  return out.string();
}

class Families : public ::testing::TestWithParam<std::string> {};

TEST_P(Families, LogitsAndGreedyTokensMatchLlamaCpp) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(vocab, "stories260K.gguf"); // and vocab/ beside it
  const std::string arch = GetParam();
  const nlohmann::json ref = reference();
  ASSERT_TRUE(ref["families"].contains(arch)) << "no llama.cpp reference for " << arch;
  const nlohmann::json& fam = ref["families"][arch];
  const std::string path =
      synth(fam.value("arch", arch), fam.value("shape", ref["shape"].get<std::string>()),
            fam.value("synth_args", std::string()), test::models_dir() / fam["vocab"].get<std::string>());
  const auto prompt = fam["prompt"].get<std::vector<TokenId>>();

  // Logits of the whole prompt in one forward (every row an output) on the reference backend.
  auto m = Model::load(path);
  const int32_t V = m->config().n_vocab;
  const auto n = static_cast<int32_t>(prompt.size());
  auto kv = make_contiguous_kv_cache(m->kv_shape(512, 1));
  ASSERT_TRUE(kv->allocate(0, n));
  std::vector<Pos> pos(prompt.size());
  std::vector<SeqId> seq(prompt.size(), 0);
  std::vector<int32_t> rows(prompt.size());
  for (int32_t i = 0; i < n; ++i)
    pos[static_cast<size_t>(i)] = rows[static_cast<size_t>(i)] = i;
  std::vector<float> logits(static_cast<size_t>(n) * static_cast<size_t>(V));
  auto be = make_reference_backend();
  m->forward(*be, {prompt, pos, seq, rows}, *kv, logits);
  for (const auto& [p_str, at] : fam["logits"].items()) {
    const int p = std::stoi(p_str);
    const auto ids = at["ids"].get<std::vector<int>>();
    const auto want = at["values"].get<std::vector<double>>();
    ASSERT_EQ(ids.size(), want.size());
    double scale = 0, worst = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_LT(ids[i], V);
      scale = std::max(scale, std::fabs(want[i]));
      worst = std::max(worst,
                       std::fabs(static_cast<double>(logits[static_cast<size_t>(p * V + ids[i])]) - want[i]));
    }
    EXPECT_LE(worst, fam.value("tolerance", 1e-3) * scale)
        << arch << " position " << p << ": max |Loom − llama.cpp| " << worst << " against a logit scale of "
        << scale;
  }

  // Greedy decoding after the prompt's first tokens, on both backends, as llama.cpp chose.
  const auto from = fam["greedy_from"].get<size_t>();
  const auto want = fam["greedy"].get<std::vector<TokenId>>();
  // The reference backend, then the cpu plugin at every level this CPU runs (a level it lacks is refused
  // by the plugin in one line: not run).
  for (const std::string run :
       {"reference", "scalar", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx"}) {
    SCOPED_TRACE(run);
    if (run != "reference") setenv("LOOM_CPU_ISA", run.c_str(), 1);
    PipelineConfig cfg;
    cfg.model.path = path;
    cfg.model.n_ctx = 128;
    cfg.backend.name = run == "reference" ? "reference" : "cpu";
    cfg.plugins.paths = {std::filesystem::path(std::getenv("LOOM_BIN")).parent_path().string()};
    cfg.samplers = {SamplerSpec{"temperature", {{"value", 0.0}}}};
    cfg.stop.eos = false;
    std::unique_ptr<Pipeline> pl;
    try {
      pl = Pipeline::create(cfg);
    } catch (const Error& e) {
      if (std::string(e.what()).find("this CPU lacks it") == std::string::npos) throw;
      continue;
    }
    GenerationRequest req;
    req.prompt_tokens =
        std::vector<TokenId>(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(from));
    req.max_new_tokens = static_cast<int32_t>(want.size());
    EXPECT_EQ(pl->generate(req).tokens, want) << arch;
  }
  unsetenv("LOOM_CPU_ISA");
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Golden, Families,
                         ::testing::Values("llama", "llama3", "mistral", "qwen2", "qwen3", "gemma2", "phi3",
                                           "smollm3", "qwen3moe", "qwen3moe_mxfp4", "gpt-oss",
                                           "gpt-oss_mxfp4"),
                         [](const auto& p) { // (a test's name: letters, digits and _)
                           std::string n = p.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

} // namespace
