// The `cpu` backend plugin: the cpu executor (cpu_backend.hpp) behind the backend ABI — prefill
// GEMMs on oneDNN, decode on our own AVX2/FMA/F16C kernels (chosen at run time; scalar otherwise),
// tiled online-softmax attention, every op on one OpenMP pool.
#include "cpu_backend.hpp"
#include "loom/sdk/executor_plugin.hpp"

#include <omp.h>
#include <string>

namespace {

constexpr char k_name[] = "cpu";
using Table = loom::sdk::ExecutorTable<k_name>;

loom_status* create(const loom_config* cfg, void** out_self, const void** out_vtable) noexcept {
  LOOM_SDK_TRY
  const loom::sdk::Config c(cfg);
  const int64_t threads = c.get_i64("threads", 0);
  if (threads < 0 || threads > 1024)
    throw loom::sdk::Error("[backend] threads: expected 0 (all cores) .. 1024, found " +
                           std::to_string(threads));
  const int64_t gemm_min = c.get_i64("gemm_min_rows", 16);
  if (gemm_min < 0 || gemm_min > 65536)
    throw loom::sdk::Error("[backend] gemm_min_rows: expected 0 (never use oneDNN) .. 65536, found " +
                           std::to_string(gemm_min));
  const int64_t gemm_min_quant = c.get_i64("gemm_min_rows_quant", 256);
  if (gemm_min_quant < 0 || gemm_min_quant > 65536)
    throw loom::sdk::Error("[backend] gemm_min_rows_quant: expected 0 (never use oneDNN) .. 65536, found " +
                           std::to_string(gemm_min_quant));
  const int64_t gemm_min_f16 = c.get_i64("gemm_min_rows_f16", 96);
  if (gemm_min_f16 < 0 || gemm_min_f16 > 65536)
    throw loom::sdk::Error("[backend] gemm_min_rows_f16: expected 0 (never use oneDNN) .. 65536, found " +
                           std::to_string(gemm_min_f16));
  const bool repack = c.get_bool("repack", true);
  const bool bf16_gemm = c.get_bool("bf16_gemm", true);
  const bool fused_decode = c.get_bool("fused_decode", true);
  const bool bf16_gemv = c.get_bool("bf16_gemv", true);
  const bool f16_as_bf16 = c.get_bool("f16_as_bf16", false);
  const bool f16_gemv = c.get_bool("f16_gemv", true);
  const bool exact_logits = c.get_bool("exact_logits", true);
  const bool exact_matmul = c.get_bool("exact_matmul", false);
  const bool profile = c.get_bool("profile", false);
  const int64_t rescore = c.get_i64("logits_rescore", 64);
  if (rescore < 0 || rescore > 4096)
    throw loom::sdk::Error("[backend] logits_rescore: expected 0 .. 4096 (0: the whole head exact), found " +
                           std::to_string(rescore));
  if (exact_matmul && f16_as_bf16)
    throw loom::sdk::Error(
        "[backend] exact_matmul = true rounds no weight and no activation, but f16_as_bf16 = true "
        "rounds F16 weights to bf16: set one of them");
  const int n = threads > 0 ? static_cast<int>(threads) : omp_get_num_procs();
  omp_set_num_threads(n); // one OpenMP pool for the process (oneDNN shares it)
  const loom::cpu::Isa isa = loom::cpu::detect_isa();
  loom::sdk::log(LOOM_LOG_INFO, std::string("cpu backend: ") + loom::cpu::isa_name(isa) + ", " +
                                    std::to_string(n) + " threads");
  auto* p = new loom::sdk::ExecutorPlugin();
  loom::cpu::CpuOptions o;
  o.threads = n;
  o.isa = isa;
  o.gemm_min_rows = static_cast<int>(gemm_min);
  o.gemm_min_rows_quant = static_cast<int>(gemm_min_quant);
  o.gemm_min_rows_f16 = static_cast<int>(gemm_min_f16);
  o.repack = repack;
  o.bf16_gemm = bf16_gemm && !exact_matmul; // (both round the activations to bf16)
  o.fused_decode = fused_decode;
  o.bf16_gemv = bf16_gemv && !exact_matmul;
  o.f16_as_bf16 = f16_as_bf16;
  o.f16_gemv = f16_gemv;
  o.exact_logits = exact_logits;
  o.exact_matmul = exact_matmul;
  o.profile = profile;
  o.logits_rescore = static_cast<int>(rescore);
  p->be = loom::cpu::make_cpu_backend(o);
  *out_self = p;
  *out_vtable = &Table::table;
  LOOM_SDK_CATCH
}

// For `loom plugins`: the kernel level a backend made now would use (LOOM_CPU_ISA or the best this CPU
// runs), what the CPU has, and the default thread count.
const char* describe() noexcept {
  static const std::string line = [] {
    const char* have = loom::cpu::isa_name(loom::cpu::cpu_isa());
    std::string level;
    try {
      level = loom::cpu::isa_name(loom::cpu::detect_isa());
    } catch (const std::exception& e) {
      return std::string("no usable level: ") + e.what();
    }
    return "isa " + level +
           (level == have ? " (the best this CPU runs)" : std::string(" (CPU: ") + have + ")") + ", " +
           std::to_string(omp_get_num_procs()) + " threads by default";
  }();
  return line.c_str();
}

} // namespace

LOOM_PLUGIN_DEFINE_DESCRIBED("cpu", "0.1.0", 1, nullptr, &describe,
                             loom_factory{sizeof(loom_factory), LOOM_KIND_BACKEND, "cpu", &create})
