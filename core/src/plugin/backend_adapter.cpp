// A backend plugin behind the host's Backend interface: the host's graph is handed over as the C
// structs of loom/sdk/backend.h (converted once per graph), the KV store as a row-access view.
#include "loom/sdk/backend.h"
#include "loom/sdk/lru_cache.hpp"
#include "plugin_internal.hpp"

#include <map>
#include <vector>

namespace loom::plugin {

namespace {

static_assert(static_cast<int32_t>(OpKind::mul) == LOOM_OP_MUL &&
                  static_cast<int32_t>(OpKind::attention) == LOOM_OP_ATTENTION &&
                  static_cast<int32_t>(OpKind::geglu) == LOOM_OP_GEGLU &&
                  static_cast<int32_t>(OpKind::softcap) == LOOM_OP_SOFTCAP &&
                  static_cast<int32_t>(OpKind::moe_route) == LOOM_OP_MOE_ROUTE &&
                  static_cast<int32_t>(OpKind::matmul_id) == LOOM_OP_MATMUL_ID &&
                  static_cast<int32_t>(OpKind::moe_combine) == LOOM_OP_MOE_COMBINE &&
                  static_cast<int32_t>(OpKind::add_id) == LOOM_OP_ADD_ID &&
                  static_cast<int32_t>(OpKind::swiglu_oai) == LOOM_OP_SWIGLU_OAI,
              "OpKind values are part of the backend ABI");

struct CGraph {
  std::vector<loom_tensor> tensors;
  std::vector<loom_node> nodes;
  loom_graph g{};
  void point() noexcept { // the graph's arrays are its own vectors (again after a move)
    g.tensors = tensors.data();
    g.nodes = nodes.data();
  }
};

CGraph to_c(const Graph& g) {
  CGraph c;
  c.tensors.reserve(g.tensors.size());
  for (const auto& t : g.tensors) {
    loom_tensor ct{};
    ct.name = t.name.c_str();
    ct.kind = t.kind == TensorKind::weight  ? LOOM_TENSOR_WEIGHT
              : t.kind == TensorKind::input ? LOOM_TENSOR_INPUT
                                            : LOOM_TENSOR_ACTIVATION;
    ct.dtype = static_cast<loom_dtype>(t.dtype);
    for (int i = 0; i < 4; ++i)
      ct.ne[i] = t.ne[static_cast<size_t>(i)];
    ct.data = t.data;
    ct.weight = t.weight;
    c.tensors.push_back(ct);
  }
  for (const auto& n : g.nodes) {
    loom_node cn{};
    cn.op = static_cast<int32_t>(n.op);
    for (int i = 0; i < 3; ++i)
      cn.src[i] = n.src[static_cast<size_t>(i)];
    cn.dst = n.dst;
    cn.eps = n.eps;
    cn.scale = n.scale;
    cn.rope = {n.rope.n_dims,      n.rope.theta,    n.rope.neox ? 1 : 0, n.rope.freq_scale, n.rope.ext_factor,
               n.rope.attn_factor, n.rope.orig_ctx, n.rope.beta_fast,    n.rope.beta_slow};
    cn.attn = {n.attn.layer,    n.attn.n_head, n.attn.n_head_kv,
               n.attn.head_dim, n.attn.scale,  n.attn.window,
               n.attn.softcap,  n.attn.sinks,  static_cast<int32_t>(n.attn.kernel)};
    cn.moe = {n.moe.n_used, static_cast<int32_t>(n.moe.gating), n.moe.norm ? 1 : 0, n.moe.weights_scale};
    cn.attn_sink_logits = n.attn.sink_logits;
    cn.glu_alpha = n.glu.alpha;
    cn.glu_limit = n.glu.limit;
    c.nodes.push_back(cn);
  }
  c.g.struct_size = sizeof(loom_graph);
  c.g.n_tensors = c.tensors.size();
  c.g.tensors = c.tensors.data();
  c.g.tensor_size = sizeof(loom_tensor);
  c.g.n_nodes = c.nodes.size();
  c.g.nodes = c.nodes.data();
  c.g.node_size = sizeof(loom_node);
  c.g.n_tokens = g.n_tokens;
  c.g.n_outputs = g.n_outputs;
  c.g.in_tokens = g.in_tokens;
  c.g.in_positions = g.in_positions;
  c.g.in_out_ids = g.in_out_ids;
  c.g.out_logits = g.out_logits;
  c.g.id = g.id;
  return c;
}

loom_kv_layout to_c(const KVLayout& l) noexcept {
  return {sizeof(loom_kv_layout),
          static_cast<loom_dtype>(l.dtype),
          l.n_layer,
          l.n_head_kv,
          l.head_dim,
          l.block_size,
          l.n_blocks,
          l.n_groups() > 1 ? l.n_groups() : 0,
          l.n_slots(),
          l.n_groups() > 1 ? l.layer_group().data() : nullptr,
          l.n_groups() > 1 ? l.layer_slot().data() : nullptr};
}

// A buffer of a plugin backend's memory (a KV pool, the logits): freed through the plugin, copies and reads
// are its calls.
class PluginBuffer final : public Buffer {
public:
  PluginBuffer(std::shared_ptr<PluginLibrary> lib, void* self, const loom_backend_i* vt, void* data,
               const void* owner, std::string what)
      : lib_(std::move(lib)), self_(self), vt_(vt), data_(data), owner_(owner), what_(std::move(what)) {}
  ~PluginBuffer() override { vt_->buffer_free(self_, data_); }
  void* data() noexcept override { return data_; }
  const void* owner() const noexcept override { return owner_; }
  void copy(const KVLayout& l, std::span<const KVBlockCopy> copies) override {
    std::vector<loom_block_copy> c(copies.size());
    for (size_t i = 0; i < copies.size(); ++i)
      c[i] = {copies[i].src, copies[i].dst, copies[i].n_positions, 0};
    const loom_kv_layout cl = to_c(l);
    throw_if(vt_->kv_copy(self_, data_, &cl, c.data(), c.size()), what_ + ": kv_copy");
  }
  void read(size_t offset, void* dst, size_t n) const override {
    throw_if(vt_->buffer_download(self_, data_, offset, dst, n), what_ + ": buffer_download");
  }
  void write(size_t offset, const void* src, size_t n) override {
    if (!vt_->buffer_upload) fail(Errc::unsupported, "plugin", what_ + " has no buffer_upload");
    throw_if(vt_->buffer_upload(self_, data_, offset, src, n), what_ + ": buffer_upload");
  }

private:
  std::shared_ptr<PluginLibrary> lib_;
  void* self_;
  const loom_backend_i* vt_;
  void* data_;
  const void* owner_;
  std::string what_;
};

class PluginBackend final : public Backend {
public:
  PluginBackend(std::shared_ptr<PluginLibrary> lib, void* self, const loom_backend_i* vt, std::string name)
      : lib_(std::move(lib)), self_(self), vt_(vt), name_(std::move(name)) {}
  ~PluginBackend() override {
    if (logits_buf_) vt_->buffer_free(self_, logits_buf_);
    if (vt_->destroy) vt_->destroy(self_);
  }
  std::string_view name() const noexcept override { return name_; }
  bool supports(const Graph& g, const Node& n) const noexcept override {
    if (!vt_->supports) return true;
    try {
      const CGraph& c = const_cast<PluginBackend*>(this)->converted(g);
      return vt_->supports(self_, &c.g, static_cast<int32_t>(&n - g.nodes.data())) != 0;
    } catch (...) {
      return false;
    }
  }
  void compute(const Graph& g, const BatchView& b, const KVRows& kv, std::span<float> logits) override {
    const CGraph& c = converted(g);
    const loom_kv_layout layout = to_c(kv.layout());
    loom_batch cb{sizeof(loom_batch),
                  b.tokens.size(),
                  b.tokens.data(),
                  b.positions.data(),
                  b.seq_ids.data(),
                  b.output_rows.size(),
                  b.output_rows.data(),
                  &layout,
                  kv.pool(),
                  kv.slots().data(),
                  kv.row_seqs().data(),
                  kv.n_seqs(),
                  kv.tables().data(),
                  kv.table_stride(),
                  nullptr,
                  nullptr,
                  nullptr,
                  nullptr};
    std::vector<loom_kv_group_rows> groups; // only a backend that declared attn_kv_groups gets a grouped pool
    for (const KVGroupRows& gr : kv.layout().n_groups() > 1 ? kv.groups() : std::span<const KVGroupRows>())
      groups.push_back({gr.slots.data(), gr.tables.data(), gr.table_stride, 0});
    if (!groups.empty()) cb.kv_groups = groups.data();
    if (b.has_tree()) { // only when supports_attention said attn_tree (the engine asks)
      cb.rope_positions = b.rope_positions.data();
      cb.tree_base = b.tree_base.data();
      cb.tree_mask = b.tree_mask.data();
    }
    const size_t bytes = logits.size() * sizeof(float);
    if (bytes > logits_cap_) { // the logits buffer grows to the largest batch's
      if (logits_buf_) vt_->buffer_free(self_, logits_buf_);
      logits_buf_ = nullptr;
      logits_cap_ = 0;
      throw_if(vt_->buffer_alloc(self_, bytes, LOOM_BUFFER_LOGITS, &logits_buf_),
               "backend '" + name_ + "' (" + lib_->path() + "): buffer_alloc for the logits");
      logits_cap_ = bytes;
    }
    throw_if(vt_->graph_compute(self_, &c.g, &cb, logits_buf_, logits.size()),
             "backend '" + name_ + "' (" + lib_->path() + ")");
    if (bytes > 0)
      throw_if(vt_->buffer_download(self_, logits_buf_, 0, logits.data(), bytes),
               "backend '" + name_ + "' (" + lib_->path() + "): buffer_download of the logits");
  }
  std::unique_ptr<Buffer> alloc(size_t bytes, BufferUsage usage) override {
    void* data = nullptr;
    const std::string what = "backend '" + name_ + "' (" + lib_->path() + ")";
    throw_if(vt_->buffer_alloc(self_, bytes, static_cast<int32_t>(usage), &data),
             what + ": buffer_alloc of " + std::to_string(bytes >> 20) + " MiB");
    if (!data && bytes > 0) fail(Errc::out_of_memory, "plugin", what + ": buffer_alloc returned no memory");
    return std::make_unique<PluginBuffer>(lib_, self_, vt_, data, instance_tag(), what);
  }
  void load(std::span<const WeightDesc> weights) override {
    if (!vt_->load_weights) return;
    std::vector<loom_weight> c(weights.size());
    for (size_t i = 0; i < weights.size(); ++i) {
      const TensorDesc& t = weights[i].tensor;
      c[i] = {t.weight,
              t.name.c_str(),
              static_cast<loom_dtype>(t.dtype),
              {t.ne[0], t.ne[1], t.ne[2], t.ne[3]},
              t.data,
              weights[i].bytes,
              weights[i].uses};
    }
    throw_if(vt_->load_weights(self_, c.data(), c.size(), sizeof(loom_weight)),
             "backend '" + name_ + "' (" + lib_->path() + "): load_weights");
  }
  // (Every 2.0 table has these entries: create refused a shorter one.)
  size_t workspace_bytes() const noexcept override {
    return vt_->workspace_bytes ? vt_->workspace_bytes(self_) : 0;
  }
  bool supports_kv_dtype(DType t) const noexcept override {
    if (t == DType::f32) return true;
    return vt_->supports_kv_dtype && vt_->supports_kv_dtype(self_, static_cast<int32_t>(t)) != 0;
  }
  bool supports_attention(AttnKernel k, uint32_t features) const noexcept override {
    if (!vt_->supports_attention) return Backend::supports_attention(k, features);
    // A 3.0 plugin cannot know the layer-group bit (its pool layout and batch lack the fields).
    if ((features & attn_kv_groups) && lib_->plugin().abi_minor < 1) return false;
    return vt_->supports_attention(self_, static_cast<int32_t>(k), features) != 0;
  }
  std::string_view describe() const noexcept override {
    const char* d = vt_->describe ? vt_->describe(self_) : nullptr;
    return d ? std::string_view(d) : std::string_view();
  }
  size_t activation_bytes() const noexcept override {
    return vt_->activation_bytes ? vt_->activation_bytes(self_) : workspace_bytes();
  }
  std::optional<MemoryInfo> memory_info() const override {
    if (!vt_->memory_info) return std::nullopt;
    loom_memory_info m{0, 0};
    vt_->memory_info(self_, &m);
    if (m.total_bytes == 0) return std::nullopt;
    return MemoryInfo{m.free_bytes, m.total_bytes};
  }

private:
  // Converted once per graph identity (Graph::id); a graph without one is converted every call.
  const CGraph& converted(const Graph& g) {
    if (g.id == 0) {
      scratch_ = to_c(g);
      scratch_.point();
      return scratch_;
    }
    CGraph& c = cache_.get(g.id, [&] { return to_c(g); });
    c.point(); // its arrays, wherever the cache moved it
    return c;
  }
  std::shared_ptr<PluginLibrary> lib_;
  void* self_;
  const loom_backend_i* vt_;
  std::string name_;
  LruCache<uint64_t, CGraph> cache_{64};
  CGraph scratch_;
  void* logits_buf_ = nullptr; // LOOM_BUFFER_LOGITS, logits_cap_ bytes
  size_t logits_cap_ = 0;
};

} // namespace

std::unique_ptr<Backend> make_plugin_backend(const PluginRegistry::Found& f, const std::string& name,
                                             const std::vector<std::pair<std::string, ParamValue>>& params,
                                             const std::string& where) {
  loom_config cfg;
  cfg.where = where;
  cfg.params = &params;
  void* self = nullptr;
  const void* vt = nullptr;
  const std::string ctx = "creating backend '" + name + "' from " + f.lib->path();
  throw_if(f.factory->create(&cfg, &self, &vt), ctx);
  const auto* bvt = static_cast<const loom_backend_i*>(vt);
  if (!self || !bvt || bvt->struct_size < sizeof(loom_backend_i) || !bvt->graph_compute || !bvt->destroy ||
      !bvt->buffer_alloc || !bvt->buffer_free || !bvt->buffer_upload || !bvt->buffer_download ||
      !bvt->kv_copy) {
    if (self && bvt && bvt->struct_size >= offsetof(loom_backend_i, destroy) + sizeof(void*) &&
        bvt->destroy && bvt->struct_size >= sizeof(loom_backend_i))
      bvt->destroy(self);
    fail(Errc::invalid_argument, "plugin",
         ctx + ": create returned no object or an incomplete loom_backend_i (graph_compute, "
               "buffer_alloc, "
               "buffer_free, buffer_upload, buffer_download, kv_copy and destroy are required); rebuild it "
               "against this SDK");
  }
  auto be = std::make_unique<PluginBackend>(f.lib, self, bvt, name);
  check_all_read(cfg, "backend '" + name + "'");
  return be;
}

} // namespace loom::plugin

namespace loom {

std::optional<MemoryInfo> backend_memory(const std::string& name, const std::vector<std::string>& dirs) {
  PluginRegistry reg;
  DiscoverOptions o;
  o.named_only = true; // only the file that provides it
  o.only = {{LOOM_KIND_BACKEND, name}};
  reg.discover(plugin_search_dirs(dirs), {}, o);
  const auto f = reg.find(LOOM_KIND_BACKEND, name);
  if (!f)
    fail(Errc::not_found, "plugin",
         "no backend plugin '" + name + "' (loom plugins lists what is found)" + reg.failures());
  const std::vector<std::pair<std::string, ParamValue>> params = {{"threads", int64_t{1}}};
  const auto be = plugin::make_plugin_backend(*f, name, params, "loom inspect");
  return be->memory_info();
}

} // namespace loom
