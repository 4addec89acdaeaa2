// The `cuda` backend plugin: the cuda executor (cuda_backend.hpp) behind the backend ABI, its buffers in
// device memory — the KV pool (LOOM_BUFFER_KV), the logits (LOOM_BUFFER_LOGITS) — and block copies run on
// the device. Built against the SDK alone. On a machine without a usable GPU the library still loads:
// `loom plugins` shows why it cannot run, and a pipeline naming it fails in one line at create.
#include "cuda_backend.hpp"
#include "loom/sdk/executor_plugin.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr char k_name[] = "cuda";

struct Plugin {
  std::unique_ptr<loom::cuda::CudaBackend> be;
  loom::sdk::ExecutorPlugin graphs; // the converted graphs (its `be` stays empty)
  std::string description;
  std::once_flag described;
};

Plugin* self_of(void* p) {
  return static_cast<Plugin*>(p);
}
const Plugin* self_of(const void* p) {
  return static_cast<const Plugin*>(p);
}

struct Table {
  static const char* name_fn(const void*) { return k_name; }
  static int32_t supports_fn(const void* self, const loom_graph* g, const loom_node* n) {
    try {
      auto* p = const_cast<Plugin*>(self_of(self));
      const loom::Graph& gg = p->graphs.graph(g);
      const auto at =
          static_cast<size_t>(reinterpret_cast<const char*>(n) - reinterpret_cast<const char*>(g->nodes)) /
          std::max<size_t>(g->node_size, 1);
      return at < gg.nodes.size() && p->be->supports(gg, gg.nodes[at]) ? 1 : 0;
    } catch (...) {
      return 0;
    }
  }
  static loom_status* compute_fn(void* self, const loom_graph* g, const loom_batch* b, void* logits,
                                 size_t n_logits) noexcept {
    LOOM_SDK_TRY
    auto* p = self_of(self);
    const loom::KVRows kv = loom::sdk::kv_rows(*b);
    const loom::BatchView batch{{b->tokens, b->n_tokens},
                                {b->positions, b->n_tokens},
                                {b->seq_ids, b->n_tokens},
                                {b->output_rows, b->n_outputs}};
    p->be->compute_device(p->graphs.graph(g), batch, kv, static_cast<float*>(logits), n_logits);
    LOOM_SDK_CATCH
  }
  static loom_status* alloc_fn(void* self, size_t bytes, int32_t usage, void** out) noexcept {
    LOOM_SDK_TRY
    *out = self_of(self)->be->buffer_alloc(bytes);
    if (usage == LOOM_BUFFER_KV && bytes > 0) // a fresh pool reads as zeros (as host memory's)
      self_of(self)->be->zero(*out, bytes);
    LOOM_SDK_CATCH
  }
  static void free_fn(void* self, void* buffer) noexcept { self_of(self)->be->buffer_free(buffer); }
  static loom_status* upload_fn(void* self, void* buffer, size_t offset, const void* src,
                                size_t bytes) noexcept {
    LOOM_SDK_TRY
    self_of(self)->be->upload(static_cast<uint8_t*>(buffer) + offset, src, bytes);
    LOOM_SDK_CATCH
  }
  static loom_status* download_fn(void* self, const void* buffer, size_t offset, void* dst,
                                  size_t bytes) noexcept {
    LOOM_SDK_TRY
    self_of(self)->be->download(dst, static_cast<const uint8_t*>(buffer) + offset, bytes);
    LOOM_SDK_CATCH
  }
  static loom_status* kv_copy_fn(void* self, void* kv, const loom_kv_layout* c, const loom_block_copy* copies,
                                 size_t n) noexcept {
    LOOM_SDK_TRY
    std::vector<loom::KVBlockCopy> v(n);
    for (size_t i = 0; i < n; ++i)
      v[i] = {copies[i].src, copies[i].dst, copies[i].n_positions};
    self_of(self)->be->kv_copy(kv, loom::sdk::from_c(*c), v);
    LOOM_SDK_CATCH
  }
  static loom_status* load_fn(void* self, const loom_weight* weights, size_t n, size_t size) noexcept {
    LOOM_SDK_TRY
    std::vector<loom::WeightDesc> v(n);
    for (size_t i = 0; i < n; ++i) {
      const auto w = loom::sdk::element<loom_weight>(weights, i, size);
      loom::TensorDesc& t = v[i].tensor;
      t.name = w.name ? w.name : "";
      t.kind = loom::TensorKind::weight;
      t.dtype = static_cast<loom::DType>(w.dtype);
      for (size_t k = 0; k < 4; ++k)
        t.ne[k] = w.ne[k];
      t.data = w.data;
      t.weight = w.id;
      v[i].bytes = static_cast<size_t>(w.bytes);
      v[i].uses = w.uses;
    }
    self_of(self)->be->load(v);
    LOOM_SDK_CATCH
  }
  static void memory_fn(const void* self, loom_memory_info* out) {
    size_t f = 0, t = 0;
    try {
      self_of(self)->be->memory_info(f, t);
    } catch (...) {
    }
    out->free_bytes = f;
    out->total_bytes = t;
  }
  static size_t workspace_fn(const void* self) { return self_of(self)->be->workspace_bytes(); }
  static size_t activation_fn(const void* self) { return self_of(self)->be->activation_bytes(); }
  static void destroy_fn(void* self) { delete self_of(self); }
  static int32_t kv_dtype_fn(const void* self, int32_t dtype) {
    return self_of(self)->be->supports_kv_dtype(static_cast<loom::DType>(dtype)) ? 1 : 0;
  }
  static int32_t attention_fn(const void* self, int32_t kernel, uint32_t features) {
    return self_of(self)->be->supports_attention(static_cast<loom::AttnKernel>(kernel), features) ? 1 : 0;
  }
  static const char* describe_fn(const void* self) noexcept {
    auto* p = const_cast<Plugin*>(self_of(self));
    try {
      std::call_once(p->described, [p] { p->description = std::string(p->be->describe()); });
    } catch (...) {
      return "";
    }
    return p->description.c_str();
  }
  static constexpr loom_backend_i table = {sizeof(loom_backend_i),
                                           &name_fn,
                                           &supports_fn,
                                           &compute_fn,
                                           &alloc_fn,
                                           &free_fn,
                                           &upload_fn,
                                           &download_fn,
                                           &kv_copy_fn,
                                           &load_fn,
                                           &memory_fn,
                                           &workspace_fn,
                                           &activation_fn,
                                           &destroy_fn,
                                           &kv_dtype_fn,
                                           &attention_fn,
                                           &describe_fn};
};

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
  loom::cuda::CudaOptions o;
  o.device = static_cast<int>(device);
  o.exact_matmul = c.get_bool("exact_matmul", false);
  o.exact_logits = c.get_bool("exact_logits", true);
  o.cuda_graphs = c.get_bool("cuda_graphs", true);
  o.tree_attention = c.get_bool("tree_attention", false);
  o.staging_bytes = static_cast<size_t>(staging) << 20;
  auto p = std::make_unique<Plugin>();
  p->be = loom::cuda::make_cuda_backend(o); // throws, in one line, where no GPU is usable
  loom::sdk::log(LOOM_LOG_INFO, "cuda backend: " + std::string(p->be->describe()));
  *out_self = p.release();
  *out_vtable = &Table::table;
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
