// Plugin loading end to end: the fixture plugins (tests/plugin/fixtures/) and the first-party ones.
//
// Every way a plugin file can be unusable must give ONE line that names the file and the cause;
// `loom plugins` lists what it finds and reports broken files without failing; plugin objects keep
// their library alive (and the library really goes away with LOOM_TEST_REAL_UNLOAD=1).
#include "loom/error.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "loom/pipeline/pipeline_config.hpp"
#include "loom/plugin/plugin_host.hpp"
#include "loom/sample/sampler.hpp"
#include "plugin/plugin_internal.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <dlfcn.h>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

using namespace loom;
namespace fs = std::filesystem;

// Candidates over storage that lives as long as the test process (tests keep the views past a call).
Candidates candidates(std::span<const float> logits) {
  static std::deque<std::vector<TokenData>> storage;
  return Candidates::from_logits(logits, storage.emplace_back());
}

const std::string k_fixtures = LOOM_FIXTURE_DIR;  // <build>/tests/plugin/fixtures
const std::string k_bin_dir = LOOM_BUILD_BIN_DIR; // <build>/bin: loom and the first-party plugins

std::string fixture(const std::string& name) {
  return k_fixtures + "/libloom-fixture-" + name + ".so";
}

// ---- helpers ----------------------------------------------------------------------------------

// What a failing PluginRegistry::load() says (the test fails if it loads).
Error load_error(const std::string& path, const std::optional<std::string>& pin = {}) {
  PluginRegistry reg;
  try {
    reg.load(path, pin);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << path << " loaded, but it should have failed";
  return Error(Errc::internal, "test", "no error");
}

// A failure message must be one line that names `path` and contains `cause`.
void expect_one_line(const std::string& msg, const std::string& path, const std::string& cause) {
  SCOPED_TRACE(msg);
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line";
  if (!path.empty()) {
    EXPECT_NE(msg.find(path), std::string::npos) << "does not name " << path;
  }
  EXPECT_NE(msg.find(cause), std::string::npos) << "does not say '" << cause << "'";
  std::printf("  message: %s\n", msg.c_str()); // for a human to read (ctest -V)
}

// The error Pipeline::create throws for a pipeline file (the test fails if it succeeds).
std::string pipeline_error(const std::string& toml) {
  try {
    auto p = Pipeline::create(parse_pipeline(toml, "fixture.toml"));
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "the pipeline was created, but it should have failed:\n" << toml;
  return {};
}

// A pipeline file: model, plugin directories (fixtures first), then `rest`.
std::string pipeline_toml(const std::string& model, const std::string& rest) {
  // the reference backend (built in): these tests load and unload plugins for real, and the cpu backend's
  // OpenMP / oneDNN runtime is not one to unload
  return "[model]\npath = \"" + model + "\"\nn_ctx = 128\n\n[plugins]\npaths = [\"" + k_fixtures + "\", \"" +
         k_bin_dir + "\"]\n\n" +
         (rest.find("[backend]") == std::string::npos ? "[backend]\nname = \"reference\"\n\n" : "") + rest;
}

// Captures host log lines (plugin logs arrive here); restores the default sink when destroyed.
struct LogCapture {
  struct Line {
    int32_t level;
    std::string plugin, message;
  };
  std::mutex m;
  std::vector<Line> lines;
  LogCapture() {
    set_log_sink([this](int32_t level, std::string_view plugin, std::string_view message) {
      std::lock_guard<std::mutex> lock(m);
      lines.push_back({level, std::string(plugin), std::string(message)});
    });
  }
  ~LogCapture() { set_log_sink({}); }
  size_t count(int32_t level, const std::string& plugin, const std::string& message) {
    std::lock_guard<std::mutex> lock(m);
    return static_cast<size_t>(std::count_if(lines.begin(), lines.end(), [&](const Line& l) {
      return l.level == level && l.plugin == plugin && l.message == message;
    }));
  }
};

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* o = std::getenv(n)) old = o;
    ::setenv(n, value, 1);
  }
  ~ScopedEnv() {
    if (old)
      ::setenv(name.c_str(), old->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

// Whether the dynamic loader has `path` mapped right now.
bool is_loaded(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!h) return false;
  dlclose(h);
  return true;
}

test::CliResult loom_cli(const std::string& args) {
  return test::run_loom(args, false);
}

#define REQUIRE_BIN() LOOM_REQUIRE_BIN()

const nlohmann::json* entry_named(const nlohmann::json& list, const std::string& key,
                                  const std::string& value) {
  for (const auto& e : list)
    if (e.contains(key) && e[key].is_string() && e[key].get<std::string>() == value) return &e;
  return nullptr;
}

std::vector<TokenId> generate(Pipeline& p, int32_t n, GenerationResult* out = nullptr) {
  GenerationRequest req;
  req.prompt = "Once upon a time";
  req.max_new_tokens = n;
  req.seed = 1;
  GenerationResult r = p.generate(req);
  if (out) *out = r;
  return r.tokens;
}

// ---- the good plugin --------------------------------------------------------------------------

TEST(PluginLoading, GoodFixtureLoads) {
  PluginRegistry reg;
  auto lib = reg.load(fixture("good"));
  ASSERT_NE(lib, nullptr);
  const loom_plugin& p = lib->plugin();
  EXPECT_STREQ(p.name, "fixture_good");
  EXPECT_STREQ(p.version, "1.2.3");
  EXPECT_EQ(p.abi_major, LOOM_ABI_MAJOR);
  EXPECT_EQ(p.abi_minor, LOOM_ABI_MINOR);
  EXPECT_EQ(p.struct_size, sizeof(loom_plugin));
  ASSERT_EQ(p.n_factories, 2u);
  EXPECT_STREQ(p.factories[0].name, "fixture_greedy");
  EXPECT_EQ(p.factories[0].kind, LOOM_KIND_SAMPLER);
  EXPECT_STREQ(p.factories[1].name, "fixture_twice");
  EXPECT_EQ(p.factories[1].kind, LOOM_KIND_DECODER);
  EXPECT_EQ(lib->score(), 1); // LOOM_PLUGIN_DEFINE's score
  EXPECT_EQ(lib->path(), fixture("good"));
  EXPECT_EQ(lib->sha256(), file_sha256(fixture("good")));
  EXPECT_EQ(lib->sha256().size(), 64u);
  EXPECT_EQ(lib->sha256().find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(PluginLoading, FixtureSamplerSelectsTheArgMaxAndLogsThroughTheHost) {
  LogCapture logs;
  PluginRegistry reg;
  reg.discover({k_fixtures});
  const auto f = reg.find(LOOM_KIND_SAMPLER, "fixture_greedy");
  ASSERT_TRUE(f.has_value()) << "found: " << reg.available(LOOM_KIND_SAMPLER) << reg.failures();
  EXPECT_EQ(logs.count(LOOM_LOG_INFO, "fixture_good", "fixture_greedy created"), 0u);
  auto s = plugin::make_plugin_sampler(*f, SamplerSpec{"fixture_greedy", {}, "test.toml:1:1"});
  EXPECT_EQ(logs.count(LOOM_LOG_INFO, "fixture_good", "fixture_greedy created"), 1u);
  EXPECT_EQ(s->name(), "fixture_greedy");
  EXPECT_TRUE(s->selects());

  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f, 1.5f};
  std::mt19937_64 rng(1);
  SamplerContext ctx;
  ctx.rng_state = &rng;
  ctx.rng_uniform = &rng_uniform;
  Candidates c = candidates(logits);
  s->apply(c, ctx);
  ASSERT_GE(c.selected, 0);
  EXPECT_EQ(c.data[static_cast<size_t>(c.selected)].id, 1); // tie with id 3: the lower id

  auto copy = s->clone(); // a clone is made without the constructor: no second log line
  Candidates c2 = candidates(logits);
  copy->apply(c2, ctx);
  EXPECT_EQ(c2.data[static_cast<size_t>(c2.selected)].id, 1);
  EXPECT_EQ(logs.count(LOOM_LOG_INFO, "fixture_good", "fixture_greedy created"), 1u);
}

// ---- each broken fixture: one line naming the file and the cause ------------------------------

TEST(PluginLoading, MissingEntryPoint) {
  const Error e = load_error(fixture("no-init"));
  expect_one_line(e.what(), fixture("no-init"), "loom_plugin_init");
  EXPECT_EQ(e.code(), Errc::invalid_argument);
}

TEST(PluginLoading, WrongAbiMajor) {
  const Error e = load_error(fixture("wrong-abi"));
  expect_one_line(e.what(), fixture("wrong-abi"), "ABI");
  const std::string msg = e.what();
  EXPECT_NE(msg.find("ABI " + std::to_string(LOOM_ABI_MAJOR + 1) + "."), std::string::npos) << msg;
  EXPECT_NE(msg.find("ABI " + std::to_string(LOOM_ABI_MAJOR) + "."), std::string::npos) << msg;
  EXPECT_EQ(e.code(), Errc::abi_mismatch);
}

TEST(PluginLoading, APluginForANewerMinorIsRefusedWithItsReason) {
  // The host hands out its tables by version (loom_host.get_api): none of a minor it does not have.
  const loom_host* h = host_api();
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->abi_major, LOOM_ABI_MAJOR);
  for (uint32_t table : {LOOM_API_SESSION, LOOM_API_REQUEST, LOOM_API_DRAFT, LOOM_API_VERIFY})
    EXPECT_NE(h->get_api(table, 0), nullptr) << "table " << table;
  EXPECT_NE(h->get_api(LOOM_API_CORE, LOOM_ABI_MINOR), nullptr);
  EXPECT_EQ(h->get_api(LOOM_API_CONFIG, LOOM_ABI_MINOR + 1), nullptr);
  EXPECT_EQ(h->get_api(99, 0), nullptr);
  EXPECT_STRNE(h->version(), "");
  // A plugin built for the next minor asks for it, gets NULL and refuses; the reason is in the error.
  const Error e = load_error(fixture("future-minor"));
  expect_one_line(e.what(), fixture("future-minor"), "refused the host");
  const std::string msg = e.what();
  const std::string newer = "older than this plugin's ABI " + std::to_string(LOOM_ABI_MAJOR) + "." +
                            std::to_string(LOOM_ABI_MINOR + 1);
  EXPECT_NE(msg.find(newer), std::string::npos) << msg;
  EXPECT_NE(msg.find("LOOM_SDK_TARGET_MINOR"), std::string::npos) << msg;
  EXPECT_EQ(e.code(), Errc::abi_mismatch);
}

TEST(PluginLoading, ScoreZero) {
  const Error e = load_error(fixture("score0"));
  expect_one_line(e.what(), fixture("score0"), "score");
  EXPECT_EQ(e.code(), Errc::unsupported);
}

TEST(PluginLoading, NotASharedObject) {
  const Error e = load_error(fixture("garbage"));
  expect_one_line(e.what(), fixture("garbage"), "shared library");
}

TEST(PluginLoading, MissingFile) {
  const Error e = load_error(k_fixtures + "/libloom-fixture-does-not-exist.so");
  expect_one_line(e.what(), k_fixtures + "/libloom-fixture-does-not-exist.so", "no such file");
  EXPECT_EQ(e.code(), Errc::not_found);
}

TEST(PluginLoading, Sha256PinMismatch) {
  const std::string wrong(64, '0');
  const Error e = load_error(fixture("good"), wrong);
  expect_one_line(e.what(), fixture("good"), "sha256");
  const std::string msg = e.what();
  EXPECT_NE(msg.find(file_sha256(fixture("good"))), std::string::npos) << msg; // the actual hash
  EXPECT_NE(msg.find(wrong), std::string::npos) << msg;                        // and the pinned one
  // The right pin loads.
  PluginRegistry reg;
  EXPECT_NO_THROW(reg.load(fixture("good"), file_sha256(fixture("good"))));
}

TEST(PluginLoading, Sha256PinMismatchInAPipeline) {
  const std::string wrong(64, '0');
  const std::string msg = pipeline_error(
      pipeline_toml("missing.gguf", "[plugins.sha256]\n\"libloom-fixture-good.so\" = \"" + wrong +
                                        "\"\n\n[[sampler]]\nname = "
                                        "\"fixture_greedy\"\n"));
  // The pipeline reports the missing sampler and, below it, one line per unusable file.
  EXPECT_NE(msg.find("'fixture_greedy'"), std::string::npos) << msg;
  std::string pin_line;
  for (size_t at = 0; at < msg.size();) {
    const size_t end = std::min(msg.find('\n', at), msg.size());
    const std::string line = msg.substr(at, end - at);
    if (line.find("pins") != std::string::npos) pin_line = line;
    at = end + 1;
  }
  expect_one_line(pin_line, fixture("good"), "sha256 is " + file_sha256(fixture("good")));
  EXPECT_NE(pin_line.find(wrong), std::string::npos) << pin_line;

  // With the right pin the plugin is used: the pipeline gets as far as the (missing) model.
  const std::string ok = pipeline_error(pipeline_toml(
      "missing.gguf", "[plugins.sha256]\n\"libloom-fixture-good.so\" = \"" + file_sha256(fixture("good")) +
                          "\"\n\n[[sampler]]\nname = \"fixture_greedy\"\n"));
  EXPECT_NE(ok.find("missing.gguf"), std::string::npos) << ok;
  EXPECT_EQ(ok.find("sha256"), std::string::npos) << ok;
}

// A pin names a plugin file, never a plugin's declared name (which any file can claim): a name key is a
// one-line config error.
TEST(PluginLoading, APinKeyedByAPluginsNameIsRefused) {
  const std::string msg = pipeline_error(
      pipeline_toml("missing.gguf", "[plugins.sha256]\nfixture_good = \"" + std::string(64, '0') + "\"\n"));
  expect_one_line(msg, "fixture.toml", "a plugin file");
}

// A pin is checked against the file before it is opened: a pinned plugin with the wrong hash never
// runs its ELF constructors (the fixture's writes a marker file); with the right hash it is loaded.
TEST(PluginLoading, APinnedPluginWithTheWrongHashNeverRunsItsConstructor) {
  const std::string mark = ::testing::TempDir() + "loom-ctor-mark-" + std::to_string(::getpid());
  std::remove(mark.c_str());
  ScopedEnv env("LOOM_FIXTURE_CTOR_MARK", mark.c_str());
  const std::string sampler = "\n\n[[sampler]]\nname = \"fixture_marked\"\n";
  const std::string wrong(64, '0');
  const std::string msg = pipeline_error(pipeline_toml(
      "missing.gguf", "[plugins.sha256]\n\"libloom-fixture-ctor-marker.so\" = \"" + wrong + "\"" + sampler));
  EXPECT_NE(msg.find("pins " + wrong), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(mark)) << "the constructor of a plugin with a wrong pin ran";
  EXPECT_FALSE(is_loaded(fixture("ctor-marker")));
  const std::string ok = pipeline_error(
      pipeline_toml("missing.gguf", "[plugins.sha256]\n\"libloom-fixture-ctor-marker.so\" = \"" +
                                        file_sha256(fixture("ctor-marker")) + "\"" + sampler));
  EXPECT_NE(ok.find("missing.gguf"), std::string::npos) << ok;
  EXPECT_TRUE(std::filesystem::exists(mark)) << "the right pin: loaded";
  std::remove(mark.c_str());
}

// A pipeline opens only the files that provide what it names (each file's static descriptor says so
// without loading it): naming one sampler of fixture_good maps that file and no other plugin file.
TEST(PluginLoading, APipelineOpensOnlyThePluginsItNames) {
  const std::string mark = ::testing::TempDir() + "loom-ctor-mark-named-" + std::to_string(::getpid());
  std::remove(mark.c_str());
  ScopedEnv env("LOOM_FIXTURE_CTOR_MARK", mark.c_str());
  std::vector<std::string> before;
  for (const auto& e : std::filesystem::directory_iterator(k_fixtures))
    if (is_loaded(e.path().string())) before.push_back(e.path().filename().string());
  ASSERT_TRUE(before.empty()) << "a fixture was loaded before the test: " << before.front();
  const std::string msg =
      pipeline_error(pipeline_toml("missing.gguf", "[[sampler]]\nname = \"fixture_greedy\"\n"));
  EXPECT_NE(msg.find("missing.gguf"), std::string::npos) << msg;
  std::vector<std::string> opened;
  for (const auto& e : std::filesystem::directory_iterator(k_fixtures))
    if (is_loaded(e.path().string())) opened.push_back(e.path().filename().string());
  EXPECT_EQ(opened, std::vector<std::string>{"libloom-fixture-good.so"});
  EXPECT_FALSE(std::filesystem::exists(mark));
  // A name no file provides: the message lists what the unopened files provide.
  const std::string none =
      pipeline_error(pipeline_toml("missing.gguf", "[[sampler]]\nname = \"fixture_nothing\"\n"));
  EXPECT_NE(none.find("fixture_marked (fixture_ctor_marker)"), std::string::npos) << none;
  EXPECT_FALSE(std::filesystem::exists(mark)) << "listing what a file provides does not open it";
}

TEST(PluginLoading, CreateThrowsCarriesThePluginsMessage) {
  const std::string msg =
      pipeline_error(pipeline_toml("missing.gguf", "[[sampler]]\nname = \"fixture_throws\"\n"));
  expect_one_line(msg, fixture("throws"), "bad things");
  EXPECT_NE(msg.find("'fixture_throws'"), std::string::npos) << msg;
}

TEST(PluginLoading, UnknownKeyForAPluginSampler) {
  const std::string msg = pipeline_error(
      pipeline_toml("missing.gguf", "[[sampler]]\nname = \"fixture_greedy\"\ntemprature = 0.5\n"));
  expect_one_line(msg, "fixture.toml", "unknown key");
  EXPECT_NE(msg.find("'temprature'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'fixture_greedy'"), std::string::npos) << msg;
}

TEST(PluginLoading, UnknownKeyForAPluginDecoder) {
  const std::string msg =
      pipeline_error(pipeline_toml("missing.gguf", "[decoder]\nname = \"fixture_twice\"\nbeams = 4\n"));
  expect_one_line(msg, "fixture.toml", "unknown key");
  EXPECT_NE(msg.find("'beams'"), std::string::npos) << msg;
}

TEST(PluginLoading, DiscoverRecordsEveryFailureWithoutThrowing) {
  PluginRegistry reg;
  std::vector<PluginInfo> infos;
  ASSERT_NO_THROW(infos = reg.discover({k_fixtures}));
  auto info = [&](const std::string& name) -> const PluginInfo* {
    for (const auto& i : infos)
      if (i.path == fixture(name)) return &i;
    ADD_FAILURE() << fixture(name) << " was not discovered";
    return nullptr;
  };
  const struct {
    const char* file;
    const char* cause;
    bool skipped;
  } broken[] = {{"garbage", "shared library", false},
                {"no-init", "loom_plugin_init", false},
                {"wrong-abi", "ABI", false},
                {"score0", "score", true}};
  for (const auto& b : broken) {
    const PluginInfo* i = info(b.file);
    if (!i) continue;
    expect_one_line(i->error, "", b.cause); // the path is in PluginInfo::path
    EXPECT_EQ(i->skipped, b.skipped) << b.file;
    EXPECT_TRUE(i->factories.empty()) << b.file;
  }
  for (const char* good : {"good", "throws"}) {
    const PluginInfo* i = info(good);
    if (!i) continue;
    EXPECT_EQ(i->error, "") << good;
    EXPECT_EQ(i->sha256, file_sha256(fixture(good)));
    EXPECT_EQ(i->score, 1);
  }
  EXPECT_TRUE(reg.find(LOOM_KIND_SAMPLER, "fixture_greedy").has_value());
  EXPECT_TRUE(reg.find(LOOM_KIND_DECODER, "fixture_twice").has_value());
  EXPECT_FALSE(reg.find(LOOM_KIND_SAMPLER, "fixture_never").has_value()); // score 0: skipped
  // failures(): the broken files, one line each, not the skipped one.
  const std::string f = reg.failures();
  EXPECT_NE(f.find(fixture("garbage")), std::string::npos) << f;
  EXPECT_NE(f.find(fixture("no-init")), std::string::npos) << f;
  EXPECT_NE(f.find(fixture("wrong-abi")), std::string::npos) << f;
  EXPECT_EQ(f.find(fixture("score0")), std::string::npos) << f;
}

// ---- loaded twice -----------------------------------------------------------------------------

size_t occurrences(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1))
    ++n;
  return n;
}

TEST(PluginLoading, SameDirectoryTwiceRegistersOnce) {
  PluginRegistry reg;
  const auto infos = reg.discover({k_fixtures, k_fixtures, k_fixtures + "/"});
  EXPECT_EQ(std::count_if(infos.begin(), infos.end(),
                          [](const PluginInfo& i) { return i.path == fixture("good"); }),
            1);
  EXPECT_EQ(occurrences(reg.available(LOOM_KIND_SAMPLER), "fixture_greedy"), 1u)
      << reg.available(LOOM_KIND_SAMPLER);
  // Another spelling of the same directory, and discovering again: still one registration.
  reg.discover({k_fixtures + "/.", k_fixtures});
  EXPECT_EQ(occurrences(reg.available(LOOM_KIND_SAMPLER), "fixture_greedy"), 1u)
      << reg.available(LOOM_KIND_SAMPLER);
  EXPECT_EQ(occurrences(reg.available(LOOM_KIND_DECODER), "fixture_twice"), 1u)
      << reg.available(LOOM_KIND_DECODER);
}

TEST(PluginLoading, SameFileLoadedTwice) {
  PluginRegistry reg;
  auto a = reg.load(fixture("good"));
  auto b = reg.load(fixture("good"));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(&a->plugin(), &b->plugin()); // one mapping of the library
  a.reset();
  EXPECT_STREQ(b->plugin().name, "fixture_good"); // still usable after the other handle is gone
  b.reset();
  auto c = reg.load(fixture("good"));
  EXPECT_STREQ(c->plugin().name, "fixture_good");
}

// ---- loom plugins -----------------------------------------------------------------------------

TEST(PluginCli, ListsFixturesAndReportsBrokenFilesAsJson) {
  REQUIRE_BIN();
  const auto r = loom_cli("plugins --plugin-path " + k_fixtures + " --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  nlohmann::json list;
  ASSERT_NO_THROW(list = nlohmann::json::parse(r.out)) << r.out;
  ASSERT_TRUE(list.is_array());

  const nlohmann::json* good = entry_named(list, "path", fixture("good"));
  ASSERT_NE(good, nullptr) << r.out;
  for (const char* key : {"name", "kind", "version", "abi", "path", "sha256", "score"})
    EXPECT_TRUE(good->contains(key)) << "missing key " << key << " in " << good->dump();
  EXPECT_EQ((*good)["name"], "fixture_good");
  const std::string kind = (*good)["kind"].get<std::string>();
  EXPECT_NE(kind.find("sampler"), std::string::npos) << kind;
  EXPECT_NE(kind.find("decoder"), std::string::npos) << kind;
  EXPECT_EQ((*good)["version"], "1.2.3");
  EXPECT_EQ((*good)["abi"], std::to_string(LOOM_ABI_MAJOR) + "." + std::to_string(LOOM_ABI_MINOR));
  EXPECT_EQ((*good)["sha256"], file_sha256(fixture("good")));
  EXPECT_EQ((*good)["score"], 1);
  EXPECT_FALSE(good->contains("error")) << good->dump();

  const struct {
    const char* file;
    const char* cause;
  } broken[] = {{"garbage", "shared library"},
                {"no-init", "loom_plugin_init"},
                {"wrong-abi", "ABI"},
                {"score0", "score"}};
  for (const auto& b : broken) {
    const nlohmann::json* e = entry_named(list, "path", fixture(b.file));
    ASSERT_NE(e, nullptr) << b.file << " is not listed:\n" << r.out;
    ASSERT_TRUE(e->contains("error") && (*e)["error"].is_string()) << e->dump();
    expect_one_line((*e)["error"].get<std::string>(), "", b.cause);
  }
  // The directory of the loom binary is searched too: the first-party plugins are there.
  EXPECT_NE(entry_named(list, "name", "sampler_extra"), nullptr) << r.out;
  EXPECT_NE(entry_named(list, "name", "stop_json"), nullptr) << r.out;
}

TEST(PluginCli, TextOutputNamesBrokenFilesAndExitsZero) {
  REQUIRE_BIN();
  const auto r = loom_cli("plugins --plugin-path " + k_fixtures);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("fixture_good"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(broken)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(skipped)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fixture("garbage")), std::string::npos) << r.out;
  std::printf("%s", r.out.c_str()); // for a human to read (ctest -V)
}

TEST(PluginCli, FirstPartyPluginsAreFoundNextToTheBinary) {
  REQUIRE_BIN();
  const auto r = loom_cli("plugins --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  nlohmann::json list;
  ASSERT_NO_THROW(list = nlohmann::json::parse(r.out)) << r.out;
  const fs::path bin_dir = fs::canonical(std::getenv("LOOM_BIN")).parent_path();
  const struct {
    const char* name;
    std::vector<std::string> provides;
  } expected[] = {{"sampler_extra", {"xtc", "mirostat_v2"}}, {"stop_json", {"json_complete"}}};
  for (const auto& x : expected) {
    const nlohmann::json* e = entry_named(list, "name", x.name);
    ASSERT_NE(e, nullptr) << x.name << " not found by `loom plugins`:\n" << r.out;
    EXPECT_FALSE(e->contains("error")) << e->dump();
    EXPECT_EQ(fs::canonical((*e)["path"].get<std::string>()).parent_path(), bin_dir) << e->dump();
    std::vector<std::string> names;
    for (const auto& p : (*e)["provides"])
      names.push_back(p["name"].get<std::string>());
    EXPECT_EQ(names, x.provides) << e->dump();
  }
  EXPECT_EQ(entry_named(list, "name", "fixture_good"), nullptr) << "fixtures are not next to loom";
}

// ---- pipelines --------------------------------------------------------------------------------

TEST(PluginPipeline, FirstPartySamplersAndStopCriterionRun) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string toml = pipeline_toml(model.string(), R"(
[[sampler]]
name = "xtc"
probability = 1.0
threshold = 0.05

[[sampler]]
name = "temperature"
value = 1.0

[[sampler]]
name = "mirostat_v2"
tau = 4.0
eta = 0.2

[[stop_criterion]]
name = "json_complete"

[stop]
max_tokens = 24
)");
  auto p = Pipeline::create(parse_pipeline(toml, "fixture.toml"));
  GenerationResult r;
  const auto first = generate(*p, 24, &r);
  EXPECT_FALSE(first.empty());
  EXPECT_LE(first.size(), 24u);
  EXPECT_NE(r.stop_reason, StopReason::none);
  // Per-request state (mirostat's mu) starts afresh: the same seed gives the same tokens.
  EXPECT_EQ(generate(*p, 24), first);
}

// A plugin's clone() that throws fails the request it was cloned for, alone: the host clones a request's
// sampler chain when it admits the request (outside any decoder call: before, the exception escaped
// Engine::step(), kept the request's KV sequence and stayed at the head of the queue, so every later step
// threw again) and at every checkpoint. Clone 3 is the second request's admission; the others and a second
// round complete, and the store holds no more KV after each round than before.
// A sampler's apply() or a stop criterion's check() that throws fails the request it ran for; the other
// requests of the batch complete, the next round too, and no KV is held after.
TEST(PluginPipeline, AThrowingSamplerOrStopCriterionFailsOneRequest) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  for (const std::string& rest :
       {std::string(
            "[[sampler]]\nname = \"fixture_apply_throws\"\nfail_at = 7\n\n[[sampler]]\nname = \"greedy\"\n"),
        std::string("[[sampler]]\nname = \"greedy\"\n\n[[stop_criterion]]\nname = \"fixture_check_throws\"\n"
                    "fail_at = 7\n")}) {
    SCOPED_TRACE(rest);
    auto p = Pipeline::create(parse_pipeline(pipeline_toml(model.string(), rest), "throws.toml"));
    const int64_t units_free = p->kv_store().n_units() - p->kv_store().units_in_use();
    std::vector<GenerationRequest> reqs(4);
    for (auto& r : reqs) {
      r.prompt = "Once upon a time";
      r.max_new_tokens = 8;
    }
    for (int round = 0; round < 2; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      const auto rs = p->generate_all(reqs, 4);
      int failed = 0;
      for (const auto& r : rs) {
        if (r.stop_reason == StopReason::error) {
          ++failed;
          EXPECT_NE(r.message.find("failed on purpose"), std::string::npos) << r.message;
        } else {
          EXPECT_EQ(r.stop_reason, StopReason::max_tokens);
          EXPECT_EQ(r.tokens.size(), 8u);
        }
      }
      EXPECT_EQ(failed, round == 0 ? 1 : 0);
      EXPECT_TRUE(p->engine().idle());
      EXPECT_EQ(p->kv_store().n_units() - p->kv_store().units_in_use(), units_free)
          << "KV held after the run";
    }
  }
}

TEST(PluginPipeline, AThrowingCloneFailsOneRequest) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto p = Pipeline::create(parse_pipeline(
      pipeline_toml(model.string(), "[[sampler]]\nname = \"fixture_clone_throws\"\nfail_at = 3\n\n"
                                    "[[sampler]]\nname = \"greedy\"\n"),
      "clone.toml"));
  const int64_t units_free = p->kv_store().n_units() - p->kv_store().units_in_use();
  std::vector<GenerationRequest> reqs(4);
  for (auto& r : reqs) {
    r.prompt = "Once upon a time";
    r.max_new_tokens = 8;
  }
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const auto rs = p->generate_all(reqs, 4);
    int failed = 0;
    for (const auto& r : rs) {
      if (r.stop_reason == StopReason::error) {
        ++failed;
        EXPECT_NE(r.message.find("clone failed on purpose"), std::string::npos) << r.message;
      } else {
        EXPECT_EQ(r.stop_reason, StopReason::max_tokens);
        EXPECT_EQ(r.tokens.size(), 8u);
      }
    }
    EXPECT_EQ(failed, round == 0 ? 1 : 0);
    EXPECT_TRUE(p->engine().idle());
    EXPECT_EQ(p->kv_store().n_units() - p->kv_store().units_in_use(), units_free) << "KV held after the run";
  }
}

TEST(PluginPipeline, FixtureSamplerMatchesTheBuiltInGreedy) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto builtin = Pipeline::create(
      parse_pipeline(pipeline_toml(model.string(), "[[sampler]]\nname = \"greedy\"\n"), "greedy.toml"));
  auto plugin = Pipeline::create(parse_pipeline(
      pipeline_toml(
          model.string(),
          "[[sampler]]\nname = \"xtc\"\nprobability = 0.0\n\n[[sampler]]\nname = \"fixture_greedy\"\n"
          "\n[[stop_criterion]]\nname = \"json_complete\"\n"),
      "fixture.toml"));
  const auto expected = generate(*builtin, 32);
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(generate(*plugin, 32), expected);
}

TEST(PluginPipeline, FixtureDecoderReportsBothSequences) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto p = Pipeline::create(parse_pipeline(
      pipeline_toml(model.string(), "[decoder]\nname = \"fixture_twice\"\n\n[[sampler]]\nname = "
                                    "\"fixture_greedy\"\n"),
      "fixture.toml"));
  GenerationResult r;
  const auto tokens = generate(*p, 12, &r);
  ASSERT_EQ(r.n_best.size(), 2u);
  EXPECT_EQ(r.n_best[0].tokens, tokens);
  EXPECT_EQ(r.n_best[1].tokens, tokens); // greedy: both sequences agree
  EXPECT_EQ(tokens.size(), 12u);
}

// ---- lifetime ---------------------------------------------------------------------------------

// A pipeline holds its plugin objects and libraries; destroying it and building another works, with
// the libraries really unloaded in between (so an object outliving its library would crash here).
TEST(PluginLifetime, PipelineDestroyedAndCreatedAgain) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  ScopedEnv real_unload("LOOM_TEST_REAL_UNLOAD", "1");
  const bool was_loaded = is_loaded(fixture("good"));
  const std::string toml = pipeline_toml(model.string(), R"(
[decoder]
name = "fixture_twice"

[[sampler]]
name = "xtc"
probability = 0.0

[[sampler]]
name = "fixture_greedy"

[[stop_criterion]]
name = "json_complete"
)");
  std::vector<TokenId> first;
  for (int i = 0; i < 3; ++i) {
    auto p = Pipeline::create(parse_pipeline(toml, "fixture.toml"));
    const auto tokens = generate(*p, 10);
    if (i == 0) first = tokens;
    EXPECT_EQ(tokens, first) << "round " << i;
    p.reset();
    if (!was_loaded) {
      EXPECT_FALSE(is_loaded(fixture("good"))) << "round " << i << ": still mapped";
    }
  }
}

// A plugin object keeps its library loaded after the registry that found it is gone.
TEST(PluginLifetime, ObjectOutlivesItsRegistry) {
  ScopedEnv real_unload("LOOM_TEST_REAL_UNLOAD", "1");
  const bool was_loaded = is_loaded(fixture("good"));
  std::unique_ptr<Sampler> s;
  {
    PluginRegistry reg;
    reg.discover({k_fixtures});
    const auto f = reg.find(LOOM_KIND_SAMPLER, "fixture_greedy");
    ASSERT_TRUE(f.has_value());
    s = plugin::make_plugin_sampler(*f, SamplerSpec{"fixture_greedy", {}, "test"});
  }
  EXPECT_TRUE(is_loaded(fixture("good")));
  std::mt19937_64 rng(1);
  SamplerContext ctx;
  ctx.rng_state = &rng;
  ctx.rng_uniform = &rng_uniform;
  const std::vector<float> logits = {0.0f, 1.0f, 3.0f};
  Candidates c = candidates(logits);
  s->apply(c, ctx);
  EXPECT_EQ(c.data[static_cast<size_t>(c.selected)].id, 2);
  s.reset();
  if (!was_loaded) {
    EXPECT_FALSE(is_loaded(fixture("good")));
  }
}

// Production mode (no LOOM_TEST_REAL_UNLOAD): a library stays mapped after its last user is gone
// (plugin threads or atexit hooks may still run its code).
TEST(PluginLifetime, ProductionNeverUnloads) {
  std::optional<std::string> old;
  if (const char* o = std::getenv("LOOM_TEST_REAL_UNLOAD")) old = o;
  ::unsetenv("LOOM_TEST_REAL_UNLOAD");
  {
    PluginRegistry reg;
    reg.discover({k_fixtures});
    ASSERT_TRUE(reg.find(LOOM_KIND_SAMPLER, "fixture_greedy").has_value());
  }
  EXPECT_TRUE(is_loaded(fixture("good")));
  if (old) ::setenv("LOOM_TEST_REAL_UNLOAD", old->c_str(), 1);
}

// Loads and destroys a registry with the fixtures 20 times, really unloading (dlclose) each time.
// The ASan build checks that nothing touches an unloaded library.
TEST(PluginLifetime, RealUnloadLoop) {
  ScopedEnv real_unload("LOOM_TEST_REAL_UNLOAD", "1");
  const bool was_loaded = is_loaded(fixture("good"));
  LogCapture logs;
  for (int i = 0; i < 20; ++i) {
    PluginRegistry reg;
    reg.discover({k_fixtures});
    const auto f = reg.find(LOOM_KIND_SAMPLER, "fixture_greedy");
    ASSERT_TRUE(f.has_value()) << "round " << i;
    auto s = plugin::make_plugin_sampler(*f, SamplerSpec{"fixture_greedy", {}, "test"});
    std::mt19937_64 rng(1);
    SamplerContext ctx;
    ctx.rng_state = &rng;
    ctx.rng_uniform = &rng_uniform;
    const std::vector<float> logits = {0.5f, -1.0f, 0.25f};
    Candidates c = candidates(logits);
    s->apply(c, ctx);
    EXPECT_EQ(c.data[static_cast<size_t>(c.selected)].id, 0);
    auto copy = s->clone();
    s.reset();
    copy.reset();
    EXPECT_NO_THROW(reg.load(fixture("good")));
  }
  EXPECT_EQ(logs.count(LOOM_LOG_INFO, "fixture_good", "fixture_greedy created"), 20u);
  if (!was_loaded) {
    EXPECT_FALSE(is_loaded(fixture("good"))) << "LOOM_TEST_REAL_UNLOAD=1 did not unload";
  }
}

// Production: a plugin whose users are all gone is neither shut down nor initialised again when loaded
// once more; its shutdown() runs once, at exit (a child process loads it and exits).
TEST(PluginLifetime, AShutDownPluginIsNeverInitialisedAgain) {
  std::optional<std::string> old;
  if (const char* o = std::getenv("LOOM_TEST_REAL_UNLOAD")) old = o;
  ::unsetenv("LOOM_TEST_REAL_UNLOAD");
  {
    LogCapture logs;
    for (int i = 0; i < 3; ++i) {
      PluginRegistry reg;
      auto lib = reg.load(fixture("shutdown"));
    }
    EXPECT_EQ(logs.count(LOOM_LOG_INFO, "fixture_shutdown", "init"), 1u);
    EXPECT_EQ(logs.count(LOOM_LOG_INFO, "fixture_shutdown", "shutdown"), 0u);
  }
  const std::string out = ::testing::TempDir() + "loom-shutdown-" + std::to_string(::getpid());
  const pid_t pid = ::fork();
  if (pid == 0) { // the child: load, drop, exit normally; the log lines go to `out`
    std::FILE* f = std::fopen(out.c_str(), "w");
    if (!f) ::_exit(3);
    set_log_sink([f](int32_t, std::string_view plugin, std::string_view msg) {
      std::fprintf(f, "%.*s: %.*s\n", static_cast<int>(plugin.size()), plugin.data(),
                   static_cast<int>(msg.size()), msg.data());
      std::fflush(f);
    });
    {
      PluginRegistry reg;
      (void)reg.load(fixture("shutdown"));
    }
    std::exit(0);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(out.c_str());
  // (In this process the library was already initialised above: the child's load found it.)
  EXPECT_NE(text.str().find("fixture_shutdown: shutdown"), std::string::npos) << text.str();
  if (old) ::setenv("LOOM_TEST_REAL_UNLOAD", old->c_str(), 1);
}

} // namespace

namespace {

// abi.h: shutdown() is "called once at exit". Two registries (two pipelines in one process) share
// one mapped library; dropping one of them must not shut the plugin down under the other.
// The host keeps one PluginLibrary per mapped file (core/src/plugin/registry.cpp).
TEST(PluginLifetime, ShutdownWaitsForTheLastUser) {
  ScopedEnv real_unload("LOOM_TEST_REAL_UNLOAD", "1"); // (in production: at exit, below)
  LogCapture logs;
  {
    PluginRegistry a, b;
    auto la = a.load(fixture("shutdown"));
    auto lb = b.load(fixture("shutdown"));
    lb.reset(); // registry b's handle is gone; a's is still in use
    EXPECT_EQ(logs.count(LOOM_LOG_INFO, "fixture_shutdown", "shutdown"), 0u)
        << "shutdown() ran while another PluginLibrary of the same file is alive";
  }
  EXPECT_EQ(logs.count(LOOM_LOG_INFO, "fixture_shutdown", "shutdown"), 1u);
}

} // namespace
