// loom/plugin_host.hpp — finding, loading and keeping plugins (shared libraries built against sdk/).
//
// Lifetime: a PluginLibrary is shared-owned by every object made from it, so the library outlives
// its objects; the registry calls each plugin's shutdown() when it is destroyed and then leaves the
// library mapped (no dlclose in production; LOOM_TEST_REAL_UNLOAD=1 unloads for real, for tests).
#pragma once

#include "loom/sdk/abi.h"

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

private:
  friend class PluginRegistry;
  PluginLibrary() = default;
  struct Handle;
  std::unique_ptr<Handle> handle_;
  const loom_plugin* plugin_ = nullptr;
  std::string path_, sha256_;
  int32_t score_ = 1;
};

struct PluginFactoryInfo {
  std::string kind; // backend | decoder | sampler | stop
  std::string name;
};

// One file found in a plugin directory: what it is, or why it could not be used.
struct PluginInfo {
  std::string path;
  std::string sha256;
  std::string name, version; // from the plugin
  uint32_t abi_major = 0, abi_minor = 0;
  int32_t score = -1; // -1: no loom_plugin_score export
  std::vector<PluginFactoryInfo> factories;
  std::string error;    // empty when loaded; else one line: the cause
  bool skipped = false; // score 0: cannot run on this machine (not an error)
};

std::string_view kind_name(int32_t kind) noexcept;

class PluginRegistry {
public:
  PluginRegistry() = default;
  ~PluginRegistry();
  PluginRegistry(const PluginRegistry&) = delete;
  PluginRegistry& operator=(const PluginRegistry&) = delete;

  // Loads one file. Throws loom::Error with one line naming the file and the cause: missing file,
  // not a shared object, missing loom_plugin_init, ABI mismatch, score 0, hash mismatch.
  std::shared_ptr<PluginLibrary> load(const std::string& path,
                                      const std::optional<std::string>& sha256_pin = {});
  // Loads every libloom-*.so in `dirs` (in order; a plugin name seen again keeps the higher score).
  // Failures are recorded in the returned list, not thrown. `pins` maps plugin name → sha256.
  std::vector<PluginInfo> discover(const std::vector<std::string>& dirs,
                                   const std::map<std::string, std::string>& pins = {});

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
};

// [plugins] paths (relative to the current directory), then the directory of the running executable.
std::vector<std::string> plugin_search_dirs(const std::vector<std::string>& configured);

// sha256 of a file, lowercase hex (OpenSSL).
std::string file_sha256(const std::string& path);

// Host log sink (tests capture plugin logs through it). Default: stderr for warn and above, or the
// level in $LOOM_LOG_LEVEL (debug, info, warn, error).
using LogSink = std::function<void(int32_t level, std::string_view plugin, std::string_view message)>;
void set_log_sink(LogSink sink);

// The host's service table handed to plugins.
const loom_host_api* host_api() noexcept;

} // namespace loom
