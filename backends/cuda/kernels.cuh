// The cuda backend's kernels behind plain C++ launchers (no CUDA syntax here: cuda_backend.cpp is C++
// compiled by the host compiler). Every launcher enqueues on `stream` and returns at once; pointers are
// device memory unless said otherwise. Tensors are row-major as the graph's (ne[0] fastest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace loom::cuda {

// The KV pool as the kernels address it (loom::KVLayout's byte layout).
struct KvPool {
  uint8_t* data = nullptr;
  uint32_t dtype = 0; // f32, f16, bf16 or q8_0
  int32_t n_layer = 0, n_head_kv = 0, head_dim = 0, block_size = 0;
  int64_t n_blocks = 0;
  int64_t row_bytes = 0;
};

struct AttnArgs {
  int32_t layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f;
  int32_t window = 0;
  float softcap = 0.0f;
  int32_t sinks = 0;
};

// dst[r][i] = src row idx[r] (stored as `type`, `row_bytes` apart), value i < n, as f32. idx null: row r.
void get_rows(uint32_t type, const uint8_t* src, int64_t row_bytes, int64_t n, const int32_t* idx,
              int64_t rows, float* dst, cudaStream_t s);
// y = x / rms(x) · w per row of n (w f32 [n] or null).
void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps, cudaStream_t s);
// y[t][j] = Σ_k w[j][k] · x[t][k] for T ≤ 8 rows of x: one warp per output j (weights of any readable type).
void gemv(uint32_t type, const uint8_t* w, int64_t row_bytes, const float* x, float* y, int64_t K, int64_t N,
          int32_t T, cudaStream_t s);
// x [n_blocks · 32] f32 as int8 blocks of 32 with a scale (Q8Block, quant_device.hpp) in xq.
void quantize_acts(const float* x, void* xq, int64_t n_blocks, cudaStream_t s);
size_t q8_block_bytes();
// y[t][j] = Σ_k w[j][k] · x[t][k] on the activations quantized by quantize_acts (K / 32 blocks per row of x),
// integer sums (dp4a) per half sub-block, for T ≤ 8 rows: one warp per output j. Quantized weight types only.
void gemv_int8(uint32_t type, const uint8_t* w, int64_t row_bytes, const void* xq, float* y, int64_t K,
               int64_t N, int32_t T, cudaStream_t s);
// Rows [j0, j0 + rows) of a weight (any readable type) as f32, f16 or bf16 (out_type 0, 1, 30), K per row.
// The output head's rescoring (cuda_backend.cpp, [backend] logits_rescore): the indices of each row's c
// highest values of y [T][N] (any order; ties at the c-th value broken by position) into idx [T][c], then
// y[t][idx] recomputed exactly (f32 products of the stored values, as gemv) from x [T][K].
void top_rows(const float* y, int64_t N, int32_t T, int32_t c, int32_t* idx, cudaStream_t s);
void rows_exact(uint32_t type, const uint8_t* w, int64_t row_bytes, const float* x, int64_t K,
                const int32_t* idx, int32_t T, int32_t c, float* y, int64_t N, cudaStream_t s);
void dequant_rows(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t K, int64_t rows, void* out,
                  uint32_t out_type, cudaStream_t s);
// f32 → f16 (bf16 false) or bf16, n values.
void to_half(const float* x, void* y, int64_t n, bool bf16, cudaStream_t s);
// Rotary embedding of x [T][H][D] into y: tables cs, sn [T][n_dims / 2] (the host's rope_table).
void rope(const float* x, float* y, const float* cs, const float* sn, int64_t D, int64_t H, int64_t T,
          int32_t n_dims, bool neox, cudaStream_t s);
// The batch's K and V rows [T][n_head_kv · head_dim] (f32) stored at their slots of `layer`.
void kv_write(const KvPool& kv, int32_t layer, const float* k, const float* v, const int64_t* slots,
              int64_t T, cudaStream_t s);
// Attention of q [T][n_head][head_dim] over each row's sequence (its block table) into out, same shape.
// pos [T], row_seq [T], tables [n_seqs][stride]; head_dim ≤ 256. A batch of few tokens splits each span
// (max_keys: the longest, at most) over several blocks and merges them, when `scratch` holds
// attention_scratch_bytes(T, n_head, head_dim, max_keys) (null: no split).
size_t attention_scratch_bytes(int64_t T, int32_t n_head, int32_t head_dim, int32_t max_keys);
// Token-tree rows (tree_base non-null; loom::BatchView's tree_* arrays): row t is a tree row when
// tree_base[t] <= pos[t] and attends the slots below the tree its window (at rope[t]) allows, then the
// slots tree_base[t] + i <= pos[t] whose bit i of tree_mask[t] is set.
void attention(const KvPool& kv, const AttnArgs& a, const float* q, const int32_t* pos,
               const int32_t* row_seq, const int32_t* tables, int32_t stride, int64_t T, int32_t max_keys,
               float* scratch, float* out, cudaStream_t s, const int32_t* rope = nullptr,
               const int32_t* tree_base = nullptr, const uint64_t* tree_mask = nullptr);

// Block copies on the pool: positions [0, n) of block src to block dst, K and V of every layer.
void kv_copy(const KvPool& kv, int64_t src, int64_t dst, int32_t n, cudaStream_t s);

enum class Unary : int32_t { scale, softcap };
enum class Binary : int32_t { add, mul, swiglu, geglu };
// dst[i] = f(a[i]) with parameter p.
void unary(Unary op, const float* a, float* dst, int64_t n, float p, cudaStream_t s);
// dst[i] = a[i] op b[i mod nb].
void binary(Binary op, const float* a, const float* b, float* dst, int64_t n, int64_t nb, cudaStream_t s);
// Row-wise softmax of rows of n.
void softmax(const float* a, float* dst, int64_t rows, int64_t n, cudaStream_t s);

} // namespace loom::cuda
