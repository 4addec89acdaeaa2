// GGUF reader on files written in memory: metadata of every type, tensors, and hostile files (truncated,
// wrong magic/version, absurd counts, flipped bytes) — each a loom::Error with an offset, never a crash.
// (Real model files: tests/integration/test_gguf.cpp.)
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"

#include <cstring>
#include <gtest/gtest.h>
#include <memory>
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

void expect_parse_error_in(const std::vector<uint8_t>& bytes, const GgufLimits& limits,
                           const std::string& needle) {
  try {
    (void)GgufFile::parse(bytes, "bad.gguf", limits);
    FAIL() << "expected a loom::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.gguf"), std::string::npos) << e.what();
  }
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

// Arrays stay in the file's bytes: numbers are read in place, strings are views.
TEST(Gguf, ArraysAreCompactViews) {
  GgufWriter w;
  GgufValue f32s, i32s, bools;
  f32s.type = i32s.type = bools.type = GgufType::array;
  f32s.elem_type = GgufType::f32;
  i32s.elem_type = GgufType::i32;
  bools.elem_type = GgufType::boolean;
  for (int k = 0; k < 1000; ++k) {
    GgufValue e;
    e.type = GgufType::f32;
    e.f = k * 0.5;
    f32s.items.push_back(e);
    e.type = GgufType::i32;
    e.i = -k;
    i32s.items.push_back(e);
    e.type = GgufType::boolean;
    e.u = k % 2;
    bools.items.push_back(e);
  }
  w.add("a.f32", f32s);
  w.add("a.i32", i32s);
  w.add("a.bool", bools);
  w.add_string_array("a.str", {"x", "yz", ""});
  auto bytes = std::make_unique<std::vector<uint8_t>>(w.serialize());
  GgufValue copy;
  {
    const auto f = GgufFile::parse(*bytes, "mem");
    const GgufArray& a = f.get_array("a.f32", GgufType::f32)->items;
    EXPECT_TRUE(a.is_view());
    EXPECT_EQ(a.heap_bytes(), 0u);
    ASSERT_EQ(a.size(), 1000u);
    EXPECT_EQ(a.as_number(999), 499.5);
    EXPECT_EQ(a.as_int(1), std::nullopt); // not an integer array
    const GgufArray& b = f.get_array("a.i32", GgufType::i32)->items;
    EXPECT_EQ(b.as_int(7), -7);
    EXPECT_EQ(b.as_number(7), -7.0);
    EXPECT_EQ(b[7].i, -7);
    const GgufArray& c = f.get_array("a.bool", GgufType::boolean)->items;
    EXPECT_EQ(c.as_bool(3), true);
    EXPECT_EQ(c.as_bool(4), false);
    EXPECT_EQ(c.as_int(3), std::nullopt);
    const GgufValue* s = f.get_array("a.str", GgufType::string);
    EXPECT_EQ(s->items.heap_bytes(), 3 * sizeof(std::string_view));
    EXPECT_EQ(s->items.str(1), "yz");
    EXPECT_EQ(s->items.str(2), "");
    EXPECT_EQ(s->to_string(), "[string × 3] {\"x\", \"yz\", \"\"}");
    copy = *s;
    copy.items.detach(); // outlives the bytes
    EXPECT_FALSE(copy.items.is_view());
  }
  bytes.reset();
  EXPECT_EQ(copy.items.str(1), "yz");
}

// What a parse may allocate is capped: an error names the key and the limit, before allocating.
TEST(Gguf, MetadataMemoryIsCapped) {
  GgufWriter w;
  w.add_string_array("many.strings", std::vector<std::string>(100000, "ab"));
  const auto bytes = w.serialize();
  const auto f = GgufFile::parse(bytes, "many.gguf");
  EXPECT_GE(f.metadata_bytes(), 100000 * sizeof(std::string_view));
  EXPECT_LT(f.metadata_bytes(), 100000 * sizeof(std::string_view) + 4096);
  try {
    (void)GgufFile::parse(bytes, "many.gguf", GgufLimits{1 << 20});
    FAIL() << "expected the metadata limit to refuse the file";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), Errc::parse_error);
    EXPECT_NE(m.find("many.strings"), std::string::npos) << m;
    EXPECT_NE(m.find("limit of 1.0 MiB"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  // Counts that fit the file but not the limit fail before the vectors are reserved.
  std::vector<uint8_t> b = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
  const uint64_t n_tensors = 0, n_kv = 1000000;
  b.insert(b.end(), reinterpret_cast<const uint8_t*>(&n_tensors),
           reinterpret_cast<const uint8_t*>(&n_tensors) + 8);
  b.insert(b.end(), reinterpret_cast<const uint8_t*>(&n_kv), reinterpret_cast<const uint8_t*>(&n_kv) + 8);
  b.resize(b.size() + 13 * n_kv, 0);
  expect_parse_error_in(b, GgufLimits{1 << 20}, "1000000 metadata entries");
}

TEST(Gguf, WriterOwnsWhatItIsGiven) {
  auto bytes = std::make_unique<std::vector<uint8_t>>(small_file());
  GgufWriter w;
  {
    const auto f = GgufFile::parse(*bytes, "mem");
    for (const auto& kv : f.metadata())
      w.add(kv.key, kv.value);
  }
  bytes.reset(); // the writer must not point into these bytes
  const auto again = w.serialize();
  const auto g = GgufFile::parse(again, "again");
  EXPECT_EQ(g.get_array("some.strings", GgufType::string)->items.str(1), "bc");
  EXPECT_EQ(g.find("some.nested")->items.nested(0).items.as_int(1), 2);
  // An array's elements must all have its element type.
  GgufValue a;
  a.type = GgufType::array;
  a.elem_type = GgufType::i32;
  GgufValue e;
  e.type = GgufType::i32;
  a.items.push_back(e);
  e.type = GgufType::f32;
  EXPECT_THROW(a.items.push_back(e), Error);
  a.elem_type = GgufType::u8;
  EXPECT_THROW(GgufWriter().add("mixed", a), Error);
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

TEST(Gguf, OpenMissingFileSaysSo) {
  try {
    (void)GgufFile::open("/nonexistent/model.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
  }
}

} // namespace
