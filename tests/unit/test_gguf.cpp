// GGUF reader: metadata of every type, tensors, and hostile files (truncated, wrong magic/version,
// absurd counts, flipped bytes) — each a loom::Error with an offset, never a crash.
#include "loom/error.hpp"
#include "loom/gguf.hpp"
#include "loom/model_config.hpp"
#include "loom/tokenizer.hpp"
#include "test_util.hpp"

#include <cstring>
#include <gtest/gtest.h>
#include <random>

namespace {

using namespace loom;

std::vector<uint8_t> small_file() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("general.alignment", 32);
  w.add_f32("some.float", 1.5f);
  w.add_bool("some.bool", true);
  GgufValue i64;
  i64.type = GgufType::i64;
  i64.i = -5;
  w.add("some.i64", i64);
  GgufValue f64;
  f64.type = GgufType::f64;
  f64.f = 2.25;
  w.add("some.f64", f64);
  GgufValue u8;
  u8.type = GgufType::u8;
  u8.u = 200;
  w.add("some.u8", u8);
  // nested array: [[1, 2], [3]] of i32
  GgufValue outer;
  outer.type = GgufType::array;
  outer.elem_type = GgufType::array;
  for (std::vector<int> inner : {std::vector<int>{1, 2}, std::vector<int>{3}}) {
    GgufValue a;
    a.type = GgufType::array;
    a.elem_type = GgufType::i32;
    for (int x : inner) {
      GgufValue e;
      e.type = GgufType::i32;
      e.i = x;
      a.items.push_back(e);
    }
    outer.items.push_back(a);
  }
  w.add("some.nested", outer);
  w.add_string_array("some.strings", {"a", "bc", ""});
  std::vector<float> data(64);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<float>(i) * 0.5f;
  std::vector<uint8_t> bytes(data.size() * 4);
  std::memcpy(bytes.data(), data.data(), bytes.size());
  w.add_tensor("t.f32", DType::f32, {32, 2}, bytes);
  std::vector<uint8_t> q(2 * 34);
  quantize_row(DType::q8_0, data.data(), q.data(), 64);
  w.add_tensor("t.q8", DType::q8_0, {64}, q);
  return w.serialize();
}

TEST(Gguf, RoundTripsEveryValueType) {
  const auto bytes = small_file();
  const auto f = GgufFile::parse(bytes, "mem");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_DOUBLE_EQ(f.get_float("some.float"), 1.5);
  EXPECT_EQ(f.get_bool_opt("some.bool"), true);
  EXPECT_EQ(f.get_int("some.i64"), -5);
  EXPECT_DOUBLE_EQ(f.get_float("some.f64"), 2.25);
  EXPECT_EQ(f.get_int("some.u8"), 200);
  const GgufValue* n = f.find("some.nested");
  ASSERT_NE(n, nullptr);
  ASSERT_EQ(n->items.size(), 2u);
  EXPECT_EQ(n->items[0].items[1].i, 2);
  EXPECT_EQ(n->items[1].items[0].i, 3);
  const GgufValue* s = f.get_array("some.strings", GgufType::string);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->items[1].str, "bc");
  EXPECT_EQ(s->items[2].str, "");
  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensor* t = f.find_tensor("t.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ne, (std::vector<int64_t>{32, 2}));
  EXPECT_EQ(t->offset % 32, 0u);
  float x;
  std::memcpy(&x, t->data + 4 * 5, 4);
  EXPECT_FLOAT_EQ(x, 2.5f);
  const GgufTensor* q = f.find_tensor("t.q8");
  ASSERT_NE(q, nullptr);
  std::vector<float> back(64);
  dequantize_row(q->type, q->data, back.data(), 64);
  for (int i = 0; i < 64; ++i)
    EXPECT_NEAR(back[static_cast<size_t>(i)], i * 0.5f, 31.5f / 127.0f);
}

TEST(Gguf, TypedGettersNameTheKey) {
  const auto bytes = small_file();
  const auto f = GgufFile::parse(bytes, "mem");
  try {
    (void)f.get_int("general.architecture");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("general.architecture"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)f.get_string("missing.key"), Error);
  EXPECT_EQ(f.get_int_opt("missing.key"), std::nullopt);
}

void expect_parse_error(const std::vector<uint8_t>& bytes, const std::string& needle) {
  try {
    (void)GgufFile::parse(bytes, "bad.gguf");
    FAIL() << "expected a loom::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.gguf"), std::string::npos) << e.what();
  }
}

TEST(Gguf, WrongMagicAndVersion) {
  auto bytes = small_file();
  auto b = bytes;
  b[0] = 'X';
  expect_parse_error(b, "magic");
  b = bytes;
  b[4] = 1;
  expect_parse_error(b, "version 1");
  b = bytes;
  b[4] = 7;
  expect_parse_error(b, "version");
  expect_parse_error({}, "bytes");
  expect_parse_error({'G', 'G'}, "bytes");
}

TEST(Gguf, AbsurdCountsAreRejectedBeforeAllocating) {
  auto bytes = small_file();
  auto b = bytes;
  const uint64_t huge = 0x7FFFFFFFFFFFFFFFull;
  std::memcpy(b.data() + 8, &huge, 8); // tensor count
  expect_parse_error(b, "tensor count");
  b = bytes;
  std::memcpy(b.data() + 16, &huge, 8); // kv count
  expect_parse_error(b, "metadata count");
  // A string length larger than the file.
  b = bytes;
  std::memcpy(b.data() + 24, &huge, 8); // first key's length
  expect_parse_error(b, "string length");
}

TEST(Gguf, TruncatedAtEveryHeaderOffsetIsAnError) {
  const auto bytes = small_file();
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> b(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      (void)GgufFile::parse(b, "trunc.gguf");
      // A prefix that only loses alignment padding after the last tensor can still be complete.
      EXPECT_GE(n, bytes.size() - 32) << "truncated at " << n << " parsed without error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::parse_error);
    }
  }
}

// Random byte flips: the reader and the consumers of its metadata either accept the file or say
// why — never crash, hang or allocate absurdly.
TEST(Gguf, FlippedBytesNeverCrash) {
  const auto bytes = small_file();
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = bytes;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k)
      b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    try {
      const auto f = GgufFile::parse(b, "flip.gguf");
      for (const auto& t : f.tensors()) {
        std::vector<float> out(static_cast<size_t>(t.n_elements));
        if (dtype_traits(t.type).can_dequantize) dequantize_row(t.type, t.data, out.data(), t.ne[0]);
      }
    } catch (const Error&) {
    }
  }
}

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

TEST(Gguf, OpenMissingFileSaysSo) {
  try {
    (void)GgufFile::open("/nonexistent/model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
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
