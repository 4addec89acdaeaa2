// tests/test_util.hpp — helpers shared by the test suites.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <sstream>
#include <string>

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

} // namespace loom::test

// Skips the test (visibly: GTest prints SKIPPED with the reason) when a model file is missing.
#define LOOM_REQUIRE_MODEL(var, relpath)                                                                     \
  const std::filesystem::path var = ::loom::test::models_dir() / (relpath);                                  \
  if (!std::filesystem::exists(var))                                                                         \
  GTEST_SKIP() << "model file missing: " << var.string()                                                     \
               << " (set LOOM_TEST_MODELS to the directory with the shared test models)"
