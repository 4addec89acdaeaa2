// The program_tests verifier (plugins/program_tests) through `loom verify`: candidate code runs against
// the task's tests in a sandbox; hostile candidates (a fork bomb, an endless loop, a huge allocation,
// writes outside their directory, the network, processes left behind) are contained; without the
// sandbox nothing runs.
#include "test_util.hpp"

#include <arpa/inet.h>
#include <chrono>
#include <dirent.h>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;

fs::path write_tasks(const std::string& name, const std::vector<nlohmann::json>& lines) {
  const fs::path p = fs::temp_directory_path() / ("loom-pt-" + std::to_string(::getpid()) + "-" + name);
  std::ofstream f(p);
  for (const auto& l : lines)
    f << l.dump() << "\n";
  return p;
}

loom::test::CliResult verify(const std::string& args, const std::string& env = "") {
  return loom::test::run_loom("verify --verifier program_tests " + args +
                                  " --json --plugin-path " LOOM_BUILD_BIN_DIR,
                              false, 120, env);
}

bool have_python() {
  return ::access("/usr/bin/python3", X_OK) == 0;
}

// The sandbox's parts (namespaces, Landlock) are the kernel's: where one is missing the verifier refuses
// to run anything (RefusesToRunWithoutTheSandbox checks that), and these tests say so and skip.
std::string sandbox_missing() {
  static const std::string why = [] {
    const fs::path f = fs::temp_directory_path() / ("loom-pt-probe-" + std::to_string(::getpid()) + ".jsonl");
    std::ofstream(f) << nlohmann::json{{"candidate", "x = 1"}, {"tests", {"assert x == 1"}}}.dump() << "\n";
    const auto r = loom::test::run_loom("verify --verifier program_tests --json --tasks " + f.string() +
                                            " --plugin-path " LOOM_BUILD_BIN_DIR,
                                        false, 60);
    fs::remove(f);
    if (r.code != 0) return "loom verify failed: " + r.err;
    const auto res = nlohmann::json::parse(r.out)["results"][0];
    return res.contains("error") ? res["error"].get<std::string>() : std::string();
  }();
  return why;
}

#define REQUIRE_SANDBOX()                                                                                    \
  do {                                                                                                       \
    LOOM_REQUIRE_BIN();                                                                                      \
    if (!have_python()) GTEST_SKIP() << "SKIPPED: /usr/bin/python3 is missing (program_tests runs Python)";  \
  } while (0)
#define REQUIRE_WORKING_SANDBOX()                                                                            \
  do {                                                                                                       \
    REQUIRE_SANDBOX();                                                                                       \
    if (const std::string why = sandbox_missing(); !why.empty())                                             \
      GTEST_SKIP() << "SKIPPED: this machine cannot give program_tests its sandbox: " << why;                \
  } while (0)

nlohmann::json task(const std::string& code, const std::vector<std::string>& tests) {
  return {{"candidate", code}, {"tests", tests}};
}

// Processes whose command line holds `marker` (anywhere on the machine).
int processes_with(const std::string& marker) {
  int n = 0;
  DIR* d = opendir("/proc");
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (s.find(marker) != std::string::npos) ++n;
  }
  closedir(d);
  return n;
}

TEST(ProgramTests, ScoresTheShareOfTestsThatPass) {
  REQUIRE_WORKING_SANDBOX();
  const std::vector<std::string> tests = {"assert add(1, 2) == 3", "assert add(-1, 1) == 0",
                                          "assert add(2, 2) == 5"};
  const fs::path f =
      write_tasks("share.jsonl", {task("def add(a, b):\n    return a + b\n", tests), // 2 of 3
                                  task("Here it is:\n```python\ndef add(a, b):\n    return a - b\n```\nDone.",
                                       tests),                                   // fenced: 0 of 3 pass
                                  task("def add(a, b) return", tests),           // does not compile
                                  task("def add(a, b):\n    return 3\n", tests), // 1 of 3
                                  task("print('PASS 0')\nprint('PASS 1')\ndef add(a, b): return 0\n",
                                       tests)}); // 1 of 3: its fake lines don't count
  const auto r = verify("--tasks " + f.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const std::vector<double> want = {2.0 / 3, 0.0, 0.0, 1.0 / 3, 1.0 / 3};
  ASSERT_EQ(j["results"].size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(j["results"][i]["score"].is_number()) << j["results"][i];
    EXPECT_DOUBLE_EQ(j["results"][i]["score"].get<double>(), want[i]) << i;
  }
  // prepend_prompt: the candidate completes the prompt's signature.
  const fs::path g = write_tasks("prepend.jsonl", {{{"prompt", "def double(x):\n"},
                                                    {"candidate", "    return 2 * x\n"},
                                                    {"tests", {"assert double(4) == 8"}}}});
  const auto p = verify("--tasks " + g.string() + " --set verifier.prepend_prompt=true");
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(p.out)["results"][0]["score"].get<double>(), 1.0);
  fs::remove(f);
  fs::remove(g);
}

TEST(ProgramTests, HostileCandidatesAreContained) {
  REQUIRE_WORKING_SANDBOX();
  // A port listening on the host: the candidate must not reach it.
  const int srv = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(srv, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(srv, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(srv, 4), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(srv, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  const std::string outside =
      (fs::temp_directory_path() / ("loom-escape-" + std::to_string(::getpid()))).string();
  const std::string marker =
      "86400." + std::to_string(::getpid()); // a `sleep` argument to look for afterwards
  const std::vector<nlohmann::json> lines = {
      // 0. a fork bomb: contained by the process limit and ended with its namespace
      task("import os\nfor _ in range(100000):\n    try:\n        os.fork()\n    except OSError:\n        "
           "pass\n",
           {"assert False"}),
      // 1. an endless loop: killed at timeout_s
      task("while True:\n    pass\n", {"assert True"}),
      // 2. a huge allocation: refused (address-space limit)
      task("x = bytearray(8 * 1024 ** 3)\n", {"assert True"}),
      // 3. a write outside its directory: refused; one inside: allowed
      task("def escape():\n    try:\n        open('" + outside +
               "', 'w').write('x')\n        return 'wrote'\n    except OSError:\n        return 'refused'\n"
               "def inside():\n    open('note.txt', 'w').write('ok')\n    return open('note.txt').read()\n",
           {"assert escape() == 'refused'", "assert inside() == 'ok'"}),
      // 4. the network: unreachable
      task("import socket\ndef reach():\n    try:\n        socket.create_connection(('127.0.0.1', " +
               std::to_string(port) +
               "), timeout=1)\n        return 'connected'\n    except OSError:\n"
               "        return 'blocked'\n",
           {"assert reach() == 'blocked'"}),
      // 5. a process left running: gone with the namespace
      task("import os\nif os.fork() == 0:\n    os.setsid()\n    os.execvp('sleep', ['sleep', '" + marker +
               "'])\n",
           {"assert True"}),
  };
  const fs::path f = write_tasks("hostile.jsonl", lines);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = verify("--tasks " + f.string() + " --set verifier.timeout_s=3 --set verifier.memory_mb=256");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  close(srv);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i)
    EXPECT_FALSE(j["results"][i].contains("error")) << i << ": " << j["results"][i];
  EXPECT_DOUBLE_EQ(j["results"][0]["score"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j["results"][1]["score"].get<double>(), 0.0) << "the loop never reached its test";
  EXPECT_DOUBLE_EQ(j["results"][2]["score"].get<double>(), 0.0) << "the allocation must fail";
  EXPECT_DOUBLE_EQ(j["results"][3]["score"].get<double>(), 1.0) << "refused outside, allowed inside";
  EXPECT_FALSE(fs::exists(outside));
  EXPECT_DOUBLE_EQ(j["results"][4]["score"].get<double>(), 1.0) << "the network must be unreachable";
  EXPECT_EQ(processes_with(marker), 0) << "a process outlived its candidate";
  EXPECT_LT(secs, 60) << "every candidate ends within its limits";
  fs::remove(f);
}

TEST(ProgramTests, RefusesToRunWithoutTheSandbox) {
  REQUIRE_SANDBOX();
  const fs::path f = write_tasks("nosandbox.jsonl", {task("def f():\n    return 1\n", {"assert f() == 1"})});
  for (const char* part : {"landlock", "netns"}) {
    SCOPED_TRACE(part);
    const auto r = verify("--tasks " + f.string(), std::string("LOOM_SANDBOX_DISABLE=") + part);
    ASSERT_EQ(r.code, 0) << r.err;
    const auto res = nlohmann::json::parse(r.out)["results"][0];
    EXPECT_TRUE(res["score"].is_null());
    EXPECT_NE(res["error"].get<std::string>().find("refusing to run candidate code without it"),
              std::string::npos)
        << res;
  }
  if (sandbox_missing().empty()) { // and with it, the candidate runs
    const auto ok = verify("--tasks " + f.string());
    ASSERT_EQ(ok.code, 0) << ok.err;
    EXPECT_DOUBLE_EQ(nlohmann::json::parse(ok.out)["results"][0]["score"].get<double>(), 1.0);
  }
  fs::remove(f);
}

TEST(ProgramTests, BadKeysAndTasksAreOneLineErrors) {
  REQUIRE_SANDBOX();
  const fs::path ok = write_tasks("keys.jsonl", {task("x = 1", {"assert x == 1"})});
  const auto one_line = [](const loom::test::CliResult& r, const std::string& has) {
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find(has), std::string::npos) << r.err;
    EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;
  };
  one_line(verify("--tasks " + ok.string() + " --set verifier.timeout_s=0"),
           "timeout_s must be in [0.1, 600]");
  one_line(verify("--tasks " + ok.string() + " --set verifier.memory_mb=1"), "memory_mb must be");
  one_line(verify("--tasks " + ok.string() + " --set 'verifier.interpreter=\"python3\"'"), "absolute path");
  one_line(verify("--tasks " + ok.string() + " --set 'verifier.interpreter=\"/nonexistent/py\"'"),
           "not an executable file");
  // A task without tests fails that line only.
  const fs::path no =
      write_tasks("notests.jsonl", {{{"candidate", "x = 1"}}, task("x = 1", {"assert x == 1"})});
  const auto r = verify("--tasks " + no.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["results"][0]["error"].get<std::string>().find("no \"tests\""), std::string::npos) << j;
  if (sandbox_missing().empty()) {
    EXPECT_DOUBLE_EQ(j["results"][1]["score"].get<double>(), 1.0);
  }
  fs::remove(ok);
  fs::remove(no);
}

} // namespace
