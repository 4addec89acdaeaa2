// A backend plugin behind the host's Backend interface: the host's graph is handed over as the C
// structs of loom/sdk/backend.h (converted once per graph), the KV store as a row-access view.
#include "loom/sdk/backend.h"
#include "plugin_internal.hpp"

#include <map>
#include <unordered_map>

namespace loom::plugin {

namespace {

static_assert(static_cast<int32_t>(OpKind::mul) == LOOM_OP_MUL &&
                  static_cast<int32_t>(OpKind::attention) == LOOM_OP_ATTENTION &&
                  static_cast<int32_t>(OpKind::geglu) == LOOM_OP_GEGLU &&
                  static_cast<int32_t>(OpKind::softcap) == LOOM_OP_SOFTCAP,
              "OpKind values are part of the backend ABI");

// What a node asks beyond ABI 1.5: the geglu and softcap ops, a bias add (src1 broadcast along rows),
// RoPE frequency divisors (src2). A plugin built before 1.6 would read past a bias or ignore the
// divisors, so it is not asked to run such a node.
bool needs_abi_1_6(const Graph& g, const Node& n) {
  if (n.op == OpKind::geglu || n.op == OpKind::softcap) return true;
  if (n.op == OpKind::rope) return n.src[2] >= 0;
  if (n.op == OpKind::add)
    return g.tensors[static_cast<size_t>(n.src[1])].n_elements() !=
           g.tensors[static_cast<size_t>(n.dst)].n_elements();
  return false;
}

struct CGraph {
  std::vector<loom_tensor> tensors;
  std::vector<loom_node> nodes;
  std::vector<loom_attention_ext> ext; // ABI 1.5: one per node
  loom_graph g{};
  void point() noexcept { // the graph's arrays are its own vectors (again after a move)
    g.tensors = tensors.data();
    g.nodes = nodes.data();
    g.attn_ext = ext.data();
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
    cn.attn = {n.attn.layer, n.attn.n_head, n.attn.n_head_kv, n.attn.head_dim,
               n.attn.scale, n.attn.window, n.attn.softcap};
    c.nodes.push_back(cn);
    c.ext.push_back({n.attn.sinks, static_cast<int32_t>(n.attn.kernel)});
  }
  c.g.struct_size = sizeof(loom_graph);
  c.g.n_tensors = c.tensors.size();
  c.g.tensors = c.tensors.data();
  c.g.n_nodes = c.nodes.size();
  c.g.nodes = c.nodes.data();
  c.g.n_tokens = g.n_tokens;
  c.g.n_outputs = g.n_outputs;
  c.g.in_tokens = g.in_tokens;
  c.g.in_positions = g.in_positions;
  c.g.in_out_ids = g.in_out_ids;
  c.g.out_logits = g.out_logits;
  c.g.id = g.id;
  c.g.attn_ext_stride = sizeof(loom_attention_ext);
  return c;
}

float* kv_k_row(void* ctx, int32_t layer, int32_t seq, int32_t pos) {
  return static_cast<KVRows*>(ctx)->k_row(layer, seq, pos);
}
float* kv_v_row(void* ctx, int32_t layer, int32_t seq, int32_t pos) {
  return static_cast<KVRows*>(ctx)->v_row(layer, seq, pos);
}
void* kv_k_data(void* ctx, int32_t layer, int32_t seq, int32_t pos) {
  return static_cast<KVRows*>(ctx)->k_data(layer, seq, pos);
}
void* kv_v_data(void* ctx, int32_t layer, int32_t seq, int32_t pos) {
  return static_cast<KVRows*>(ctx)->v_data(layer, seq, pos);
}

class PluginBackend final : public Backend {
public:
  PluginBackend(std::shared_ptr<PluginLibrary> lib, void* self, const loom_backend_i* vt, std::string name)
      : lib_(std::move(lib)), self_(self), vt_(vt), name_(std::move(name)) {}
  ~PluginBackend() override {
    if (vt_->destroy) vt_->destroy(self_);
  }
  std::string_view name() const noexcept override { return name_; }
  bool supports(const Graph& g, const Node& n) const noexcept override {
    if (lib_ && lib_->plugin().abi_minor < 6 && needs_abi_1_6(g, n)) return false;
    if (!vt_->supports) return true;
    try {
      const CGraph& c = const_cast<PluginBackend*>(this)->converted(g);
      const size_t idx = static_cast<size_t>(&n - g.nodes.data());
      return vt_->supports(self_, &c.g, &c.nodes[idx]) != 0;
    } catch (...) {
      return false;
    }
  }
  void compute(const Graph& g, const BatchView& b, KVRows& kv, std::span<float> logits) override {
    const CGraph& c = converted(g);
    loom_batch cb{sizeof(loom_batch), b.tokens.size(),      b.tokens.data(),     b.positions.data(),
                  b.seq_ids.data(),   b.output_rows.size(), b.output_rows.data()};
    const bool f32 = kv.kv_dtype() == DType::f32;
    loom_kv_view view{sizeof(loom_kv_view),
                      &kv,
                      f32 ? &kv_k_row : nullptr,
                      f32 ? &kv_v_row : nullptr,
                      static_cast<int32_t>(kv.kv_dtype()),
                      &kv_k_data,
                      &kv_v_data};
    throw_if(vt_->graph_compute(self_, &c.g, &cb, &view, logits.data(), logits.size()),
             "backend '" + name_ + "' (" + lib_->path() + ")");
  }
  size_t workspace_bytes() const noexcept override {
    const bool has = vt_->struct_size >= offsetof(loom_backend_i, workspace_bytes) + sizeof(void*);
    return has && vt_->workspace_bytes ? vt_->workspace_bytes(self_) : 0;
  }
  bool supports_kv_dtype(DType t) const noexcept override {
    if (t == DType::f32) return true;
    const bool has = vt_->struct_size >= offsetof(loom_backend_i, supports_kv_dtype) + sizeof(void*);
    return has && vt_->supports_kv_dtype && vt_->supports_kv_dtype(self_, static_cast<int32_t>(t)) != 0;
  }
  bool supports_attention(AttnKernel k, uint32_t features) const noexcept override {
    const bool has = vt_->struct_size >= offsetof(loom_backend_i, supports_attention) + sizeof(void*);
    if (!has || !vt_->supports_attention) return Backend::supports_attention(k, features); // before ABI 1.5
    return vt_->supports_attention(self_, static_cast<int32_t>(k), features) != 0;
  }
  std::string_view describe() const noexcept override {
    const bool has = vt_->struct_size >= offsetof(loom_backend_i, describe) + sizeof(void*);
    const char* d = has && vt_->describe ? vt_->describe(self_) : nullptr;
    return d ? std::string_view(d) : std::string_view();
  }
  size_t activation_bytes() const noexcept override {
    const bool has = vt_->struct_size >= offsetof(loom_backend_i, activation_bytes) + sizeof(void*);
    return has && vt_->activation_bytes ? vt_->activation_bytes(self_) : workspace_bytes();
  }

private:
  // Converted once per graph identity (Graph::id); a graph without one is converted every call.
  const CGraph& converted(const Graph& g) {
    if (g.id == 0) {
      scratch_ = to_c(g);
      scratch_.point();
      return scratch_;
    }
    auto it = cache_.find(g.id);
    if (it == cache_.end()) {
      if (cache_.size() >= 64) cache_.clear(); // bounded: prefill shapes vary per prompt
      it = cache_.emplace(g.id, to_c(g)).first;
      it->second.point();
    }
    return it->second;
  }
  std::shared_ptr<PluginLibrary> lib_;
  void* self_;
  const loom_backend_i* vt_;
  std::string name_;
  std::unordered_map<uint64_t, CGraph> cache_;
  CGraph scratch_;
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
  if (!self || !bvt || bvt->struct_size < offsetof(loom_backend_i, destroy) + sizeof(void*) ||
      !bvt->graph_compute || !bvt->destroy)
    fail(Errc::invalid_argument, "plugin",
         ctx + ": create returned no object or an incomplete loom_backend_i");
  auto be = std::make_unique<PluginBackend>(f.lib, self, bvt, name);
  check_all_read(cfg, "backend '" + name + "'");
  return be;
}

} // namespace loom::plugin
