// loom/sdk/executor_plugin.hpp — a loom::Backend executor (loom/sdk/executor.hpp) behind the backend
// ABI (header-only): the ABI's loom_graph converted back to a loom::Graph (once per host graph
// identity, loom_graph::id), the KV pool and block tables of each batch as loom::KVRows, buffers as the
// executor's own (Backend::alloc: host memory by default, device memory where it says), the weights handed to
// Backend::load, exceptions turned into statuses. Every backend plugin — reference, cpu, cuda, a third
// party's — is this table over its executor. A backend plugin writes its executor and a factory:
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
#include "loom/sdk/lru_cache.hpp"
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

// OpKind, BufferUsage and DType values are the ABI's (append-only on both sides).
static_assert(static_cast<int32_t>(loom::OpKind::get_rows) == LOOM_OP_GET_ROWS &&
              static_cast<int32_t>(loom::OpKind::attention) == LOOM_OP_ATTENTION &&
              static_cast<int32_t>(loom::OpKind::mul) == LOOM_OP_MUL &&
              static_cast<int32_t>(loom::OpKind::softcap) == LOOM_OP_SOFTCAP);
static_assert(static_cast<int32_t>(loom::BufferUsage::kv) == LOOM_BUFFER_KV &&
              static_cast<int32_t>(loom::BufferUsage::logits) == LOOM_BUFFER_LOGITS);
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
inline loom::KVLayout from_c(const loom_kv_layout& c) {
  loom::KVLayout l;
  l.dtype = static_cast<loom::DType>(c.dtype);
  l.n_layer = c.n_layer;
  l.n_head_kv = c.n_head_kv;
  l.head_dim = c.head_dim;
  l.block_size = c.block_size;
  l.n_blocks = c.n_blocks;
  const bool grouped =
      c.struct_size >= offsetof(loom_kv_layout, layer_slot) + sizeof(c.layer_slot) && c.n_groups > 1;
  if (grouped) { // the slots follow from the groups; a host that says otherwise is not this SDK's
    if (!c.layer_group || c.n_layer <= 0)
      throw loom::Error(loom::Errc::invalid_argument, "backend", "a KV layout of layer groups without them");
    l.set_groups({c.layer_group, static_cast<size_t>(c.n_layer)});
    const auto slots = l.layer_slot();
    if (c.n_groups != l.n_groups() || c.n_slots != l.n_slots() ||
        (c.layer_slot && !std::equal(slots.begin(), slots.end(), c.layer_slot)))
      throw loom::Error(loom::Errc::invalid_argument, "backend",
                        "a KV layout whose layer slots are not its groups' layers in order");
  }
  return l;
}

// The ABI's KV pool and batch tables as the executor's loom::KVRows.
inline loom::KVRows kv_rows(const loom_batch& b) {
  if (!b.kv_layout || !b.kv)
    throw loom::Error(loom::Errc::invalid_argument, "backend", "a batch without its KV pool");
  const loom::KVLayout l = from_c(*b.kv_layout);
  const auto group = [&](const int64_t* slots, const int32_t* tables, int32_t stride) {
    const size_t n_tables = b.n_seqs * static_cast<size_t>(std::max(stride, 0));
    return loom::KVGroupRows{{slots, b.n_tokens}, {tables, n_tables}, stride};
  };
  std::vector<loom::KVGroupRows> groups{group(b.slots, b.tables, b.table_stride)};
  if (l.n_groups() > 1) {
    if (b.struct_size < offsetof(loom_batch, kv_groups) + sizeof(b.kv_groups) || !b.kv_groups)
      throw loom::Error(loom::Errc::invalid_argument, "backend",
                        "a batch of layer groups without their tables");
    for (int32_t g = 1; g < l.n_groups(); ++g)
      groups.push_back(group(b.kv_groups[g].slots, b.kv_groups[g].tables, b.kv_groups[g].table_stride));
  }
  return loom::KVRows(l, b.kv, {b.row_seq, b.n_tokens}, std::move(groups));
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
    d.moe.n_used = n.moe.n_used; // (a host before 3.2: zeros, and no MoE node)
    d.moe.gating = static_cast<loom::MoeGating>(n.moe.gating);
    d.moe.norm = n.moe.norm != 0;
    d.moe.weights_scale = n.moe.weights_scale;
    // (3.2: a node of an older host has no sink logits, whatever its zero-filled field says)
    d.attn.sink_logits =
        c.node_size >= offsetof(loom_node, attn_sink_logits) + sizeof(int32_t) ? n.attn_sink_logits : -1;
    d.glu.alpha = n.glu_alpha;
    d.glu.limit = n.glu_limit;
    g.nodes.push_back(d);
  }
  g.id = c.id; // the host's name for this graph's shape (backends key their caches by it)
  g.n_tokens = c.n_tokens;
  g.n_outputs = c.n_outputs;
  g.in_tokens = c.in_tokens;
  g.in_positions = c.in_positions;
  g.in_out_ids = c.in_out_ids;
  g.out_logits = c.out_logits;
  return g;
}

// The object behind an ExecutorTable: the executor, its converted graphs and the buffers it made.
struct ExecutorPlugin {
  std::unique_ptr<loom::Backend> be;
  std::map<const void*, std::unique_ptr<loom::Buffer>> buffers; // by address (Buffer::data())
  std::mutex buffers_mutex;
  loom::LruCache<uint64_t, loom::Graph> graphs{64}; // converted once per host graph identity (loom_graph::id)
  loom::Graph scratch;                              // a graph without identity, converted every call
  std::string description;                          // what describe() returned (once)
  std::once_flag described;

  const loom::Graph& graph(const loom_graph* c) {
    const bool has_id = c->struct_size >= offsetof(loom_graph, id) + sizeof(c->id) && c->id != 0;
    if (!has_id) return scratch = from_c(*c);
    return graphs.get(c->id, [&] { return from_c(*c); });
  }
  // The buffer alloc made at this address (the ABI names buffers by address).
  loom::Buffer& buffer(const void* data) {
    const std::lock_guard<std::mutex> lock(buffers_mutex);
    const auto it = buffers.find(data);
    if (it == buffers.end())
      throw loom::Error(
          loom::Errc::invalid_argument, "backend",
          "expected the address of a buffer this backend allocated (buffer_alloc), found another");
    return *it->second;
  }
};

// The loom_backend_i entries over an ExecutorPlugin; NAME is returned by name().
template <const char* NAME> struct ExecutorTable {
  static const char* name_fn(const void*) { return NAME; }
  static int32_t supports_fn(const void* self, const loom_graph* g, int32_t node) {
    try {
      auto* p = const_cast<ExecutorPlugin*>(static_cast<const ExecutorPlugin*>(self));
      const loom::Graph& gg = p->graph(g);
      const auto at = static_cast<size_t>(node);
      return node >= 0 && at < gg.nodes.size() && p->be->supports(gg, gg.nodes[at]) ? 1 : 0;
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
    if (b->tree_base) { // token-tree rows (LOOM_ATTN_FEATURE_TREE)
      batch.rope_positions = {b->rope_positions, b->n_tokens};
      batch.tree_base = {b->tree_base, b->n_tokens};
      batch.tree_mask = {b->tree_mask, b->n_tokens};
    }
    p->be->compute(p->graph(g), batch, kv, {static_cast<float*>(logits), n_logits});
    LOOM_SDK_CATCH
  }
  static loom_status* alloc_fn(void* self, size_t bytes, int32_t usage, void** out) noexcept {
    LOOM_SDK_TRY
    auto* p = static_cast<ExecutorPlugin*>(self);
    auto buf = p->be->alloc(std::max<size_t>(bytes, 1), static_cast<loom::BufferUsage>(usage));
    *out = buf->data();
    const std::lock_guard<std::mutex> lock(p->buffers_mutex);
    p->buffers.emplace(*out, std::move(buf));
    LOOM_SDK_CATCH
  }
  static void free_fn(void* self, void* buffer) noexcept {
    auto* p = static_cast<ExecutorPlugin*>(self);
    std::unique_ptr<loom::Buffer> gone; // freed outside the lock
    const std::lock_guard<std::mutex> lock(p->buffers_mutex);
    if (const auto it = p->buffers.find(buffer); it != p->buffers.end()) {
      gone = std::move(it->second);
      p->buffers.erase(it);
    }
  }
  static loom_status* upload_fn(void* self, void* buffer, size_t offset, const void* src,
                                size_t bytes) noexcept {
    LOOM_SDK_TRY
    static_cast<ExecutorPlugin*>(self)->buffer(buffer).write(offset, src, bytes);
    LOOM_SDK_CATCH
  }
  static loom_status* download_fn(void* self, const void* buffer, size_t offset, void* dst,
                                  size_t bytes) noexcept {
    LOOM_SDK_TRY
    static_cast<ExecutorPlugin*>(self)->buffer(buffer).read(offset, dst, bytes);
    LOOM_SDK_CATCH
  }
  static loom_status* kv_copy_fn(void* self, void* kv, const loom_kv_layout* c, const loom_block_copy* copies,
                                 size_t n) noexcept {
    LOOM_SDK_TRY
    std::vector<loom::KVBlockCopy> v(n);
    for (size_t i = 0; i < n; ++i)
      v[i] = {copies[i].src, copies[i].dst, copies[i].n_positions};
    static_cast<ExecutorPlugin*>(self)->buffer(kv).copy(from_c(*c), v);
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
  static void memory_fn(const void* self, loom_memory_info* out) {
    out->free_bytes = out->total_bytes = 0; // 0: nothing to say (host memory)
    try {
      if (const auto m = static_cast<const ExecutorPlugin*>(self)->be->memory_info()) {
        out->free_bytes = m->free_bytes;
        out->total_bytes = m->total_bytes;
      }
    } catch (...) {
    }
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
                                           &memory_fn,
                                           &workspace_fn,
                                           &activation_fn,
                                           &destroy_fn,
                                           &kv_dtype_fn,
                                           &attention_fn,
                                           &describe_fn};
};

} // namespace loom::sdk
