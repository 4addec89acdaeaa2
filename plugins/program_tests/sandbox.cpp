// program_tests' sandbox: the forked processes (outer child, the namespaces' init, the judge, the
// candidate's reaper and process) and the seccomp filter (sandbox.hpp).
#include "sandbox.hpp"

#include "loom/sdk/plugin.hpp"

#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <string>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 1U
#endif

namespace program_tests {

bool disabled(const char* part) {
  const char* d = std::getenv("LOOM_SANDBOX_DISABLE");
  return d && std::strstr(d, part) != nullptr;
}

[[noreturn]] void refuse(const std::string& why) {
  throw loom::sdk::Error("program_tests: the sandbox could not be set up (" + why +
                         "); refusing to run candidate code without it");
}

namespace {

// ---- the forked processes: system calls only (no allocation: the parent may have other threads) ----

// Async-signal-safe reporting: the step that failed (and the path it was at), errno on the status pipe,
// then exit.
[[noreturn]] void child_fail(int fd, const char* what, const char* path = nullptr) {
  const int e = errno;
  char buf[400];
  size_t n = 0;
  for (const char* p = what; *p && n < 140; ++p)
    buf[n++] = *p;
  if (path) {
    for (const char* p = " of "; *p; ++p)
      buf[n++] = *p;
    for (const char* p = path; *p && n < 340; ++p)
      buf[n++] = *p;
  }
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

// fork(), or a process in new namespaces (`flags`), without glibc's fork handlers.
pid_t raw_clone(unsigned long flags) {
  return static_cast<pid_t>(syscall(SYS_clone, flags | SIGCHLD, 0L, 0L, 0L, 0L));
}

void close_from(unsigned lo) {
  syscall(SYS_close_range, lo, ~0U, 0U);
}

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool write_file(const char* path, const char* data, size_t n) {
  const int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write_all(fd, data, n);
  close(fd);
  return ok;
}

// Puts `sources[i]` at descriptor `targets[i]` (the last one close-on-exec: the status pipe) and closes
// every other descriptor.
bool place_fds(const int* targets, const int* sources, int n) {
  int tmp[8];
  int top = 0;
  for (int i = 0; i < n; ++i) {
    tmp[i] = fcntl(sources[i], F_DUPFD_CLOEXEC, 32);
    if (tmp[i] < 0) return false;
  }
  for (int i = 0; i < n; ++i) {
    if (dup3(tmp[i], targets[i], i == n - 1 ? O_CLOEXEC : 0) < 0) return false;
    if (targets[i] > top) top = targets[i];
  }
  for (int fd = 0; fd < top; ++fd) { // the gaps
    bool used = false;
    for (int i = 0; i < n; ++i)
      used = used || targets[i] == fd;
    if (!used) close(fd);
  }
  close_from(static_cast<unsigned>(top) + 1);
  return true;
}

[[noreturn]] void run_judge_or_candidate(const SandboxSetup& p, int status, const int* targets,
                                         const int* sources, int n, char* const* argv) {
  if (!place_fds(targets, sources, n)) child_fail(status, "placing the descriptors");
  status = targets[n - 1];
  if (!p.userns && (setresgid(k_nobody, k_nobody, k_nobody) || setresuid(k_nobody, k_nobody, k_nobody)))
    child_fail(status, "dropping to nobody");
  if (!p.filter.empty()) {
    const sock_fprog prog{static_cast<unsigned short>(p.filter.size()),
                          const_cast<sock_filter*>(p.filter.data())};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0) child_fail(status, "seccomp filter");
  }
  if (chdir(k_task_dir) != 0) child_fail(status, "chdir /task");
  execve(p.interpreter, argv, p.envp.data());
  child_fail(status,
             "exec inside the sandbox (only /usr, /bin, /lib* and the interpreter's prefix are there)",
             p.interpreter);
}

// The new root's steps; `root_len` is the length of the prefix (<dir>/root) to leave out of messages.
void make_root(const SandboxSetup& p, int sfd) {
  const size_t root_len = p.new_root.size();
  for (const MountStep& s : p.steps) {
    const char* t = s.target.c_str();
    const char* inside = t + root_len; // the path as the sandbox sees it
    switch (s.kind) {
    case MountStep::Dir:
      if (mkdir(t, 0755) != 0 && errno != EEXIST) child_fail(sfd, "mkdir", inside);
      continue;
    case MountStep::Symlink:
      if (symlink(s.source.c_str(), t) != 0) child_fail(sfd, "symlink", inside);
      continue;
    case MountStep::File: {
      const int fd = open(t, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0 || !write_all(fd, s.source.data(), s.source.size())) child_fail(sfd, "writing", inside);
      close(fd);
      continue;
    }
    default:
      break;
    }
    if (s.file) {
      const int fd = open(t, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) child_fail(sfd, "a mount point", inside);
      close(fd);
    } else if (mkdir(t, 0755) != 0 && errno != EEXIST) {
      child_fail(sfd, "a mount point", inside);
    }
    if (mount(s.source.c_str(), t, nullptr, MS_BIND | MS_REC, nullptr) != 0)
      child_fail(sfd, "bind mount", s.source.c_str());
    unsigned long f = MS_BIND | MS_REMOUNT | MS_NOSUID | s.keep;
    if (s.kind == MountStep::BindRo) f |= MS_RDONLY | MS_NODEV;
    if (s.kind == MountStep::BindRw) f |= MS_NODEV;
    if (s.kind == MountStep::BindDev) f |= MS_NOEXEC;
    if (mount(nullptr, t, nullptr, f, nullptr) != 0) child_fail(sfd, "remount of the bind", inside);
  }
}

// Landlock: writes (and creating, removing, renaming) only beneath /task, and to /dev's devices.
void restrict_writes(int sfd) {
  const long abi = syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 1) child_fail(sfd, "Landlock (Linux 5.13+, enabled in the kernel's LSM list)");
  uint64_t write_rights = LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR |
                          LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
                          LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
                          LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO |
                          LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM;
  if (abi >= 2) write_rights |= LANDLOCK_ACCESS_FS_REFER;
  if (abi >= 3) write_rights |= LANDLOCK_ACCESS_FS_TRUNCATE;
  landlock_ruleset_attr ra{};
  ra.handled_access_fs = write_rights;
  const int rs = static_cast<int>(syscall(SYS_landlock_create_ruleset, &ra, sizeof ra, 0));
  if (rs < 0) child_fail(sfd, "landlock_create_ruleset");
  const auto allow = [&](const char* path, uint64_t rights) {
    landlock_path_beneath_attr pb{};
    pb.allowed_access = rights;
    pb.parent_fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (pb.parent_fd < 0 || syscall(SYS_landlock_add_rule, rs, LANDLOCK_RULE_PATH_BENEATH, &pb, 0) != 0)
      child_fail(sfd, "landlock_add_rule");
    close(pb.parent_fd);
  };
  allow(k_task_dir, write_rights);
  allow("/dev", LANDLOCK_ACCESS_FS_WRITE_FILE | (abi >= 3 ? LANDLOCK_ACCESS_FS_TRUNCATE : 0));
  if (syscall(SYS_landlock_restrict_self, rs, 0) != 0) child_fail(sfd, "landlock_restrict_self");
  close(rs);
}

// The namespaces' init (PID 1): builds the root, sets the limits, starts the judge and (in a PID
// namespace of its own, under a reaper) the candidate's process, and ends everything when the judge
// is done. Its descriptors on entry: sync (7), report (8), status (9).
[[noreturn]] void run_init(const SandboxSetup& p) {
  constexpr int sync_fd = 7, report_fd = 8, sfd = 9;
  char go = 0;
  ssize_t got;
  while ((got = read(sync_fd, &go, 1)) < 0 && errno == EINTR) {
  }
  if (got != 1) _exit(k_sandbox_failed); // the parent could not map the ids (it said why)
  close(sync_fd);
  const int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(devnull, 1) < 0 || dup2(devnull, 2) < 0)
    child_fail(sfd, "/dev/null");
  if (p.userns && (setresgid(k_nobody, k_nobody, k_nobody) || setresuid(k_nobody, k_nobody, k_nobody)))
    child_fail(sfd, "becoming nobody in the user namespace");
  if (sethostname("sandbox", 7) != 0) child_fail(sfd, "sethostname in the UTS namespace");
  // The new root: nothing of the host's but what the setup binds.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) child_fail(sfd, "making / private");
  if (mount("tmpfs", p.new_root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=512,mode=755") !=
      0)
    child_fail(sfd, "tmpfs for the new root");
  make_root(p, sfd);
  if (mkdir(p.put_old.c_str(), 0700) != 0) child_fail(sfd, "mkdir old root");
  if (syscall(SYS_pivot_root, p.new_root.c_str(), p.put_old.c_str()) != 0) child_fail(sfd, "pivot_root");
  if (chdir("/") != 0 || umount2("/old", MNT_DETACH) != 0 || rmdir("/old") != 0)
    child_fail(sfd, "unmounting the host's root");
  if (mount(nullptr, "/", nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0)
    child_fail(sfd, "read-only remount of the new root");
  // Limits, privileges, Landlock: inherited by everything started from here.
  const rlimit lc{p.cpu, p.cpu}, lm{p.mem, p.mem}, lp{p.nproc, p.nproc}, lf{p.fsize, p.fsize}, ln{64, 64},
      l0{0, 0};
  if (setrlimit(RLIMIT_CPU, &lc) || setrlimit(RLIMIT_AS, &lm) || setrlimit(RLIMIT_FSIZE, &lf) ||
      setrlimit(RLIMIT_NOFILE, &ln) || setrlimit(RLIMIT_CORE, &l0) || setrlimit(RLIMIT_NPROC, &lp))
    child_fail(sfd, "setrlimit");
  for (int cap = 0; prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0; ++cap) {
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
    child_fail(sfd, "clearing ambient capabilities");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_fail(sfd, "no_new_privs");
  restrict_writes(sfd);
  // The judge's tests, on a descriptor only it gets.
  const int tests = static_cast<int>(syscall(SYS_memfd_create, "tests", MFD_CLOEXEC));
  if (tests < 0 || !write_all(tests, p.tests_json.data(), p.tests_json.size()) ||
      lseek(tests, 0, SEEK_SET) != 0)
    child_fail(sfd, "memfd for the tests");
  int ctrl[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctrl) != 0) child_fail(sfd, "socketpair");
  const pid_t judge = raw_clone(0);
  if (judge < 0) child_fail(sfd, "fork of the judge");
  if (judge == 0) {
    const int targets[] = {0, 1, 2, 3, 4, 5}, sources[] = {tests, devnull, devnull, report_fd, ctrl[0], sfd};
    run_judge_or_candidate(p, sfd, targets, sources, 6, p.judge_argv.data());
  }
  const pid_t reaper = raw_clone(CLONE_NEWPID);
  if (reaper < 0) child_fail(sfd, "a PID namespace for the candidate");
  if (reaper == 0) { // PID 1 of the candidate's namespace: its processes end with it
    const pid_t cand = raw_clone(0);
    if (cand < 0) child_fail(sfd, "fork of the candidate's process");
    if (cand == 0) {
      const int targets[] = {0, 1, 2, 3, 5}, sources[] = {devnull, devnull, devnull, ctrl[1], sfd};
      run_judge_or_candidate(p, sfd, targets, sources, 5, p.candidate_argv.data());
    }
    close_from(0);
    for (;;) {
      int st = 0;
      const pid_t w = waitpid(-1, &st, 0);
      if (w == cand || (w < 0 && errno != EINTR)) _exit(0);
    }
  }
  close(tests);
  close(ctrl[0]);
  close(ctrl[1]);
  close(report_fd);
  for (;;) { // when the judge is done, so is everything: init's exit ends both namespaces
    int st = 0;
    const pid_t w = waitpid(-1, &st, 0);
    if (w == judge || (w < 0 && errno != EINTR)) _exit(0);
  }
}

void itoa(char*& p, unsigned long v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  while (n)
    *p++ = tmp[--n];
}

bool write_id_maps(const SandboxSetup& p, pid_t pid) {
  char path[64];
  const auto at = [&](const char* leaf) {
    char* q = path;
    for (const char* s = "/proc/"; *s; ++s)
      *q++ = *s;
    itoa(q, static_cast<unsigned long>(pid));
    *q++ = '/';
    for (const char* s = leaf; *s; ++s)
      *q++ = *s;
    *q = 0;
    return path;
  };
  return write_file(at("setgroups"), "deny", 4) &&
         write_file(at("uid_map"), p.uid_map.data(), p.uid_map.size()) &&
         write_file(at("gid_map"), p.gid_map.data(), p.gid_map.size());
}

} // namespace

[[noreturn]] void run_outer(SandboxSetup& p, int sync_r, int sync_w, int report_w, int status_w) {
  setpgid(0, 0);
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGCHLD, &dfl, nullptr);
  sigaction(SIGPIPE, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (p.root && setgroups(0, nullptr) != 0) child_fail(status_w, "clearing supplementary groups");
  constexpr unsigned long ns = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS;
  pid_t init = -1;
  if (p.userns) init = raw_clone(ns | CLONE_NEWUSER);
  if (init < 0 && p.root) { // root without user namespaces: root's own namespaces, nobody's uid below
    p.userns = false;
    init = raw_clone(ns);
  }
  if (init < 0)
    child_fail(status_w, p.root ? "new PID, network, mount, IPC and UTS namespaces"
                                : "a user namespace with new PID, network, mount, IPC and UTS namespaces");
  if (init == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int targets[] = {7, 8, 9}, sources[] = {sync_r, report_w, status_w};
    if (!place_fds(targets, sources, 3)) child_fail(status_w, "placing the descriptors");
    run_init(p);
  }
  close(sync_r);
  close(report_w);
  if (p.userns && !write_id_maps(p, init)) {
    kill(init, SIGKILL);
    child_fail(status_w, "writing the user namespace's uid/gid maps");
  }
  if (!write_all(sync_w, "g", 1)) child_fail(status_w, "starting init");
  close(sync_w);
  int st = 0;
  while (waitpid(init, &st, 0) < 0 && errno == EINTR) {
  }
  _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
}

std::vector<sock_filter> make_filter() {
  std::vector<sock_filter> f;
#if defined(__x86_64__)
  constexpr uint32_t arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  constexpr uint32_t arch = AUDIT_ARCH_AARCH64;
#else
  return f; // other architectures: the namespaces, Landlock and the limits only
#endif
  constexpr uint32_t eperm = SECCOMP_RET_ERRNO | EPERM;
  const auto stmt = [&](uint16_t code, uint32_t k) { f.push_back(sock_filter{code, 0, 0, k}); };
  const auto jump = [&](uint16_t code, uint32_t k, uint8_t jt, uint8_t jf) {
    f.push_back(sock_filter{code, jt, jf, k});
  };
  stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch));
  jump(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0);
  stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr));
#if defined(__x86_64__)
  jump(BPF_JMP | BPF_JGE | BPF_K, 0x40000000U, 0, 1); // the x32 ABI
  stmt(BPF_RET | BPF_K, eperm);
#endif
  // clang-format off
  const long denied[] = {
      SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_mount, SYS_umount2, SYS_pivot_root,
      SYS_chroot, SYS_unshare, SYS_setns, SYS_keyctl, SYS_add_key, SYS_request_key, SYS_bpf,
      SYS_perf_event_open, SYS_userfaultfd, SYS_open_by_handle_at, SYS_name_to_handle_at, SYS_kexec_load,
      SYS_init_module, SYS_finit_module, SYS_delete_module, SYS_swapon, SYS_swapoff, SYS_reboot, SYS_acct,
      SYS_quotactl, SYS_syslog, SYS_kcmp, SYS_sethostname, SYS_setdomainname, SYS_settimeofday,
      SYS_clock_settime, SYS_clock_adjtime, SYS_adjtimex, SYS_vhangup,
#ifdef SYS_kexec_file_load
      SYS_kexec_file_load,
#endif
#ifdef SYS_io_uring_setup
      SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register,
#endif
#ifdef SYS_open_tree
      SYS_open_tree, SYS_move_mount, SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_fspick,
#endif
#ifdef SYS_mount_setattr
      SYS_mount_setattr,
#endif
#ifdef SYS_pidfd_getfd
      SYS_pidfd_getfd,
#endif
#ifdef SYS_iopl
      SYS_iopl, SYS_ioperm,
#endif
#ifdef SYS_uselib
      SYS_uselib,
#endif
  };
  // clang-format on
  for (const long nr : denied) {
    jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1);
    stmt(BPF_RET | BPF_K, eperm);
  }
#ifdef SYS_clone3
  jump(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1); // its flags are out of reach: glibc falls back to clone
  stmt(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS);
#endif
  constexpr uint32_t new_ns = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
                              CLONE_NEWNET | CLONE_NEWCGROUP;
  jump(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 3);
  stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])); // the flags' low word
  jump(BPF_JMP | BPF_JSET | BPF_K, new_ns, 0, 1);
  stmt(BPF_RET | BPF_K, eperm);
  stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  return f;
}

} // namespace program_tests
