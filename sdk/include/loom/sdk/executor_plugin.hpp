// loom/sdk/executor_plugin.hpp — a loom::Backend executor (loom/sdk/executor.hpp) behind the backend
// ABI (header-only): the ABI's loom_graph converted back to a loom::Graph (once per host graph
// identity, loom_graph::id), the KV cache seen through the ABI's row view, exceptions turned into
// statuses. A backend plugin writes its executor and a factory:
//
//   constexpr char k_name[] = "mine";
//   loom_status* create(const loom_config* cfg, void** self, const void** vtable) noexcept {
//     LOOM_SDK_TRY
//     auto* p = new loom::sdk::ExecutorPlugin();
//     p->be = std::make_unique<MyExecutor>(loom::sdk::Config(cfg));
//     *self = p;
//     *vtable = &loom::sdk::ExecutorTable<k_name>::table;
//     LOOM_SDK_CATCH
//   }
//   LOOM_PLUGIN_DEFINE("mine", "1.0.0", loom_factory{sizeof(loom_factory), LOOM_KIND_BACKEND, "mine",
//   &create})
#pragma once

#include "loom/sdk/backend.h"
#include "loom/sdk/executor.hpp"
#include "loom/sdk/graph.hpp"
#include "loom/sdk/plugin.hpp"

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace loom::sdk {

// OpKind and DType values are the ABI's (append-only on both sides).
static_assert(static_cast<int32_t>(loom::OpKind::get_rows) == LOOM_OP_GET_ROWS &&
              static_cast<int32_t>(loom::OpKind::attention) == LOOM_OP_ATTENTION &&
              static_cast<int32_t>(loom::OpKind::mul) == LOOM_OP_MUL &&
              static_cast<int32_t>(loom::OpKind::softcap) == LOOM_OP_SOFTCAP);
static_assert(static_cast<uint32_t>(loom::DType::q4_k) == LOOM_DTYPE_Q4_K &&
              static_cast<uint32_t>(loom::DType::bf16) == LOOM_DTYPE_BF16);

// The host's KV cache seen through the ABI's row view.
class KVView final : public loom::KVRows {
public:
  explicit KVView(const loom_kv_view& v)
      : v_(v),
        typed_(v.struct_size >= offsetof(loom_kv_view, v_data) + sizeof(void*) && v.k_data && v.v_data) {}
  float* k_row(int32_t layer, loom::SeqId seq, loom::Pos pos) noexcept override {
    return v_.k_row ? v_.k_row(v_.ctx, layer, seq, pos) : nullptr;
  }
  float* v_row(int32_t layer, loom::SeqId seq, loom::Pos pos) noexcept override {
    return v_.v_row ? v_.v_row(v_.ctx, layer, seq, pos) : nullptr;
  }
  loom::DType kv_dtype() const noexcept override {
    return typed_ ? static_cast<loom::DType>(v_.dtype) : loom::DType::f32;
  }
  void* k_data(int32_t layer, loom::SeqId seq, loom::Pos pos) noexcept override {
    return typed_ ? v_.k_data(v_.ctx, layer, seq, pos) : k_row(layer, seq, pos);
  }
  void* v_data(int32_t layer, loom::SeqId seq, loom::Pos pos) noexcept override {
    return typed_ ? v_.v_data(v_.ctx, layer, seq, pos) : v_row(layer, seq, pos);
  }

private:
  loom_kv_view v_;
  bool typed_;
};

// The ABI's graph as the executor's loom::Graph (tensor data pointers are borrowed).
inline loom::Graph from_c(const loom_graph& c) {
  loom::Graph g;
  for (size_t i = 0; i < c.n_tensors; ++i) {
    const loom_tensor& t = c.tensors[i];
    loom::TensorDesc d;
    d.name = t.name ? t.name : "";
    d.kind = t.kind == LOOM_TENSOR_WEIGHT  ? loom::TensorKind::weight
             : t.kind == LOOM_TENSOR_INPUT ? loom::TensorKind::input
                                           : loom::TensorKind::activation;
    d.dtype = static_cast<loom::DType>(t.dtype);
    for (size_t k = 0; k < 4; ++k)
      d.ne[k] = t.ne[k];
    d.data = t.data;
    g.tensors.push_back(std::move(d));
  }
  const bool has_ext = c.struct_size >= offsetof(loom_graph, attn_ext_stride) + sizeof(size_t) &&
                       c.attn_ext && c.attn_ext_stride >= sizeof(loom_attention_ext);
  for (size_t i = 0; i < c.n_nodes; ++i) {
    const loom_node& n = c.nodes[i];
    loom::Node d;
    d.op = static_cast<loom::OpKind>(n.op);
    for (size_t k = 0; k < 3; ++k)
      d.src[k] = n.src[k];
    d.dst = n.dst;
    d.eps = n.eps;
    d.scale = n.scale;
    d.rope = {n.rope.n_dims,      n.rope.theta,    n.rope.neox != 0, n.rope.freq_scale, n.rope.ext_factor,
              n.rope.attn_factor, n.rope.orig_ctx, n.rope.beta_fast, n.rope.beta_slow};
    d.attn.layer = n.attn.layer;
    d.attn.n_head = n.attn.n_head;
    d.attn.n_head_kv = n.attn.n_head_kv;
    d.attn.head_dim = n.attn.head_dim;
    d.attn.scale = n.attn.scale;
    d.attn.window = n.attn.window;
    d.attn.softcap = n.attn.softcap;
    if (has_ext) {
      const auto* e = reinterpret_cast<const loom_attention_ext*>(reinterpret_cast<const char*>(c.attn_ext) +
                                                                  i * c.attn_ext_stride);
      d.attn.sinks = e->sinks;
      d.attn.kernel = static_cast<loom::AttnKernel>(e->kernel);
    }
    g.nodes.push_back(d);
  }
  g.n_tokens = c.n_tokens;
  g.n_outputs = c.n_outputs;
  g.in_tokens = c.in_tokens;
  g.in_positions = c.in_positions;
  g.in_out_ids = c.in_out_ids;
  g.out_logits = c.out_logits;
  return g;
}

// The object behind an ExecutorTable: the executor and its converted graphs.
struct ExecutorPlugin {
  std::unique_ptr<loom::Backend> be;
  std::map<uint64_t, loom::Graph> graphs; // converted once per host graph identity (loom_graph::id)
  loom::Graph scratch;                    // a graph without identity, converted every call
  std::string description;                // what describe() returned (once)
  std::once_flag described;

  const loom::Graph& graph(const loom_graph* c) {
    const bool has_id = c->struct_size >= offsetof(loom_graph, id) + sizeof(c->id) && c->id != 0;
    if (!has_id) return scratch = from_c(*c);
    auto it = graphs.find(c->id);
    if (it == graphs.end()) {
      if (graphs.size() >= 64) graphs.clear(); // bounded: prefill shapes vary per prompt
      it = graphs.emplace(c->id, from_c(*c)).first;
    }
    return it->second;
  }
};

// The loom_backend_i entries over an ExecutorPlugin; NAME is returned by name().
template <const char* NAME> struct ExecutorTable {
  static const char* name_fn(const void*) { return NAME; }
  static int32_t supports_fn(const void* self, const loom_graph* g, const loom_node* n) {
    try {
      auto* p = const_cast<ExecutorPlugin*>(static_cast<const ExecutorPlugin*>(self));
      const loom::Graph& gg = p->graph(g);
      return p->be->supports(gg, gg.nodes[static_cast<size_t>(n - g->nodes)]) ? 1 : 0;
    } catch (...) {
      return 0;
    }
  }
  static loom_status* compute_fn(void* self, const loom_graph* g, const loom_batch* b, const loom_kv_view* kv,
                                 float* logits, size_t n_logits) noexcept {
    LOOM_SDK_TRY
    auto* p = static_cast<ExecutorPlugin*>(self);
    KVView view(*kv);
    const loom::BatchView batch{{b->tokens, b->n_tokens},
                                {b->positions, b->n_tokens},
                                {b->seq_ids, b->n_tokens},
                                {b->output_rows, b->n_outputs}};
    p->be->compute(p->graph(g), batch, view, {logits, n_logits});
    LOOM_SDK_CATCH
  }
  static size_t workspace_fn(const void* self) {
    return static_cast<const ExecutorPlugin*>(self)->be->workspace_bytes();
  }
  static size_t activation_fn(const void* self) {
    return static_cast<const ExecutorPlugin*>(self)->be->activation_bytes();
  }
  static void destroy_fn(void* self) { delete static_cast<ExecutorPlugin*>(self); }
  static int32_t kv_dtype_fn(const void* self, int32_t dtype) {
    return static_cast<const ExecutorPlugin*>(self)->be->supports_kv_dtype(static_cast<loom::DType>(dtype))
               ? 1
               : 0;
  }
  static int32_t attention_fn(const void* self, int32_t kernel, uint32_t features) {
    return static_cast<const ExecutorPlugin*>(self)->be->supports_attention(
               static_cast<loom::AttnKernel>(kernel), features)
               ? 1
               : 0;
  }
  // Computed once (the pointer stays valid until destroy, whatever the threads).
  static const char* describe_fn(const void* self) noexcept {
    auto* p = const_cast<ExecutorPlugin*>(static_cast<const ExecutorPlugin*>(self));
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
                                           nullptr,
                                           nullptr,
                                           nullptr,
                                           nullptr,
                                           nullptr,
                                           &workspace_fn,
                                           &destroy_fn,
                                           &activation_fn,
                                           &kv_dtype_fn,
                                           &attention_fn,
                                           &describe_fn};
};

} // namespace loom::sdk
