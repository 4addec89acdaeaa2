// Host-side pieces of the plugin ABI shared by the registry, the host API and the adapters.
#pragma once

#include "loom/backend.hpp"
#include "loom/decoder.hpp"
#include "loom/engine.hpp"
#include "loom/error.hpp"
#include "loom/plugin_host.hpp"
#include "loom/sampler.hpp"
#include "loom/sdk/abi.h"

#include <memory>
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
};

namespace loom::plugin {

// Takes ownership of a status from a plugin and throws it as loom::Error ("context: message").
void throw_if(loom_status* s, const std::string& context);
Errc errc_of(int32_t status_code) noexcept;

// Fails with "unknown key" when the plugin did not read every key of its table.
void check_all_read(const loom_config& cfg, std::string_view plugin_object);

// Adapters: plugin objects behind the host's C++ interfaces. Each holds the library alive.
std::unique_ptr<Sampler> make_plugin_sampler(const PluginRegistry::Found& f, const SamplerSpec& spec);
std::unique_ptr<StopPlugin> make_plugin_stop(const PluginRegistry::Found& f, const SamplerSpec& spec);
std::unique_ptr<Backend> make_plugin_backend(const PluginRegistry::Found& f, const std::string& name,
                                             const std::vector<std::pair<std::string, ParamValue>>& params,
                                             const std::string& where);
// A decoder factory: validates the table once (now), then makes a fresh decoder per request.
std::function<std::unique_ptr<Decoder>()>
make_plugin_decoder_factory(const PluginRegistry::Found& f, std::string name,
                            std::vector<std::pair<std::string, ParamValue>> params, std::string where);

} // namespace loom::plugin
