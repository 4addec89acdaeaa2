// Hostile plugin files: nothing a file in a plugin directory holds may take the host down.
//
// A truncated .so, a FIFO, a self-looping symlink, a plugin that crashes or hangs while loading, a
// factory of an unknown kind, a table with struct_size 0, strings that are not UTF-8: `loom plugins`
// lists each with a one-line reason, exits 0 and goes on to list the good fixture next to it; a
// pipeline (`loom run`) that needs a plugin fails with exit 1 and a message, never a signal or a hang.
// The hostile fixtures live in <build>/tests/plugin/hostile-fixtures (no other test scans it); each
// test links or copies what it needs into a temporary directory of its own.
#include "loom/error.hpp"
#include "loom/plugin/plugin_host.hpp"
#include "test_util.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

using namespace loom;
namespace fs = std::filesystem;

const std::string k_fixtures = LOOM_FIXTURE_DIR;        // <build>/tests/plugin/fixtures
const std::string k_hostile = LOOM_HOSTILE_FIXTURE_DIR; // <build>/tests/plugin/hostile-fixtures

std::string good_fixture() {
  return k_fixtures + "/libloom-fixture-good.so";
}
std::string hostile(const std::string& name) {
  return k_hostile + "/libloom-hostile-" + name + ".so";
}

// A fresh plugin directory, removed with the test. It always holds a symlink to the good fixture:
// the listing must go on past the hostile file and still list fixture_good.
struct PluginDir {
  fs::path dir;
  PluginDir() {
    std::string tmpl = (fs::temp_directory_path() / "loom-hostile-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) ADD_FAILURE() << "mkdtemp failed";
    dir = fs::canonical(tmpl);
    fs::create_symlink(good_fixture(), dir / "libloom-fixture-good.so");
  }
  ~PluginDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  PluginDir(const PluginDir&) = delete;
  PluginDir& operator=(const PluginDir&) = delete;
  std::string path(const std::string& name) const { return (dir / name).string(); }
  std::string link(const std::string& target, const std::string& name) const {
    fs::create_symlink(target, dir / name);
    return path(name);
  }
  // The first `n` bytes of `src`, as a partly written copy would be.
  std::string truncated_copy(const std::string& src, size_t n, const std::string& name) const {
    std::ifstream in(src, std::ios::binary);
    std::string bytes(n, '\0');
    in.read(bytes.data(), static_cast<std::streamsize>(n));
    EXPECT_EQ(static_cast<size_t>(in.gcount()), n) << src << " is shorter than " << n << " bytes";
    std::ofstream(dir / name, std::ios::binary).write(bytes.data(), in.gcount());
    return path(name);
  }
};

// Runs loom with a hard time limit (a hang must fail the test, not stall it): see test::run_loom.
test::CliResult loom_limited(const std::string& args, int seconds = 60) {
  return test::run_loom(args, false, seconds);
}

// `loom plugins --plugin-path DIR --json`: exit 0 and valid JSON (the test fails otherwise).
nlohmann::json plugins_json(const PluginDir& d) {
  const auto r = loom_limited("plugins --plugin-path " + d.dir.string() + " --json");
  EXPECT_EQ(r.code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  nlohmann::json list;
  try {
    list = nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON (" << e.what() << "):\n" << r.out;
  }
  return list;
}

const nlohmann::json* entry_at(const nlohmann::json& list, const std::string& path) {
  if (!list.is_array()) return nullptr;
  for (const auto& e : list)
    if (e.contains("path") && e["path"].is_string() && e["path"].get<std::string>() == path) return &e;
  return nullptr;
}

// The listing named `path` with an error containing every piece of `causes`, on one line, and went on
// to list the good fixture (loaded, no error).
void expect_listed_broken(const nlohmann::json& list, const std::string& path,
                          const std::vector<std::string>& causes) {
  const nlohmann::json* e = entry_at(list, path);
  ASSERT_NE(e, nullptr) << path << " is not listed:\n" << list.dump(2);
  ASSERT_TRUE(e->contains("error") && (*e)["error"].is_string()) << e->dump();
  const std::string err = (*e)["error"].get<std::string>();
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  for (const auto& c : causes)
    EXPECT_NE(err.find(c), std::string::npos) << "'" << c << "' not in: " << err;
  std::printf("  %s: %s\n", path.c_str(), err.c_str()); // for a human to read (ctest -V)
  const nlohmann::json* good = entry_at(list, good_fixture());
  ASSERT_NE(good, nullptr) << "the listing did not go on to the good fixture:\n" << list.dump(2);
  EXPECT_EQ((*good)["name"], "fixture_good") << good->dump();
  EXPECT_FALSE(good->contains("error")) << good->dump();
}

// The text listing: exit 0, names `path` and `cause`, and still lists fixture_good.
void expect_text_lists(const PluginDir& d, const std::string& path, const std::string& cause) {
  const auto r = loom_limited("plugins --plugin-path " + d.dir.string());
  EXPECT_EQ(r.code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  EXPECT_NE(r.out.find(path), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(cause), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fixture_good"), std::string::npos) << r.out;
}

#define REQUIRE_BIN() LOOM_REQUIRE_BIN()

// ---- files that are not (complete) shared objects: checked before dlopen --------------------------

TEST(HostilePlugins, TruncatedCopyIsListedWithTheReason) {
  REQUIRE_BIN();
  PluginDir d;
  const std::string cut = d.truncated_copy(good_fixture(), 5000, "libloom-truncated.so");
  const auto list = plugins_json(d); // before the check: SIGBUS inside dlopen (exit 135)
  expect_listed_broken(list, cut, {"not a complete ELF shared object", "5000 bytes", "truncated"});
  expect_text_lists(d, cut, "not a complete ELF shared object");

  // In-process, the same one line from load() and discover().
  PluginRegistry reg;
  try {
    reg.load(cut);
    ADD_FAILURE() << "a truncated file loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(cut), std::string::npos) << msg;
    EXPECT_NE(msg.find("ends at byte"), std::string::npos) << msg;
  }
}

TEST(HostilePlugins, TruncatedCopyFailsARunWithExit1) {
  REQUIRE_BIN();
  PluginDir d;
  fs::remove(d.dir / "libloom-fixture-good.so"); // only the partly written copy is there
  const std::string cut = d.truncated_copy(good_fixture(), 5000, "libloom-fixture-good.so");
  const auto r = loom_limited("run -m " + d.path("missing.gguf") +
                              " -p hi --decoder fixture_twice --plugin-path " + d.dir.string());
  EXPECT_EQ(r.code, 1) << "stdout:\n" << r.out << "\nstderr:\n" << r.err; // before: 135 (SIGBUS)
  EXPECT_NE(r.err.find("'fixture_twice'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(cut + ": not a complete ELF shared object"), std::string::npos) << r.err;
}

TEST(HostilePlugins, FifoIsRejectedWithoutBeingOpened) {
  REQUIRE_BIN();
  PluginDir d;
  const std::string fifo = d.path("libloom-fifo.so");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto list = plugins_json(d); // before: blocked for ever opening it to hash it (timeout: 137)
  expect_listed_broken(list, fifo, {"not a regular file", "FIFO"});
  const nlohmann::json* e = entry_at(list, fifo);
  if (e) {
    EXPECT_EQ((*e)["sha256"], "") << e->dump(); // never hashed
  }

  // A pipeline that looks up a plugin in that directory finishes too: the decoder is found, the
  // (missing) model is what fails.
  const auto r = loom_limited("run -m " + d.path("missing.gguf") +
                              " -p hi --decoder fixture_twice --plugin-path " + d.dir.string());
  EXPECT_EQ(r.code, 1) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  EXPECT_NE(r.err.find("missing.gguf"), std::string::npos) << r.err;

  // In-process: neither hashing nor loading opens it.
  EXPECT_THROW(file_sha256(fifo), Error);
  PluginRegistry reg;
  EXPECT_THROW(reg.load(fifo), Error);
}

TEST(HostilePlugins, SelfLoopingSymlinkIsListedWhereItWasFound) {
  REQUIRE_BIN();
  PluginDir d;
  const std::string loop = d.link("libloom-loop.so", "libloom-loop.so"); // points at itself
  const auto list = plugins_json(d);
  expect_listed_broken(list, loop, {"symlink loop"});

  PluginRegistry reg;
  std::vector<PluginInfo> infos;
  ASSERT_NO_THROW(infos = reg.discover({d.dir.string()}));
  bool found = false;
  for (const auto& i : infos)
    if (i.path == loop) {
      found = true;
      EXPECT_NE(i.error.find("symlink loop"), std::string::npos) << i.error;
    }
  EXPECT_TRUE(found) << loop << " not discovered by that path";
  EXPECT_TRUE(reg.find(LOOM_KIND_SAMPLER, "fixture_greedy").has_value());
}

TEST(HostilePlugins, OtherFilesThatAreNoPluginForThisHost) {
  PluginDir d;
  // A directory named like a plugin.
  fs::create_directory(d.dir / "libloom-dir.so");
  // The good fixture claiming another machine (e_machine at byte 18: EM_AARCH64 = 183, or EM_X86_64
  // = 62 on an AArch64 host).
  const std::string arm = d.path("libloom-other-machine.so");
  fs::copy_file(good_fixture(), arm);
  {
    std::fstream f(arm, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(18);
#if defined(__aarch64__)
    const char m[2] = {62, 0};
#else
    const char m[2] = {static_cast<char>(183), 0};
#endif
    f.write(m, 2);
  }
  PluginRegistry reg;
  std::vector<PluginInfo> infos;
  ASSERT_NO_THROW(infos = reg.discover({d.dir.string()}));
  auto error_of = [&](const std::string& p) {
    for (const auto& i : infos)
      if (i.path == p) return i.error;
    return std::string("(not listed)");
  };
  EXPECT_NE(error_of(d.path("libloom-dir.so")).find("a directory"), std::string::npos)
      << error_of(d.path("libloom-dir.so"));
  EXPECT_NE(error_of(arm).find("not a shared library for this host"), std::string::npos) << error_of(arm);
  EXPECT_NE(error_of(arm).find("e_machine"), std::string::npos) << error_of(arm);
  EXPECT_EQ(error_of(good_fixture()), "");
}

// ---- plugins that crash or hang while loading: probed in a child process ------------------------

TEST(HostilePlugins, SegfaultInInitIsReportedAsACrash) {
  REQUIRE_BIN();
  PluginDir d;
  d.link(hostile("segv-init"), "libloom-segv.so");
  const auto list = plugins_json(d); // before: the listing died with it (exit 139)
  expect_listed_broken(list, hostile("segv-init"),
                       {"crashed while loading (signal 11: SIGSEGV", "in loom_plugin_init"});
  expect_text_lists(d, hostile("segv-init"), "crashed while loading");
}

TEST(HostilePlugins, AbortInAnElfConstructorIsReportedAsACrash) {
  REQUIRE_BIN();
  PluginDir d;
  d.link(hostile("abort-ctor"), "libloom-abort.so");
  const auto list = plugins_json(d); // before: exit 134
  expect_listed_broken(list, hostile("abort-ctor"),
                       {"crashed while loading (signal 6: SIGABRT", "ELF constructors"});
  expect_text_lists(d, hostile("abort-ctor"), "crashed while loading");
}

TEST(HostilePlugins, ProbeInChildThroughTheRegistry) {
  PluginDir d;
  d.link(hostile("segv-init"), "libloom-segv.so");
  d.link(hostile("hangs"), "libloom-hangs.so");
  PluginRegistry reg;
  DiscoverOptions opt;
  opt.probe_in_child = true;
  opt.probe_timeout = std::chrono::milliseconds(500);
  std::vector<PluginInfo> infos;
  ASSERT_NO_THROW(infos = reg.discover({d.dir.string()}, {}, opt));
  auto error_of = [&](const std::string& p) {
    for (const auto& i : infos)
      if (i.path == p) return i.error;
    return std::string("(not listed)");
  };
  EXPECT_NE(error_of(hostile("segv-init")).find("crashed while loading (signal 11: SIGSEGV"),
            std::string::npos)
      << error_of(hostile("segv-init"));
  EXPECT_NE(error_of(hostile("hangs"))
                .find("timed out while loading (no answer within 500 ms, in "
                      "loom_plugin_init"),
            std::string::npos)
      << error_of(hostile("hangs"));
  EXPECT_EQ(error_of(good_fixture()), "");
  EXPECT_TRUE(reg.find(LOOM_KIND_SAMPLER, "fixture_greedy").has_value());
}

// ---- tables the host cannot use -----------------------------------------------------------------

TEST(HostilePlugins, UnknownFactoryKindIsListedAsUnusable) {
  REQUIRE_BIN();
  PluginDir d;
  d.link(hostile("unknown-kind"), "libloom-unknown-kind.so");
  const auto list = plugins_json(d);
  const nlohmann::json* e = entry_at(list, hostile("unknown-kind"));
  ASSERT_NE(e, nullptr) << list.dump(2);
  EXPECT_FALSE(e->contains("error")) << e->dump(); // the plugin loads; one factory is unusable
  ASSERT_TRUE((*e)["provides"].is_array() && (*e)["provides"].size() == 2) << e->dump();
  const auto& future = (*e)["provides"][0];
  EXPECT_EQ(future["name"], "fixture_future");
  ASSERT_TRUE(future.contains("error")) << future.dump(); // before: listed as usable, kind "unknown"
  EXPECT_NE(future["error"].get<std::string>().find("kind 99"), std::string::npos) << future.dump();
  EXPECT_FALSE((*e)["provides"][1].contains("error")) << e->dump();
  EXPECT_EQ((*e)["kind"], "sampler") << e->dump();
  EXPECT_NE(entry_at(list, good_fixture()), nullptr);
  expect_text_lists(d, hostile("unknown-kind"), "(unusable: kind 99");

  // Never found, so never instantiated; the plugin's other factory is.
  PluginRegistry reg;
  reg.discover({d.dir.string()});
  EXPECT_FALSE(reg.find(99, "fixture_future").has_value());
  EXPECT_TRUE(reg.find(LOOM_KIND_SAMPLER, "fixture_known").has_value());
  EXPECT_EQ(reg.available(99), "none");
}

TEST(HostilePlugins, StructSizeZeroHasItsOwnReason) {
  REQUIRE_BIN();
  PluginDir d;
  d.link(hostile("size0-plugin"), "libloom-size0-plugin.so");
  d.link(hostile("size0-factory"), "libloom-size0-factory.so");
  const auto list = plugins_json(d);
  // Before: "built for ABI 1.1, the host speaks ABI 1.1 (the major must match)" and "its loom_factory
  // entries are smaller than" the least a host reads.
  expect_listed_broken(list, hostile("size0-plugin"), {"loom_plugin table has struct_size 0"});
  expect_listed_broken(list, hostile("size0-factory"), {"factory 0 has struct_size 0"});
  const nlohmann::json* e = entry_at(list, hostile("size0-plugin"));
  if (e) {
    EXPECT_EQ((*e)["error"].get<std::string>().find("the major must match"), std::string::npos) << e->dump();
  }
}

TEST(HostilePlugins, InvalidUtf8InPluginStringsGivesValidJson) {
  REQUIRE_BIN();
  PluginDir d;
  d.link(hostile("bad-utf8"), "libloom-bad-utf8.so");
  const auto list = plugins_json(d); // before: type_error.316 from nlohmann::json, exit 1
  const nlohmann::json* e = entry_at(list, hostile("bad-utf8"));
  ASSERT_NE(e, nullptr) << list.dump(2);
  EXPECT_FALSE(e->contains("error")) << e->dump();
  const std::string replacement = "\xEF\xBF\xBD"; // U+FFFD
  EXPECT_EQ((*e)["name"].get<std::string>(), "fixture_bad_utf8_" + replacement) << e->dump();
  EXPECT_NE((*e)["version"].get<std::string>().find("INJECTED LINE"), std::string::npos) << e->dump();
  EXPECT_NE((*e)["provides"][0]["name"].get<std::string>().find(replacement), std::string::npos) << e->dump();
  EXPECT_NE(entry_at(list, good_fixture()), nullptr);

  // The text listing keeps the version's newline escaped: no line of its own for the plugin's text.
  const auto r = loom_limited("plugins --plugin-path " + d.dir.string());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("1.0.0\\nINJECTED LINE"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\nINJECTED LINE"), std::string::npos) << r.out;
}

// ---- loaded by content, not by claim (issue 37) -------------------------------------------------

// A file without a static descriptor (a hand-written loom_plugin_init) is never loaded by a pipeline,
// even while what it names is missing: before, this one's ELF constructor aborted `loom run` (exit 134).
TEST(HostilePlugins, APipelineNeverLoadsAFileWithoutADescriptor) {
  REQUIRE_BIN();
  PluginDir d;
  d.link(hostile("abort-ctor"), "libloom-abort.so");
  const auto r = loom_limited("run -m " + d.path("missing.gguf") +
                              " -p hi --decoder no_such_decoder --plugin-path " + d.dir.string());
  EXPECT_EQ(r.code, 1) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  EXPECT_NE(r.err.find("'no_such_decoder'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no static descriptor"), std::string::npos) << r.err;
}

// A pin names a file, not the name a plugin declares: a copy of the pinned plugin that declares another
// name and offers the same sampler is not loaded in its place (before, an unpinned name dodged the pin).
TEST(HostilePlugins, APinIsKeptByFileNotByTheNameAFileDeclares) {
  PluginDir d; // holds libloom-fixture-good.so (a link to the real fixture)
  std::string bytes = test::read_file(good_fixture());
  const std::string from = std::string("loom-plugin-descriptor-2") + '\0' + "fixture_good";
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at + from.size() - 4, 4, "evil"); // declares "fixture_evil", provides fixture_greedy
  const fs::path evil_dir = d.dir / "first";
  fs::create_directory(evil_dir);
  std::ofstream(evil_dir / "libloom-aaa.so", std::ios::binary) << bytes;
  const std::string pinned = file_sha256(good_fixture());
  PluginRegistry reg;
  DiscoverOptions o;
  o.named_only = true;
  o.only = {{LOOM_KIND_SAMPLER, "fixture_greedy"}};
  const auto infos =
      reg.discover({evil_dir.string(), d.dir.string()}, {{"libloom-fixture-good.so", pinned}}, o);
  const auto f = reg.find(LOOM_KIND_SAMPLER, "fixture_greedy");
  ASSERT_TRUE(f.has_value()) << reg.failures();
  EXPECT_EQ(f->lib->sha256(), pinned) << "the unpinned copy was loaded in the pinned file's place";
  bool listed = false;
  for (const auto& i : infos)
    if (i.path == (evil_dir / "libloom-aaa.so").string())
      listed = i.error.find("pinned plugin file provides") != std::string::npos;
  EXPECT_TRUE(listed) << reg.failures();
  // A wrong pin by file fails that file, whatever it declares.
  PluginRegistry reg2;
  (void)reg2.discover({d.dir.string()}, {{"libloom-fixture-good.so", std::string(64, '0')}}, o);
  EXPECT_FALSE(reg2.find(LOOM_KIND_SAMPLER, "fixture_greedy").has_value());
  EXPECT_NE(reg2.failures().find("pins " + std::string(64, '0')), std::string::npos) << reg2.failures();
}

} // namespace
