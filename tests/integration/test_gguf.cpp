// The GGUF reader on real files: stories260K truncated at many offsets and with flipped header bytes (an
// error, never a crash), its model configuration, and a vocabulary-only file refused as a model. (Files
// written in memory, hostile headers included: tests/unit/test_gguf.cpp.)
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/model/model_config.hpp"
#include "loom/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>
#include <random>

namespace {

using namespace loom;

TEST(Gguf, RealModelTruncatedAndFlipped) {
  LOOM_REQUIRE_MODEL(path, "stories260K.gguf");
  const std::string s = test::read_file(path);
  const std::vector<uint8_t> bytes(s.begin(), s.end());
  const auto good = GgufFile::parse(bytes, "stories260K.gguf");
  const uint64_t header = good.data_offset();
  // Every offset in the first KiB, then a stride through the header and the tensor data.
  std::vector<size_t> cuts;
  for (size_t n = 0; n < 1024; ++n)
    cuts.push_back(n);
  for (size_t n = 1024; n < header; n += 61)
    cuts.push_back(n);
  for (size_t n = header; n < bytes.size(); n += 40009)
    cuts.push_back(n);
  cuts.push_back(bytes.size() - 1);
  for (size_t n : cuts) {
    std::vector<uint8_t> b(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW((void)GgufFile::parse(b, "trunc.gguf"), Error) << "cut at " << n;
  }
  std::mt19937 rng(99);
  for (int iter = 0; iter < 1500; ++iter) {
    auto b = bytes;
    b[rng() % header] ^= static_cast<uint8_t>(1u << (rng() % 8));
    try {
      const auto f = GgufFile::parse(b, "flip.gguf");
      (void)ModelConfig::from_gguf(f);
      const auto tok = Tokenizer::from_gguf(f);
      (void)tok->encode("Once upon a time", {});
    } catch (const Error&) {
    }
  }
}

TEST(Gguf, ModelConfigOfStories260K) {
  LOOM_REQUIRE_MODEL(path, "stories260K.gguf");
  const auto f = GgufFile::open(path.string());
  const auto c = ModelConfig::from_gguf(f);
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_layer, 5);
  EXPECT_EQ(c.n_head, 8);
  EXPECT_EQ(c.n_head_kv, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.n_ff, 172);
  EXPECT_EQ(c.n_vocab, 512);
  EXPECT_EQ(c.n_ctx_train, 2048);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope.theta, 10000.0f);
  EXPECT_FALSE(c.tied_output);
  // 2 · L · H_kv · D · 4 bytes
  EXPECT_EQ(c.kv_bytes_per_token(DType::f32), 2u * 5 * 4 * 8 * 4);
  EXPECT_EQ(c.kv_bytes_per_token(DType::f16), 2u * 5 * 4 * 8 * 2);
}

TEST(Gguf, ModelConfigRejectsNonModels) {
  LOOM_REQUIRE_MODEL(path, "vocab/ggml-vocab-gpt-2.gguf");
  const auto f = GgufFile::open(path.string());
  EXPECT_THROW((void)ModelConfig::from_gguf(f), Error);
}

} // namespace
