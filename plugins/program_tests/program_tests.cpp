// "program_tests": a verifier that runs candidate code against the task's tests in a sandbox
// and scores the share of tests that pass.
//
//   [verifier]
//   name = "program_tests"
//   interpreter = "/usr/bin/python3"  # runs the candidate and the tests (Python 3.7+); an absolute path
//   timeout_s = 5.0          # wall-clock limit per candidate, all its tests (0.1 .. 600); CPU time alike
//   memory_mb = 512          # address space per process (RLIMIT_AS), 16 .. 65536
//   max_processes = 16       # processes the candidate may have (RLIMIT_NPROC), 1 .. 4096
//   max_file_mb = 16         # the largest file it may write (RLIMIT_FSIZE), 1 .. 4096
//   prepend_prompt = false   # true: the program is the prompt followed by the candidate (a completion
//                            # of a given signature, HumanEval-style)
//
// The task (the request's JSON object: `loom verify`'s task line, `loom ab`'s JSONL line) gives
// "tests": a list of Python snippets (an assert, a call); the score is the share that run without an
// exception. The code is the candidate's first fenced block (```python … ```) when it has one, else its
// whole text.
//
// Who decides a verdict. The candidate's code never runs in a process that reports one:
//   - the candidate's process (a python that loads its code once; a fresh fork of it per test) runs in
//     a PID namespace of its own, so it cannot see, signal or trace anything outside; it holds one
//     socket, to its test's judge, and nothing else (no report channel, no test source);
//   - the judge (a python of ours, a fresh fork per test) runs the test with the candidate's top-level
//     names bound to references: calling `f(1)` asks the candidate over the socket, whose answer comes
//     back as plain data read with ast.literal_eval (None, numbers, strings, bytes, lists, tuples,
//     dicts, sets, named tuples); anything else stays a reference that can be called, indexed and
//     iterated further but compares equal only to itself — the candidate's __eq__, __hash__ or any
//     other code of its never runs in the judge. Its exceptions come back as exceptions of that class
//     (or of one made with its name and first builtin base); it dying, exiting or answering out of
//     protocol fails the test whatever the test catches. Builtins cannot be shadowed by the candidate;
//   - a test passes when its judge process wrote so on a pipe of its own and exited 0; their parent
//     (a python that never runs candidate code nor reads its data) writes one byte per test on the
//     report pipe to this process, in order. That pipe is the only channel trusted: the candidate
//     never holds it (every process starts with only the descriptors it is given), and its stdout
//     and stderr go to /dev/null. Each test costs two forks (a few ms); the next test's candidate
//     process is forked while a test runs.
// What that costs: values passed to the candidate are copies (in-place changes do not come back), the
// test cannot pass it callables of its own, and candidate-defined objects compare by identity.
//
// The sandbox — all of it, or the candidate does not run (the verifier fails with the reason):
//   - an init of ours (not Python) is PID 1 of new PID, network, mount, IPC and UTS namespaces (and a
//     user namespace: as root it maps only nobody, 65534; without one, root's own namespaces and a
//     drop to nobody); killing it at the verdict ends every process of the run, wherever it moved
//     (setsid, double fork) — the PID namespace, not a process group, is what is killed;
//   - a mount namespace whose root is an empty read-only tmpfs holding only read-only binds of /usr,
//     /bin, /lib* (symlinks kept as such), the interpreter's prefix, /etc/ld.so.cache and
//     /etc/localtime, a made-up /etc/passwd and /etc/group, /dev/{null,zero,full,random,urandom},
//     the harness at /loom, and the candidate's temporary directory read-write at /task (its cwd,
//     HOME and TMPDIR); the host's root is unmounted (pivot_root), there is no /proc, /sys or /tmp,
//     so no other file, and no Unix socket with a path, can be reached; abstract Unix sockets and
//     the network are the new network namespace's (a down loopback);
//   - Landlock: nothing may be written, created or removed outside /task (and /dev's devices);
//   - seccomp (x86-64, AArch64): no namespaces (clone/unshare/setns), mount, ptrace,
//     process_vm_*, bpf, io_uring, keyctl, perf_event_open, userfaultfd, module or kexec calls;
//   - rlimits per process: CPU seconds, address space, file size, open files (64), no core dumps;
//     processes: max_processes plus the sandbox's own six; no capabilities, no new privileges;
//   - the wall-clock limit: at timeout_s the namespaces' init is killed, with everything in them.
// LOOM_SANDBOX_DISABLE=landlock|netns|mountns (tests only) makes that part count as missing;
// LOOM_SANDBOX_DISABLE=userns makes root use its own namespaces (the fallback) and others refuse.
#include "harness.hpp"
#include "loom/sdk/plugin.hpp"
#include "sandbox.hpp"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <set>
#include <string>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace program_tests;

std::string code_of(const std::string& text) {
  const size_t open = text.find("```");
  if (open == std::string::npos) return text;
  const size_t line = text.find('\n', open);
  if (line == std::string::npos) return text;
  const size_t close = text.find("```", line + 1);
  return text.substr(line + 1, (close == std::string::npos ? text.size() : close) - line - 1);
}

class ProgramTests final : public loom::Verifier {
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

  double score(std::string_view prompt, std::string_view text, std::string_view task) override {
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

  // The flags a remount of a bind of `path` must keep (a namespace's mounts are locked to them).
  static unsigned long locked_flags(const std::string& path) {
    struct statvfs v {};
    if (statvfs(path.c_str(), &v) != 0) return 0;
    unsigned long f = 0;
    if (v.f_flag & ST_NOSUID) f |= MS_NOSUID;
    if (v.f_flag & ST_NODEV) f |= MS_NODEV;
    if (v.f_flag & ST_NOEXEC) f |= MS_NOEXEC;
    if (v.f_flag & ST_RDONLY) f |= MS_RDONLY;
    return f;
  }

  // The new root's steps: the system's directories, the interpreter's prefix, a few files, the devices,
  // the harness and the task's directory.
  std::vector<MountStep> root_steps(const fs::path& dir) const {
    const std::string root = (dir / "root").string();
    std::vector<MountStep> steps;
    std::set<std::string> made, covered;
    const auto parents = [&](const std::string& path) { // mkdir -p of the path's parents
      for (size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1))
        if (made.insert(path.substr(0, at)).second)
          steps.push_back({MountStep::Dir, root + path.substr(0, at), {}, false, 0});
    };
    const auto add = [&](MountStep::Kind kind, const std::string& at, const std::string& source, bool file) {
      parents(at);
      if (kind == MountStep::Dir && !made.insert(at).second) return;
      steps.push_back({kind, root + at, source, file, kind >= MountStep::BindRo ? locked_flags(source) : 0});
    };
    const auto is_covered = [&](const std::string& p) {
      for (const auto& c : covered)
        if (p == c || p.rfind(c + "/", 0) == 0) return true;
      return false;
    };
    for (const char* top : {"/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"}) {
      struct stat st {};
      if (lstat(top, &st) != 0) continue;
      if (S_ISLNK(st.st_mode)) {
        std::error_code ec;
        const fs::path to = fs::read_symlink(top, ec);
        if (ec) continue;
        add(MountStep::Symlink, top, to.string(), false);
      } else if (S_ISDIR(st.st_mode)) {
        add(MountStep::BindRo, top, top, false);
      } else {
        continue;
      }
      covered.insert(top);
    }
    // The interpreter's prefix (/opt/conda for /opt/conda/bin/python3; a venv's own directory), as
    // configured and as resolved.
    std::error_code ec;
    for (const fs::path& exe : {fs::path(interpreter_), fs::canonical(interpreter_, ec)}) {
      const std::string prefix = exe.parent_path().parent_path().lexically_normal().string();
      if (exe.empty() || prefix.size() < 2 || prefix[0] != '/' || is_covered(prefix)) continue;
      add(MountStep::BindRo, prefix, prefix, false);
      covered.insert(prefix);
    }
    add(MountStep::Dir, "/etc", {}, false);
    struct stat st {};
    if (stat("/etc/ld.so.cache", &st) == 0 && S_ISREG(st.st_mode))
      add(MountStep::BindRo, "/etc/ld.so.cache", "/etc/ld.so.cache", true);
    if (lstat("/etc/localtime", &st) == 0) {
      if (S_ISLNK(st.st_mode)) {
        const fs::path to = fs::read_symlink("/etc/localtime", ec);
        if (!ec) add(MountStep::Symlink, "/etc/localtime", to.string(), false);
      } else if (S_ISREG(st.st_mode)) {
        add(MountStep::BindRo, "/etc/localtime", "/etc/localtime", true);
      }
    }
    add(MountStep::File, "/etc/passwd",
        "root:x:0:0:root:/:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/task:/usr/sbin/nologin\n", false);
    add(MountStep::File, "/etc/group", "root:x:0:\nnogroup:x:65534:\n", false);
    add(MountStep::Dir, "/dev", {}, false);
    for (const char* d : {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"})
      if (stat(d, &st) == 0 && S_ISCHR(st.st_mode)) add(MountStep::BindDev, d, d, true);
    add(MountStep::BindRo, "/loom", (dir / "loom").string(), false);
    add(MountStep::BindRw, k_task_dir, (dir / "task").string(), false);
    return steps;
  }

  // The candidate's code against the tests in the sandbox: <dir> made and filled, the children started
  // with a setup made before the fork, the judge's verdicts read until done or timed out, the children
  // killed; a sandbox failure the children reported refuses the request.
  Run run_sandboxed(const std::string& code, const std::string& tests_json, size_t n_tests) const {
    const bool root = check_layers();
    const fs::path dir = make_temp_dir();
    struct Cleanup {
      fs::path d;
      ~Cleanup() {
        std::error_code ec;
        fs::remove_all(d, ec);
      }
    } cleanup{dir};
    fill_dir(dir, code, root);
    SetupStrings strings;
    strings.interp = interpreter_;
    SandboxSetup setup = make_setup(dir, root, tests_json, strings);
    const Children c = start_children(setup);
    bool timed_out = false;
    const std::string got = read_verdicts(c.report, n_tests, timed_out);
    kill_children(c.pid);
    close(c.report);
    const std::string why = read_status(c.status);
    if (!why.empty()) refuse(why);
    Run run;
    run.timed_out = timed_out;
    for (size_t i = 0; i < got.size() && i < n_tests; ++i)
      if (got[i] == 'P') ++run.passed;
    return run;
  }

  // Refuses when LOOM_SANDBOX_DISABLE turns off a layer the sandbox needs; whether we run as root.
  static bool check_layers() {
    if (disabled("landlock")) refuse("Landlock unavailable (LOOM_SANDBOX_DISABLE)");
    if (disabled("netns")) refuse("network namespace unavailable (LOOM_SANDBOX_DISABLE)");
    if (disabled("mountns")) refuse("mount namespace unavailable (LOOM_SANDBOX_DISABLE)");
    const bool root = geteuid() == 0;
    if (!root && disabled("userns")) refuse("user namespace unavailable (LOOM_SANDBOX_DISABLE)");
    return root;
  }

  static fs::path make_temp_dir() {
    std::string tmpl = (fs::temp_directory_path() / "loom-program-tests-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      throw loom::sdk::Error(std::string("program_tests: cannot make a temporary directory: ") +
                             std::strerror(errno));
    return tmpl;
  }

  // <dir>: loom/ (the harness and the candidate's code, read-only inside), task/ (the candidate's
  // directory) and root/ (where the new root is mounted).
  static void fill_dir(const fs::path& dir, const std::string& code, bool root) {
    std::error_code ec;
    fs::create_directory(dir / "loom", ec);
    fs::create_directory(dir / "task", ec);
    fs::create_directory(dir / "root", ec);
    const auto put = [&](const char* name, const std::string& body) {
      std::ofstream f(dir / "loom" / name, std::ios::binary);
      f << body;
      if (!f) throw loom::sdk::Error("program_tests: cannot write " + (dir / "loom" / name).string());
    };
    put("candidate.py", code);
    put("judge.py", std::string(k_codec) + k_judge);
    put("candidate_side.py", std::string(k_codec) + k_candidate);
    // Inside, the processes are nobody: they may cross <dir>, read loom/, and own task/.
    if (chmod(dir.c_str(), 0711) != 0 || chmod((dir / "loom").c_str(), 0755) != 0 ||
        chmod((dir / "root").c_str(), 0755) != 0)
      throw loom::sdk::Error("program_tests: cannot set the permissions of " + dir.string());
    for (const char* f : {"candidate.py", "judge.py", "candidate_side.py"})
      chmod((dir / "loom" / f).c_str(), 0644);
    if (root && chown((dir / "task").c_str(), k_nobody, k_nobody) != 0)
      throw loom::sdk::Error(std::string("program_tests: cannot hand the directory to nobody: ") +
                             std::strerror(errno));
  }

  // The strings a SandboxSetup's argv and envp point into (they live until the children are gone).
  struct SetupStrings {
    std::string interp, isolated = "-I", no_pyc = "-B", judge_py = k_judge_py, cand_py = k_candidate_py;
    std::vector<std::string> envs = {"PATH=/usr/bin:/bin", "HOME=/task", "TMPDIR=/task", "LANG=C.UTF-8"};
  };

  // Everything the children need, made before fork (they only make system calls).
  SandboxSetup make_setup(const fs::path& dir, bool root, const std::string& tests_json,
                          SetupStrings& s) const {
    SandboxSetup setup;
    setup.root = root;
    setup.userns = !disabled("userns");
    const unsigned outer_uid = root ? k_nobody : geteuid(), outer_gid = root ? k_nobody : getegid();
    setup.uid_map = "65534 " + std::to_string(outer_uid) + " 1\n";
    setup.gid_map = "65534 " + std::to_string(outer_gid) + " 1\n";
    setup.steps = root_steps(dir);
    setup.new_root = (dir / "root").string();
    setup.put_old = (dir / "root" / "old").string();
    setup.tests_json = tests_json;
    setup.interpreter = s.interp.c_str();
    setup.judge_argv = {s.interp.data(), s.isolated.data(), s.no_pyc.data(), s.judge_py.data(), nullptr};
    setup.candidate_argv = {s.interp.data(), s.isolated.data(), s.no_pyc.data(), s.cand_py.data(), nullptr};
    for (auto& e : s.envs)
      setup.envp.push_back(e.data());
    setup.envp.push_back(nullptr);
    setup.cpu = static_cast<rlim_t>(std::ceil(timeout_s_)) + 1;
    setup.mem = static_cast<rlim_t>(memory_mb_) << 20;
    // init, the judge, a test's judge, the reaper, the loaded candidate and the next test's fork of it
    setup.nproc = static_cast<rlim_t>(max_processes_) + 6;
    setup.fsize = static_cast<rlim_t>(max_file_mb_) << 20;
    setup.filter = make_filter();
    return setup;
  }

  struct Children {
    pid_t pid;  // the outer child (run_outer)
    int report; // the judge's verdicts: one byte per test
    int status; // a sandbox failure, in words
  };

  // Forks the outer child with its pipes; the parent keeps the read ends of report and status.
  static Children start_children(SandboxSetup& setup) {
    int report[2], status_pipe[2], sync_pipe[2];
    if (pipe2(report, O_CLOEXEC) != 0)
      throw loom::sdk::Error(std::string("program_tests: pipe: ") + std::strerror(errno));
    if (pipe2(status_pipe, O_CLOEXEC) != 0 || pipe2(sync_pipe, O_CLOEXEC) != 0) {
      close(report[0]);
      close(report[1]);
      throw loom::sdk::Error(std::string("program_tests: pipe: ") + std::strerror(errno));
    }
    const pid_t pid = fork();
    if (pid < 0) {
      for (const int fd : {report[0], report[1], status_pipe[0], status_pipe[1], sync_pipe[0], sync_pipe[1]})
        close(fd);
      throw loom::sdk::Error(std::string("program_tests: fork: ") + std::strerror(errno));
    }
    if (pid == 0) run_outer(setup, sync_pipe[0], sync_pipe[1], report[1], status_pipe[1]);
    close(report[1]);
    close(status_pipe[1]);
    close(sync_pipe[0]);
    close(sync_pipe[1]);
    return {pid, report[0], status_pipe[0]};
  }

  // One byte per test from the judge ('P' passed), until it is done or the clock runs out.
  std::string read_verdicts(int report, size_t n_tests, bool& timed_out) const {
    std::string got;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000));
    while (got.size() < n_tests) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        timed_out = true;
        break;
      }
      pollfd p{report, POLLIN, 0};
      const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      if (r <= 0) continue;
      char buf[4096];
      const ssize_t n = read(report, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break; // the judge is gone
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }

  static void kill_children(pid_t pid) {
    kill(-pid, SIGKILL); // the outer child and init (whose death ends every process of its namespaces)
    kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
  }

  // What the children reported failing (empty: nothing); closes the pipe.
  static std::string read_status(int status) {
    std::string why;
    pollfd sp{status, POLLIN, 0};
    while (poll(&sp, 1, 2000) > 0) {
      char buf[256];
      const ssize_t n = read(status, buf, sizeof buf);
      if (n <= 0 || why.size() > 1000) break;
      why.append(buf, static_cast<size_t>(n));
    }
    close(status);
    return why;
  }

  std::string interpreter_;
  double timeout_s_ = 5.0;
  int64_t memory_mb_ = 512, max_processes_ = 16, max_file_mb_ = 16;
  bool prepend_prompt_ = false;
};

} // namespace

LOOM_PLUGIN_DEFINE("program_tests", "1.0.0", LOOM_VERIFIER("program_tests", ProgramTests));
