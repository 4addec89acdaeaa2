// Hostile and careless input at the command line (issue 9): every case exits ≠ 0 with one or two
// lines naming what was expected and what was found — no crash, no hang, no silent success.
#include "test_util.hpp"

#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sstream>

namespace {

namespace fs = std::filesystem;

struct Case {
  const char* args; // after `loom`; {M} = the model, {D} = a directory, {T} = a temp dir
  int code;
  const char* needle; // in stderr
};

std::string expand(std::string s, const std::string& model, const std::string& dir) {
  for (auto [k, v] : {std::pair<std::string, std::string>{"{M}", model}, {"{D}", dir}}) {
    for (size_t p; (p = s.find(k)) != std::string::npos;)
      s.replace(p, k.size(), v);
  }
  return s;
}

size_t lines(const std::string& s) {
  size_t n = 0;
  for (char c : s)
    n += c == '\n';
  return n + (!s.empty() && s.back() != '\n');
}

TEST(HostileCli, EachBadInputIsAClearErrorOnOneLine) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const fs::path dir = fs::temp_directory_path() / ("loom-hostile-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  { std::ofstream(dir / "nul.toml") << "[model]\npath = \"" << model.string() << "\\u0000.other\"\n"; }
  const std::string nul_toml = (dir / "nul.toml").string();
  const Case cases[] = {
      {"run -m {M} -p hi -n 2 --set 'stop.strings=[\"unterminated'", 1, "not a valid TOML value"},
      {"run -m {M} -p hi -n 2 --set 'stop.strings={'", 1, "not a valid TOML value"},
      {"run -m {M} -n 2 --prompts {D}", 1, "is a directory"},
      {"run -m {M} -n 2 -f {D}", 1, "is a directory"},
      {"tokenize -m {M} --file {D}", 1, "is a directory"},
      {"run -c {D} -p hi", 1, "is a directory"},
      {"run -m {M} -p hi -n 2 --seed -1", 2, "expected an integer in 0..9223372036854775807"},
      {"run -m {M} -p hi -n 2 --seed 18446744073709551615", 2, "expected an integer in 0.."},
      {"run -m {M} -p hi -n 2 --seed 12abc", 2, "expected an integer"},
      {"bench -m {M} --threads -1", 2, "--threads must be in 0..1024"},
      {"bench -m {M} --pp 2147483647 --tg 1", 2, "--pp and --tg must be in 1.."},
      {"bench -m {M} --pp 1 --tg 2147483647", 2, "--pp and --tg must be in 1.."},
      {"bench -m {M} --pp 1000000 --tg 1", 1, "was trained on 2048; use at most that many in all"},
      {"run -m {M} -p hi -n 2 --ctx-size 2000000000", 1, "lower [model] n_ctx"}, // before allocating
      // a capability error names the backend the pipeline chose, not the reference backend
      {"run -m {M} -p hi -n 2 --set 'backend.name=\"reference\"' --set attention.kernel=flash", 1,
       "not supported by backend 'reference'"},
      {"run -m {M} -p hi -n 2 --set attention.sinks=4", 1, "needs a sliding window"},
      {"run -m {M} -p hi -n 2 --set attention.variant=standard --set attention.window=8", 1,
       "attention.window"},
      {"run -m {M} -p hi -n 2 --set kv_cache.dtype=q4_0", 1, "kv_cache.dtype"},
      {"run -m {M} -p hi -n 2 --set kv_cache.block_size=12", 1, "a power of two in 1..4096"},
      {"run -m {M} -p hi -n 2 --set 'verifier.name=\"\"'", 1,
       "verifier.name: expected the name of a verifier plugin, found the string ''"},
      {"run -m {M} -p hi -n 2 --set 'stop.strings=\"a\nb'", 1, "'\"a\\nb'"}, // a newline echoed as \n
  };
  for (const Case& c : cases) {
    const std::string args = expand(c.args, model.string(), dir.string());
    SCOPED_TRACE(args);
    const auto r = loom::test::run_loom(args, false, 60);
    EXPECT_EQ(r.code, c.code) << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    if (c.code == 1) {
      EXPECT_LE(lines(r.err), 2u) << r.err;
    }
  }
  { // a NUL in [model] path (TOML \u0000) would open another file
    const auto r = loom::test::run_loom("run -c " + nul_toml + " -p hi -n 2", false);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find("without NUL characters"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find('\0'), std::string::npos) << "the message itself must not carry the NUL";
  }
  fs::remove_all(dir);
}

// `--ctx-size 256 --set kv_cache.max_tokens=512 --parallel 4`: two KV sequences for four running
// requests. Requests wait for room; none ends empty.
TEST(HostileCli, RequestsBeyondTheKvCacheWaitInsteadOfEndingEmpty) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const fs::path prompts =
      fs::temp_directory_path() / ("loom-prompts-" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream f(prompts);
    for (const char* p : {"Once upon a time", "The dog", "Lily", "One day", "A big cat", "Tom and Sue"})
      f << p << "\n";
  }
  const auto r = loom::test::run_loom("run -m " + model.string() + " --prompts " + prompts.string() +
                                          " -n 8 --temp 0 --ctx-size 256 --set kv_cache.max_tokens=512 "
                                          "--parallel 4 --json",
                                      false);
  EXPECT_EQ(r.code, 0) << r.err;
  std::istringstream in(r.out);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["stop_reason"], "max_tokens") << line;
    EXPECT_EQ(j["tokens"].size(), 8u) << line;
    ++n;
  }
  EXPECT_EQ(n, 6);
  fs::remove(prompts);
}

} // namespace
