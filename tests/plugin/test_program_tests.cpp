// The program_tests verifier (plugins/program_tests) through `loom verify`: candidate code runs against
// the task's tests in a sandbox; hostile candidates (a fork bomb, an endless loop, a huge allocation,
// writes outside their directory, the network, processes left behind) are contained; a candidate cannot
// forge its verdict (fake report lines, patched builtins, exits, objects equal to anything) nor reach a
// file, a Unix socket or a process outside; without the sandbox nothing runs.
#include "test_util.hpp"

#include <arpa/inet.h>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
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

// Ends what processes_with found (a failed test must not leave them running).
void kill_processes_with(const std::string& marker) {
  DIR* d = opendir("/proc");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/cmdline", std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (s.find(marker) != std::string::npos) ::kill(std::atoi(e->d_name), SIGKILL);
  }
  closedir(d);
}

// Each line's score (NaN for an error, with the line's JSON in `errors`).
std::vector<double> scores(const loom::test::CliResult& r, std::string* errors = nullptr) {
  std::vector<double> out;
  const auto j = nlohmann::json::parse(r.out);
  for (const auto& res : j["results"]) {
    if (res["score"].is_number()) {
      out.push_back(res["score"].get<double>());
    } else {
      out.push_back(std::nan(""));
      if (errors) *errors += res.dump() + "\n";
    }
  }
  return out;
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

TEST(ProgramTests, CandidatesCannotForgeTheirVerdict) {
  REQUIRE_WORKING_SANDBOX();
  const std::vector<std::string> failing = {"assert False", "assert 1 == 2", "raise Exception()"};
  const std::vector<nlohmann::json> lines = {
      // 0. report lines with the harness's nonce (a global of the old harness's interpreter)
      task("import __main__; [print(__main__.nonce, 'PASS', i) for i in range(100)]", failing),
      // 1. a print that turns the harness's FAIL lines into PASS lines
      task("import builtins\n"
           "_p = builtins.print\n"
           "def p(*a, **k):\n"
           "    a = list(a)\n"
           "    if len(a) > 2 and a[1] == 'FAIL':\n"
           "        a = [a[0], 'PASS', a[2]]\n"
           "    _p(*a, **k)\n"
           "builtins.print = p\n",
           failing),
      // 2. a compile that turns every test into `pass`
      task("import builtins\n"
           "_c = builtins.compile\n"
           "builtins.compile = lambda s, f, m, *a, **k: _c('pass', f, m)\n",
           failing),
      // 3. PASS lines written to every descriptor it has
      task("import os\n"
           "for fd in range(1024):\n"
           "    try:\n"
           "        os.write(fd, b'PASS 0\\nPASS 1\\nPASS 2\\nPPP')\n"
           "    except OSError:\n"
           "        pass\n",
           failing),
      // 4. an object equal to everything
      task("class Eq:\n"
           "    def __eq__(self, other):\n"
           "        return True\n"
           "    def __ne__(self, other):\n"
           "        return False\n"
           "    __hash__ = object.__hash__\n"
           "def f():\n"
           "    return Eq()\n",
           {"assert f() == 5", "assert f() == 'x'", "assert [f()] == [[1]]"}),
      // 5. builtins the tests use, shadowed
      task("def sorted(x, **k):\n"
           "    return [1, 2, 3]\n"
           "def abs(x):\n"
           "    return 0\n"
           "def f(x):\n"
           "    return [3, 1]\n",
           {"assert sorted(f(1)) == [1, 2, 3]", "assert abs(f(2)[0] - 4) < 1e-9"}),
      // 6. StopIteration raised from a call, ending the test's loop before its first assert
      task("def f(x):\n    raise StopIteration\n",
           {"for x, y in zip([1, 2], map(f, [1, 2])):\n    assert y == 2 * x"}),
      // 7. exits when loaded, and inside the calls (the tests catch what they can)
      task("import os; os._exit(0)", {"assert False"}),
      task("import sys; sys.exit(0)", {"assert False"}),
      task("import os, sys\ndef f():\n    os._exit(0)\ndef g():\n    sys.exit(0)\n",
           {"try:\n    f()\nexcept BaseException:\n    pass\n",
            "try:\n    g()\nexcept SystemExit:\n    pass\n"}),
  };
  const fs::path f = write_tasks("forge.jsonl", lines);
  const auto r = verify("--tasks " + f.string() + " --set verifier.timeout_s=5");
  ASSERT_EQ(r.code, 0) << r.err;
  std::string errors;
  const auto got = scores(r, &errors);
  ASSERT_EQ(got.size(), lines.size()) << r.out;
  EXPECT_TRUE(errors.empty()) << errors;
  for (size_t i = 0; i < lines.size(); ++i)
    EXPECT_DOUBLE_EQ(got[i], 0.0) << "line " << i << " forged a pass: " << lines[i].dump();
  fs::remove(f);
}

TEST(ProgramTests, TestsSeeTheCandidatesValuesAndObjects) {
  REQUIRE_WORKING_SANDBOX();
  // The judge holds plain values and references; what tests do with them still works.
  const std::string code =
      "import collections, math\n"
      "Point = collections.namedtuple('Point', 'x y')\n"
      "LIMIT = 10\n"
      "SEEN = []\n"
      "class Negative(ValueError):\n    pass\n"
      "class Stack:\n"
      "    def __init__(self):\n"
      "        self.items = []\n"
      "    def push(self, x):\n"
      "        self.items.append(x)\n"
      "    def pop(self):\n"
      "        return self.items.pop()\n"
      "    def __len__(self):\n"
      "        return len(self.items)\n"
      "def root(x):\n    if x < 0:\n        raise Negative('negative: %d' % x)\n    return math.sqrt(x)\n"
      "def squares(n):\n    for i in range(n):\n        yield i * i\n"
      "def see(x):\n    SEEN.append(x)\n    return len(SEEN)\n"
      "def odd():\n    return [float('inf'), -0.0, 2 ** 20000, {1: (2, b'3')}, {4}, None, Point(1, 2)]\n";
  const std::vector<std::string> tests = {
      "assert root(4) == 2.0 and LIMIT == 10",
      "try:\n    root(-1)\n    assert False\nexcept Negative as e:\n    assert str(e) == 'negative: -1'",
      "try:\n    root(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False",
      "s = Stack()\ns.push(1)\ns.push(2)\nassert len(s) == 2 and s.pop() == 2 and s.items == [1]",
      "assert list(squares(4)) == [0, 1, 4, 9] and 9 in squares(4)",
      "assert see('a') == 1 and see('b') == 2 and SEEN == ['a', 'b']",
      "import math\nv = odd()\nassert math.isinf(v[0]) and str(v[1]) == '-0.0' and v[2] == 2 ** 20000\n"
      "assert v[3:6] == [{1: (2, b'3')}, {4}, None] and v[6] == (1, 2) and v[6].y == 2",
      "def check(candidate):\n    assert candidate(9) == 3\ncheck(root)",
      "assert SEEN == []", // each test has a fresh candidate process
      "assert True",
  };
  const fs::path f = write_tasks("objects.jsonl", {task(code, tests)});
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = verify("--tasks " + f.string());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.code, 0) << r.err;
  std::string errors;
  const auto got = scores(r, &errors);
  ASSERT_EQ(got.size(), 1u) << r.out;
  EXPECT_DOUBLE_EQ(got[0], 1.0) << errors << r.out;
  EXPECT_LT(secs, 20) << "a run of ten tests takes one judge and one candidate start, not ten";
  fs::remove(f);
}

TEST(ProgramTests, NothingOutsideTheSandboxCanBeReached) {
  REQUIRE_WORKING_SANDBOX();
  const std::string tag = std::to_string(::getpid());
  // A file outside (readable by anyone, even nobody), the tasks file and the tests themselves.
  const fs::path secret = fs::temp_directory_path() / ("loom-pt-secret-" + tag);
  std::ofstream(secret) << "s3cret";
  fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                              fs::perms::others_read);
  // A Unix socket with a path, and one in the abstract namespace, both listening (anyone may connect).
  const std::string sock_path = (fs::temp_directory_path() / ("loom-pt-sock-" + tag)).string();
  const std::string abstract = "loom-pt-abstract-" + tag;
  const auto listen_unix = [](const std::string& name, bool in_abstract) {
    const int s = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path + (in_abstract ? 1 : 0), name.data(), name.size());
    const socklen_t len =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size() + (in_abstract ? 1 : 0));
    if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(s, 8) != 0) return -1;
    return s;
  };
  ::unlink(sock_path.c_str());
  const int path_srv = listen_unix(sock_path, false), abstract_srv = listen_unix(abstract, true);
  ASSERT_GE(path_srv, 0);
  ASSERT_GE(abstract_srv, 0);
  ::chmod(sock_path.c_str(), 0777);
  const fs::path f = fs::temp_directory_path() / ("loom-pt-" + tag + "-outside.jsonl");
  const std::string code =
      "import os, socket\n"
      "def peek(path):\n    try:\n        with open(path) as f:\n            return f.read()\n"
      "    except (OSError, ValueError):\n        return 'unreadable'\n"
      "def reach(address):\n    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
      "    s.settimeout(2)\n    try:\n        s.connect(address)\n        return 'connected'\n"
      "    except OSError:\n        return 'blocked'\n"
      "def others():\n    try:\n        return sorted(os.listdir('/proc'))\n    except OSError:\n"
      "        return 'none'\n"
      "def find(marker):\n"
      "    for top in {'.', '/tmp', '/loom', '/task', '/etc', os.environ.get('HOME', '.')}:\n"
      "        for d, _, files in os.walk(top):\n            for name in files:\n"
      "                if marker in peek(os.path.join(d, name)):\n                    return 'found'\n"
      "    return 'absent'\n";
  const std::vector<nlohmann::json> lines = {task(
      code,
      {"assert peek('" + secret.string() + "') == 'unreadable'",
       "assert peek('" + f.string() + "') == 'unreadable'",
       "assert peek('/proc/self/environ') == 'unreadable'", "assert reach('" + sock_path + "') == 'blocked'",
       "assert reach('\\0" + abstract + "') == 'blocked'", "assert others() == 'none'",
       // the tests themselves: this one's source holds the marker the candidate looks for
       "# loom-test-marker-" + tag + "\nassert find('loom-test-marker-' + '" + tag + "') == 'absent'"})};
  {
    std::ofstream out(f);
    for (const auto& l : lines)
      out << l.dump() << "\n";
  }
  const auto r = verify("--tasks " + f.string());
  close(path_srv);
  close(abstract_srv);
  ::unlink(sock_path.c_str());
  fs::remove(secret);
  fs::remove(f);
  ASSERT_EQ(r.code, 0) << r.err;
  std::string errors;
  const auto got = scores(r, &errors);
  ASSERT_EQ(got.size(), 1u) << r.out;
  EXPECT_DOUBLE_EQ(got[0], 1.0) << "a file, a socket, /proc or the tests were reachable " << errors;
}

TEST(ProgramTests, ProcessesThatLeaveTheGroupStillEndWithTheVerdict) {
  REQUIRE_WORKING_SANDBOX();
  const std::string marker = "599." + std::to_string(::getpid()); // a `sleep` argument to look for afterwards
  const std::vector<nlohmann::json> lines = {
      // 0. the loading process itself leaves the group, closes its output and becomes the sleeper
      task("import os\n"
           "os.setsid()\n"
           "os.close(1)\n"
           "os.close(2)\n"
           "os.execvp('sleep', ['sleep', '" +
               marker + "1'])\n",
           {"assert True"}),
      // 1. a call that starts a sleeper in a session of its own (double fork)
      task("import os\n"
           "def spawn():\n"
           "    if os.fork() == 0:\n"
           "        os.setsid()\n"
           "        if os.fork() == 0:\n"
           "            os.execvp('sleep', ['sleep', '" +
               marker +
               "2'])\n"
               "        os._exit(0)\n"
               "    os.wait()\n"
               "    return 'spawned'\n",
           {"assert spawn() == 'spawned'"}),
  };
  const fs::path f = write_tasks("escape.jsonl", lines);
  // 5 s: task 1 (an interpreter, a fork, an exec) must end inside it on a loaded 2-core machine;
  // task 0 takes it all.
  const auto r = verify("--tasks " + f.string() + " --set verifier.timeout_s=5");
  ASSERT_EQ(r.code, 0) << r.err;
  std::string errors;
  const auto got = scores(r, &errors);
  ASSERT_EQ(got.size(), lines.size()) << r.out;
  EXPECT_TRUE(errors.empty()) << errors;
  EXPECT_DOUBLE_EQ(got[0], 0.0) << "its code never finished loading";
  EXPECT_DOUBLE_EQ(got[1], 1.0);
  EXPECT_EQ(processes_with(marker), 0) << "a process outlived its verdict";
  kill_processes_with(marker);
  fs::remove(f);
}

TEST(ProgramTests, RefusesToRunWithoutTheSandbox) {
  REQUIRE_SANDBOX();
  const fs::path f = write_tasks("nosandbox.jsonl", {task("def f():\n    return 1\n", {"assert f() == 1"})});
  for (const char* part : {"landlock", "netns", "mountns"}) {
    SCOPED_TRACE(part);
    const auto r = verify("--tasks " + f.string(), std::string("LOOM_SANDBOX_DISABLE=") + part);
    ASSERT_EQ(r.code, 0) << r.err;
    const auto res = nlohmann::json::parse(r.out)["results"][0];
    EXPECT_TRUE(res["score"].is_null());
    EXPECT_NE(res.value("error", std::string()).find("refusing to run candidate code without it"),
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
