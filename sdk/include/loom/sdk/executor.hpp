// loom/sdk/executor.hpp — the C++ side of a backend (header-only): an executor runs a whole
// loom::Graph for one batch over the KV cache's rows. The host's built-in backends implement it, and
// a backend plugin exposes one through loom/sdk/executor_plugin.hpp (ExecutorTable), so the same
// executor code runs built in or behind the ABI.
#pragma once

#include "loom/sdk/graph.hpp"
#include "loom/sdk/types.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace loom {

// The K/V rows of the cache: n_head_kv · head_dim f32 values for (layer, seq, pos). Positions a
// batch writes are allocated by the host before compute(). In a plugin the rows come through the
// ABI's loom_kv_view; the host's KVCacheStore is one.
// The rows of a KV cache. k_row / v_row: f32 rows, nullptr when the store holds another type;
// k_data / v_data: the row in its stored type kv_dtype() (f32, f16, bf16, q8_0) — read and write
// them with kv_load / kv_store (dtype.hpp), or type-specific kernels.
class KVRows {
public:
  virtual ~KVRows() = default;
  virtual float* k_row(int32_t layer, SeqId seq, Pos pos) noexcept = 0;
  virtual float* v_row(int32_t layer, SeqId seq, Pos pos) noexcept = 0;
  virtual DType kv_dtype() const noexcept { return DType::f32; }
  virtual void* k_data(int32_t layer, SeqId seq, Pos pos) noexcept { return k_row(layer, seq, pos); }
  virtual void* v_data(int32_t layer, SeqId seq, Pos pos) noexcept { return v_row(layer, seq, pos); }
};

// One device that executes model graphs.
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
  virtual void compute(const Graph& g, const BatchView& batch, KVRows& kv, std::span<float> logits) = 0;
  // Bytes of activations + workspace the last compute used (memory accounting).
  virtual size_t workspace_bytes() const noexcept { return 0; }
  // Of workspace_bytes(), the bytes holding activations (the rest is scratch: GEMM panels, …).
  virtual size_t activation_bytes() const noexcept { return workspace_bytes(); }
  // Whether compute() handles KV rows stored in this type (through KVRows::k_data / v_data).
  virtual bool supports_kv_dtype(DType t) const noexcept { return t == DType::f32; }
  // Whether attention nodes asking for kernel strategy `k` with these AttnFeature bits (window,
  // softcap, sinks) run as asked. The default is what every backend has honoured since ABI 1.0: its
  // own kernel (auto) with a window and soft-capping; a backend with sinks or a choice of kernels says so.
  virtual bool supports_attention(AttnKernel k, uint32_t features) const noexcept {
    return k == AttnKernel::auto_ && (features & ~(attn_window | attn_softcap)) == 0;
  }
  // One line on what runs (instruction set, threads, device), for reports; "" = nothing to say.
  virtual std::string_view describe() const noexcept { return {}; }
};

} // namespace loom
