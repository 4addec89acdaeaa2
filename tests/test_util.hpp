// tests/test_util.hpp — helpers shared by the test suites.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace loom::test {

// Directory with the shared test models: $LOOM_TEST_MODELS, else ../shared/models next to the
// source tree.
inline std::filesystem::path models_dir() {
  if (const char* e = std::getenv("LOOM_TEST_MODELS"); e && *e) return std::filesystem::path(e);
#ifdef LOOM_SOURCE_DIR
  return std::filesystem::path(LOOM_SOURCE_DIR) / ".." / "shared" / "models";
#else
  return std::filesystem::path("../shared/models");
#endif
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A path of this process's own in the temp directory: loom-<tag>-<pid>-<name>.
inline std::filesystem::path temp_path(const std::string& tag, const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("loom-" + tag + "-" + std::to_string(::getpid()) + "-" + name);
}

// Writes `text` (bytes as given) to temp_path(tag, name); returns that path.
inline std::string write_temp(const std::string& tag, const std::string& name, const std::string& text) {
  const std::filesystem::path p = temp_path(tag, name);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// `$LOOM_BIN args` through a shell: stdout, stderr (or both in `out` when merge_stderr) and the
// exit code (-1 when LOOM_BIN is unset or the command could not run). With timeout_s > 0 the
// command is killed after that many seconds (a hang fails the test instead of stalling it): code 137.
// A death by signal N shows as 128 + N.
struct CliResult {
  std::string out, err;
  int code = -1;
};

// env: "NAME=value …" assignments for the command (shell syntax), or "".
inline CliResult run_loom(const std::string& args, bool merge_stderr, int timeout_s = 0,
                          const std::string& env = "") {
  CliResult r;
  const char* bin = std::getenv("LOOM_BIN");
  if (!bin) return r;
  const std::filesystem::path err_file =
      std::filesystem::temp_directory_path() / ("loom-test-stderr-" + std::to_string(::getpid()));
  const std::string limit = timeout_s > 0 ? "timeout -s KILL " + std::to_string(timeout_s) + " " : "";
  const std::string cmd = (env.empty() ? "" : env + " ") + limit + std::string(bin) + " " + args +
                          (merge_stderr ? " 2>&1" : " 2>" + err_file.string());
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0)
    r.out.append(buf, n);
  const int st = pclose(f);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  if (!merge_stderr) {
    r.err = read_file(err_file);
    std::error_code ec;
    std::filesystem::remove(err_file, ec);
  }
  return r;
}

// `$LOOM_BIN args` with stdout and stderr together, as a user sees them.
inline CliResult run_loom_merged(const std::string& args) {
  return run_loom(args, true);
}

} // namespace loom::test

// Skips (visibly) when LOOM_BIN does not name the loom executable.
#define LOOM_REQUIRE_BIN()                                                                                   \
  if (!std::getenv("LOOM_BIN") || !std::filesystem::exists(std::getenv("LOOM_BIN")))                         \
  GTEST_SKIP() << "LOOM_BIN does not point to the loom executable"

// Skips the test (visibly: GTest prints SKIPPED with the reason) when a model file is missing.
#define LOOM_REQUIRE_MODEL(var, relpath)                                                                     \
  const std::filesystem::path var = ::loom::test::models_dir() / (relpath);                                  \
  if (!std::filesystem::exists(var))                                                                         \
  GTEST_SKIP() << "model file missing: " << var.string()                                                     \
               << " (set LOOM_TEST_MODELS to the directory with the shared test models)"
