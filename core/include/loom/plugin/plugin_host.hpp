// loom/plugin/plugin_host.hpp — finding, loading and keeping plugins (shared libraries built against sdk/).
//
// Lifetime: a PluginLibrary is shared-owned by every object made from it, so the library outlives
// its objects; the registry calls each plugin's shutdown() when it is destroyed and then leaves the
// library mapped (no dlclose in production; LOOM_TEST_REAL_UNLOAD=1 unloads for real, for tests).
#pragma once

#include "loom/sdk/abi.h"
#include "loom/sdk/executor.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

class PluginLibrary {
public:
  ~PluginLibrary();
  const std::string& path() const noexcept { return path_; }
  const std::string& sha256() const noexcept { return sha256_; }
  const loom_plugin& plugin() const noexcept { return *plugin_; }
  int32_t score() const noexcept { return score_; }
  // Why factory i cannot be used ("" when it can): a kind that is none of backend, decoder, sampler,
  // stop, or an entry whose struct_size is 0 or too small. Unusable factories are never found.
  std::string_view factory_problem(size_t i) const noexcept {
    return i < factory_problems_.size() ? std::string_view(factory_problems_[i]) : std::string_view();
  }

private:
  friend class PluginRegistry;
  PluginLibrary() = default;
  struct Handle;
  std::unique_ptr<Handle> handle_;
  const loom_plugin* plugin_ = nullptr;
  std::string path_, sha256_;
  int fd_ = -1;           // the open file the library was loaded from (its bytes were hashed)
  std::string load_path_; // "/proc/self/fd/N": the name the dynamic loader knows it by
  int32_t score_ = 1;
  std::vector<std::string> factory_problems_; // one per factory, "" when usable
  bool shut_down_ = false;

public:
  // Calls the plugin's shutdown() once (the registry: when the last user goes under
  // LOOM_TEST_REAL_UNLOAD=1, else at exit).
  void shut_down() noexcept;
};

struct PluginFactoryInfo {
  std::string kind; // backend | decoder | sampler | stop | unknown
  std::string name;
  std::string error; // empty when usable; else one line: why the factory is never used
};

// One file found in a plugin directory: what it is, or why it could not be used.
struct PluginInfo {
  std::string path;
  std::string sha256;
  std::string name, version; // from the plugin
  uint32_t abi_major = 0, abi_minor = 0;
  int32_t score = -1; // -1: no loom_plugin_score export
  std::vector<PluginFactoryInfo> factories;
  std::string description; // the plugin's describe() line: e.g. the CPU level it will use
  std::string error;       // empty when loaded; else one line: the cause
  bool skipped = false;    // score 0: cannot run on this machine (not an error)
};

std::string_view kind_name(int32_t kind) noexcept;

struct DiscoverOptions {
  // For `loom plugins`, the diagnostic command: each file's dlopen and handshake first run in a child
  // process, so a plugin that crashes (in an ELF constructor, loom_plugin_init, …) or hangs is listed
  // as "crashed while loading (signal N: …)" / "timed out while loading" and the listing goes on.
  // Only a file whose probe got through is then loaded in-process. Off for pipelines (`loom run`).
  bool probe_in_child = false;
  std::chrono::milliseconds probe_timeout{10000};
  // For pipelines: open only the files that provide one of `only` (LOOM_KIND_*, name), known from each
  // file's static descriptor without loading it; a pin is checked before such a file is opened.
  bool named_only = false;
  std::vector<std::pair<int32_t, std::string>> only;
};

class PluginRegistry {
public:
  PluginRegistry() = default;
  ~PluginRegistry();
  PluginRegistry(const PluginRegistry&) = delete;
  PluginRegistry& operator=(const PluginRegistry&) = delete;

  // Loads one file. Throws loom::Error with one line naming the file and the cause: missing file,
  // symlink loop, not a regular file, not a (complete) ELF shared object for this host — checked
  // before dlopen —, missing loom_plugin_init, ABI mismatch, struct_size 0, score 0, hash mismatch.
  std::shared_ptr<PluginLibrary> load(const std::string& path,
                                      const std::optional<std::string>& sha256_pin = {});
  // Loads every libloom-*.so in `dirs` (in order; a plugin name seen again keeps the higher score).
  // Failures are recorded in the returned list, not thrown. `pins` maps plugin name → sha256.
  // A file is listed by its canonical path, or by the path it was found at when that does not
  // resolve (a dangling symlink, a symlink loop).
  std::vector<PluginInfo> discover(const std::vector<std::string>& dirs,
                                   const std::map<std::string, std::string>& pins = {},
                                   const DiscoverOptions& options = {});

  struct Found {
    std::shared_ptr<PluginLibrary> lib;
    const loom_factory* factory = nullptr;
  };
  std::optional<Found> find(int32_t kind, std::string_view name) const;
  // "xtc (sampler_extra), mirostat_v2 (sampler_extra)" — for error messages.
  std::string available(int32_t kind) const;
  // Files that failed in the last discover(), one per line — for error messages.
  std::string failures() const;

private:
  std::vector<std::shared_ptr<PluginLibrary>> libs_;
  std::vector<PluginInfo> last_;
  struct Described {
    int32_t kind;
    std::string name, plugin;
  };
  std::vector<Described> described_; // what unopened files provide (named_only), for messages
};

// The memory of a backend plugin's device as it reports it (Backend::memory_info): nullopt for a backend in
// host memory. The backend is made (and released) to ask; throws loom::Error with the reason when it cannot
// be (no such plugin, no GPU).
std::optional<MemoryInfo> backend_memory(const std::string& backend, const std::vector<std::string>& dirs);

// [plugins] paths (relative to the current directory), then the directory of the running executable.
std::vector<std::string> plugin_search_dirs(const std::vector<std::string>& configured);

// sha256 of a file, lowercase hex (OpenSSL). Reads regular files only: anything else (a FIFO, a
// device) throws loom::Error without being opened for reading.
std::string file_sha256(const std::string& path);

// Host log sink (tests capture plugin logs through it). Default: stderr for warn and above, or the
// level in $LOOM_LOG_LEVEL (debug, info, warn, error).
using LogSink = std::function<void(int32_t level, std::string_view plugin, std::string_view message)>;
void set_log_sink(LogSink sink);

// The host handed to plugins (its tables are asked for by version: loom_host.get_api).
const loom_host* host_api() noexcept;

} // namespace loom
