// The child-process probe of `loom plugins`: each candidate's dlopen and handshake run first in a forked
// child, so a plugin that crashes, exits or hangs while loading is reported, not fatal.
#include "plugin_internal.hpp"

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <string>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

namespace loom {

// ---- the child-process probe (`loom plugins`) ---------------------------------------------------

namespace plugin {

namespace {

// Bytes the probe child writes before each step, so the parent can say where it died.
constexpr char k_step_dlopen = 'o', k_step_score = 's', k_step_init = 'i', k_step_table = 't',
               k_step_done = 'K';

const char* step_text(char step) {
  switch (step) {
  case k_step_dlopen:
    return "while dlopen ran its ELF constructors";
  case k_step_score:
    return "in loom_plugin_score";
  case k_step_init:
    return "in loom_plugin_init";
  case k_step_table:
    return "while its loom_plugin table was read";
  default:
    return nullptr;
  }
}

const char* signal_name(int sig) {
  switch (sig) {
  case SIGSEGV:
    return "SIGSEGV";
  case SIGBUS:
    return "SIGBUS";
  case SIGABRT:
    return "SIGABRT";
  case SIGILL:
    return "SIGILL";
  case SIGFPE:
    return "SIGFPE";
  case SIGTRAP:
    return "SIGTRAP";
  case SIGSYS:
    return "SIGSYS";
  case SIGKILL:
    return "SIGKILL";
  case SIGTERM:
    return "SIGTERM";
  case SIGPIPE:
    return "SIGPIPE";
  case SIGXCPU:
    return "SIGXCPU";
  case SIGXFSZ:
    return "SIGXFSZ";
  default:
    return nullptr;
  }
}

void quiet_log(int32_t, const char*, const char*) {}

void put(int fd, char c) noexcept {
  while (::write(fd, &c, 1) < 0 && errno == EINTR) {
  }
}

[[noreturn]] void finish(int out) noexcept {
  put(out, k_step_done);
  ::_exit(0);
}

// The child: only dlopen/dlsym, the plugin's own code, write() and _exit() — it may have been forked
// from a process with other threads, so nothing here allocates or takes a lock of the host's.
[[noreturn]] void probe_child(const char* path, int out, const loom_host* api, pid_t parent) noexcept {
  // Die by the signal (no sanitizer or host handler, no core file), and go with the parent.
  for (const int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGSYS}) {
    struct sigaction sa {};
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  const struct rlimit no_core { 0, 0 };
  ::setrlimit(RLIMIT_CORE, &no_core);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
  // Whatever the plugin prints (or a sanitizer's report) must not reach the listing.
  if (const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC); null >= 0) {
    ::dup2(null, STDIN_FILENO);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
  }
  // The same steps, in the same order, as PluginRegistry::load(); a clean refusal is "done" too.
  put(out, k_step_dlopen);
  void* h = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) finish(out);
  if (void* score = ::dlsym(h, "loom_plugin_score")) {
    put(out, k_step_score);
    if (reinterpret_cast<int32_t (*)()>(score)() <= 0) finish(out);
  }
  void* init = ::dlsym(h, "loom_plugin_init");
  if (!init) finish(out);
  put(out, k_step_init);
  const loom_plugin* p = reinterpret_cast<loom_plugin_init_fn>(init)(api, LOOM_ABI_MAJOR, LOOM_ABI_MINOR);
  put(out, k_step_table);
  if (!p || p->struct_size < LOOM_PLUGIN_SIZE_MIN || p->abi_major != LOOM_ABI_MAJOR) finish(out);
  if (!p->name || !p->version || (p->n_factories > 0 && !p->factories)) finish(out);
  volatile size_t sink = std::strlen(p->name) + std::strlen(p->version);
  if (p->n_factories > k_max_factories ||
      (p->n_factories > 0 && p->factories[0].struct_size < sizeof(loom_factory)))
    finish(out);
  for (size_t i = 0; i < p->n_factories; ++i) {
    const loom_factory& f = factory_at(*p, i);
    sink = sink + static_cast<size_t>(f.kind) + f.struct_size;
    if (f.name) sink = sink + std::strlen(f.name);
  }
  (void)plugin_description(*p); // describe() too runs here first: a crash in it is reported
  (void)sink;
  finish(out);
}

std::string duration_text(std::chrono::milliseconds t) {
  const auto ms = t.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

} // namespace

std::string probe_in_child(const std::string& path, std::chrono::milliseconds timeout) {
  // Everything the child needs, made before fork(): it allocates nothing.
  loom_host api = *host_api();
  api.log = &quiet_log; // the host's sink takes a lock another thread may hold at fork time
  const pid_t parent = ::getpid();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {}; // cannot probe: load in-process as pipelines do
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return {};
  }
  if (pid == 0) {
    ::close(fds[0]);
    probe_child(path.c_str(), fds[1], &api, parent);
  }
  ::close(fds[1]);
  const int in = fds[0];
  ::fcntl(in, F_SETFL, ::fcntl(in, F_GETFL) | O_NONBLOCK);

  std::string steps;
  auto drain = [&]() {
    char buf[64];
    for (;;) {
      const ssize_t n = ::read(in, buf, sizeof buf);
      if (n > 0) {
        steps.append(buf, static_cast<size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        return n == 0; // true: end of file
      }
    }
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  bool reaped = false, timed_out = false, eof = false;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      reaped = true;
      break;
    }
    if (r < 0 && errno != EINTR) break; // ECHILD: reaped elsewhere (SIGCHLD ignored); judge by the pipe
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      timed_out = true;
      break;
    }
    // Wake on the child's bytes (or the end of the pipe when it exits); poll waitpid meanwhile.
    const int wait_ms = static_cast<int>(std::min<int64_t>(left.count(), eof ? 2 : 50));
    if (eof) {
      const struct timespec ts { 0, static_cast<long>(wait_ms) * 1000000L };
      ::nanosleep(&ts, nullptr);
    } else {
      struct pollfd pfd {
        in, POLLIN, 0
      };
      if (::poll(&pfd, 1, wait_ms) > 0) eof = drain();
    }
  }
  drain();
  ::close(in);

  const char last = steps.empty() ? '\0' : steps.back();
  const char* where = step_text(last);
  if (timed_out)
    return "timed out while loading (no answer within " + duration_text(timeout) +
           (where ? std::string(", ") + where : std::string()) + "; the probe process was killed)";
  if (!reaped) return last == k_step_done ? std::string() : "the probe process that loaded it vanished";
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = signal_name(sig);
    return "crashed while loading (signal " + std::to_string(sig) + (name ? std::string(": ") + name : "") +
           (where ? std::string(", ") + where : std::string()) + ")";
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && last == k_step_done) return {};
  return "exited while loading (exit status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
         (where ? std::string(", ") + where : std::string()) + ") instead of returning to the host";
}

} // namespace plugin

} // namespace loom
