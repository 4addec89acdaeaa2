// loom/sdk/executor_plugin.hpp — a loom::Backend executor (loom/sdk/executor.hpp) behind the backend
// ABI (header-only): the ABI's loom_graph converted back to a loom::Graph (once per host graph
// identity, loom_graph::id), the KV pool and block tables of each batch as loom::KVRows, buffers in host
// memory, the weights handed to Backend::load, exceptions turned into statuses. A backend plugin writes its
// executor and a factory:
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

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace loom::sdk {

// OpKind and DType values are the ABI's (append-only on both sides).
static_assert(static_cast<int32_t>(loom::OpKind::get_rows) == LOOM_OP_GET_ROWS &&
              static_cast<int32_t>(loom::OpKind::attention) == LOOM_OP_ATTENTION &&
              static_cast<int32_t>(loom::OpKind::mul) == LOOM_OP_MUL &&
              static_cast<int32_t>(loom::OpKind::softcap) == LOOM_OP_SOFTCAP);
static_assert(static_cast<uint32_t>(loom::DType::q4_k) == LOOM_DTYPE_Q4_K &&
              static_cast<uint32_t>(loom::DType::bf16) == LOOM_DTYPE_BF16);

// Element i of an array of C structs `size` bytes apart, as this SDK's view of the struct: the fields a
// shorter (older) struct lacks read as zero.
template <class T> T element(const void* base, size_t i, size_t size) noexcept {
  T out{};
  std::memcpy(&out, static_cast<const char*>(base) + i * size, std::min(size, sizeof(T)));
  return out;
}

// The ABI's KV pool layout as loom::KVLayout.
inline loom::KVLayout from_c(const loom_kv_layout& c) noexcept {
  loom::KVLayout l;
  l.dtype = static_cast<loom::DType>(c.dtype);
  l.n_layer = c.n_layer;
  l.n_head_kv = c.n_head_kv;
  l.head_dim = c.head_dim;
  l.block_size = c.block_size;
  l.n_blocks = c.n_blocks;
  return l;
}

// Block copies on a KV pool in host memory (what a host-memory backend's kv_copy does).
inline void copy_blocks_c(void* kv, const loom_kv_layout& c, const loom_block_copy* copies, size_t n) {
  std::vector<loom::KVBlockCopy> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = {copies[i].src, copies[i].dst, copies[i].n_positions};
  loom::HostKVBuffer::copy_blocks(static_cast<uint8_t*>(kv), from_c(c), v);
}

// The ABI's KV pool and batch tables as the executor's loom::KVRows.
inline loom::KVRows kv_rows(const loom_batch& b) {
  if (b.struct_size < offsetof(loom_batch, table_stride) + sizeof(b.table_stride) || !b.kv_layout || !b.kv)
    throw loom::Error(loom::Errc::invalid_argument, "backend",
                      "a batch without its KV pool (ABI before 2.0)");
  const loom::KVLayout l = from_c(*b.kv_layout);
  const size_t n_tables = b.n_seqs * static_cast<size_t>(std::max(b.table_stride, 0));
  return loom::KVRows(l, b.kv, {b.slots, b.n_tokens}, {b.row_seq, b.n_tokens}, {b.tables, n_tables},
                      b.table_stride);
}

// The ABI's graph as the executor's loom::Graph (tensor data pointers are borrowed).
inline loom::Graph from_c(const loom_graph& c) {
  loom::Graph g;
  for (size_t i = 0; i < c.n_tensors; ++i) {
    const auto t = element<loom_tensor>(c.tensors, i, c.tensor_size);
    loom::TensorDesc d;
    d.name = t.name ? t.name : "";
    d.kind = t.kind == LOOM_TENSOR_WEIGHT  ? loom::TensorKind::weight
             : t.kind == LOOM_TENSOR_INPUT ? loom::TensorKind::input
                                           : loom::TensorKind::activation;
    d.dtype = static_cast<loom::DType>(t.dtype);
    for (size_t k = 0; k < 4; ++k)
      d.ne[k] = t.ne[k];
    d.data = t.data;
    d.weight = t.weight;
    g.tensors.push_back(std::move(d));
  }
  for (size_t i = 0; i < c.n_nodes; ++i) {
    const auto n = element<loom_node>(c.nodes, i, c.node_size);
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
    d.attn.sinks = n.attn.sinks;
    d.attn.kernel = static_cast<loom::AttnKernel>(n.attn.kernel);
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

// The object behind an ExecutorTable: the executor, its converted graphs and its buffers (host memory: a
// KV pool as loom::HostKVBuffer, others on the heap).
struct ExecutorPlugin {
  std::unique_ptr<loom::Backend> be;
  std::map<const void*, std::unique_ptr<loom::HostKVBuffer>> buffers; // by address
  std::mutex buffers_mutex;
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
    auto* p = static_cast<ExecutorPlugin*>(self);
    const loom::KVRows kv = kv_rows(*b);
    loom::BatchView batch{{b->tokens, b->n_tokens},
                          {b->positions, b->n_tokens},
                          {b->seq_ids, b->n_tokens},
                          {b->output_rows, b->n_outputs}};
    // Token-tree rows (2.1): read only from a host whose loom_batch has the fields.
    if (b->struct_size >= offsetof(loom_batch, tree_mask) + sizeof(b->tree_mask) && b->tree_base) {
      batch.rope_positions = {b->rope_positions, b->n_tokens};
      batch.tree_base = {b->tree_base, b->n_tokens};
      batch.tree_mask = {b->tree_mask, b->n_tokens};
    }
    p->be->compute(p->graph(g), batch, kv, {static_cast<float*>(logits), n_logits});
    LOOM_SDK_CATCH
  }
  // Host memory: every buffer is a loom::HostKVBuffer (an uncommitted anonymous mapping; a small one is
  // as cheap as the heap's).
  static loom_status* alloc_fn(void* self, size_t bytes, int32_t, void** out) noexcept {
    LOOM_SDK_TRY
    auto* p = static_cast<ExecutorPlugin*>(self);
    auto buf = std::make_unique<loom::HostKVBuffer>(std::max<size_t>(bytes, 1));
    *out = buf->data();
    const std::lock_guard<std::mutex> lock(p->buffers_mutex);
    p->buffers.emplace(*out, std::move(buf));
    LOOM_SDK_CATCH
  }
  static void free_fn(void* self, void* buffer) noexcept {
    auto* p = static_cast<ExecutorPlugin*>(self);
    const std::lock_guard<std::mutex> lock(p->buffers_mutex);
    p->buffers.erase(buffer);
  }
  static loom_status* upload_fn(void*, void* buffer, size_t offset, const void* src, size_t bytes) noexcept {
    std::memcpy(static_cast<char*>(buffer) + offset, src, bytes);
    return nullptr;
  }
  static loom_status* download_fn(void*, const void* buffer, size_t offset, void* dst,
                                  size_t bytes) noexcept {
    std::memcpy(dst, static_cast<const char*>(buffer) + offset, bytes);
    return nullptr;
  }
  static loom_status* kv_copy_fn(void*, void* kv, const loom_kv_layout* c, const loom_block_copy* copies,
                                 size_t n) noexcept {
    LOOM_SDK_TRY
    copy_blocks_c(kv, *c, copies, n);
    LOOM_SDK_CATCH
  }
  static loom_status* load_fn(void* self, const loom_weight* weights, size_t n, size_t size) noexcept {
    LOOM_SDK_TRY
    std::vector<loom::WeightDesc> v(n);
    for (size_t i = 0; i < n; ++i) {
      const auto w = element<loom_weight>(weights, i, size);
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
    static_cast<ExecutorPlugin*>(self)->be->load(v);
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
                                           &alloc_fn,
                                           &free_fn,
                                           &upload_fn,
                                           &download_fn,
                                           &kv_copy_fn,
                                           &load_fn,
                                           nullptr,
                                           &workspace_fn,
                                           &activation_fn,
                                           &destroy_fn,
                                           &kv_dtype_fn,
                                           &attention_fn,
                                           &describe_fn};
};

} // namespace loom::sdk
