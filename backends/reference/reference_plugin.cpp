// reference_plugin: the reference backend built a second time, as a plugin behind the backend ABI,
// so the ABI path (graph as C structs, KV through a row view, statuses) is proven by the golden
// tests before the fast backends use it. The kernels are the very same sources as the built-in
// reference backend (compiled into this library; nothing of the host is linked).
#include "../common/executor_plugin.hpp"

namespace {

constexpr char k_name[] = "reference_plugin";
using Table = loom::backend_plugin::ExecutorTable<k_name>;

loom_status* create(const loom_config* cfg, void** out_self, const void** out_vtable) noexcept {
  LOOM_SDK_TRY
  const loom::sdk::Config c(cfg);
  const int64_t threads = c.get_i64("threads", 0); // the reference backend is single-threaded
  if (threads < 0) throw loom::sdk::Error("threads must be ≥ 0");
  auto* p = new loom::backend_plugin::ExecutorPlugin();
  p->be = loom::make_reference_backend();
  *out_self = p;
  *out_vtable = &Table::table;
  LOOM_SDK_CATCH
}

} // namespace

LOOM_PLUGIN_DEFINE("reference_plugin", "1.0.0",
                   loom_factory{sizeof(loom_factory), LOOM_KIND_BACKEND, "reference_plugin", &create})
