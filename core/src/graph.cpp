#include "loom/graph.hpp"

#include "loom/error.hpp"

#include <atomic>

namespace loom {

uint64_t new_graph_id() noexcept {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

const char* op_name(OpKind op) noexcept {
  switch (op) {
  case OpKind::get_rows:
    return "get_rows";
  case OpKind::rms_norm:
    return "rms_norm";
  case OpKind::matmul:
    return "matmul";
  case OpKind::rope:
    return "rope";
  case OpKind::attention:
    return "attention";
  case OpKind::swiglu:
    return "swiglu";
  case OpKind::add:
    return "add";
  case OpKind::scale:
    return "scale";
  case OpKind::softmax:
    return "softmax";
  case OpKind::copy:
    return "copy";
  case OpKind::mul:
    return "mul";
  }
  return "unknown";
}

int32_t Graph::add_tensor(TensorDesc t) {
  tensors.push_back(std::move(t));
  return static_cast<int32_t>(tensors.size() - 1);
}

int32_t Graph::add_weight(std::string name, DType dtype, std::array<int64_t, 4> ne, const void* data) {
  TensorDesc t;
  t.name = std::move(name);
  t.kind = TensorKind::weight;
  t.dtype = dtype;
  t.ne = ne;
  t.data = data;
  return add_tensor(std::move(t));
}

int32_t Graph::add_activation(std::string name, std::array<int64_t, 4> ne) {
  TensorDesc t;
  t.name = std::move(name);
  t.kind = TensorKind::activation;
  t.ne = ne;
  return add_tensor(std::move(t));
}

int32_t Graph::add_node(Node n) {
  LOOM_ASSERT(n.dst >= 0 && n.dst < static_cast<int32_t>(tensors.size()), "node without a valid dst");
  for (int32_t s : n.src)
    LOOM_ASSERT(s < static_cast<int32_t>(tensors.size()), "node src out of range");
  nodes.push_back(n);
  return n.dst;
}

bool weights_dequantizable(const Graph& g, const Node& n) noexcept {
  for (int32_t s : n.src) {
    if (s < 0) continue;
    const TensorDesc& t = g.tensors[static_cast<size_t>(s)];
    if (t.kind == TensorKind::weight && !dtype_traits(t.dtype).can_dequantize) return false;
  }
  return true;
}

void check_batch(const Graph& g, const BatchView& batch) {
  LOOM_ASSERT(static_cast<int32_t>(batch.tokens.size()) == g.n_tokens, "batch size differs from the graph's");
  LOOM_ASSERT(static_cast<int32_t>(batch.output_rows.size()) == g.n_outputs,
              "output rows differ from the graph's");
}

} // namespace loom
