// The `cpu` backend plugin: Loom's executor with the matrix products on our own kernels (AVX2/FMA/
// F16C when the CPU has them, chosen at run time; scalar otherwise), reading weights straight from
// their GGUF blocks and split over OpenMP threads. Every other op is the reference op.
#include "../common/executor_plugin.hpp"
#include "kernels.hpp"
#include "reference_backend_hooks.hpp"

#include <omp.h>

namespace {

constexpr char k_name[] = "cpu";
using Table = loom::backend_plugin::ExecutorTable<k_name>;

loom_status* create(const loom_config* cfg, void** out_self, const void** out_vtable) noexcept {
  LOOM_SDK_TRY
  const loom::sdk::Config c(cfg);
  const int64_t threads = c.get_i64("threads", 0);
  if (threads < 0 || threads > 1024)
    throw loom::sdk::Error("[backend] threads: expected 0 (all cores) .. 1024");
  const int n = threads > 0 ? static_cast<int>(threads) : omp_get_num_procs();
  omp_set_num_threads(n); // one OpenMP pool for the process (oneDNN shares it)
  const loom::cpu::Isa isa = loom::cpu::detect_isa();
  loom::sdk::log(LOOM_LOG_INFO, std::string("cpu backend: ") + loom::cpu::isa_name(isa) + ", " +
                                    std::to_string(n) + " threads");
  auto* p = new loom::backend_plugin::ExecutorPlugin();
  p->be = loom::make_reference_backend_with(
      [isa, n](const loom::TensorDesc& w, const float* x, int64_t T, float* y) {
        if (!loom::cpu::has_kernel(w.dtype)) return false;
        loom::cpu::matmul(isa, w.dtype, static_cast<const uint8_t*>(w.data),
                          loom::row_bytes(w.dtype, w.ne[0]), w.ne[0], w.ne[1], x, T, y, n);
        return true;
      },
      "cpu");
  *out_self = p;
  *out_vtable = &Table::table;
  LOOM_SDK_CATCH
}

} // namespace

LOOM_PLUGIN_DEFINE("cpu", "0.1.0", loom_factory{sizeof(loom_factory), LOOM_KIND_BACKEND, "cpu", &create})
