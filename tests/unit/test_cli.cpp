// The `loom` executable without a model: exit codes (0 ok, 1 error, 2 usage), help everywhere, one-line
// errors. (Its commands on a model — tokenize, inspect, run --json, quantize, bench:
// tests/integration/test_cli.cpp.)
#include "test_util.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>

namespace {

using loom::test::run_loom_merged;

TEST(Cli, UsageErrorsExitTwo) {
  LOOM_REQUIRE_BIN();
  EXPECT_EQ(run_loom_merged("").code, 2);
  EXPECT_EQ(run_loom_merged("frobnicate").code, 2);
  auto r = run_loom_merged("run -p hi");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("-m"), std::string::npos) << r.out;
  EXPECT_EQ(run_loom_merged("run -m x.gguf -p hi --bogus").code, 2);
  EXPECT_EQ(run_loom_merged("run -m x.gguf -p hi --temp -1").code, 2);
  EXPECT_EQ(run_loom_merged("run -m x.gguf -p hi --top-p 1.5").code, 2);
  EXPECT_EQ(run_loom_merged("tokenize -m x.gguf").code, 2);
  EXPECT_EQ(run_loom_merged("config").code, 2);
}

TEST(Cli, HelpEverywhere) {
  LOOM_REQUIRE_BIN();
  for (const char* c : {"--help", "run --help", "tokenize --help", "inspect --help", "config --help"}) {
    const auto r = run_loom_merged(c);
    EXPECT_EQ(r.code, 0) << c;
    EXPECT_NE(r.out.find("usage"), std::string::npos) << c << ": " << r.out;
  }
}

TEST(Cli, ErrorsAreOneOrTwoLines) {
  LOOM_REQUIRE_BIN();
  auto r = run_loom_merged("run -m /nonexistent.gguf -p hi");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out.rfind("loom: error:", 0), 0u) << r.out;
  EXPECT_LE(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
  const auto dir = std::filesystem::temp_directory_path() / "loom_cli_test";
  std::filesystem::create_directories(dir);
  const auto bad = dir / "bad.toml";
  {
    std::ofstream f(bad);
    f << "[stop]\nmax_tokens = \"many\"\n";
  }
  r = run_loom_merged("config show -c " + bad.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("bad.toml:2:"), std::string::npos) << r.out;
  EXPECT_LE(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
  const auto notgguf = dir / "not.gguf";
  {
    std::ofstream f(notgguf);
    f << "this is not a model";
  }
  r = run_loom_merged("inspect " + notgguf.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("magic"), std::string::npos) << r.out;
}

} // namespace
