/* loom/sdk/backend.h — the backend part of the plugin ABI (C99): the model graph a backend runs.
 *
 * The host's model builds a node list once per batch shape; a backend executes it on its device.
 * Tensors are described, not allocated: weights point at their bytes as stored in the model file
 * (GGML block layouts), inputs (i32) are filled from the batch, activations are f32 and belong to
 * the backend. Shapes use GGML's order: ne[0] is the fastest-varying dimension (a row).
 * Op semantics (src → dst):
 *   GET_ROWS   dst[:, r] = src0[:, src1[r]] (dequantizing)  src0 [n, rows] any, src1 [k] i32 → [n, k]
 *   RMS_NORM   dst = src0 / sqrt(mean(src0²) + eps) * src1   src0 [n, T], src1 [n] → [n, T]
 *   MATMUL     dst[t][j] = Σ_k src0[j][k] · src1[t][k]       src0 [K, N] weights, src1 [K, T] → [N, T]
 *   ROPE       rotary embedding of src0 at positions src1    src0 [D, H, T], src1 [T] i32 → [D, H, T]
 *   ATTENTION  writes k (src1), v (src2) rows into the KV cache at (seq, pos) of each batch row, then
 *              causal attention of q (src0) over the sequence's cached positions
 *                                                           q [D, Hq, T], k, v [D, Hkv, T] → [D·Hq, T]
 *   SWIGLU     dst = silu(src0) ⊙ src1;  ADD dst = src0 + src1;  MUL (src1 broadcast along rows)
 *   SCALE      dst = src0 · scale;  SOFTMAX row-wise;  COPY dst = src0 as f32
 */
#ifndef LOOM_SDK_BACKEND_H
#define LOOM_SDK_BACKEND_H

#include "loom/sdk/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_op { /* append-only */
                       LOOM_OP_GET_ROWS = 0,
                       LOOM_OP_RMS_NORM = 1,
                       LOOM_OP_MATMUL = 2,
                       LOOM_OP_ROPE = 3,
                       LOOM_OP_ATTENTION = 4,
                       LOOM_OP_SWIGLU = 5,
                       LOOM_OP_ADD = 6,
                       LOOM_OP_SCALE = 7,
                       LOOM_OP_SOFTMAX = 8,
                       LOOM_OP_COPY = 9,
                       LOOM_OP_MUL = 10,
                       LOOM_OP_GEGLU = 11,  /* ABI 1.6 */
                       LOOM_OP_SOFTCAP = 12 /* ABI 1.6 */
} loom_op;

/* Element types: GGML's ids (F32 0, F16 1, Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q4_K 12, Q6_K 14,
 * I32 26, BF16 30 …), so a GGUF tensor type maps 1:1. */
typedef uint32_t loom_dtype;
#define LOOM_DTYPE_F32 0u
#define LOOM_DTYPE_F16 1u
#define LOOM_DTYPE_Q4_0 2u
#define LOOM_DTYPE_Q4_1 3u
#define LOOM_DTYPE_Q5_0 6u
#define LOOM_DTYPE_Q5_1 7u
#define LOOM_DTYPE_Q8_0 8u
#define LOOM_DTYPE_Q4_K 12u
#define LOOM_DTYPE_Q6_K 14u
#define LOOM_DTYPE_I32 26u
#define LOOM_DTYPE_BF16 30u

typedef enum loom_tensor_kind {
  LOOM_TENSOR_WEIGHT = 0,
  LOOM_TENSOR_INPUT = 1,
  LOOM_TENSOR_ACTIVATION = 2
} loom_tensor_kind;

typedef struct loom_tensor {
  const char* name;
  int32_t kind; /* loom_tensor_kind */
  loom_dtype dtype;
  int64_t ne[4];
  const void* data; /* weights: bytes as stored; else NULL */
} loom_tensor;

typedef struct loom_rope_params {
  int32_t n_dims;   /* rotated dims per head */
  float theta;      /* frequency base */
  int32_t neox;     /* 0: adjacent pairs (GGUF llama); 1: rotate-half */
  float freq_scale; /* 1 / linear scaling factor */
  float ext_factor; /* YaRN ramp mix (0 = off) */
  float attn_factor;
  int32_t orig_ctx;
  float beta_fast, beta_slow;
} loom_rope_params;

typedef struct loom_attention_params {
  int32_t layer;
  int32_t n_head, n_head_kv, head_dim;
  float scale;    /* usually 1/sqrt(head_dim) */
  int32_t window; /* sliding window in tokens (0 = full causal) */
  float softcap;  /* tanh soft-capping of scores (0 = off) */
} loom_attention_params;

/* ABI 1.5: attention kernel strategies and the features an attention node may need. */
#define LOOM_ATTN_KERNEL_AUTO 0  /* the backend's choice */
#define LOOM_ATTN_KERNEL_NAIVE 1 /* materialized scores per query row (the reference kernel) */
#define LOOM_ATTN_KERNEL_FLASH 2 /* tiled keys, online softmax, no scores matrix */
#define LOOM_ATTN_FEATURE_WINDOW 1u
#define LOOM_ATTN_FEATURE_SOFTCAP 2u
#define LOOM_ATTN_FEATURE_SINKS 4u
#define LOOM_ATTN_FEATURE_SPAN_ONLY 8u /* its kernels read only each query's span: others may be released */

/* ABI 1.5: what an ATTENTION node asks beyond loom_attention_params (which sits inside the node array
 * and so cannot grow). loom_graph::attn_ext holds one per node (zero for other ops), attn_ext_stride
 * bytes apart. Positions [0, sinks) are attended besides the window (attention sinks; only with a
 * window); a query at pos then reads [0, min(sinks, first)) and [first, pos], first = max(0, pos −
 * window + 1); rows outside that are never read (the host may have released them). */
typedef struct loom_attention_ext {
  int32_t sinks;
  int32_t kernel; /* LOOM_ATTN_KERNEL_* the pipeline asked for */
} loom_attention_ext;

typedef struct loom_node {
  int32_t op; /* loom_op */
  int32_t src[3];
  int32_t dst;
  float eps;
  float scale;
  loom_rope_params rope;
  loom_attention_params attn;
} loom_node;

typedef struct loom_graph {
  uint32_t struct_size;
  size_t n_tensors;
  const loom_tensor* tensors;
  size_t n_nodes;
  const loom_node* nodes;
  int32_t n_tokens, n_outputs;
  int32_t in_tokens, in_positions, in_out_ids; /* input tensors (i32) */
  int32_t out_logits;                          /* [n_vocab, n_outputs] */
  /* ABI 1.2: unique over the host process's life, never reused — a backend may cache what it
   * derives from a graph under this id (never under the graph's address, which is reused for other
   * shapes). 0 (or a struct_size without it): no identity, derive again on every call. */
  uint64_t id;
  /* ABI 1.5: n_nodes entries attn_ext_stride bytes apart (NULL, or a struct_size without it: sinks 0,
   * kernel AUTO). The host sends sinks or an explicit kernel only to a backend whose
   * supports_attention says yes. */
  const loom_attention_ext* attn_ext;
  size_t attn_ext_stride;
} loom_graph;

/* The tokens one forward pass evaluates; rows of different sequences may be mixed. */
typedef struct loom_batch {
  uint32_t struct_size;
  size_t n_tokens;
  const int32_t* tokens;
  const int32_t* positions;
  const int32_t* seq_ids;
  size_t n_outputs;
  const int32_t* output_rows; /* ascending indices into tokens */
} loom_batch;

/* The host's KV cache: rows of n_head_kv · head_dim values per (layer, sequence, position).
 * Positions of the batch are already allocated; rows are valid for the duration of graph_compute.
 * k_row / v_row give f32 rows and are NULL unless dtype is LOOM_DTYPE_F32. ABI 1.4: dtype and
 * k_data / v_data, the row in its stored type (f32, f16, bf16, or q8_0 blocks of 32 along the row);
 * the host uses a type other than f32 only with a backend whose supports_kv_dtype says yes. */
typedef struct loom_kv_view {
  uint32_t struct_size;
  void* ctx;
  float* (*k_row)(void* ctx, int32_t layer, int32_t seq, int32_t pos);
  float* (*v_row)(void* ctx, int32_t layer, int32_t seq, int32_t pos);
  int32_t dtype; /* ABI 1.4: LOOM_DTYPE_* of the stored rows */
  void* (*k_data)(void* ctx, int32_t layer, int32_t seq, int32_t pos);
  void* (*v_data)(void* ctx, int32_t layer, int32_t seq, int32_t pos);
} loom_kv_view;

typedef struct loom_memory_info {
  uint64_t free_bytes;
  uint64_t total_bytes;
} loom_memory_info;

typedef enum loom_buffer_usage {
  LOOM_BUFFER_WEIGHTS = 0,
  LOOM_BUFFER_KV = 1,
  LOOM_BUFFER_SCRATCH = 2
} loom_buffer_usage;

struct loom_backend_i {
  uint32_t struct_size;
  const char* (*name)(const void* self); /* static storage */
  /* 1 if the backend can run this node (op + dtypes of its tensors). */
  int32_t (*supports)(const void* self, const loom_graph* g, const loom_node* n);
  /* Runs g for one batch; writes logits of batch->output_rows, row-major [n_outputs][n_vocab]. */
  loom_status* (*graph_compute)(void* self, const loom_graph* g, const loom_batch* b, const loom_kv_view* kv,
                                float* logits, size_t n_logits);
  /* Device buffers (optional for host-memory backends: NULL means the host allocates). */
  loom_status* (*buffer_alloc)(void* self, size_t bytes, int32_t usage, void** out);
  void (*buffer_free)(void* self, void* buffer);
  loom_status* (*buffer_upload)(void* self, void* buffer, size_t offset, const void* src, size_t bytes);
  loom_status* (*buffer_download)(void* self, const void* buffer, size_t offset, void* dst, size_t bytes);
  void (*memory_info)(const void* self, loom_memory_info* out); /* optional */
  size_t (*workspace_bytes)(const void* self);                  /* optional: bytes of the last compute */
  void (*destroy)(void* self);                                  /* required */
  /* ABI 1.1, optional: of workspace_bytes, the bytes holding activations (the rest is scratch). */
  size_t (*activation_bytes)(const void* self);
  /* ABI 1.4, optional: 1 if graph_compute reads and writes KV rows stored in this LOOM_DTYPE_*
   * through k_data / v_data. NULL: f32 only. */
  int32_t (*supports_kv_dtype)(const void* self, int32_t dtype);
  /* ABI 1.5, optional: 1 if attention nodes with kernel strategy `kernel` (LOOM_ATTN_KERNEL_*) and
   * these LOOM_ATTN_FEATURE_* bits run as asked. NULL: kernel AUTO with window and softcap only. */
  int32_t (*supports_attention)(const void* self, int32_t kernel, uint32_t features);
  /* ABI 1.5, optional: one line on what runs (e.g. "avx512_bf16, 2 threads"), valid until destroy. */
  const char* (*describe)(const void* self);
};

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LOOM_SDK_BACKEND_H */
