// Host-side pieces of the plugin ABI shared by the registry, the host API and the adapters.
#pragma once

#include "loom/engine/engine.hpp"
#include "loom/engine/sample_decoder.hpp"
#include "loom/error.hpp"
#include "loom/plugin/plugin_host.hpp"
#include "loom/sample/sampler.hpp"
#include "loom/sdk/abi.h"
#include "loom/sdk/executor.hpp"

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

// Opaque ABI types, defined by the host.
struct loom_status {
  int32_t code;
  std::string message;
};

struct loom_config {
  std::string where; // "p.toml:12:1: [decoder] 'best_of_n'"
  const std::vector<std::pair<std::string, loom::ParamValue>>* params = nullptr;
  std::set<std::string> read;
  std::map<std::string, std::vector<double>> as_f64; // int arrays read as numbers (config_get_f64_array)
};

namespace loom::plugin {

// While alive, what plugins log at warn or error level on this thread is collected in `text` instead
// of logged: loom_plugin_init's reason for refusing the host becomes part of the load error.
struct InitLogCapture {
  InitLogCapture();
  ~InitLogCapture();
  InitLogCapture(const InitLogCapture&) = delete;
  InitLogCapture& operator=(const InitLogCapture&) = delete;
  std::string text;

private:
  std::string* prev_;
};

// Why a file cannot be a plugin, found without mapping or running it.
struct FileProblem {
  Errc code;
  std::string why; // one line, without the path
};
// Checks `path` before dlopen(): it must resolve (a self-looping symlink is "symlink loop") to a
// regular file (a FIFO, directory or device is rejected without being opened for reading) that holds
// a complete 64-bit ELF shared object of this host's byte order and machine: the ELF header, the
// program header table, every PT_LOAD/PT_DYNAMIC segment and the section header table lie inside the
// file (a truncated file would otherwise be mapped and kill the process with SIGBUS). Reads with pread.
std::optional<FileProblem> check_plugin_file(const std::string& path);
// The same checks on an open file: the bytes that will be loaded.
std::optional<FileProblem> check_plugin_fd(int fd);
// sha256 of an open regular file's bytes (read with pread from offset 0), lowercase hex.
std::string fd_sha256(int fd);
// What a plugin file says it provides in its static descriptor (the ELF section ".loom_plugin" that
// LOOM_PLUGIN_DEFINE emits, loom/sdk/plugin.hpp), read with pread from the section headers — nothing is
// mapped or run. nullopt: no descriptor (a hand-written loom_plugin_init), or a malformed one.
struct PluginDescriptor {
  std::string name;                                      // the plugin's name
  std::vector<std::pair<int32_t, std::string>> provides; // (LOOM_KIND_*, object name)
};
std::optional<PluginDescriptor> read_plugin_descriptor(const std::string& path);
// Opens `path` for reading only if it is a regular file (never blocks on a FIFO). Returns the
// descriptor (O_CLOEXEC), or -1 with `why` set.
int open_regular_file(const std::string& path, std::string& why);

// Runs dlopen() and the handshake the registry does (loom_plugin_score, loom_plugin_init, the ABI
// check, reading the plugin and factory tables) in a forked child process, whose stdin/stdout/stderr
// are /dev/null. Returns "" when the child got through (loaded, or refused the plugin cleanly — the
// in-process load then says why), else one line: "crashed while loading (signal 11: SIGSEGV, in
// loom_plugin_init)", "exited while loading (status 3, …)" or "timed out while loading (…)"; a child
// still running at `timeout` is killed. Run check_plugin_file() first: the child must not map a
// truncated file either.
std::string probe_in_child(const std::string& path, std::chrono::milliseconds timeout);

// The plugin's describe() line, if its table has the field and sets it; at most 512 bytes.
inline std::string plugin_description(const loom_plugin& p) {
  if (p.struct_size < offsetof(loom_plugin, describe) + sizeof(p.describe) || !p.describe) return {};
  const char* s = p.describe();
  return s ? one_line(std::string(s, strnlen(s, 512))) : std::string();
}

// More factories than any plugin has: the table holds garbage (it is read before anything is used).
constexpr size_t k_max_factories = 1 << 16;

// Entries of the factory array are factories[0].struct_size apart (a newer minor may append fields).
inline const loom_factory& factory_at(const loom_plugin& p, size_t i) {
  const auto* base = reinterpret_cast<const char*>(p.factories);
  return *reinterpret_cast<const loom_factory*>(base + i * p.factories[0].struct_size);
}

// Takes ownership of a status from a plugin and throws it as loom::Error ("context: message").
void throw_if(loom_status* s, const std::string& context);

// Fails with "unknown key" when the plugin did not read every key of its table.
void check_all_read(const loom_config& cfg, std::string_view plugin_object);

// Adapters: plugin objects behind the host's C++ interfaces. Each holds the library alive.
std::unique_ptr<Sampler> make_plugin_sampler(const PluginRegistry::Found& f, const SamplerSpec& spec);
std::unique_ptr<StopCriterion> make_plugin_stop(const PluginRegistry::Found& f, const SamplerSpec& spec);
std::unique_ptr<Backend> make_plugin_backend(const PluginRegistry::Found& f, const std::string& name,
                                             const std::vector<std::pair<std::string, ParamValue>>& params,
                                             const std::string& where);
// A verifier: its score of (prompt, text), checked to be in [0, 1].
std::shared_ptr<Verifier> make_plugin_verifier(const PluginRegistry::Found& f, const std::string& name,
                                               const std::vector<std::pair<std::string, ParamValue>>& params,
                                               const std::string& where);
// A decoder factory: validates the table once (now), then makes a fresh decoder per request.
std::function<std::unique_ptr<Decoder>()>
make_plugin_decoder_factory(const PluginRegistry::Found& f, std::string name,
                            std::vector<std::pair<std::string, ParamValue>> params, std::string where);

} // namespace loom::plugin
