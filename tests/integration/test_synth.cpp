// `loom synth` files with stories260K's vocabulary: every offered type loads and generates in Loom, with
// the requested shape. (A synthetic vocabulary, bad input and the families: tests/unit/test_synth.cpp.)
#include "loom/format/gguf.hpp"
#include "loom/model/synth.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "test_util.hpp"

#include <cmath>
#include <filesystem>
#include <gtest/gtest.h>

namespace {

using namespace loom;

TEST(Synth, EveryTypeLoadsAndGenerates) {
  LOOM_REQUIRE_MODEL(vocab, "stories260K.gguf");
  const auto dir = std::filesystem::temp_directory_path() / "loom_synth_test";
  std::filesystem::create_directories(dir);
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q4_0}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    SynthOptions o;
    o.shape = "stories15m";
    o.type = t;
    o.vocab_from = vocab.string();
    o.out = (dir / ("s15-" + std::string(dtype_name(t)) + ".gguf")).string();
    synth_model(o);
    const auto f = GgufFile::open(o.out);
    const auto c = ModelConfig::from_gguf(f);
    EXPECT_EQ(c.n_embd, 288);
    EXPECT_EQ(c.n_layer, 6);
    EXPECT_EQ(c.n_ff, 768);
    EXPECT_EQ(c.n_vocab, 512); // the vocabulary's size wins
    EXPECT_EQ(c.weight_type, t);
    EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
    if (t == DType::f32) { // weights have the promised spread
      const GgufTensor* w = f.find_tensor("blk.0.ffn_up.weight");
      ASSERT_NE(w, nullptr);
      const auto* x = reinterpret_cast<const float*>(w->data);
      double ss = 0;
      for (int64_t i = 0; i < w->n_elements; ++i)
        ss += static_cast<double>(x[i]) * static_cast<double>(x[i]);
      EXPECT_NEAR(std::sqrt(ss / static_cast<double>(w->n_elements)), 0.02, 0.002);
    }
    PipelineConfig cfg;
    cfg.model.path = o.out;
    cfg.samplers = {SamplerSpec{"greedy", {}}};
    cfg.stop.eos = false;
    auto p = Pipeline::create(cfg);
    GenerationRequest req;
    req.prompt = "Once upon a time";
    req.max_new_tokens = 6;
    const auto r = p->generate(req);
    EXPECT_EQ(r.tokens.size(), 6u);
    for (float lp : r.logprobs)
      EXPECT_TRUE(std::isfinite(lp));
    std::filesystem::remove(o.out);
  }
}

} // namespace
