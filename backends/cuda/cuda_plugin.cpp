// The `cuda` backend plugin: the cuda executor (cuda_backend.hpp) behind the SDK's ExecutorTable, as every
// backend plugin is — its buffers (the KV pool, the logits) in device memory through Backend::alloc, block
// copies on the device. Built against the SDK alone. On a machine without a usable GPU the library still
// loads: `loom plugins` shows why it cannot run, and a pipeline naming it fails in one line at create.
#include "cuda_backend.hpp"
#include "loom/sdk/executor_plugin.hpp"

#include <memory>
#include <string>

namespace {

constexpr char k_name[] = "cuda";

loom_status* create(const loom_config* cfg, void** out_self, const void** out_vtable) noexcept {
  LOOM_SDK_TRY
  const loom::sdk::Config c(cfg);
  (void)c.get_i64("threads", 0); // the host passes the pipeline's thread count to every backend
  const int64_t device = c.get_i64("device", 0);
  if (device < 0 || device > 63)
    throw loom::sdk::Error("[backend] device: expected a CUDA device index 0 .. 63, found " +
                           std::to_string(device));
  const int64_t staging = c.get_i64("staging_mib", 64);
  if (staging < 1 || staging > 4096)
    throw loom::sdk::Error(
        "[backend] staging_mib: expected 1 .. 4096 (MiB of pinned memory for uploads), found " +
        std::to_string(staging));
  const int64_t rescore = c.get_i64("logits_rescore", 64);
  if (rescore < 0 || rescore > 4096)
    throw loom::sdk::Error("[backend] logits_rescore: expected 0 .. 4096 (0: the whole head exact), found " +
                           std::to_string(rescore));
  loom::cuda::CudaOptions o;
  o.device = static_cast<int>(device);
  o.exact_matmul = c.get_bool("exact_matmul", false);
  o.exact_logits = c.get_bool("exact_logits", true);
  o.logits_rescore = static_cast<int>(rescore);
  o.cuda_graphs = c.get_bool("cuda_graphs", true);
  o.tree_attention = c.get_bool("tree_attention", true);
  o.profile = c.get_bool("profile", false);
  o.staging_bytes = static_cast<size_t>(staging) << 20;
  auto p = std::make_unique<loom::sdk::ExecutorPlugin>();
  p->be = loom::cuda::make_cuda_backend(o); // throws, in one line, where no GPU is usable
  loom::sdk::log(LOOM_LOG_INFO, "cuda backend: " + std::string(p->be->describe()));
  *out_self = p.release();
  *out_vtable = &loom::sdk::ExecutorTable<k_name>::table;
  LOOM_SDK_CATCH
}

// For `loom plugins`: the device a backend made now would use, or why none can be.
const char* describe() noexcept {
  static const std::string line = [] {
    try {
      return loom::cuda::describe_device(0);
    } catch (const std::exception& e) {
      return std::string("cannot describe the device: ") + e.what();
    }
  }();
  return line.c_str();
}

} // namespace

LOOM_PLUGIN_DEFINE_DESCRIBED("cuda", "0.1.0", 1, nullptr, &describe,
                             loom_factory{sizeof(loom_factory), LOOM_KIND_BACKEND, "cuda", &create})
