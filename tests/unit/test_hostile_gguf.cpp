// Hostile GGUF files that used to be accepted, hang or exhaust memory: large arrays, overlapping
// tensors, non-finite RoPE parameters, FIFOs and directories, invalid UTF-8, NUL bytes in the path.
// Each case is a one-line loom::Error (exit 1 from the CLI) or, for inspect --json, valid JSON.
#include "gguf_values.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/model/model_config.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <limits>
#include <malloc.h>
#include <map>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

namespace {

using namespace loom;
using namespace loom::test; // gguf_values.hpp
namespace fs = std::filesystem;

// ---- crafting files ------------------------------------------------------------------------------

using Meta = std::map<std::string, GgufValue>;

// Metadata of a complete tiny Llama (n_embd 8, one block, 2 heads, n_ff 16, 8-token vocabulary).
Meta tiny_meta() {
  Meta m;
  m["general.architecture"] = str_value("llama");
  m["general.name"] = str_value("tiny");
  m["llama.context_length"] = u32_value(64);
  m["llama.embedding_length"] = u32_value(8);
  m["llama.block_count"] = u32_value(1);
  m["llama.feed_forward_length"] = u32_value(16);
  m["llama.attention.head_count"] = u32_value(2);
  m["llama.attention.head_count_kv"] = u32_value(2);
  m["llama.rope.freq_base"] = f32_value(10000.0f);
  m["llama.attention.layer_norm_rms_epsilon"] = f32_value(1e-5f);
  m["tokenizer.ggml.model"] = str_value("llama");
  m["tokenizer.ggml.tokens"] = strings({"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "c", "d"});
  m["tokenizer.ggml.scores"] = array_of(GgufType::f32, {0, 0, 0, -1, -2, -3, -4, -5});
  m["tokenizer.ggml.token_type"] = array_of(GgufType::i32, {2, 3, 3, 1, 1, 1, 1, 1});
  m["tokenizer.ggml.bos_token_id"] = u32_value(1);
  m["tokenizer.ggml.eos_token_id"] = u32_value(2);
  return m;
}

std::vector<uint8_t> f32_bytes(size_t n) {
  std::vector<float> x(n, 0.25f);
  std::vector<uint8_t> b(n * 4);
  std::memcpy(b.data(), x.data(), b.size());
  return b;
}

std::vector<uint8_t> tiny_model(const Meta& m, const std::string& extra_tensor = "") {
  GgufWriter w;
  for (const auto& [k, v] : m)
    w.add(k, v);
  auto t = [&](const std::string& name, std::vector<int64_t> ne) {
    size_t n = 1;
    for (auto e : ne)
      n *= static_cast<size_t>(e);
    w.add_tensor(name, DType::f32, ne, f32_bytes(n));
  };
  t("token_embd.weight", {8, 8});
  t("blk.0.attn_norm.weight", {8});
  t("blk.0.attn_q.weight", {8, 8});
  t("blk.0.attn_k.weight", {8, 8});
  t("blk.0.attn_v.weight", {8, 8});
  t("blk.0.attn_output.weight", {8, 8});
  t("blk.0.ffn_norm.weight", {8});
  t("blk.0.ffn_gate.weight", {8, 16});
  t("blk.0.ffn_up.weight", {8, 16});
  t("blk.0.ffn_down.weight", {16, 8});
  t("output_norm.weight", {8});
  if (!extra_tensor.empty()) t(extra_tensor, {8});
  return w.serialize();
}

// Byte position of tensor `name`'s offset field in the tensor infos.
size_t tensor_offset_field(const std::vector<uint8_t>& bytes, const std::string& name) {
  std::vector<uint8_t> needle(8);
  const uint64_t len = name.size();
  std::memcpy(needle.data(), &len, 8);
  needle.insert(needle.end(), name.begin(), name.end());
  const auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  EXPECT_NE(it, bytes.end()) << name;
  size_t p = static_cast<size_t>(it - bytes.begin()) + needle.size();
  uint32_t n_dims;
  std::memcpy(&n_dims, bytes.data() + p, 4);
  return p + 4 + 8 * n_dims + 4;
}
uint64_t get_u64(const std::vector<uint8_t>& b, size_t p) {
  uint64_t v;
  std::memcpy(&v, b.data() + p, 8);
  return v;
}
void set_u64(std::vector<uint8_t>& b, size_t p, uint64_t v) {
  std::memcpy(b.data() + p, &v, 8);
}

// A directory of this process's own, removed at exit.
fs::path temp_dir() {
  struct Dir {
    fs::path path = fs::temp_directory_path() / ("loom-hostile-gguf-" + std::to_string(::getpid()));
    Dir() { fs::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Dir d;
  return d.path;
}

fs::path write_file(const std::string& name, const std::vector<uint8_t>& bytes) {
  const fs::path p = temp_dir() / name;
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return p;
}

// `$LOOM_BIN args` killed after 10 s: a hang shows as exit code 137 instead of a stuck test.
test::CliResult loom_cli(const std::string& args, bool merge_stderr = true) {
  return test::run_loom(args, merge_stderr, 10);
}

size_t lines(const std::string& s) {
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

// The loom::Error that `fn` throws (fails the test when it throws none).
template <class F> std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a loom::Error";
  return "";
}

std::string config_error(const Meta& m) {
  const auto bytes = tiny_model(m);
  return error_of([&] {
    const GgufFile f = GgufFile::parse(bytes, "tiny.gguf");
    (void)ModelConfig::from_gguf(f);
  });
}

#define EXPECT_ONE_LINE_WITH(msg, needle)                                                                    \
  do {                                                                                                       \
    EXPECT_NE((msg).find(needle), std::string::npos) << (msg);                                               \
    EXPECT_EQ((msg).find('\n'), std::string::npos) << "multi-line: " << (msg);                               \
  } while (0)

// ---- arrays ---------------------------------------------------------------------------------------

// magic, version 3, no tensors, one key
std::vector<uint8_t> one_key_header(const std::string& key) {
  std::vector<uint8_t> b;
  auto put = [&b](auto v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  };
  put(uint32_t{0x46554747u});
  put(uint32_t{3});
  put(uint64_t{0});
  put(uint64_t{1});
  put(uint64_t{key.size()});
  b.insert(b.end(), key.begin(), key.end());
  return b;
}
template <class T> void put_raw(std::vector<uint8_t>& b, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof v);
}

size_t heap_in_use() {
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

TEST(HostileGguf, EightMiBArrayOfU8TakesLittleMemory) {
  constexpr uint64_t n = 8ull << 20;
  std::vector<uint8_t> bytes = one_key_header("big.u8");
  put_raw(bytes, uint32_t{9}); // array
  put_raw(bytes, uint32_t{0}); // of u8
  put_raw(bytes, n);
  const size_t at = bytes.size();
  bytes.resize(at + n);
  for (uint64_t k = 0; k < n; ++k)
    bytes[at + k] = static_cast<uint8_t>(k * 7);

  const size_t before = heap_in_use();
  const GgufFile f = GgufFile::parse(bytes, "big.gguf");
  const size_t after = heap_in_use();
  // ~96 bytes per element would be 800 MB; the array now stays in the file's bytes.
  EXPECT_LT(after > before ? after - before : 0, size_t{1} << 20)
      << "parsing an 8 MiB u8 array took " << (after - before) << " bytes of heap";
  const GgufValue* v = f.find("big.u8");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->items.size(), n);
  EXPECT_EQ(v->items[123457].u, static_cast<uint8_t>(123457 * 7));
  EXPECT_EQ(v->items[n - 1].u, static_cast<uint8_t>((n - 1) * 7));
}

TEST(HostileGguf, BillionElementArraysInASmallFileAreClearErrors) {
  for (uint32_t elem : {0u, 6u, 8u, 9u}) { // u8, f32, string, array
    std::vector<uint8_t> bytes = one_key_header("huge");
    put_raw(bytes, uint32_t{9});
    put_raw(bytes, elem);
    put_raw(bytes, uint64_t{1000000000});
    bytes.resize(bytes.size() + 64, 0);
    const std::string msg = error_of([&] { (void)GgufFile::parse(bytes, "huge.gguf"); });
    EXPECT_ONE_LINE_WITH(msg, "array of 1000000000");
    EXPECT_NE(msg.find("huge.gguf"), std::string::npos) << msg;
  }
}

// ---- tensors --------------------------------------------------------------------------------------

TEST(HostileGguf, OverlappingTensorsAreRejected) {
  const auto good = tiny_model(tiny_meta());
  (void)GgufFile::parse(good, "tiny.gguf"); // the unpatched model is fine
  const size_t q = tensor_offset_field(good, "blk.0.attn_q.weight");
  const size_t k = tensor_offset_field(good, "blk.0.attn_k.weight");
  for (uint64_t shift : {uint64_t{0}, uint64_t{32}, uint64_t{224}}) {
    auto bad = good;
    set_u64(bad, k, get_u64(good, q) + shift); // k starts inside q's 256 bytes
    const std::string msg = error_of([&] { (void)GgufFile::parse(bad, "overlap.gguf"); });
    EXPECT_ONE_LINE_WITH(msg, "overlap");
    EXPECT_NE(msg.find("blk.0.attn_q.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("blk.0.attn_k.weight"), std::string::npos) << msg;
  }
  // Adjacent tensors share no byte.
  auto adjacent = good;
  set_u64(adjacent, k, get_u64(good, q) + 256);
  set_u64(adjacent, tensor_offset_field(good, "blk.0.attn_v.weight"), get_u64(good, k) + 256);
  (void)GgufFile::parse(adjacent, "adjacent.gguf");
}

TEST(HostileGguf, OverlappingTensorsExitOneFromTheCli) {
  LOOM_REQUIRE_BIN();
  auto bad = tiny_model(tiny_meta());
  set_u64(bad, tensor_offset_field(bad, "output_norm.weight"),
          get_u64(bad, tensor_offset_field(bad, "token_embd.weight")));
  const auto p = write_file("overlap.gguf", bad);
  const auto r = loom_cli("inspect " + p.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("overlap"), std::string::npos) << r.out;
  EXPECT_LE(lines(r.out), 2u) << r.out;
}

// ---- RoPE -----------------------------------------------------------------------------------------

TEST(HostileGguf, FreqBaseMustBeFiniteAndPositive) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::pair<float, const char*> cases[] = {
      {inf, "inf"}, {-inf, "-inf"}, {nan, "NaN"}, {0.0f, "0"}, {-1.0f, "-1"}};
  for (const auto& [x, shown] : cases) {
    Meta m = tiny_meta();
    m["llama.rope.freq_base"] = f32_value(x);
    const std::string msg = config_error(m);
    EXPECT_ONE_LINE_WITH(msg, "llama.rope.freq_base");
    EXPECT_NE(msg.find(std::string("found ") + shown), std::string::npos) << msg;
  }
}

TEST(HostileGguf, RopeScalingFactorMustBeFiniteAndPositive) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const char* key : {"llama.rope.scaling.factor", "llama.rope.scale_linear"}) {
    for (float x : {nan, inf, 0.0f, -2.0f}) {
      for (const char* type : {"linear", "yarn", "none"}) {
        Meta m = tiny_meta();
        m["llama.rope.scaling.type"] = str_value(type);
        m[key] = f32_value(x);
        const std::string msg = config_error(m);
        EXPECT_ONE_LINE_WITH(msg, key);
      }
    }
  }
}

TEST(HostileGguf, YarnOriginalContextMustBePositive) {
  for (GgufValue v : {u32_value(0), i32_value(0), i32_value(-4096)}) {
    Meta m = tiny_meta();
    m["llama.rope.scaling.type"] = str_value("yarn");
    m["llama.rope.scaling.factor"] = f32_value(4.0f);
    m["llama.rope.scaling.original_context_length"] = v;
    const std::string msg = config_error(m);
    EXPECT_ONE_LINE_WITH(msg, "llama.rope.scaling.original_context_length");
    EXPECT_NE(msg.find("found " + std::to_string(v.type == GgufType::u32 ? 0 : v.i)), std::string::npos)
        << msg;
  }
  // A sound YaRN setup still loads.
  Meta m = tiny_meta();
  m["llama.rope.scaling.type"] = str_value("yarn");
  m["llama.rope.scaling.factor"] = f32_value(4.0f);
  m["llama.rope.scaling.original_context_length"] = u32_value(16);
  const auto bytes = tiny_model(m);
  const ModelConfig c = ModelConfig::from_gguf(GgufFile::parse(bytes, "tiny.gguf"));
  EXPECT_EQ(c.rope.scaling, RopeScaling::yarn);
  EXPECT_EQ(c.rope.orig_ctx, 16);
  EXPECT_FLOAT_EQ(c.rope.factor, 4.0f);
}

TEST(HostileGguf, NonFiniteRopeExitsOneFromTheCli) {
  LOOM_REQUIRE_BIN();
  Meta m = tiny_meta();
  m["llama.rope.freq_base"] = f32_value(std::numeric_limits<float>::infinity());
  const auto p = write_file("inf_theta.gguf", tiny_model(m));
  const auto r = loom_cli("inspect " + p.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("llama.rope.freq_base"), std::string::npos) << r.out;
  EXPECT_LE(lines(r.out), 2u) << r.out;
  // The unpatched model inspects fine.
  const auto ok = write_file("tiny.gguf", tiny_model(tiny_meta()));
  EXPECT_EQ(loom_cli("inspect " + ok.string()).code, 0);
}

TEST(HostileGguf, FileValuesAreEchoedOnOneLine) {
  Meta m = tiny_meta();
  m["general.architecture"] = str_value("llama\nloom: error: forged second line");
  std::string msg = config_error(m);
  EXPECT_ONE_LINE_WITH(msg, "llama\\nloom: error: forged");
  m = tiny_meta();
  m["llama.rope.scaling.type"] = str_value("yarn\r\n");
  msg = config_error(m);
  EXPECT_ONE_LINE_WITH(msg, "yarn\\r\\n");
  m = tiny_meta();
  m["llama.context_length"] = str_value("many\nlines");
  msg = config_error(m);
  EXPECT_ONE_LINE_WITH(msg, "many\\nlines");
}

// ---- paths ----------------------------------------------------------------------------------------

TEST(HostileGguf, DirectoryIsNotAModel) {
  const fs::path d = temp_dir() / "model_dir.gguf";
  fs::create_directories(d);
  const std::string msg = error_of([&] { (void)GgufFile::open(d.string()); });
  EXPECT_ONE_LINE_WITH(msg, "directory");
  EXPECT_NE(msg.find("regular"), std::string::npos) << msg;
  if (!std::getenv("LOOM_BIN")) return;
  const auto r = loom_cli("inspect " + d.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("directory"), std::string::npos) << r.out;
  EXPECT_LE(lines(r.out), 2u) << r.out;
}

TEST(HostileGguf, FifoIsAnErrorNotAHang) {
  LOOM_REQUIRE_BIN();
  const fs::path p = temp_dir() / "model.fifo";
  fs::remove(p);
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  const auto r = loom_cli("inspect " + p.string());
  EXPECT_NE(r.code, 137) << "loom inspect FIFO hung (killed by the 10 s limit)";
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FIFO"), std::string::npos) << r.out;
  EXPECT_LE(lines(r.out), 2u) << r.out;
  // In process too (only when the CLI did not hang: a hanging open would block this test).
  if (r.code == 1) {
    const std::string msg = error_of([&] { (void)GgufFile::open(p.string()); });
    EXPECT_ONE_LINE_WITH(msg, "FIFO");
  }
  fs::remove(p);
}

TEST(HostileGguf, NulByteInPathIsRefused) {
  const auto p = write_file("real.gguf", tiny_model(tiny_meta()));
  (void)GgufFile::open(p.string()); // the file itself is fine
  std::string with_nul = p.string();
  with_nul += '\0';
  with_nul += "../other.gguf";
  const std::string msg = error_of([&] { (void)GgufFile::open(with_nul); });
  EXPECT_ONE_LINE_WITH(msg, "NUL");
  EXPECT_EQ(msg.find('\0'), std::string::npos) << "the message holds a raw NUL";
}

// ---- invalid UTF-8 --------------------------------------------------------------------------------

TEST(HostileGguf, InspectJsonSurvivesInvalidUtf8) {
  LOOM_REQUIRE_BIN();
  Meta m = tiny_meta();
  m["general.name"] = str_value("bad \xff\xfe name \xc3");
  m["general.bad\xc3\x28key"] = str_value("value \x80\xbf\n end");
  m["general.bad_strings"] = strings({"ok", "\xed\xa0\x80", "\xf8\x88\x80\x80\x80"});
  const auto p = write_file("bad_utf8.gguf", tiny_model(m, "extra.\xff\xfe.weight"));
  for (const char* flags : {"--json", "--json --metadata"}) {
    const auto r = loom_cli("inspect " + p.string() + " " + flags, false);
    ASSERT_EQ(r.code, 0) << flags << ": " << r.out;
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
    ASSERT_TRUE(j["name"].is_string());
    EXPECT_NE(j["name"].get<std::string>().find("name"), std::string::npos) << j.dump();
    if (std::string(flags).find("metadata") != std::string::npos) {
      EXPECT_TRUE(j["metadata"].is_object());
      EXPECT_EQ(j["metadata"].size(), m.size());
    }
  }
  // The text form keeps one line per key.
  const auto r = loom_cli("inspect " + p.string() + " --metadata", false);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("value \x80"), std::string::npos) << "raw bytes in: " << r.out;
}

} // namespace
