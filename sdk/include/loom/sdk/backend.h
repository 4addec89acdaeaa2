/* loom/sdk/backend.h — the backend part of the plugin ABI (C99): the model graph a backend runs.
 *
 * The host's model builds a node list once per batch shape; a backend executes it on its device.
 * The boundary has the shape of a device:
 * - Weights are loaded once (load_weights: id, name, type, shape, bytes, how the graphs use them); the
 *   backend uploads, repacks or keeps them until destroy. Graph tensors name a weight by that id (and
 *   still point at the host's bytes, for a host-memory backend that reads in place).
 * - The KV pool is the backend's memory (buffer_alloc with LOOM_BUFFER_KV, loom_kv_layout's bytes); the
 *   host keeps the accounting and hands each forward the slot of every new row and the block table of
 *   every sequence (loom_batch). Copy-on-write and fork copies are kv_copy calls, in order, before the
 *   forward that needs them.
 * - Logits are written to a backend buffer (LOOM_BUFFER_LOGITS) and downloaded by the host.
 * Tensors are described, not allocated: inputs (i32) are filled from the batch, activations are f32 and
 * belong to the backend. Shapes use GGML's order: ne[0] is the fastest-varying dimension (a row).
 * Arrays of structs (tensors, nodes, weights) come with their element size, so that each struct can grow
 * at its end: a reader uses the fields inside min(element size, sizeof(its own view)).
 * Op semantics (src → dst):
 *   GET_ROWS   dst[:, r] = src0[:, src1[r]] (dequantizing)  src0 [n, rows] any, src1 [k] i32 → [n, k]
 *   RMS_NORM   dst = src0 / sqrt(mean(src0²) + eps) * src1   src0 [n, T], src1 [n] → [n, T]
 *   MATMUL     dst[t][j] = Σ_k src0[j][k] · src1[t][k]       src0 [K, N] weights, src1 [K, T] → [N, T]
 *   ROPE       rotary embedding of src0 at positions src1    src0 [D, H, T], src1 [T] i32 → [D, H, T]
 *   ATTENTION  writes k (src1), v (src2) rows into the KV pool at each batch row's slot, then causal
 *              attention of q (src0) over its sequence's positions (through the sequence's block table)
 *                                                           q [D, Hq, T], k, v [D, Hkv, T] → [D·Hq, T]
 *   SWIGLU     dst = silu(src0) ⊙ src1;  ADD dst = src0 + src1;  MUL (src1 broadcast along rows)
 *   SCALE      dst = src0 · scale;  SOFTMAX row-wise;  COPY dst = src0 as f32
 *   (3.2) Mixture of experts. A route is [k, 2, T]: row (0, t) the ids of token t's k experts (exact
 *   floats, highest selection score first), row (1, t) their weights.
 *   MOE_ROUTE   router logits src0 [E, T] (+ an optional selection bias src1 [E] that chooses but does not
 *               weigh) → route [k, 2, T], as loom_moe_params says (loom/sdk/graph.hpp: moe_route_token)
 *   MATMUL_ID   dst[:, i, t] = src0[id(i, t)]ᵀ · src1[:, i or 0, t]
 *                                            src0 [K, N, E] weights, src1 [K, k or 1, T], src2 route → [N, k,
 * T] MOE_COMBINE dst[:, t] = Σ_i weight(i, t) · src0[:, i, t] (i in order)  src0 [N, k, T], src1 route → [N,
 * T] ADD_ID      dst[:, i, t] = src0[:, i, t] + src1[:, id(i, t)]     src0 [N, k, T], src1 weight [N, E],
 * src2 route SWIGLU_OAI  dst = x·σ(α·x) ⊙ (clamp(src1, −L, L) + 1), x = min(src0, L)   (loom_node.glu: α, L)
 *   ATTENTION with loom_node.attn_sink_logits ≥ 0: that weight [n_head] holds each head's learned sink logit,
 *               a key every query sees that carries no value (in each softmax's denominator only)
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
                       LOOM_OP_GEGLU = 11,
                       LOOM_OP_SOFTCAP = 12,
                       /* (3.2) mixture of experts: loom_node.moe */
                       LOOM_OP_MOE_ROUTE = 13,
                       LOOM_OP_MATMUL_ID = 14,
                       LOOM_OP_MOE_COMBINE = 15,
                       LOOM_OP_ADD_ID = 16,
                       LOOM_OP_SWIGLU_OAI = 17
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
  const void* data; /* weights: the host's bytes as stored (valid until destroy); else NULL */
  int64_t weight;   /* weights: the id load_weights gave it; else -1 */
} loom_tensor;

/* How the graphs use a weight (bits of loom_weight::uses). */
#define LOOM_WEIGHT_USE_MATMUL 1u /* src0 of a matmul other than the logits' */
#define LOOM_WEIGHT_USE_LOGITS 2u /* src0 of the matmul that makes the logits */
#define LOOM_WEIGHT_USE_ROWS 4u   /* src0 of get_rows (an embedding table) */
#define LOOM_WEIGHT_USE_VECTOR 8u /* an element-wise operand: norm weights, biases, RoPE divisors */

/* One weight handed to load_weights. */
typedef struct loom_weight {
  int64_t id; /* what graph tensors carry in loom_tensor::weight */
  const char* name;
  loom_dtype dtype;
  int64_t ne[4];
  const void* data; /* host memory, valid until destroy */
  uint64_t bytes;
  uint32_t uses; /* LOOM_WEIGHT_USE_* */
} loom_weight;

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
  /* Positions [0, sinks) are attended besides the window (attention sinks; only with a window): a query
   * at pos reads [0, min(sinks, first)) and [first, pos], first = max(0, pos − window + 1); rows outside
   * that are never read (the host may have released them). */
  int32_t sinks;
  int32_t kernel; /* LOOM_ATTN_KERNEL_* the pipeline asked for */
} loom_attention_params;

/* Attention kernel strategies and the features an attention node may need. */
#define LOOM_ATTN_KERNEL_AUTO 0  /* the backend's choice */
#define LOOM_ATTN_KERNEL_NAIVE 1 /* materialized scores per query row (the reference kernel) */
#define LOOM_ATTN_KERNEL_FLASH 2 /* tiled keys, online softmax, no scores matrix */
#define LOOM_ATTN_FEATURE_WINDOW 1u
#define LOOM_ATTN_FEATURE_SOFTCAP 2u
#define LOOM_ATTN_FEATURE_SINKS 4u
#define LOOM_ATTN_FEATURE_SPAN_ONLY 8u /* its kernels read only each query's span: others may be released */
#define LOOM_ATTN_FEATURE_TREE 16u     /* it runs token-tree rows: loom_batch rope_positions / tree_* */
#define LOOM_ATTN_FEATURE_KV_GROUPS                                                                          \
  32u /* (3.1) it reads KV pools of layer groups: loom_kv_layout.n_groups                                    \
       */
#define LOOM_ATTN_FEATURE_SINK_LOGITS                                                                        \
  64u /* (3.2) learned per-head sink logits (loom_node.attn_sink_logits) */

/* (3.2) How MOE_ROUTE turns router logits into experts and weights. */
#define LOOM_MOE_GATING_SOFTMAX 0          /* softmax over every expert, the k highest, their probabilities */
#define LOOM_MOE_GATING_SIGMOID 1          /* sigmoid of each logit, the k highest, their values */
#define LOOM_MOE_GATING_SOFTMAX_SELECTED 2 /* the k highest logits, softmax over those k (gpt-oss) */
typedef struct loom_moe_params {
  int32_t n_used;      /* k: experts a token uses */
  int32_t gating;      /* LOOM_MOE_GATING_* */
  int32_t norm;        /* 1: the k weights divided by their sum (at least 2^-14) */
  float weights_scale; /* then multiplied by this (0 or 1: unchanged) */
} loom_moe_params;

typedef struct loom_node {
  int32_t op; /* loom_op */
  int32_t src[3];
  int32_t dst;
  float eps;
  float scale;
  loom_rope_params rope;
  loom_attention_params attn;
  loom_moe_params moe; /* (3.2) MOE_ROUTE */
  /* (3.2) ATTENTION: a weight [n_head] of learned sink logits, or −1 (a node of an older host: none) */
  int32_t attn_sink_logits;
  float glu_alpha, glu_limit; /* (3.2) SWIGLU_OAI: the sigmoid's slope and the clamp limit */
} loom_node;

typedef struct loom_graph {
  uint32_t struct_size;
  size_t n_tensors;
  const loom_tensor* tensors; /* n_tensors entries tensor_size bytes apart */
  size_t tensor_size;
  size_t n_nodes;
  const loom_node* nodes; /* n_nodes entries node_size bytes apart */
  size_t node_size;
  int32_t n_tokens, n_outputs;
  int32_t in_tokens, in_positions, in_out_ids; /* input tensors (i32) */
  int32_t out_logits;                          /* [n_vocab, n_outputs] */
  /* Unique over the host process's life, never reused — a backend may cache what it derives from a
   * graph under this id (never under the graph's address, which is reused for other shapes). */
  uint64_t id;
} loom_graph;

/* The KV pool: K and V of every layer in blocks of block_size positions, one buffer of
 *   [n_layer][2: K, V][n_blocks][block_size][n_head_kv · head_dim values of dtype]
 * (dtype f32, f16, bf16 or q8_0 with its blocks of 32 along the row). The row at offset o of block b,
 * layer l, K (kv 0) or V (kv 1) starts at byte (((l·2 + kv)·n_blocks + b)·block_size + o)·row_bytes. */
typedef struct loom_kv_layout {
  uint32_t struct_size;
  loom_dtype dtype;
  int32_t n_layer, n_head_kv, head_dim;
  int32_t block_size;
  int64_t n_blocks;
  /* (3.1) Layer groups (vLLM's hybrid KV cache), given only to a backend that declared
   * LOOM_ATTN_FEATURE_KV_GROUPS; n_groups 0 or 1: every layer in every block, as above. Otherwise a block
   * holds the rows of n_slots layers, the pool is [n_slots][2: K, V][n_blocks][block_size][row], and layer
   * l's rows lie in slot layer_slot[l] of the blocks of group layer_group[l]: each group has its own slots
   * and block tables (loom_batch.kv_groups) over the one pool. A hybrid model's sliding-window layers are
   * groups of their own, whose blocks are released past the window while the others keep every position. */
  int32_t n_groups, n_slots;
  const int32_t* layer_group; /* n_layer entries */
  const int32_t* layer_slot;  /* n_layer entries */
} loom_kv_layout;

/* Positions [0, n_positions) of block src copied to block dst, K and V of every layer (every slot). */
typedef struct loom_block_copy {
  int64_t src, dst;
  int32_t n_positions;
  int32_t reserved; /* 0 */
} loom_block_copy;

/* One layer group's rows of a batch (loom_batch.kv_groups): as loom_batch's slots, tables, table_stride. */
typedef struct loom_kv_group_rows {
  const int64_t* slots;
  const int32_t* tables;
  int32_t table_stride;
  int32_t reserved; /* 0 */
} loom_kv_group_rows;

/* The tokens one forward pass evaluates (rows of different sequences may be mixed) and where their
 * K/V live: row t writes its K/V at slots[t] (block · block_size + offset) and attends positions of its
 * sequence through tables[row_seq[t] · table_stride + pos / block_size] (−1: a released block, outside
 * every query's span, never read). The host allocated every position a row writes or reads. */
typedef struct loom_batch {
  uint32_t struct_size;
  size_t n_tokens;
  const int32_t* tokens;
  const int32_t* positions;
  const int32_t* seq_ids;
  size_t n_outputs;
  const int32_t* output_rows; /* ascending indices into tokens */
  const loom_kv_layout* kv_layout;
  void* kv; /* the pool: a LOOM_BUFFER_KV buffer of this backend */
  const int64_t* slots;
  const int32_t* row_seq;
  size_t n_seqs;
  const int32_t* tables; /* n_seqs × table_stride block ids */
  int32_t table_stride;
  /* Token trees (NULL: every row plain causal; given only to a backend that declared
   * LOOM_ATTN_FEATURE_TREE). positions[t] is the row's KV slot; it is rotated at rope_positions[t] and
   * attends the slots j < tree_base[t] causal attention allows (the window taken at its rope position)
   * and the slots tree_base[t] + i <= positions[t] with bit i of tree_mask[t] set. */
  const int32_t* rope_positions;
  const int32_t* tree_base;
  const uint64_t* tree_mask;
  /* (3.1) With layer groups (kv_layout->n_groups > 1): each group's slots and tables, n_groups entries
   * (entry 0 repeats slots, tables, table_stride above); NULL otherwise. */
  const loom_kv_group_rows* kv_groups;
} loom_batch;

typedef struct loom_memory_info {
  uint64_t free_bytes;
  uint64_t total_bytes;
} loom_memory_info;

typedef enum loom_buffer_usage {
  LOOM_BUFFER_WEIGHTS = 0,
  LOOM_BUFFER_KV = 1, /* a KV pool (loom_kv_layout); its pages may be committed lazily */
  LOOM_BUFFER_SCRATCH = 2,
  LOOM_BUFFER_LOGITS = 3 /* where graph_compute writes the logits */
} loom_buffer_usage;

struct loom_backend_i {
  uint32_t struct_size;
  const char* (*name)(const void* self); /* static storage */
  /* 1 if the backend can run node g->nodes[node] (op + dtypes of its tensors). Optional (NULL: every
   * node). The host asks once per graph shape, before the first graph_compute of that shape, and
   * refuses a graph with a node the backend cannot run in one line naming the op. */
  int32_t (*supports)(const void* self, const loom_graph* g, int32_t node);
  /* Runs g for one batch; writes the logits of batch->output_rows, row-major [n_outputs][n_vocab] f32, at
   * the start of `logits` (a LOOM_BUFFER_LOGITS buffer of at least n_logits floats). */
  loom_status* (*graph_compute)(void* self, const loom_graph* g, const loom_batch* b, void* logits,
                                size_t n_logits);
  /* Buffers of the backend's memory (required): the KV pool, the logits, anything else. */
  loom_status* (*buffer_alloc)(void* self, size_t bytes, int32_t usage, void** out);
  void (*buffer_free)(void* self, void* buffer);
  loom_status* (*buffer_upload)(void* self, void* buffer, size_t offset, const void* src, size_t bytes);
  loom_status* (*buffer_download)(void* self, const void* buffer, size_t offset, void* dst, size_t bytes);
  /* Runs block copies on a KV pool, in order (required). */
  loom_status* (*kv_copy)(void* self, void* kv, const loom_kv_layout* layout, const loom_block_copy* copies,
                          size_t n_copies);
  /* Optional: the weights of a model, once, before its first graph_compute (n entries weight_size bytes
   * apart). NULL: the backend reads loom_tensor::data in place. */
  loom_status* (*load_weights)(void* self, const loom_weight* weights, size_t n, size_t weight_size);
  void (*memory_info)(const void* self, loom_memory_info* out); /* optional */
  size_t (*workspace_bytes)(const void* self);                  /* optional: bytes of the last compute */
  size_t (*activation_bytes)(const void* self); /* optional: of workspace_bytes, those holding activations */
  void (*destroy)(void* self);                  /* required */
  /* Optional: 1 if graph_compute reads and writes KV rows stored in this LOOM_DTYPE_*. NULL: f32 only. */
  int32_t (*supports_kv_dtype)(const void* self, int32_t dtype);
  /* Optional: 1 if attention nodes with kernel strategy `kernel` (LOOM_ATTN_KERNEL_*) and these
   * LOOM_ATTN_FEATURE_* bits run as asked. NULL: kernel AUTO with window and softcap only. */
  int32_t (*supports_attention)(const void* self, int32_t kernel, uint32_t features);
  /* Optional: one line on what runs (e.g. "avx512_bf16, 2 threads"), valid until destroy. */
  const char* (*describe)(const void* self);
};

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LOOM_SDK_BACKEND_H */
