// "program_tests": a verifier (ABI 2.2) that runs candidate code against the task's tests in a sandboxed
// child process and scores the share of tests that pass.
//
//   [verifier]
//   name = "program_tests"
//   interpreter = "/usr/bin/python3"  # runs the harness (Python); an absolute path
//   timeout_s = 5.0          # wall-clock limit per candidate (0.1 .. 600); CPU time is limited alike
//   memory_mb = 512          # address space per process (RLIMIT_AS), 16 .. 65536
//   max_processes = 16       # processes the candidate may have (RLIMIT_NPROC), 1 .. 4096
//   max_file_mb = 16         # the largest file it may write (RLIMIT_FSIZE), 1 .. 4096
//   prepend_prompt = false   # true: the program is the prompt followed by the candidate (a completion
//                            # of a given signature, HumanEval-style)
//
// The task (the request's JSON object: `loom verify`'s task line, `loom ab`'s JSONL line) gives
// "tests": a list of Python snippets, each run after the candidate's code in its namespace (an assert,
// a call); the score is the share that run without an exception. The code is the candidate's first
// fenced block (```python … ```) when it has one, else its whole text.
//
// The sandbox — all of it, or the candidate does not run (the verifier fails with the reason):
//   - new network and PID namespaces (no interface but a down loopback: no network at all; when the
//     harness ends, every process it started is killed with it), a new user namespace when not root;
//   - Landlock: nothing may be written, created or removed outside the candidate's temporary directory;
//   - rlimits: CPU seconds, address space, processes, file size, open files; no core dumps;
//   - as root, the uid and gid of nobody (65534), so the process limit applies;
//   - the wall-clock limit: the whole process group is killed at timeout_s.
// LOOM_SANDBOX_DISABLE=landlock|netns (tests only) makes that part count as missing.
#include "loom/sdk/plugin.hpp"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <grp.h>
#include <linux/landlock.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <random>
#include <sched.h>
#include <string>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#ifndef LANDLOCK_ACCESS_FS_REFER
#define LANDLOCK_ACCESS_FS_REFER (1ULL << 13)
#endif
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif

namespace {

namespace fs = std::filesystem;

// The child's exit codes that mean the sandbox could not be set up (the reason is on the status pipe).
constexpr int k_sandbox_failed = 121;

// The harness: runs the candidate's code, then each test in a copy of its namespace; reports each pass
// with a line carrying the run's nonce (taken out of the environment before the candidate runs).
constexpr const char* k_harness = R"PY(import json, os, sys
nonce = os.environ.pop("LOOM_NONCE", "")
tests = json.load(open("tests.json"))
src = open("candidate.py").read()
ns = {"__name__": "__candidate__"}
try:
    exec(compile(src, "candidate.py", "exec"), ns)
except BaseException as e:
    print(nonce, "LOAD", type(e).__name__, flush=True)
    sys.exit(3)
for i, t in enumerate(tests):
    try:
        exec(compile(t, "test%d" % i, "exec"), dict(ns))
        print(nonce, "PASS", i, flush=True)
    except BaseException as e:
        print(nonce, "FAIL", i, type(e).__name__, flush=True)
)PY";

std::string code_of(const std::string& text) {
  const size_t open = text.find("```");
  if (open == std::string::npos) return text;
  const size_t line = text.find('\n', open);
  if (line == std::string::npos) return text;
  const size_t close = text.find("```", line + 1);
  return text.substr(line + 1, (close == std::string::npos ? text.size() : close) - line - 1);
}

bool disabled(const char* part) {
  const char* d = std::getenv("LOOM_SANDBOX_DISABLE");
  return d && std::strstr(d, part) != nullptr;
}

// Async-signal-safe reporting from the forked child: the step that failed and errno, then exit.
[[noreturn]] void child_fail(int fd, const char* what) {
  const int e = errno;
  char buf[160];
  size_t n = 0;
  for (const char* p = what; *p && n < 100; ++p)
    buf[n++] = *p;
  const char* es = e ? strerrordesc_np(e) : nullptr;
  if (es) {
    buf[n++] = ':';
    buf[n++] = ' ';
    for (const char* p = es; *p && n < sizeof buf - 1; ++p)
      buf[n++] = *p;
  }
  if (write(fd, buf, n) < 0) { /* nothing more to do */
  }
  _exit(k_sandbox_failed);
}

class ProgramTests final : public loom::sdk::Verifier {
public:
  explicit ProgramTests(const loom::sdk::Config& cfg) {
    interpreter_ = cfg.get_str("interpreter", "/usr/bin/python3");
    if (interpreter_.empty() || interpreter_[0] != '/')
      throw loom::sdk::Error("program_tests: interpreter must be an absolute path, got \"" + interpreter_ +
                             "\"");
    if (access(interpreter_.c_str(), X_OK) != 0)
      throw loom::sdk::Error("program_tests: interpreter \"" + interpreter_ +
                             "\" is not an executable file; install Python 3 or set interpreter");
    timeout_s_ = cfg.get_f64("timeout_s", 5.0);
    if (!(timeout_s_ >= 0.1 && timeout_s_ <= 600))
      throw loom::sdk::Error("program_tests: timeout_s must be in [0.1, 600], got " +
                             std::to_string(timeout_s_));
    const auto int_key = [&](const char* k, int64_t def, int64_t lo, int64_t hi) {
      const int64_t v = cfg.get_i64(k, def);
      if (v < lo || v > hi)
        throw loom::sdk::Error("program_tests: " + std::string(k) + " must be an integer in [" +
                               std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                               std::to_string(v));
      return v;
    };
    memory_mb_ = int_key("memory_mb", 512, 16, 65536);
    max_processes_ = int_key("max_processes", 16, 1, 4096);
    max_file_mb_ = int_key("max_file_mb", 16, 1, 4096);
    prepend_prompt_ = cfg.get_bool("prepend_prompt", false);
  }

  double score(std::string_view prompt, std::string_view text) override {
    return score_task(prompt, text, {});
  }

  double score_task(std::string_view prompt, std::string_view text, std::string_view task) override {
    if (task.empty())
      throw loom::sdk::Error(
          "program_tests: the request has no task: give its tests as {\"tests\": [\"assert "
          "f(1) == 2\", …]} (a task line of loom verify / loom ab)");
    nlohmann::json tj;
    try {
      tj = nlohmann::json::parse(task);
    } catch (const nlohmann::json::exception& e) {
      throw loom::sdk::Error(std::string("program_tests: the task is not JSON (") + e.what() + ")");
    }
    if (!tj.is_object() || !tj.contains("tests") || !tj["tests"].is_array() || tj["tests"].empty())
      throw loom::sdk::Error(
          "program_tests: the task has no \"tests\" (a non-empty list of Python snippets)");
    for (const auto& t : tj["tests"])
      if (!t.is_string()) throw loom::sdk::Error("program_tests: every test must be a string of Python code");
    const size_t n_tests = tj["tests"].size();
    const std::string code =
        (prepend_prompt_ ? std::string(prompt) : std::string()) + code_of(std::string(text)) + "\n";
    const Run run = run_sandboxed(code, tj["tests"].dump(), n_tests);
    return static_cast<double>(run.passed) / static_cast<double>(n_tests);
  }

private:
  struct Run {
    size_t passed = 0;
    bool timed_out = false;
  };

  Run run_sandboxed(const std::string& code, const std::string& tests_json, size_t n_tests) const {
    // The candidate's directory, with its program, its tests and the harness.
    std::string tmpl = (fs::temp_directory_path() / "loom-program-tests-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      throw loom::sdk::Error(std::string("program_tests: cannot make a temporary directory: ") +
                             std::strerror(errno));
    const fs::path dir = tmpl;
    struct Cleanup {
      fs::path d;
      ~Cleanup() {
        std::error_code ec;
        fs::remove_all(d, ec);
      }
    } cleanup{dir};
    const auto put = [&](const char* name, const std::string& body) {
      std::ofstream f(dir / name, std::ios::binary);
      f << body;
      if (!f) throw loom::sdk::Error("program_tests: cannot write " + (dir / name).string());
    };
    put("candidate.py", code);
    put("tests.json", tests_json);
    put("run.py", k_harness);
    const bool root = geteuid() == 0;
    if (root) { // nobody must own its directory to write there
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (chown(e.path().c_str(), 65534, 65534) != 0) { /* reported by the run if it matters */
        }
      if (chown(dir.c_str(), 65534, 65534) != 0)
        throw loom::sdk::Error(std::string("program_tests: cannot hand the directory to nobody: ") +
                               std::strerror(errno));
    }
    // Everything the child needs, made before fork (the child only makes system calls).
    std::random_device rd;
    char nonce[40];
    std::snprintf(nonce, sizeof nonce, "loom%08x%08x", rd(), rd());
    const std::string env_nonce = std::string("LOOM_NONCE=") + nonce;
    const std::string dir_s = dir.string();
    std::vector<std::string> envs = {env_nonce, "PATH=/usr/bin:/bin", "HOME=" + dir_s,
                                     "PYTHONDONTWRITEBYTECODE=1", "LANG=C.UTF-8"};
    std::vector<char*> envp;
    for (auto& e : envs)
      envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string interp = interpreter_, flag = "-I", script = "run.py";
    char* argv[] = {interp.data(), flag.data(), script.data(), nullptr};
    const int dir_fd = open(dir_s.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) throw loom::sdk::Error("program_tests: cannot open " + dir_s);
    const bool no_landlock = disabled("landlock"), no_netns = disabled("netns");
    const rlim_t cpu = static_cast<rlim_t>(std::ceil(timeout_s_)) + 1;
    const rlim_t mem = static_cast<rlim_t>(memory_mb_) << 20, nproc = static_cast<rlim_t>(max_processes_),
                 fsize = static_cast<rlim_t>(max_file_mb_) << 20;

    int out[2], status_pipe[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(status_pipe, O_CLOEXEC) != 0) {
      close(dir_fd);
      throw loom::sdk::Error(std::string("program_tests: pipe: ") + std::strerror(errno));
    }
    const pid_t pid = fork();
    if (pid < 0) {
      close(dir_fd);
      throw loom::sdk::Error(std::string("program_tests: fork: ") + std::strerror(errno));
    }
    if (pid == 0) { // C1: the namespaces, then the harness as their init
      const int sfd = status_pipe[1];
      setpgid(0, 0);
      if (no_netns) child_fail(sfd, "network namespace unavailable (LOOM_SANDBOX_DISABLE)");
      int flags = CLONE_NEWNET | CLONE_NEWPID;
      if (!root) flags |= CLONE_NEWUSER;
      if (unshare(flags) != 0) child_fail(sfd, "unshare(network, PID namespaces)");
      const pid_t inner = fork();
      if (inner < 0) child_fail(sfd, "fork in the PID namespace");
      if (inner == 0) { // C2: pid 1 of the namespace
        const struct rlimit lc {
          cpu, cpu
        }, lm{mem, mem}, lp{nproc, nproc}, lf{fsize, fsize}, ln{64, 64}, l0{0, 0};
        if (setrlimit(RLIMIT_CPU, &lc) || setrlimit(RLIMIT_AS, &lm) || setrlimit(RLIMIT_FSIZE, &lf) ||
            setrlimit(RLIMIT_NOFILE, &ln) || setrlimit(RLIMIT_CORE, &l0))
          child_fail(sfd, "setrlimit");
        if (root) {
          if (setgroups(0, nullptr) || setgid(65534) || setuid(65534)) child_fail(sfd, "dropping to nobody");
        }
        if (setrlimit(RLIMIT_NPROC, &lp)) child_fail(sfd, "setrlimit(NPROC)");
        if (no_landlock) {
          errno = 0;
          child_fail(sfd, "Landlock unavailable (LOOM_SANDBOX_DISABLE)");
        }
        const long abi = syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
        if (abi < 1) child_fail(sfd, "Landlock (Linux 5.13+, enabled in the kernel's LSM list)");
        uint64_t write_rights = LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR |
                                LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
                                LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
                                LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO |
                                LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM;
        if (abi >= 2) write_rights |= LANDLOCK_ACCESS_FS_REFER;
        if (abi >= 3) write_rights |= LANDLOCK_ACCESS_FS_TRUNCATE;
        struct landlock_ruleset_attr ra {};
        ra.handled_access_fs = write_rights;
        const int rs = static_cast<int>(syscall(SYS_landlock_create_ruleset, &ra, sizeof ra, 0));
        if (rs < 0) child_fail(sfd, "landlock_create_ruleset");
        struct landlock_path_beneath_attr pb {};
        pb.allowed_access = write_rights;
        pb.parent_fd = dir_fd;
        if (syscall(SYS_landlock_add_rule, rs, LANDLOCK_RULE_PATH_BENEATH, &pb, 0) != 0)
          child_fail(sfd, "landlock_add_rule");
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_fail(sfd, "no_new_privs");
        if (syscall(SYS_landlock_restrict_self, rs, 0) != 0) child_fail(sfd, "landlock_restrict_self");
        if (fchdir(dir_fd) != 0) child_fail(sfd, "chdir");
        if (dup2(out[1], 1) < 0 || dup2(out[1], 2) < 0) child_fail(sfd, "dup2");
        const int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        execve(argv[0], argv, envp.data());
        child_fail(sfd, "exec of the interpreter");
      }
      int st = 0;
      while (waitpid(inner, &st, 0) < 0 && errno == EINTR) {
      }
      _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    }
    close(dir_fd);
    close(out[1]);
    close(status_pipe[1]);
    // The harness's lines until it ends or the clock runs out.
    std::string got;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000));
    bool timed_out = false;
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        timed_out = true;
        break;
      }
      pollfd p{out[0], POLLIN, 0};
      const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      char buf[4096];
      const ssize_t n = read(out[0], buf, sizeof buf);
      if (n <= 0) break; // EOF: every process of the namespace is gone
      if (got.size() < (1u << 20)) got.append(buf, static_cast<size_t>(n));
    }
    kill(-pid, SIGKILL); // the group: C1 and the namespace's init (whose death ends every other process)
    kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    close(out[0]);
    char why[256] = {0};
    const ssize_t wn = read(status_pipe[0], why, sizeof why - 1);
    close(status_pipe[0]);
    if (wn > 0)
      throw loom::sdk::Error(std::string("program_tests: the sandbox could not be set up (") + why +
                             "); refusing to run candidate code without it");
    Run run;
    run.timed_out = timed_out;
    // Each test's pass counts once (lines start with the run's nonce, which the candidate is not given).
    const std::string tag = std::string(nonce) + " PASS ";
    std::vector<bool> seen(n_tests, false);
    for (size_t at = got.find(tag); at != std::string::npos; at = got.find(tag, at + 1)) {
      if (at != 0 && got[at - 1] != '\n') continue;
      const size_t i = std::strtoul(got.c_str() + at + tag.size(), nullptr, 10);
      if (i < n_tests && !seen[i]) {
        seen[i] = true;
        ++run.passed;
      }
    }
    return run;
  }

  std::string interpreter_;
  double timeout_s_ = 5.0;
  int64_t memory_mb_ = 512, max_processes_ = 16, max_file_mb_ = 16;
  bool prepend_prompt_ = false;
};

} // namespace

LOOM_PLUGIN_DEFINE("program_tests", "1.0.0", LOOM_VERIFIER("program_tests", ProgramTests));
