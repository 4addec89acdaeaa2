// reference_plugin: the reference backend built a second time, as a plugin behind the backend ABI,
// so the ABI path (graph as C structs, KV through a row view, statuses) is proven by the golden
// tests before the fast backends use it. The executor is the SDK's header-only reference executor
// (loom/sdk/reference.hpp), the very code of the built-in reference backend; the plugin is built
// against the SDK alone and links nothing of the host.
#include "loom/sdk/executor_plugin.hpp"
#include "loom/sdk/reference.hpp"

namespace {

constexpr char k_name[] = "reference_plugin";
using Table = loom::sdk::ExecutorTable<k_name>;

loom_status* create(const loom_config* cfg, void** out_self, const void** out_vtable) noexcept {
  LOOM_SDK_TRY
  const loom::sdk::Config c(cfg);
  const int64_t threads = c.get_i64("threads", 0); // the reference backend is single-threaded
  if (threads < 0) throw loom::sdk::Error("threads must be ≥ 0");
  auto* p = new loom::sdk::ExecutorPlugin();
  p->be = std::make_unique<loom::ReferenceBackend>();
  *out_self = p;
  *out_vtable = &Table::table;
  LOOM_SDK_CATCH
}

} // namespace

LOOM_PLUGIN_DEFINE("reference_plugin", "1.0.0",
                   loom_factory{sizeof(loom_factory), LOOM_KIND_BACKEND, "reference_plugin", &create})
