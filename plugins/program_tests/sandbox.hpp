// program_tests' sandbox: the setup of a run (the new root's mounts, ids, limits, the seccomp filter,
// the judge's and the candidate's command lines) made before any fork, and the processes that carry
// it out — system calls only after the fork. program_tests.cpp's header describes what it gives.
#pragma once

#include <linux/filter.h>
#include <string>
#include <sys/resource.h>
#include <vector>

namespace program_tests {

// The child's exit code that means the sandbox could not be set up (the reason is on the status pipe).
constexpr int k_sandbox_failed = 121;
constexpr unsigned k_nobody = 65534;

// Sandbox-internal paths (the mount namespace's view).
constexpr const char* k_task_dir = "/task";
constexpr const char* k_judge_py = "/loom/judge.py";
constexpr const char* k_candidate_py = "/loom/candidate_side.py";

// LOOM_SANDBOX_DISABLE names this part (tests only): it counts as missing.
bool disabled(const char* part);
// Throws the verifier's refusal: "the sandbox could not be set up (why); refusing to run …".
[[noreturn]] void refuse(const std::string& why);

// One step of the new root's construction (all paths are the host's, under <dir>/root).
struct MountStep {
  enum Kind { Dir, Symlink, File, BindRo, BindRw, BindDev } kind = Dir;
  std::string target;
  std::string source;     // what is bound; a symlink's text; a file's contents
  bool file = false;      // a bind of a file (its mount point is an empty file)
  unsigned long keep = 0; // MS_NOSUID/MS_NODEV/MS_NOEXEC/MS_RDONLY the source's mount has (locked)
};

// Everything the forked processes need, made before the fork.
struct SandboxSetup {
  bool root = false, userns = true;
  std::string uid_map, gid_map; // "65534 <outer id> 1"
  std::vector<MountStep> steps;
  std::string new_root, put_old; // <dir>/root, <dir>/root/old
  std::string tests_json;
  std::vector<char*> judge_argv, candidate_argv, envp;
  const char* interpreter = nullptr;
  rlim_t cpu = 0, mem = 0, nproc = 0, fsize = 0;
  std::vector<sock_filter> filter;
};

// The first child (in the parent's namespaces): starts init in the new namespaces, maps its ids, waits.
// Reports a failure on status_w and exits k_sandbox_failed; the judges' verdicts come on report_w.
[[noreturn]] void run_outer(SandboxSetup& p, int sync_r, int sync_w, int report_w, int status_w);

// seccomp: what neither the judge nor the candidate needs and a sandbox escape would.
std::vector<sock_filter> make_filter();

} // namespace program_tests
