// loom/backend.hpp — one device that executes model graphs.
#pragma once

#include "loom/graph.hpp"
#include "loom/kv_cache.hpp"

#include <memory>
#include <span>
#include <string_view>

namespace loom {

class Backend {
public:
  virtual ~Backend() = default;
  virtual std::string_view name() const noexcept = 0;
  // Whether the backend can run this node (op + dtypes); the model falls back otherwise.
  virtual bool supports(const Graph& g, const Node& n) const noexcept = 0;
  // Runs `g` for one batch: inputs from `batch`; each attention node first writes the batch's K/V
  // rows into `kv` (positions must already be allocated there), then attends causally over the
  // sequence's cached positions. Writes logits of batch.output_rows to `logits`, row-major
  // [n_outputs][n_vocab].
  virtual void compute(const Graph& g, const BatchView& batch, KVCacheStore& kv, std::span<float> logits) = 0;
  // Bytes of activations + workspace the last compute used (memory accounting).
  virtual size_t workspace_bytes() const noexcept { return 0; }
  // Of workspace_bytes(), the bytes holding activations (the rest is scratch: GEMM panels, …).
  virtual size_t activation_bytes() const noexcept { return workspace_bytes(); }
};

// Plain, obviously-correct F32 C++: the ground truth of every test and the fallback for any op.
std::unique_ptr<Backend> make_reference_backend();

} // namespace loom
