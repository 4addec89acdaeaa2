// The cuda backend's executor: a loom::Backend whose weights, KV pool, activations and logits live in
// device memory. Graph nodes run as kernels (kernels.cuh) and cuBLAS GEMMs on one stream; the host waits
// only for the logits.
#pragma once

#include "loom/sdk/executor.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace loom::cuda {

struct CudaOptions {
  int device = 0;
  // false (default): quantized weights in batches of ≤ 8 rows multiply activations rounded to int8 per
  // block of 32 (integer sums, dp4a), longer batches run as f16/bf16 tiles with the activations rounded to
  // that type on the tensor cores (f32 accumulation); true: f32 throughout (exact weights on the GEMV kernel,
  // dequantized tiles and SGEMM without TF32): what the op tests compare with the reference.
  bool exact_matmul = false;
  // The output head's products exact whatever exact_matmul says (as the cpu backend's exact_logits: 8-bit
  // activations move logits enough to flip near-ties).
  bool exact_logits = true;
  // Under exact_logits, a block type's head at the int8 route's cost: the whole vocabulary in int8, then each
  // row's logits_rescore highest recomputed exactly (greedy and top-k up to that many see exact logits; the
  // cpu backend's rule). 0: the whole head exact.
  int logits_rescore = 64;
  size_t staging_bytes = size_t{64} << 20; // pinned host memory for weight uploads
  // Decode steps (≤ 8 rows) of a recurring shape replayed as CUDA graphs (one launch per step).
  bool cuda_graphs = true;
  // Token-tree rows (speculative decoding's trees) in the attention kernel; off: drafts are chains here.
  bool tree_attention = true;
  // Each node timed with CUDA events (the launches eager, no graphs), and the host's share of each compute:
  // a table by op kind on stderr when the backend goes ([backend] profile; slows every step).
  bool profile = false;
};

// Whether a CUDA device can be used, and if not, why (one line; "" when it can).
std::string unavailable_reason();
// "NVIDIA H200, sm_90, 139.8 GiB" for device `d`, or the reason none is usable.
std::string describe_device(int d);

// The cuda executor (Backend::alloc gives device memory, memory_info the device's); throws loom::Error in one
// line where no GPU is usable.
std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& o);

} // namespace loom::cuda
