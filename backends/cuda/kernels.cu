// The cuda backend's kernels: plain, obviously correct first (each checked against the reference by the
// backend-op tests on a GPU: scripts/gpu-check.sh). The weight formats are quant_device.hpp's, shared with
// the host tests.
#include "kernels.cuh"
#include "quant_device.hpp"

#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

namespace loom::cuda {

namespace {

constexpr int k_threads = 256;

unsigned blocks_for(int64_t n, int threads = k_threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum of v over the block (blockDim.x a multiple of 32, ≤ 1024); every thread gets it.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads(); // (part reused by a previous call)
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int nw = static_cast<int>(blockDim.x / 32);
  float t = lane < nw ? part[lane] : 0.0f;
  return warp_sum(t);
}
__device__ float block_max(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int nw = static_cast<int>(blockDim.x / 32);
  float t = lane < nw ? part[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1)
    t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, o));
  return t;
}

__global__ void k_get_rows(uint32_t type, const uint8_t* src, int64_t row_bytes, int64_t n,
                           const int32_t* idx, int64_t rows, float* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * rows) return;
  const int64_t r = i / n, c = i % n;
  const int64_t sr = idx ? idx[r] : r;
  dst[i] = value_at(type, src + sr * row_bytes, c);
}

__global__ void k_rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    yr[i] = (w ? w[i] : 1.0f) * (inv * xr[i]);
}

template <int T>
__global__ void k_gemv(uint32_t type, const uint8_t* w, int64_t row_bytes, const float* x, float* y,
                       int64_t K, int64_t N) {
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (j >= N) return;
  const uint8_t* row = w + j * row_bytes;
  float acc[T];
  for (int t = 0; t < T; ++t)
    acc[t] = 0.0f;
  if (block_values(type) == 1) { // plain types: lanes along the row
    for (int64_t k = lane; k < K; k += 32) {
      const float wv = value_at(type, row, k);
      for (int t = 0; t < T; ++t)
        acc[t] += wv * x[t * K + k];
    }
  } else { // 32 values at a time
    float v[32];
    for (int64_t sb = lane; sb < K / 32; sb += 32) {
      dequant32(type, row, sb, v);
      for (int t = 0; t < T; ++t) {
        const float* xs = x + t * K + 32 * sb;
        float a = 0.0f;
        for (int q = 0; q < 32; ++q)
          a += v[q] * xs[q];
        acc[t] += a;
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    const float r = warp_sum(acc[t]);
    if (lane == 0) y[t * N + j] = r;
  }
}

// The plain types (f32, f16, bf16) when K is a multiple of 8: each lane reads 8 weights at a time in 16-byte
// loads (a warp: 256 consecutive weights), four rounds in flight; x in float4s. Same sums as k_gemv's up to
// their order.
__device__ __forceinline__ void widen8(uint32_t type, const uint8_t* p, float* v) {
  if (type == qt_f32) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  for (int i = 0; i < 4; ++i) {
    const auto lo = static_cast<uint16_t>(w[i] & 0xFFFFu), hi = static_cast<uint16_t>(w[i] >> 16);
    v[2 * i] = type == qt_bf16 ? bf16_to_float(lo) : __half2float(__ushort_as_half(lo));
    v[2 * i + 1] = type == qt_bf16 ? bf16_to_float(hi) : __half2float(__ushort_as_half(hi));
  }
}

template <int T, uint32_t Type>
__global__ void k_gemv_wide(const uint8_t* w, int64_t row_bytes, const float* x, float* y, int64_t K,
                            int64_t N) {
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (j >= N) return;
  constexpr int es = Type == qt_f32 ? 4 : 2;
  const uint8_t* row = w + j * row_bytes;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t)
    acc[t] = 0.0f;
  // U rounds of 16-byte weight loads issued before any is used: decode is bound by the bytes in flight.
  constexpr int U = 4;
  for (int64_t k0 = 8 * lane; k0 < K; k0 += 256 * U) {
    constexpr int L = es / 2; // 16-byte loads per 8 weights
    uint4 raw[U][L];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int l = 0; l < L; ++l)
        if (k0 + 256 * u < K) raw[u][l] = reinterpret_cast<const uint4*>(row + (k0 + 256 * u) * es)[l];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = k0 + 256 * u;
      if (k >= K) break;
      float v[8];
      widen8(Type, reinterpret_cast<const uint8_t*>(raw[u]), v);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const float4 a = *reinterpret_cast<const float4*>(x + t * K + k);
        const float4 b = *reinterpret_cast<const float4*>(x + t * K + k + 4);
        acc[t] += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y + v[6] * b.z +
                  v[7] * b.w;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float r = warp_sum(acc[t]);
    if (lane == 0) y[t * N + j] = r;
  }
}

__global__ void k_quantize_acts(const float* x, Q8Block* xq, int64_t n_blocks) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_blocks) return;
  quantize_q8(x + 32 * i, xq[i]);
}

template <int T>
__global__ void k_gemv_int8(uint32_t type, const uint8_t* w, int64_t row_bytes, const Q8Block* xq, float* y,
                            int64_t K, int64_t N) {
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (j >= N) return;
  const uint8_t* row = w + j * row_bytes;
  const int64_t nsb = K / 32;
  float acc[T];
  for (int t = 0; t < T; ++t)
    acc[t] = 0.0f;
  int8_t q[32];
  float a[2], b[2];
  for (int64_t sb = lane; sb < nsb; sb += 32) {
    unpack32(type, row, sb, q, a, b);
    for (int t = 0; t < T; ++t)
      acc[t] += dot32(q, a, b, xq[t * nsb + sb]);
  }
  for (int t = 0; t < T; ++t) {
    const float r = warp_sum(acc[t]);
    if (lane == 0) y[t * N + j] = r;
  }
}

// Q4_0 and Q8_0, the types of most quantized files, without unpack32's byte arrays: a lane reads its block in
// 2-byte words (blocks are 18 and 34 bytes: 2-byte aligned) straight into 32-bit registers and feeds dp4a
// with them; Q4_0's −8 offset is −8·Σq of the activations' block (Q8Block::s). Same integer sums as
// k_gemv_int8's.
template <uint32_t Type> struct WordBlock {
  static constexpr int bytes = Type == qt_q4_0 ? 18 : 34, words = Type == qt_q4_0 ? 4 : 8;
  float d;
  uint32_t q[words];
  __device__ __forceinline__ void load(const uint8_t* p) {
    const auto* h = reinterpret_cast<const uint16_t*>(p);
    d = __half2float(__ushort_as_half(h[0]));
#pragma unroll
    for (int i = 0; i < words; ++i)
      q[i] = static_cast<uint32_t>(h[1 + 2 * i]) | (static_cast<uint32_t>(h[2 + 2 * i]) << 16);
  }
  __device__ __forceinline__ float dot(const Q8Block& x) const {
    const auto* xq = reinterpret_cast<const int*>(x.q);
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (Type == qt_q4_0) {
        s = __dp4a(static_cast<int>(q[i] & 0x0F0F0F0Fu), xq[i], s);
        s = __dp4a(static_cast<int>((q[i] >> 4) & 0x0F0F0F0Fu), xq[4 + i], s);
      } else {
        s = __dp4a(static_cast<int>(q[i]), xq[i], s);
        s = __dp4a(static_cast<int>(q[4 + i]), xq[4 + i], s);
      }
    }
    if constexpr (Type == qt_q4_0) s -= 8 * (x.s[0] + x.s[1]);
    return d * x.d * static_cast<float>(s);
  }
};

template <int T, uint32_t Type>
__global__ void k_gemv_int8_words(const uint8_t* w, int64_t row_bytes, const Q8Block* xq, float* y, int64_t K,
                                  int64_t N) {
  // The activations' blocks of a chunk, staged in shared memory by the whole thread block (its 8 warps, one
  // row each, read the same ones): a lane's Q8Block lies 11 words from its neighbour's, so the lanes' reads
  // fall in 32 different banks, where from global memory each of them touched 11 cache lines.
  constexpr int U = 4, C = 32 * U, words_per_block = sizeof(Q8Block) / 4;
  static_assert(sizeof(Q8Block) % 4 == 0 && alignof(Q8Block) == 4);
  __shared__ int xs[T][C * words_per_block]; // raw words: a __shared__ Q8Block may not have initializers
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const bool live = j < N; // no early return: every thread takes part in the staging
  const uint8_t* row = w + (live ? j : 0) * row_bytes;
  const int64_t nsb = K / 32;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t)
    acc[t] = 0.0f;
  for (int64_t sb0 = 0; sb0 < nsb; sb0 += C) {
    WordBlock<Type> b[U]; // the weights' loads first: in flight while the activations are staged
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (live && sb0 + lane + 32 * u < nsb) b[u].load(row + WordBlock<Type>::bytes * (sb0 + lane + 32 * u));
    const int n = static_cast<int>(nsb - sb0 < C ? nsb - sb0 : C);
    __syncthreads(); // the previous chunk is consumed
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const auto* src = reinterpret_cast<const int*>(xq + t * nsb + sb0);
      int* dst = xs[t];
      for (int i = static_cast<int>(threadIdx.x); i < n * words_per_block; i += static_cast<int>(blockDim.x))
        dst[i] = src[i];
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!live || lane + 32 * u >= n) break;
#pragma unroll
      for (int t = 0; t < T; ++t)
        acc[t] += b[u].dot(reinterpret_cast<const Q8Block*>(xs[t])[lane + 32 * u]);
    }
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float r = warp_sum(acc[t]);
    if (live && lane == 0) y[t * N + j] = r;
  }
}

// A float's bits as an unsigned key in the floats' order (NaN: 0, never among the highest).
__device__ __forceinline__ unsigned order_key(float f) {
  if (f != f) return 0u;
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One block per row: a radix select of the c-th highest key, 8 bits a pass from the top (a shared histogram
// of the keys that share the bits chosen so far), then every key above it and enough of those equal to it.
__global__ void k_select_top(const float* y, int64_t N, int32_t c, int32_t* idx) {
  const float* yr = y + static_cast<int64_t>(blockIdx.x) * N;
  int32_t* out = idx + static_cast<int64_t>(blockIdx.x) * c;
  __shared__ unsigned hist[256];
  __shared__ unsigned prefix, mask;
  __shared__ int need, n_above, n_equal;
  if (threadIdx.x == 0) {
    prefix = mask = 0u;
    need = c;
    n_above = n_equal = 0;
  }
  __syncthreads();
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (unsigned i = threadIdx.x; i < 256u; i += blockDim.x)
      hist[i] = 0u;
    __syncthreads();
    const unsigned pf = prefix, mk = mask;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
      const unsigned k = order_key(yr[i]);
      if ((k & mk) == pf) atomicAdd(&hist[(k >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) { // the bucket holding the need-th highest; the keys above it are all taken
      int above = 0, b = 255;
      for (; b > 0 && above + static_cast<int>(hist[b]) < need; --b)
        above += static_cast<int>(hist[b]);
      need -= above;
      prefix = pf | (static_cast<unsigned>(b) << shift);
      mask = mk | (255u << shift);
    }
    __syncthreads();
  }
  const unsigned th = prefix; // the c-th highest key: c − need keys above it, `need` of those equal taken
  const int take = need;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    const unsigned k = order_key(yr[i]);
    if (k > th) {
      out[atomicAdd(&n_above, 1)] = static_cast<int32_t>(i);
    } else if (k == th) {
      const int e = atomicAdd(&n_equal, 1);
      if (e < take) out[c - take + e] = static_cast<int32_t>(i);
    }
  }
}

// One warp per (row t, candidate i): y[t][idx[t][i]] = the exact dot of that weight row with x[t] (k_gemv's
// products).
__global__ void k_rows_exact(uint32_t type, const uint8_t* w, int64_t row_bytes, const float* x, int64_t K,
                             const int32_t* idx, int32_t T, int32_t c, float* y, int64_t N) {
  const int64_t wi = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (wi >= static_cast<int64_t>(T) * c) return;
  const int64_t t = wi / c, j = idx[wi];
  const uint8_t* row = w + j * row_bytes;
  const float* xt = x + t * K;
  float a = 0.0f;
  if (block_values(type) == 1) {
    for (int64_t k = lane; k < K; k += 32)
      a += value_at(type, row, k) * xt[k];
  } else {
    float v[32];
    for (int64_t sb = lane; sb < K / 32; sb += 32) {
      dequant32(type, row, sb, v);
      for (int q = 0; q < 32; ++q)
        a += v[q] * xt[32 * sb + q];
    }
  }
  a = warp_sum(a);
  if (lane == 0) y[t * N + j] = a;
}

__device__ __forceinline__ void put_value(void* out, uint32_t out_type, int64_t i, float v) {
  if (out_type == qt_f32)
    static_cast<float*>(out)[i] = v;
  else if (out_type == qt_f16)
    static_cast<__half*>(out)[i] = __float2half_rn(v);
  else
    static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
}

// Plain types: a thread per value. Block types: a thread per 32 values (one dequant32 of its sub-block,
// not 32 — a block is decoded once).
__global__ void k_dequant_rows(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t K, int64_t rows,
                               void* out, uint32_t out_type) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (block_values(type) == 1) {
    if (i < K * rows) put_value(out, out_type, i, value_at(type, w + (i / K) * row_bytes, i % K));
    return;
  }
  const int64_t per_row = K / 32;
  if (i >= per_row * rows) return;
  const int64_t r = i / per_row, sb = i % per_row;
  float v[32];
  dequant32(type, w + r * row_bytes, sb, v);
#pragma unroll
  for (int j = 0; j < 32; ++j)
    put_value(out, out_type, r * K + 32 * sb + j, v[j]);
}

__global__ void k_to_half(const float* x, void* y, int64_t n, bool bf16) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (bf16)
    static_cast<__nv_bfloat16*>(y)[i] = __float2bfloat16_rn(x[i]);
  else
    static_cast<__half*>(y)[i] = __float2half_rn(x[i]);
}

__global__ void k_rope(const float* x, float* y, const float* cs, const float* sn, int64_t D, int64_t H,
                       int64_t T, int32_t n_dims, bool neox) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= D * H * T) return;
  const int64_t d = i % D, head = i - d; // head: the index of this head's first value
  const int64_t t = i / (D * H);
  if (d >= n_dims) {
    y[i] = x[i];
    return;
  }
  const int64_t half = n_dims / 2;
  int64_t p, a, b;
  bool first;
  if (neox) {
    p = d < half ? d : d - half;
    a = p;
    b = p + half;
    first = d < half;
  } else {
    p = d / 2;
    a = 2 * p;
    b = 2 * p + 1;
    first = d % 2 == 0;
  }
  const float c = cs[t * half + p], s = sn[t * half + p];
  const float x0 = x[head + a], x1 = x[head + b];
  y[i] = first ? x0 * c - x1 * s : x0 * s + x1 * c;
}

__device__ __forceinline__ uint8_t* pool_row(const KvPool& kv, int32_t layer, int which, int64_t block,
                                             int64_t off) {
  return kv.data +
         ((static_cast<int64_t>(layer) * 2 + which) * kv.n_blocks + block) * kv.block_size * kv.row_bytes +
         off * kv.row_bytes;
}

// One thread per 32 values (q8_0: one block) or per value (plain types) of each new row.
__global__ void k_kv_write(KvPool kv, int32_t layer, const float* k, const float* v, const int64_t* slots,
                           int64_t T) {
  const int64_t E = static_cast<int64_t>(kv.n_head_kv) * kv.head_dim;
  const int64_t per_row = kv.dtype == qt_q8_0 ? E / 32 : E;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= 2 * T * per_row) return;
  const int which = static_cast<int>(i / (T * per_row));
  const int64_t t = (i / per_row) % T, e = i % per_row;
  const float* src = (which == 0 ? k : v) + t * E;
  const int64_t slot = slots[t];
  uint8_t* row = pool_row(kv, layer, which, slot / kv.block_size, slot % kv.block_size);
  switch (kv.dtype) {
  case qt_f32:
    reinterpret_cast<float*>(row)[e] = src[e];
    break;
  case qt_f16: {
    store_u16(row + 2 * e, float_to_half(src[e]));
    break;
  }
  case qt_bf16: {
    store_u16(row + 2 * e, float_to_bf16(src[e]));
    break;
  }
  default: // q8_0
    quant32_q8_0(src + 32 * e, row + 34 * e);
    break;
  }
}

// One block of k_attn_warps warps per (token, head, split): the split's share of the query's span (split-K,
// as flash-decoding: a batch of few tokens still fills the device) is taken by the warps in turn, each with
// an online softmax (running max, sum, output in registers: lane l holds dims l, l + 32, …), then the
// warps' partial results are merged — into the output (one split) or into `part` (max, sum, unnormalized
// output per split; k_attn_combine merges them). Rows outside each query's span are never read.
constexpr int k_attn_warps = 4;
constexpr int k_attn_dims = 8;    // per lane: head_dim ≤ 256
constexpr int k_attn_fill = 264;  // blocks that keep every SM of an H100/H200 busy (2 × 132)
constexpr int k_attn_splits = 32; // at most
constexpr int k_attn_chunk = 256; // keys per split at least

// The index of the k-th set bit of m (k < popcount(m)).
__device__ int nth_set_bit(uint64_t m, int k) {
  for (int b = 0; b < 64; ++b)
    if ((m >> b) & 1u) {
      if (k == 0) return b;
      --k;
    }
  return 63;
}

__global__ void k_attention(KvPool kv, AttnArgs a, const float* q, const int32_t* pos, const int32_t* row_seq,
                            const int32_t* tables, int32_t stride, float* out, float* part,
                            const int32_t* trope, const int32_t* tbase, const uint64_t* tmask) {
  const int64_t t = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int split = static_cast<int>(blockIdx.z), n_split = static_cast<int>(gridDim.z);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int D = a.head_dim, hk = h / (a.n_head / a.n_head_kv);
  const float* qh = q + (t * a.n_head + h) * D;
  float qr[k_attn_dims], acc[k_attn_dims];
  for (int i = 0; i < k_attn_dims; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < D ? qh[d] : 0.0f;
    acc[i] = 0.0f;
  }
  // key_span: [0, sink_end) ∪ [first, last]; a token-tree row: that span taken at its rope position, below
  // its tree ([0, se) ∪ [ws, we]), then its ancestors and itself (the set bits of `mask`, from `base`)
  const int32_t p = pos[t];
  const bool tree = tbase != nullptr && tbase[t] <= p;
  const int32_t rp = tree ? trope[t] : p;
  const int32_t first = a.window > 0 ? max(0, rp - a.window + 1) : 0;
  const int32_t sink_end = a.window > 0 ? min(max(a.sinks, 0), first) : 0;
  int32_t count = sink_end + (p - first + 1), se = sink_end, ws = first, n_win = p - first + 1, base = 0;
  uint64_t mask = 0;
  if (tree) {
    base = tbase[t];
    se = min(sink_end, base);
    ws = max(first, sink_end);
    const int32_t we = min(rp, base - 1);
    n_win = we >= ws ? we - ws + 1 : 0;
    const int32_t span = p - base + 1; // tree slots up to this row's own
    mask = tmask[t] & (span >= 64 ? ~0ull : ((1ull << span) - 1));
    count = se + n_win + __popcll(static_cast<unsigned long long>(mask));
  }
  const int32_t* table = tables + static_cast<int64_t>(row_seq[t]) * stride;
  const int32_t chunk = (count + n_split - 1) / n_split;
  const int32_t c0 = split * chunk, c1 = min(count, c0 + chunk);
  float m = -INFINITY, l = 0.0f;
  for (int32_t c = c0 + warp; c < c1; c += k_attn_warps) {
    const int32_t j = c < se ? c : c < se + n_win ? ws + (c - se) : base + nth_set_bit(mask, c - se - n_win);
    const int32_t blk = table[j / kv.block_size];
    const uint8_t* kr = pool_row(kv, a.layer, 0, blk, j % kv.block_size);
    const uint8_t* vr = pool_row(kv, a.layer, 1, blk, j % kv.block_size);
    float part = 0.0f;
    for (int i = 0; i < k_attn_dims; ++i) {
      const int d = lane + 32 * i;
      if (d < D) part += qr[i] * value_at(kv.dtype, kr, static_cast<int64_t>(hk) * D + d);
    }
    float sc = warp_sum(part) * a.scale;
    if (a.softcap > 0.0f) sc = a.softcap * tanhf(sc / a.softcap);
    const float mn = fmaxf(m, sc);
    const float corr = m == -INFINITY ? 0.0f : expf(m - mn);
    const float e = expf(sc - mn);
    l = l * corr + e;
    for (int i = 0; i < k_attn_dims; ++i) {
      const int d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < D ? e * value_at(kv.dtype, vr, static_cast<int64_t>(hk) * D + d) : 0.0f);
    }
    m = mn;
  }
  __shared__ float sm[k_attn_warps], sl[k_attn_warps];
  __shared__ float sacc[k_attn_warps][32 * k_attn_dims];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
  for (int i = 0; i < k_attn_dims; ++i)
    sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float M = -INFINITY;
  for (int w = 0; w < k_attn_warps; ++w)
    M = fmaxf(M, sm[w]);
  float L = 0.0f, f[k_attn_warps];
  for (int w = 0; w < k_attn_warps; ++w) {
    f[w] = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M);
    L += sl[w] * f[w];
  }
  float* o =
      n_split == 1 ? out + (t * a.n_head + h) * D : part + ((t * a.n_head + h) * n_split + split) * (D + 2);
  if (n_split > 1 && lane == 0) {
    o[0] = M;
    o[1] = L;
  }
  for (int i = 0; i < k_attn_dims; ++i) {
    const int d = lane + 32 * i;
    if (d >= D) continue;
    float v = 0.0f;
    for (int w = 0; w < k_attn_warps; ++w)
      v += sacc[w][d] * f[w];
    if (n_split == 1)
      o[d] = v / L;
    else
      o[2 + d] = v;
  }
}

// The splits of one (token, head) merged: out = Σ_s acc_s · e^(M_s − M) / Σ_s L_s · e^(M_s − M).
__global__ void k_attn_combine(AttnArgs a, int32_t n_split, const float* part, float* out) {
  const int64_t t = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int D = a.head_dim;
  const float* p = part + (t * a.n_head + h) * n_split * (D + 2);
  float M = -INFINITY;
  for (int s = 0; s < n_split; ++s)
    M = fmaxf(M, p[s * (D + 2)]);
  float L = 0.0f;
  for (int s = 0; s < n_split; ++s) {
    const float ms = p[s * (D + 2)];
    L += ms == -INFINITY ? 0.0f : p[s * (D + 2) + 1] * expf(ms - M);
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < n_split; ++s) {
      const float ms = p[s * (D + 2)];
      if (ms != -INFINITY) v += p[s * (D + 2) + 2 + d] * expf(ms - M);
    }
    out[(t * a.n_head + h) * D + d] = v / L;
  }
}

int attn_splits(int64_t T, int32_t n_head, int32_t max_keys) {
  const int64_t blocks = T * n_head;
  if (blocks >= k_attn_fill) return 1;
  const int64_t want = (k_attn_fill + blocks - 1) / blocks,
                by_keys = (max_keys + k_attn_chunk - 1) / k_attn_chunk;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, by_keys, k_attn_splits})));
}

__global__ void k_kv_copy(KvPool kv, int64_t src, int64_t dst, int64_t bytes) {
  // grid.y: layer · 2 + (K or V)
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= bytes) return;
  const int32_t layer = static_cast<int32_t>(blockIdx.y / 2);
  const int which = static_cast<int>(blockIdx.y % 2);
  pool_row(kv, layer, which, dst, 0)[i] = pool_row(kv, layer, which, src, 0)[i];
}

__global__ void k_unary(Unary op, const float* a, float* dst, int64_t n, float p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  dst[i] = op == Unary::scale ? a[i] * p : p * tanhf(a[i] / p);
}

__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x)));
}

__global__ void k_binary(Binary op, const float* a, const float* b, float* dst, int64_t n, int64_t nb) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = a[i], y = b[i % nb];
  switch (op) {
  case Binary::add:
    dst[i] = x + y;
    break;
  case Binary::mul:
    dst[i] = x * y;
    break;
  case Binary::swiglu:
    dst[i] = x * (1.0f / (1.0f + expf(-x))) * y;
    break;
  case Binary::geglu:
    dst[i] = gelu_tanh(x) * y;
    break;
  }
}

__global__ void k_softmax(const float* a, float* dst, int64_t n) {
  const float* x = a + static_cast<int64_t>(blockIdx.x) * n;
  float* y = dst + static_cast<int64_t>(blockIdx.x) * n;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    mx = fmaxf(mx, x[i]);
  mx = block_max(mx);
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    s += expf(x[i] - mx);
  s = block_sum(s);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    y[i] = expf(x[i] - mx) / s;
}

} // namespace

void get_rows(uint32_t type, const uint8_t* src, int64_t row_bytes, int64_t n, const int32_t* idx,
              int64_t rows, float* dst, cudaStream_t s) {
  if (n * rows == 0) return;
  k_get_rows<<<blocks_for(n * rows), k_threads, 0, s>>>(type, src, row_bytes, n, idx, rows, dst);
}

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps, cudaStream_t s) {
  if (rows == 0) return;
  k_rms_norm<<<static_cast<unsigned>(rows), k_threads, 0, s>>>(x, w, y, n, eps);
}

// Runs launch(integral_constant<int, n>, t0) for the rows of a GEMV in chunks of at most 8 (the kernels'
// accumulators per lane are a template argument).
template <class Launch> void by_chunks_of_8(int32_t T, const Launch& launch) {
  for (int32_t t0 = 0; t0 < T; t0 += 8) {
    switch (T - t0 < 8 ? T - t0 : 8) {
    case 1:
      launch(std::integral_constant<int, 1>{}, t0);
      break;
    case 2:
      launch(std::integral_constant<int, 2>{}, t0);
      break;
    case 3:
      launch(std::integral_constant<int, 3>{}, t0);
      break;
    case 4:
      launch(std::integral_constant<int, 4>{}, t0);
      break;
    case 5:
      launch(std::integral_constant<int, 5>{}, t0);
      break;
    case 6:
      launch(std::integral_constant<int, 6>{}, t0);
      break;
    case 7:
      launch(std::integral_constant<int, 7>{}, t0);
      break;
    default:
      launch(std::integral_constant<int, 8>{}, t0);
      break;
    }
  }
}

void gemv(uint32_t type, const uint8_t* w, int64_t row_bytes, const float* x, float* y, int64_t K, int64_t N,
          int32_t T, cudaStream_t s) {
  if (N == 0 || T == 0) return;
  const unsigned grid = blocks_for(N * 32);
  // 16-byte loads: rows and x aligned to 16 bytes (device allocations are; K a multiple of 8 keeps rows so)
  const bool wide = K % 8 == 0 && (type == qt_f32 || type == qt_f16 || type == qt_bf16) &&
                    reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                    row_bytes % 16 == 0;
  by_chunks_of_8(T, [&](auto n, int32_t t0) {
    constexpr int R = decltype(n)::value;
    const float* xs = x + static_cast<int64_t>(t0) * K;
    float* ys = y + static_cast<int64_t>(t0) * N;
    if (!wide)
      k_gemv<R><<<grid, k_threads, 0, s>>>(type, w, row_bytes, xs, ys, K, N);
    else if (type == qt_bf16)
      k_gemv_wide<R, qt_bf16><<<grid, k_threads, 0, s>>>(w, row_bytes, xs, ys, K, N);
    else if (type == qt_f16)
      k_gemv_wide<R, qt_f16><<<grid, k_threads, 0, s>>>(w, row_bytes, xs, ys, K, N);
    else
      k_gemv_wide<R, qt_f32><<<grid, k_threads, 0, s>>>(w, row_bytes, xs, ys, K, N);
  });
}

void quantize_acts(const float* x, void* xq, int64_t n_blocks, cudaStream_t s) {
  if (n_blocks == 0) return;
  k_quantize_acts<<<blocks_for(n_blocks), k_threads, 0, s>>>(x, static_cast<Q8Block*>(xq), n_blocks);
}

size_t q8_block_bytes() {
  return sizeof(Q8Block);
}

void gemv_int8(uint32_t type, const uint8_t* w, int64_t row_bytes, const void* xq, float* y, int64_t K,
               int64_t N, int32_t T, cudaStream_t s) {
  if (N == 0 || T == 0) return;
  const unsigned grid = blocks_for(N * 32);
  const auto* x = static_cast<const Q8Block*>(xq);
  // 2-byte word loads: the row starts 2-byte aligned (device allocations are; row_bytes even)
  const bool words =
      (type == qt_q4_0 || type == qt_q8_0) && reinterpret_cast<uintptr_t>(w) % 2 == 0 && row_bytes % 2 == 0;
  by_chunks_of_8(T, [&](auto n, int32_t t0) {
    constexpr int R = decltype(n)::value;
    const Q8Block* xs = x + t0 * (K / 32);
    float* ys = y + static_cast<int64_t>(t0) * N;
    if (words && type == qt_q4_0)
      k_gemv_int8_words<R, qt_q4_0><<<grid, k_threads, 0, s>>>(w, row_bytes, xs, ys, K, N);
    else if (words)
      k_gemv_int8_words<R, qt_q8_0><<<grid, k_threads, 0, s>>>(w, row_bytes, xs, ys, K, N);
    else
      k_gemv_int8<R><<<grid, k_threads, 0, s>>>(type, w, row_bytes, xs, ys, K, N);
  });
}

void top_rows(const float* y, int64_t N, int32_t T, int32_t c, int32_t* idx, cudaStream_t s) {
  if (T == 0 || c == 0) return;
  k_select_top<<<static_cast<unsigned>(T), 1024, 0, s>>>(y, N, c, idx);
}

void rows_exact(uint32_t type, const uint8_t* w, int64_t row_bytes, const float* x, int64_t K,
                const int32_t* idx, int32_t T, int32_t c, float* y, int64_t N, cudaStream_t s) {
  if (T == 0 || c == 0) return;
  k_rows_exact<<<blocks_for(static_cast<int64_t>(T) * c * 32), k_threads, 0, s>>>(type, w, row_bytes, x, K,
                                                                                  idx, T, c, y, N);
}

void dequant_rows(uint32_t type, const uint8_t* w, int64_t row_bytes, int64_t K, int64_t rows, void* out,
                  uint32_t out_type, cudaStream_t s) {
  if (K * rows == 0) return;
  const int64_t threads = block_values(type) == 1 ? K * rows : K / 32 * rows;
  k_dequant_rows<<<blocks_for(threads), k_threads, 0, s>>>(type, w, row_bytes, K, rows, out, out_type);
}

void to_half(const float* x, void* y, int64_t n, bool bf16, cudaStream_t s) {
  if (n == 0) return;
  k_to_half<<<blocks_for(n), k_threads, 0, s>>>(x, y, n, bf16);
}

void rope(const float* x, float* y, const float* cs, const float* sn, int64_t D, int64_t H, int64_t T,
          int32_t n_dims, bool neox, cudaStream_t s) {
  if (D * H * T == 0) return;
  k_rope<<<blocks_for(D * H * T), k_threads, 0, s>>>(x, y, cs, sn, D, H, T, n_dims, neox);
}

void kv_write(const KvPool& kv, int32_t layer, const float* k, const float* v, const int64_t* slots,
              int64_t T, cudaStream_t s) {
  const int64_t E = static_cast<int64_t>(kv.n_head_kv) * kv.head_dim;
  const int64_t per_row = kv.dtype == qt_q8_0 ? E / 32 : E;
  if (T * per_row == 0) return;
  k_kv_write<<<blocks_for(2 * T * per_row), k_threads, 0, s>>>(kv, layer, k, v, slots, T);
}

size_t attention_scratch_bytes(int64_t T, int32_t n_head, int32_t head_dim, int32_t max_keys) {
  const int n = attn_splits(T, n_head, max_keys);
  return n == 1 ? 0 : static_cast<size_t>(T * n_head * n) * static_cast<size_t>(head_dim + 2) * sizeof(float);
}

void attention(const KvPool& kv, const AttnArgs& a, const float* q, const int32_t* pos,
               const int32_t* row_seq, const int32_t* tables, int32_t stride, int64_t T, int32_t max_keys,
               float* scratch, float* out, cudaStream_t s, const int32_t* rope, const int32_t* tree_base,
               const uint64_t* tree_mask) {
  if (T == 0) return;
  const int n_split = scratch ? attn_splits(T, a.n_head, max_keys) : 1;
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(a.n_head), static_cast<unsigned>(n_split));
  k_attention<<<grid, 32 * k_attn_warps, 0, s>>>(kv, a, q, pos, row_seq, tables, stride, out, scratch, rope,
                                                 tree_base, tree_mask);
  if (n_split > 1)
    k_attn_combine<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>(a.n_head)), 128, 0, s>>>(
        a, n_split, scratch, out);
}

void kv_copy(const KvPool& kv, int64_t src, int64_t dst, int32_t n, cudaStream_t s) {
  const int64_t bytes = static_cast<int64_t>(n) * kv.row_bytes;
  if (bytes == 0 || kv.n_layer == 0) return;
  const dim3 grid(blocks_for(bytes), static_cast<unsigned>(kv.n_layer * 2));
  k_kv_copy<<<grid, k_threads, 0, s>>>(kv, src, dst, bytes);
}

void unary(Unary op, const float* a, float* dst, int64_t n, float p, cudaStream_t s) {
  if (n == 0) return;
  k_unary<<<blocks_for(n), k_threads, 0, s>>>(op, a, dst, n, p);
}

void binary(Binary op, const float* a, const float* b, float* dst, int64_t n, int64_t nb, cudaStream_t s) {
  if (n == 0) return;
  k_binary<<<blocks_for(n), k_threads, 0, s>>>(op, a, b, dst, n, nb);
}

void softmax(const float* a, float* dst, int64_t rows, int64_t n, cudaStream_t s) {
  if (rows == 0) return;
  k_softmax<<<static_cast<unsigned>(rows), k_threads, 0, s>>>(a, dst, n);
}

} // namespace loom::cuda
