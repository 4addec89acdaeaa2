// Pipeline TOML: validation messages name file, line, column and the expected form.
#include "loom/error.hpp"
#include "loom/pipeline/pipeline_config.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>

namespace {

using namespace loom;

std::string error_of(const std::string& toml, const std::vector<ConfigOverride>& o = {}) {
  try {
    (void)parse_pipeline(toml, "p.toml", o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& toml, std::initializer_list<const char*> needles,
                  const std::vector<ConfigOverride>& o = {}) {
  const std::string e = error_of(toml, o);
  ASSERT_FALSE(e.empty()) << "expected an error for:\n" << toml;
  for (const char* n : needles)
    EXPECT_NE(e.find(n), std::string::npos) << "'" << n << "' not in: " << e;
}

TEST(Config, FullPipelineParses) {
  const auto c = parse_pipeline(R"(
[model]
path = "m.gguf"
n_ctx = 256
[backend]
name = "reference"
threads = 2
[attention]
variant = "sliding_window"
window = 64
[kv_cache]
store = "contiguous"
[decoder]
name = "sample"
[[sampler]]
name = "top_k"
k = 40
[[sampler]]
name = "top_p"
p = 0.9
[[sampler]]
name = "temperature"
value = 0.7
[stop]
max_tokens = 32
strings = ["\n\n", "END"]
token_ids = [13]
eos = false
timeout_ms = 1000
[run]
seed = 42
add_bos = true
)",
                                "p.toml");
  EXPECT_EQ(c.model.path, "m.gguf");
  EXPECT_EQ(c.model.n_ctx, 256);
  EXPECT_EQ(c.attention.window, 64);
  ASSERT_EQ(c.samplers.size(), 3u);
  EXPECT_EQ(c.samplers[0].name, "top_k");
  EXPECT_EQ(std::get<int64_t>(c.samplers[0].params[0].second), 40);
  EXPECT_DOUBLE_EQ(std::get<double>(c.samplers[1].params[0].second), 0.9);
  EXPECT_EQ(c.stop.strings.size(), 2u);
  EXPECT_EQ(c.stop.token_ids, std::vector<int64_t>{13});
  EXPECT_FALSE(c.stop.eos);
  EXPECT_EQ(c.run.seed, 42u);
}

TEST(Config, MalformedTomlNamesLineAndColumn) {
  expect_error("[model]\npath = \n", {"p.toml:2:", "TOML"});
  expect_error("[model\n", {"p.toml:1:"});
}

TEST(Config, UnknownKeysAndSections) {
  expect_error("[model]\npath = \"m\"\npaht = \"x\"\n",
               {"p.toml:3:1", "unknown key 'paht'", "[model]", "path"});
  expect_error("[modle]\npath = \"m\"\n", {"p.toml:1:", "unknown key 'modle'"});
  expect_error("[[sampler]]\nname = \"top_k\"\nkk = 3\n", {"p.toml:3:1", "unknown key 'kk'", "top_k"});
}

TEST(Config, WrongTypes) {
  expect_error("[model]\npath = 3\n", {"p.toml:2:8", "model.path", "expected a string", "found 3"});
  expect_error("[stop]\nmax_tokens = \"ten\"\n", {"p.toml:2:", "stop.max_tokens", "expected an integer"});
  expect_error("[stop]\neos = 1\n", {"stop.eos", "true or false"});
  expect_error("model = 3\n", {"[model]", "a table"});
  expect_error("[[sampler]]\nname = \"top_p\"\np = \"x\"\n", {"p.toml:3:5", "top_p", "expected a number"});
}

TEST(Config, OutOfRangeValues) {
  expect_error("[[sampler]]\nname = \"top_p\"\np = 1.5\n", {"p.toml:3:5", "top_p", "found 1.5"});
  expect_error("[[sampler]]\nname = \"top_p\"\np = 0.0\n", {"top_p", "found 0"});
  expect_error("[[sampler]]\nname = \"temperature\"\nvalue = -0.5\n", {"temperature", "found -0.5"});
  expect_error("[[sampler]]\nname = \"top_k\"\nk = -1\n", {"top_k", "found -1"});
  expect_error("[stop]\nmax_tokens = -2\n", {"stop.max_tokens", "found -2"});
  expect_error("[attention]\nvariant = \"sideways\"\n", {"attention.variant", "\"standard\"", "sideways"});
  // A name that is not built in is a plugin sampler: resolved (or refused) when the pipeline is built.
  EXPECT_EQ(parse_pipeline("[[sampler]]\nname = \"nucleus\"\nq = 0.5\n", "p.toml").samplers[0].name,
            "nucleus");
  expect_error("[[sampler]]\nk = 3\n", {"'name'"});
  expect_error("[stop]\nstrings = [\"\"]\n", {"stop.strings", "non-empty"});
}

TEST(Config, SetOverridesAnyKey) {
  const std::string base = "[model]\npath = \"m.gguf\"\n[[sampler]]\nname = \"top_p\"\np = 0.9\n";
  auto c = parse_pipeline(base, "p.toml",
                          {parse_override("stop.max_tokens=7"), parse_override("model.path=other.gguf"),
                           parse_override("sampler.0.p=0.5"), parse_override("run.seed=3"),
                           parse_override("stop.strings=[\"a\", \"b\"]")});
  EXPECT_EQ(c.stop.max_tokens, 7);
  EXPECT_EQ(c.model.path, "other.gguf");
  EXPECT_DOUBLE_EQ(std::get<double>(c.samplers[0].params[0].second), 0.5);
  EXPECT_EQ(c.run.seed, 3u);
  EXPECT_EQ(c.stop.strings, (std::vector<std::string>{"a", "b"}));
  // A bare word that is not a TOML literal is a string.
  c = parse_pipeline(base, "p.toml", {parse_override("backend.name=reference")});
  EXPECT_EQ(c.backend.name, "reference");
  // An overridden value is validated like any other, and the message says it came from --set.
  expect_error(base, {"--set", "stop.max_tokens", "expected an integer"},
               {parse_override("stop.max_tokens=lots")});
  expect_error(base, {"--set", "unknown key 'nope'"}, {parse_override("stop.nope=1")});
  expect_error(base, {"sampler index 3"}, {parse_override("sampler.3.p=0.5")});
  EXPECT_THROW(parse_override("no-equals"), Error);
  EXPECT_THROW(parse_override("=1"), Error);
  expect_error(base, {"section.key=value"}, {parse_override("max_tokens=1")});
}

// A front end's default (ConfigOverride::if_absent, loom serve's paged store) applies where the file sets
// nothing at that key, and never over the file's own value; a later plain override still wins.
TEST(Config, DefaultsApplyOnlyWhereTheFileIsSilent) {
  const ConfigOverride paged{"kv_cache.store", "\"paged\"", true};
  EXPECT_EQ(parse_pipeline("[model]\npath = \"m.gguf\"\n", "p.toml", {paged}).kv_cache.store, "paged");
  EXPECT_EQ(parse_pipeline("[kv_cache]\ndtype = \"f16\"\n", "p.toml", {paged}).kv_cache.store, "paged");
  EXPECT_EQ(parse_pipeline("[kv_cache]\nstore = \"contiguous\"\n", "p.toml", {paged}).kv_cache.store,
            "contiguous");
  EXPECT_EQ(parse_pipeline("", "p.toml", {paged, parse_override("kv_cache.store=contiguous")}).kv_cache.store,
            "contiguous");
}

TEST(Config, ToTomlRoundTrips) {
  const auto c = parse_pipeline("[model]\npath = \"m.gguf\"\n[[sampler]]\nname = \"logit_bias\"\ntokens = "
                                "[1, 2]\nvalues = [-1.0, 2.5]\n"
                                "[stop]\nstrings = [\"x\"]\n[run]\nseed = 5\n",
                                "p.toml");
  const std::string t = to_toml(c);
  const auto c2 = parse_pipeline(t, "resolved.toml");
  EXPECT_EQ(to_toml(c2), t);
  EXPECT_EQ(c2.samplers.size(), 1u);
  EXPECT_EQ(c2.run.seed, 5u);
  const auto c3 = apply_overrides(c2, {parse_override("stop.max_tokens=3")});
  EXPECT_EQ(c3.stop.max_tokens, 3);
}

TEST(Config, MissingFileIsNotFound) {
  try {
    (void)load_pipeline("/nonexistent/p.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
  }
}

} // namespace

namespace {

TEST(Config, ServeNameIsAMetricsSafeLabel) {
  EXPECT_EQ(loom::parse_pipeline("[serve]\nname = \"tiny-greedy\"\n", "p.toml").serve.name, "tiny-greedy");
  EXPECT_TRUE(loom::parse_pipeline("[model]\npath = \"m.gguf\"\n", "p.toml").serve.name.empty());
  for (const char* bad : {"[serve]\nname = \"a\\\"b\"\n", "[serve]\nname = \"\"\n", "[serve]\nname = 3\n",
                          "[serve]\nnam = \"x\"\n"})
    EXPECT_THROW((void)loom::parse_pipeline(bad, "p.toml"), loom::Error) << bad;
}

} // namespace
