// Matrix kernels of the cpu backend: the scalar kernels, the repacking and the run-time dispatch.
// The kernels of each instruction-set level are in kernels_avx2.cpp, kernels_avx512.cpp, kernels_vnni.cpp
// and kernels_amx.cpp; every path computes the same thing and is tested against the reference backend.
#include "kernels.hpp"

#include "kernels_internal.hpp"
#include "loom/sdk/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <omp.h>
#include <string>
#include <sys/syscall.h>
#include <unistd.h>
#include <vector>

namespace loom::cpu {

namespace {

// ---- activations quantized to 8 bits (BlockQ8, BlockQ8K: kernels_internal.hpp) ----

// Every token's activations, quantized in parallel (one token per iteration).
void quantize_rows(Isa isa, const float* x, int64_t K, int64_t T, BlockQ8* out, int threads) {
  const auto q = at_least(isa, Isa::avx512) ? quantize_x_avx512
                 : at_least(isa, Isa::avx2)
                     ? quantize_x_avx2
                     : [](const float* a, int64_t k, BlockQ8* o) { quantize_x(a, k, o); };
#pragma omp parallel for num_threads(threads) schedule(static) if (T >= 4)
  for (int64_t t = 0; t < T; ++t)
    q(x + t * K, K, out + t * (K / 32));
}

void quantize_x_k(const float* x, int64_t K, BlockQ8K* out) {
  for (int64_t b = 0; b < K / 256; ++b) {
    out[b].d = quantize_block(x + b * 256, 256, out[b].qs);
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i)
        sum += out[b].qs[i];
      out[b].bsums[g] = static_cast<int16_t>(sum);
    }
  }
}

void quantize_rows_k(Isa isa, const float* x, int64_t K, int64_t T, BlockQ8K* out, int threads) {
  const bool avx512 = at_least(isa, Isa::avx512);
#pragma omp parallel for num_threads(threads) schedule(static) if (T >= 4)
  for (int64_t t = 0; t < T; ++t)
    (avx512 ? quantize_x_k_avx512 : quantize_x_k)(x + t * K, K, out + t * (K / 256));
}

// ---- scalar ----

float dot_f32_scalar(const uint8_t* w, const float* x, int64_t K) {
  const auto* a = reinterpret_cast<const float*>(w);
  float s = 0.0f;
  for (int64_t k = 0; k < K; ++k)
    s += a[k] * x[k];
  return s;
}
float dot_f16_scalar(const uint8_t* w, const float* x, int64_t K) {
  float s = 0.0f;
  for (int64_t k = 0; k < K; ++k)
    s += f16(w + 2 * k) * x[k];
  return s;
}
float dot_bf16_scalar(const uint8_t* w, const float* x, int64_t K) {
  float s = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    uint16_t h;
    std::memcpy(&h, w + 2 * k, 2);
    s += bf16_to_fp32(h) * x[k];
  }
  return s;
}
float dot_q8_0_scalar(const uint8_t* w, const BlockQ8* x, int64_t nb) {
  float s = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 34) {
    const auto* q = reinterpret_cast<const int8_t*>(w + 2);
    int32_t acc = 0;
    for (int i = 0; i < 32; ++i)
      acc += static_cast<int32_t>(q[i]) * x[b].qs[i];
    s += f16(w) * x[b].d * static_cast<float>(acc);
  }
  return s;
}
float dot_q4_0_scalar(const uint8_t* w, const BlockQ8* x, int64_t nb) {
  float s = 0.0f;
  for (int64_t b = 0; b < nb; ++b, w += 18) {
    const uint8_t* q = w + 2;
    int32_t acc = 0;
    for (int i = 0; i < 16; ++i) {
      acc += ((q[i] & 0x0F) - 8) * x[b].qs[i];
      acc += ((q[i] >> 4) - 8) * x[b].qs[i + 16];
    }
    s += f16(w) * x[b].d * static_cast<float>(acc);
  }
  return s;
}

// ---- Q4_0 and Q8_0 repacked in groups of 8 rows, two groups side by side ("q4_0x8", "q8_0x8") ----
// Per group of 8 rows and block of 32 columns: the 8 rows' f16 scales (16 bytes), then vectors V0..Vn of
// 32 bytes where dword r of Vc is row r's quantized bytes 4c..4c+3 — Q4_0: four vectors, the low nibbles
// elements 4c..4c+3 and the high ones 16+4c..16+4c+3 (144 bytes a block); Q8_0: eight vectors, columns
// 4c..4c+3 (272 bytes). One vector load then serves 8 rows, the products of a row land in its own dword
// lane, and the 8 scales convert with one instruction.
// Groups 2p and 2p + 1 (rows 16p..16p+15) are stored as one pair, block by block: the 16 rows' scales
// (32 bytes), then per c the two groups' Vc side by side (64 bytes) — so a 512-bit load takes 16 rows'
// bytes at once, and the 16 scales one 256-bit load. An odd last group is stored alone. A pair starts at
// 2p · group_bytes and the odd group at 2·pairs · group_bytes: the matrix keeps the GGUF size.
// H groups stored together (1: alone, 2: a pair): block b at H · blk · b; within it, group h's scales at
// 16h, its Vc at 16H + 32H·c + 32h.
// (k_q4x8_block, k_q8x8_block, q_scale_at, q_vec_at: kernels_internal.hpp)

// A b32 type's GGUF block: bytes before the quantized ones (the scale; Q4_1: and the min; Q5_0: and the
// fifth bits), and the quantized bytes.
constexpr size_t b32_src_head(DType type) {
  return type == DType::q4_1 ? 4 : type == DType::q5_0 ? 6 : type == DType::q5_1 ? 8 : 2;
}
constexpr int b32_qs(DType type) {
  return type == DType::q8_0 ? 32 : 16;
}

// GGUF blocks of 32 (Q4_0, Q4_1, Q5_0, Q8_0) of 8·H rows (rb bytes apart) into the layout above.
void repack_groups_b32(DType type, const uint8_t* w, size_t rb, int64_t nb, int H, uint8_t* out) {
  const int qs = b32_qs(type);
  const size_t head = b32_head(type), src_head = b32_src_head(type);
  const size_t bs = src_head + static_cast<size_t>(qs), blk = b32_block_bytes(type);
  for (int64_t b = 0; b < nb; ++b, out += static_cast<size_t>(H) * blk) {
    if (b32_fifth(type)) std::memset(out, 0, static_cast<size_t>(H) * head);
    for (int r = 0; r < 8 * H; ++r) {
      const uint8_t* src = w + static_cast<size_t>(r) * rb + static_cast<size_t>(b) * bs;
      const int h = r / 8, lane = r % 8;
      std::memcpy(out + q_scale_at(h) + 2 * lane, src, 2);
      if (b32_mins(type)) std::memcpy(out + q_min_at(H, h) + 2 * lane, src + 2, 2);
      if (b32_fifth(type)) { // element e's fifth bit into its nibble's byte of vector (e % 16) / 4
        uint32_t qh;
        std::memcpy(&qh, src + src_head - 4, 4);
        for (int e = 0; e < 32; ++e) {
          const int c = (e % 16) / 4, half = e / 16, i = e % 4;
          out[q_hmask_at(type, H, h, c, half) + static_cast<size_t>((4 * lane + i) / 8)] |=
              static_cast<uint8_t>(((qh >> e) & 1u) << ((4 * lane + i) % 8));
        }
      }
      for (int c = 0; c < qs / 4; ++c)
        std::memcpy(out + q_vec_at(H, h, c, head) + 4 * lane, src + src_head + 4 * c, 4);
    }
  }
}

// Row r (0..8H−1) of H groups stored together back to its GGUF blocks (nb of them).
void unpack_row_b32(DType type, const uint8_t* g, int64_t nb, int r, int H, uint8_t* out) {
  const int qs = b32_qs(type), h = r / 8, lane = r % 8;
  const size_t head = b32_head(type), src_head = b32_src_head(type);
  const size_t bs = src_head + static_cast<size_t>(qs), blk = b32_block_bytes(type);
  for (int64_t b = 0; b < nb; ++b, g += static_cast<size_t>(H) * blk, out += bs) {
    std::memcpy(out, g + q_scale_at(h) + 2 * lane, 2);
    if (b32_mins(type)) std::memcpy(out + 2, g + q_min_at(H, h) + 2 * lane, 2);
    if (b32_fifth(type)) { // value 16·half + 4c + i's bit is bit 4·lane + i of mask (c, half): a nibble
      uint32_t qh = 0;
      for (int half = 0; half < 2; ++half)
        for (int c = 0; c < 4; ++c) {
          const uint8_t byte = g[q_hmask_at(type, H, h, c, half) + static_cast<size_t>(lane / 2)];
          qh |= static_cast<uint32_t>((byte >> (4 * (lane % 2))) & 0xFu) << (16 * half + 4 * c);
        }
      std::memcpy(out + src_head - 4, &qh, 4);
    }
    for (int c = 0; c < qs / 4; ++c)
      std::memcpy(out + src_head + 4 * c, g + q_vec_at(H, h, c, head) + 4 * lane, 4);
  }
}

// H groups stored together (8·H rows) against one token: out[0..8H).
template <int H> void gemv_q8_0x8_scalar(const uint8_t* g, const BlockQ8* x, int64_t nb, float* out) {
  for (int r = 0; r < 8 * H; ++r)
    out[r] = 0.0f;
  for (int64_t b = 0; b < nb; ++b, g += H * k_q8x8_block)
    for (int r = 0; r < 8 * H; ++r) {
      int32_t acc = 0;
      for (int c = 0; c < 8; ++c)
        for (int i = 0; i < 4; ++i)
          acc += static_cast<int8_t>(g[q_vec_at(H, r / 8, c) + 4 * (r % 8) + i]) * x[b].qs[4 * c + i];
      out[r] += f16(g + q_scale_at(r / 8) + 2 * (r % 8)) * x[b].d * static_cast<float>(acc);
    }
}

// Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL (8·H rows) against one token: the integer sums of q·x (Q4_1, Q5_1: of the
// unsigned values; IQ4_NL: of its levels), then the type's float step (not the vector kernels' fused one:
// within rounding of them).
template <DType Q, int H> void gemv_q4x8_scalar(const uint8_t* g, const BlockQ8* x, int64_t nb, float* out) {
  constexpr size_t head = b32_head(Q), blk = b32_block_bytes(Q);
  constexpr int off = b32_mins(Q) ? 0 : Q == DType::q5_0 ? 16 : 8; // the weights' zero
  const auto value = [](int u) { // a nibble (with its fifth bit) as the weight's integer
    if constexpr (Q == DType::iq4_nl)
      return static_cast<int>(dtype_detail::k_iq4nl_values[u]);
    else
      return u - off;
  };
  for (int r = 0; r < 8 * H; ++r)
    out[r] = 0.0f;
  for (int64_t b = 0; b < nb; ++b, g += H * blk)
    for (int r = 0; r < 8 * H; ++r) {
      const int h = r / 8, lane = r % 8;
      const auto bit5 = [&](int c, int half, int i) { // Q5_0's / Q5_1's fifth bit, as 16
        if constexpr (!b32_fifth(Q)) return 0;
        const uint8_t m = g[q_hmask_at(Q, H, h, c, half) + static_cast<size_t>((4 * lane + i) / 8)];
        return 16 * ((m >> ((4 * lane + i) % 8)) & 1);
      };
      int32_t acc = 0;
      for (int c = 0; c < 4; ++c)
        for (int i = 0; i < 4; ++i) {
          const uint8_t q = g[q_vec_at(H, h, c, head) + 4 * lane + i];
          acc += value((q & 0x0F) + bit5(c, 0, i)) * x[b].qs[4 * c + i] +
                 value((q >> 4) + bit5(c, 1, i)) * x[b].qs[16 + 4 * c + i];
        }
      const float dw = f16(g + q_scale_at(h) + 2 * lane);
      if constexpr (b32_mins(Q))
        out[r] +=
            dw * (x[b].d * static_cast<float>(acc)) + f16(g + q_min_at(H, h) + 2 * lane) * (0.125f * x[b].s8);
      else
        out[r] += dw * x[b].d * static_cast<float>(acc);
    }
}

// The types repacked in groups of 8 rows by blocks of 32 (the layout above).
constexpr bool b32(DType type) {
  return type == DType::q4_0 || type == DType::q8_0 || type == DType::q4_1 || type == DType::q5_0 ||
         type == DType::q5_1 || type == DType::iq4_nl;
}

// The types repacked 8 rows at a time: the b32 layout, or the k-quants' super-blocks (KLayout).
constexpr bool repacked_type(DType type) {
  return b32(type) || type == DType::q2_k || type == DType::q3_k || type == DType::q4_k ||
         type == DType::q5_k || type == DType::q6_k || type == DType::iq4_xs;
}

// The lowest level with kernels for a type's repacked layout (below it its GGUF rows take the i8dq route
// from avx2 on): Q5_1 has only avx512_vnni's (gemm_*_x16_vnni, pairs of groups for one token as for
// several); Q2_K, Q3_K, Q5_K, IQ4_NL and IQ4_XS vector kernels from avx2 (whose int8 route on their GGUF
// rows they replace, not the exact products below it); the others every level.
constexpr Isa repack_level(DType type) {
  switch (type) {
  case DType::q5_1:
    return Isa::avx512_vnni;
  case DType::q2_k:
  case DType::q3_k:
  case DType::q5_k:
  case DType::iq4_nl:
  case DType::iq4_xs:
    return Isa::avx2;
  default:
    return Isa::scalar;
  }
}

// Whether a type has kernels for its repacked layout at this level.
constexpr bool repacked_kernels(Isa isa, DType type) {
  return repacked_type(type) && at_least(isa, repack_level(type));
}

// The one-token kernel of a b32 type for a pair of groups or a lone one, at avx2 or below (Q5_1: the scalar
// one, for an odd last group at avx512_vnni).
using GemvB32 = void (*)(const uint8_t*, const BlockQ8*, int64_t, float*);
GemvB32 gemv_b32(DType type, bool avx2, bool pair) {
  if (type == DType::q5_1) return pair ? gemv_q4x8_scalar<DType::q5_1, 2> : gemv_q4x8_scalar<DType::q5_1, 1>;
  if (type == DType::iq4_nl)
    return avx2 ? (pair ? gemv_q4x8_avx2<DType::iq4_nl, 2> : gemv_q4x8_avx2<DType::iq4_nl, 1>)
                : (pair ? gemv_q4x8_scalar<DType::iq4_nl, 2> : gemv_q4x8_scalar<DType::iq4_nl, 1>);
  if (type == DType::q4_0)
    return avx2 ? (pair ? gemv_q4x8_avx2<DType::q4_0, 2> : gemv_q4x8_avx2<DType::q4_0, 1>)
                : (pair ? gemv_q4x8_scalar<DType::q4_0, 2> : gemv_q4x8_scalar<DType::q4_0, 1>);
  if (type == DType::q4_1)
    return avx2 ? (pair ? gemv_q4x8_avx2<DType::q4_1, 2> : gemv_q4x8_avx2<DType::q4_1, 1>)
                : (pair ? gemv_q4x8_scalar<DType::q4_1, 2> : gemv_q4x8_scalar<DType::q4_1, 1>);
  if (type == DType::q5_0)
    return avx2 ? (pair ? gemv_q4x8_avx2<DType::q5_0, 2> : gemv_q4x8_avx2<DType::q5_0, 1>)
                : (pair ? gemv_q4x8_scalar<DType::q5_0, 2> : gemv_q4x8_scalar<DType::q5_0, 1>);
  return avx2 ? (pair ? gemv_q8_0x8_avx2<2> : gemv_q8_0x8_avx2<1>)
              : (pair ? gemv_q8_0x8_scalar<2> : gemv_q8_0x8_scalar<1>);
}

// k-quants: 256-element super-blocks against BlockQ8K activations.
void q4_k_scale_min(int j, const uint8_t* q, int& d, int& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K: y = d·sc_j·q − dmin·m_j per sub-block j of 32 →
//   Σ = x.d · (d · Σ_j sc_j · Σ q·xq − dmin · Σ_j m_j · Σ xq), the inner sums in integers.
float dot_q4_k_scalar(const uint8_t* w, const BlockQ8K* x, int64_t nsb) {
  float s = 0.0f;
  for (int64_t i = 0; i < nsb; ++i, w += 144, ++x) {
    const uint8_t* q = w + 16;
    int32_t sumq = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      q4_k_scale_min(j, w + 4, sc, m);
      int32_t acc = 0;
      for (int l = 0; l < 32; ++l)
        acc += ((j & 1) ? q[32 * (j / 2) + l] >> 4 : q[32 * (j / 2) + l] & 0xF) * x->qs[32 * j + l];
      sumq += sc * acc;
      summ += m * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
    }
    s += x->d * (f16(w) * static_cast<float>(sumq) - f16(w + 2) * static_cast<float>(summ));
  }
  return s;
}

// ---- Q4_K repacked in groups of 8 rows ("q4_kx8") ----
// Per group of 8 rows and super-block of 256 columns, 1152 bytes (the GGUF size): d[8] and dmin[8]
// (f16, row r at r); the 12 packed scale bytes of each row as three 32-byte vectors (vector u,
// dword r = row r's bytes 4u..4u+3), so the 6-bit scales and mins of all 8 rows unpack with a few
// vector ops; then per 64-column chunk j the 8 rows' 32 nibble bytes as eight 32-byte vectors whose
// dword r is row r's bytes 4c..4c+3 (low nibbles: sub-block 2j, columns 4c..4c+3; high nibbles:
// sub-block 2j+1).
// (k_q4kx8_block: kernels_internal.hpp)

// Row r's d, dmin, scales (the first 16 bytes of a Q4_K or Q5_K super-block, blk) and 128 nibble bytes (qs)
// into a group's q4_kx8 super-block, and back.
void put_k4_row(const uint8_t* blk, const uint8_t* qs, int r, uint8_t* out) {
  std::memcpy(out + 2 * r, blk, 2);
  std::memcpy(out + 16 + 2 * r, blk + 2, 2);
  for (int u = 0; u < 3; ++u)
    std::memcpy(out + 32 + 32 * u + 4 * r, blk + 4 + 4 * u, 4);
  for (int j = 0; j < 4; ++j)
    for (int c = 0; c < 8; ++c)
      std::memcpy(out + 128 + 256 * j + 32 * c + 4 * r, qs + 32 * j + 4 * c, 4);
}
void get_k4_row(const uint8_t* g, int r, uint8_t* blk, uint8_t* qs) {
  std::memcpy(blk, g + 2 * r, 2);
  std::memcpy(blk + 2, g + 16 + 2 * r, 2);
  for (int u = 0; u < 3; ++u)
    std::memcpy(blk + 4 + 4 * u, g + 32 + 32 * u + 4 * r, 4);
  for (int j = 0; j < 4; ++j)
    for (int c = 0; c < 8; ++c)
      std::memcpy(qs + 32 * j + 4 * c, g + 128 + 256 * j + 32 * c + 4 * r, 4);
}

void put_q4_k(const uint8_t* blk, int r, uint8_t* out) {
  put_k4_row(blk, blk + 16, r, out);
}

// Row r (0..7) of a repacked super-block back to its GGUF Q4_K super-block (zeroed by the caller).
void get_q4_k(const uint8_t* g, int r, uint8_t* blk) {
  get_k4_row(g, r, blk, blk + 16);
}

void gemv_q4_kx8_scalar(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out) {
  for (int r = 0; r < 8; ++r)
    out[r] = 0.0f;
  for (int64_t i = 0; i < nsb; ++i, g += k_q4kx8_block, ++x)
    for (int r = 0; r < 8; ++r) {
      uint8_t packed[12]; // row r's GGUF scale bytes
      for (int u = 0; u < 3; ++u)
        std::memcpy(packed + 4 * u, g + 32 + 32 * u + 4 * r, 4);
      int32_t sumq = 0, summ = 0;
      for (int s = 0; s < 8; ++s) {
        int sc, m;
        q4_k_scale_min(s, packed, sc, m);
        int32_t acc = 0;
        for (int c = 0; c < 8; ++c)
          for (int b = 0; b < 4; ++b) {
            const uint8_t q = g[128 + 256 * (s / 2) + 32 * c + 4 * r + b];
            acc += ((s & 1) ? q >> 4 : q & 0xF) * x->qs[32 * s + 4 * c + b];
          }
        sumq += sc * acc;
        summ += m * (x->bsums[2 * s] + x->bsums[2 * s + 1]);
      }
      out[r] +=
          x->d * (f16(g + 2 * r) * static_cast<float>(sumq) - f16(g + 16 + 2 * r) * static_cast<float>(summ));
    }
}

// ---- Q5_K repacked in groups of 8 rows ("q5_kx8") ----
// Per group of 8 rows and super-block, 1408 bytes (the GGUF size): the q4_kx8 super-block of its d, dmin,
// scales and low nibbles (1152), then per 64-column chunk j two 32-byte vectors of fifth bits: dword r,
// byte b, bit c of the first = the fifth bit of the low nibble in byte b of chunk j's vector c (column
// 64j + 4c + b), of the second = of the high nibble (column 64j + 32 + 4c + b).
// (k_q5kx8_block: kernels_internal.hpp)

void put_q5_k(const uint8_t* blk, int r, uint8_t* out) {
  put_k4_row(blk, blk + 48, r, out);
  for (int j = 0; j < 4; ++j)
    for (int half = 0; half < 2; ++half)
      for (int l = 0; l < 32; ++l) // qh[l]'s bit 2j + half: of column 64j + 32·half + l
        out[k_q4kx8_block + 64 * j + 32 * half + 4 * r + l % 4] |=
            static_cast<uint8_t>(((blk[16 + l] >> (2 * j + half)) & 1) << (l / 4));
}

// Row r (0..7) of a repacked super-block back to its GGUF Q5_K super-block (zeroed by the caller).
void get_q5_k(const uint8_t* g, int r, uint8_t* blk) {
  get_k4_row(g, r, blk, blk + 48);
  for (int j = 0; j < 4; ++j)
    for (int half = 0; half < 2; ++half)
      for (int l = 0; l < 32; ++l)
        blk[16 + l] |= static_cast<uint8_t>(
            ((g[k_q4kx8_block + 64 * j + 32 * half + 4 * r + l % 4] >> (l / 4)) & 1) << (2 * j + half));
}

void gemv_q5_kx8_scalar(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out) {
  uint8_t blk[176];
  for (int r = 0; r < 8; ++r)
    out[r] = 0.0f;
  for (int64_t i = 0; i < nsb; ++i, ++x)
    for (int r = 0; r < 8; ++r) {
      std::memset(blk, 0, sizeof blk);
      get_q5_k(g + static_cast<size_t>(i) * k_q5kx8_block, r, blk);
      int32_t sumq = 0, summ = 0;
      for (int s = 0; s < 8; ++s) {
        int sc, m;
        q4_k_scale_min(s, blk + 4, sc, m);
        int32_t acc = 0;
        for (int l = 0; l < 32; ++l) {
          const uint8_t q = blk[48 + 32 * (s / 2) + l];
          const int u = ((s & 1) ? q >> 4 : q & 0xF) | (((blk[16 + l] >> s) & 1) << 4);
          acc += u * x->qs[32 * s + l];
        }
        sumq += sc * acc;
        summ += m * (x->bsums[2 * s] + x->bsums[2 * s + 1]);
      }
      out[r] += x->d * (f16(blk) * static_cast<float>(sumq) - f16(blk + 2) * static_cast<float>(summ));
    }
}

// The 6-bit value of Q6_K element e (0..255) of a super-block, minus 32, and its scale index.
inline int q6_k_value(const uint8_t* w, int e, int& scale_idx) {
  const int n = e / 128, r = e % 128, k = r / 32, l = r % 32;
  const uint8_t* ql = w + 64 * n;
  const uint8_t* qh = w + 128 + 32 * n;
  const int lo = (k & 1) ? ql[l + 32] : ql[l];
  const int nib = (k & 2) ? lo >> 4 : lo & 0xF;
  scale_idx = 8 * n + l / 16 + 2 * k;
  return (nib | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
}

// Q6_K: y = d·sc_g·(q − 32) per group g of 16 → Σ = x.d · d · Σ_g sc_g · Σ (q−32)·xq.
float dot_q6_k_scalar(const uint8_t* w, const BlockQ8K* x, int64_t nsb) {
  float s = 0.0f;
  for (int64_t i = 0; i < nsb; ++i, w += 210, ++x) {
    const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
    int32_t sumq = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t acc = 0;
      int si = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e)
        acc += q6_k_value(w, e, si) * x->qs[e];
      sumq += sc[si] * acc;
    }
    s += x->d * f16(w + 208) * static_cast<float>(sumq);
  }
  return s;
}

// ---- Q6_K repacked in groups of 8 rows ("q6_kx8") ----
// Per group of 8 rows and super-block, 1680 bytes (the GGUF size): d[8] (f16); the 16 int8 scales
// as [pair p][row r][group 2p, 2p+1] (128); per group g of 16 columns two 32-byte nibble vectors
// (dword r, byte i of vector h: low nibble = low 4 bits of column 16g + 8h + i, high nibble = of
// column 16g + 8h + 4 + i) (1024); per group one 32-byte vector of high bits (dword r, byte i:
// bits 2k, 2k+1 = the top 2 bits of column 16g + 4k + i) (512).
// (k_q6kx8_block: kernels_internal.hpp)

void put_q6_k(const uint8_t* blk, int r, uint8_t* out) {
  std::memcpy(out + 2 * r, blk + 208, 2);
  for (int g = 0; g < 16; ++g)
    out[16 + 16 * (g / 2) + 2 * r + g % 2] = blk[192 + g];
  for (int col = 0; col < 256; ++col) {
    int si = 0;
    const int v = q6_k_value(blk, col, si) + 32; // 0..63
    const int g = col / 16, k = (col % 16) / 4, b = col % 4;
    out[144 + 64 * g + 32 * (k / 2) + 4 * r + b] |= static_cast<uint8_t>((v & 0xF) << (4 * (k % 2)));
    out[1168 + 32 * g + 4 * r + b] |= static_cast<uint8_t>((v >> 4) << (2 * k));
  }
}

// Row r (0..7) of a repacked super-block back to its GGUF Q6_K super-block (zeroed by the caller).
void get_q6_k(const uint8_t* g8, int r, uint8_t* blk) {
  std::memcpy(blk + 208, g8 + 2 * r, 2);
  for (int g = 0; g < 16; ++g)
    blk[192 + g] = g8[16 + 16 * (g / 2) + 2 * r + g % 2];
  for (int col = 0; col < 256; ++col) {
    const int g = col / 16, k = (col % 16) / 4, b = col % 4;
    const int lo = (g8[144 + 64 * g + 32 * (k / 2) + 4 * r + b] >> (4 * (k % 2))) & 0xF;
    const int hi = (g8[1168 + 32 * g + 4 * r + b] >> (2 * k)) & 3;
    // the GGUF packing q6_k_value reads
    const int n = col / 128, kk = (col % 128) / 32, l = col % 32;
    blk[64 * n + 32 * (kk & 1) + l] |= static_cast<uint8_t>(lo << (4 * (kk >> 1)));
    blk[128 + 32 * n + l] |= static_cast<uint8_t>(hi << (2 * kk));
  }
}

void gemv_q6_kx8_scalar(const uint8_t* g8, const BlockQ8K* x, int64_t nsb, float* out) {
  for (int r = 0; r < 8; ++r)
    out[r] = 0.0f;
  for (int64_t i = 0; i < nsb; ++i, g8 += k_q6kx8_block, ++x)
    for (int r = 0; r < 8; ++r) {
      int32_t sumq = 0;
      for (int g = 0; g < 16; ++g) {
        int32_t acc = 0;
        for (int c = 16 * g; c < 16 * g + 16; ++c) {
          const int k = (c % 16) / 4, b = c % 4;
          const int lo = (g8[144 + 64 * g + 32 * (k / 2) + 4 * r + b] >> (4 * (k % 2))) & 0xF;
          const int hi = (g8[1168 + 32 * g + 4 * r + b] >> (2 * k)) & 3;
          acc += ((lo | (hi << 4)) - 32) * x->qs[c];
        }
        sumq += static_cast<int8_t>(g8[16 + 16 * (g / 2) + 2 * r + g % 2]) * acc;
      }
      out[r] += x->d * f16(g8 + 2 * r) * static_cast<float>(sumq);
    }
}

// ---- Q3_K repacked in groups of 8 rows ("q3_kx8") ----
// Per group of 8 rows and super-block, 880 bytes (the GGUF size): d[8] (f16, row r at r); the 12 packed
// scale bytes of each row as three 32-byte vectors (vector u, dword r = row r's bytes 4u..4u+3, as q4_kx8);
// per group g of 16 columns one 32-byte vector of low bits (dword r, byte b: bits 2k, 2k+1 = the low 2 bits
// of column 16g + 4k + b) (512); per pair p of groups one 32-byte vector of third bits (dword r, byte b:
// bit k = that of column 32p + 4k + b, bit 4 + k = of column 32p + 16 + 4k + b) (256). A column's unsigned
// value u = low | third << 2 is 0..7; its weight is d·(scale − 32)·(u − 4).
// (k_q3kx8_block: kernels_internal.hpp)

// The unsigned 3-bit value u of Q3_K element e (0..255) of a GGUF super-block (dequant_q3_k's layout).
inline int q3_k_u(const uint8_t* blk, int e) {
  const int n = e / 128, j = (e % 128) / 32, l = e % 32;
  return ((blk[32 + 32 * n + l] >> (2 * j)) & 3) | (((blk[l] >> (4 * n + j)) & 1) << 2);
}

void put_q3_k(const uint8_t* blk, int r, uint8_t* out) {
  std::memcpy(out + 2 * r, blk + 108, 2);
  for (int u = 0; u < 3; ++u)
    std::memcpy(out + 16 + 32 * u + 4 * r, blk + 96 + 4 * u, 4);
  for (int col = 0; col < 256; ++col) {
    const int u = q3_k_u(blk, col), k = (col % 16) / 4, b = col % 4;
    out[q3_low_at(col / 16) + 4 * r + b] |= static_cast<uint8_t>((u & 3) << (2 * k));
    out[q3_high_at(col / 32) + 4 * r + b] |= static_cast<uint8_t>((u >> 2) << (4 * ((col / 16) % 2) + k));
  }
}

// The unsigned value of column col of row r in a repacked super-block.
inline int q3_kx8_u(const uint8_t* g, int r, int col) {
  const int k = (col % 16) / 4, b = col % 4;
  const int low = (g[q3_low_at(col / 16) + 4 * r + b] >> (2 * k)) & 3;
  const int third = (g[q3_high_at(col / 32) + 4 * r + b] >> (4 * ((col / 16) % 2) + k)) & 1;
  return low | third << 2;
}

// Row r (0..7) of a repacked super-block back to its GGUF Q3_K super-block (zeroed by the caller).
void get_q3_k(const uint8_t* g, int r, uint8_t* blk) {
  std::memcpy(blk + 108, g + 2 * r, 2);
  for (int u = 0; u < 3; ++u)
    std::memcpy(blk + 96 + 4 * u, g + 16 + 32 * u + 4 * r, 4);
  for (int col = 0; col < 256; ++col) {
    const int u = q3_kx8_u(g, r, col), n = col / 128, j = (col % 128) / 32, l = col % 32;
    blk[32 + 32 * n + l] |= static_cast<uint8_t>((u & 3) << (2 * j));
    blk[l] |= static_cast<uint8_t>((u >> 2) << (4 * n + j));
  }
}

void gemv_q3_kx8_scalar(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out) {
  for (int r = 0; r < 8; ++r)
    out[r] = 0.0f;
  for (int64_t i = 0; i < nsb; ++i, g += k_q3kx8_block, ++x)
    for (int r = 0; r < 8; ++r) {
      uint8_t packed[12]; // row r's GGUF scale bytes
      for (int u = 0; u < 3; ++u)
        std::memcpy(packed + 4 * u, g + 16 + 32 * u + 4 * r, 4);
      int32_t sumq = 0;
      for (int s = 0; s < 16; ++s) {
        int32_t acc = 0;
        for (int col = 16 * s; col < 16 * s + 16; ++col)
          acc += (q3_kx8_u(g, r, col) - 4) * x->qs[col];
        sumq += dtype_detail::q3_k_scale(packed, s) * acc;
      }
      out[r] += x->d * f16(g + 2 * r) * static_cast<float>(sumq);
    }
}

// ---- Q2_K repacked in groups of 8 rows ("q2_kx8") ----
// Per group of 8 rows and super-block, 672 bytes (the GGUF size): d[8] and dmin[8] (f16, row r at r); the 16
// scale bytes of each row (low nibble: scale, high: min, of each 16 columns) as four 32-byte vectors (vector
// u, dword r = row r's bytes 4u..4u+3); per group g of 16 columns one 32-byte vector of the 2-bit values
// laid out as q3_kx8's low bits (dword r, byte b: bits 2k, 2k+1 = column 16g + 4k + b).
// (k_q2kx8_block: kernels_internal.hpp)

void put_q2_k(const uint8_t* blk, int r, uint8_t* out) {
  std::memcpy(out + 2 * r, blk + 80, 2);
  std::memcpy(out + 16 + 2 * r, blk + 82, 2);
  for (int u = 0; u < 4; ++u)
    std::memcpy(out + 32 + 32 * u + 4 * r, blk + 4 * u, 4);
  for (int col = 0; col < 256; ++col) {
    const int n = col / 128, j = (col % 128) / 32, l = col % 32, k = (col % 16) / 4, b = col % 4;
    const int q = (blk[16 + 32 * n + l] >> (2 * j)) & 3;
    out[q2_vals_at(col / 16) + 4 * r + b] |= static_cast<uint8_t>(q << (2 * k));
  }
}

inline int q2_kx8_q(const uint8_t* g, int r, int col) {
  return (g[q2_vals_at(col / 16) + 4 * r + col % 4] >> (2 * ((col % 16) / 4))) & 3;
}

// Row r (0..7) of a repacked super-block back to its GGUF Q2_K super-block (zeroed by the caller).
void get_q2_k(const uint8_t* g, int r, uint8_t* blk) {
  std::memcpy(blk + 80, g + 2 * r, 2);
  std::memcpy(blk + 82, g + 16 + 2 * r, 2);
  for (int u = 0; u < 4; ++u)
    std::memcpy(blk + 4 * u, g + 32 + 32 * u + 4 * r, 4);
  for (int col = 0; col < 256; ++col) {
    const int n = col / 128, j = (col % 128) / 32, l = col % 32;
    blk[16 + 32 * n + l] |= static_cast<uint8_t>(q2_kx8_q(g, r, col) << (2 * j));
  }
}

// Q2_K: y = d·sc_s·q − dmin·m_s per group s of 16 → Σ = x.d · (d · Σ_s sc_s · Σ q·xq − dmin · Σ_s m_s ·
// bsum_s).
void gemv_q2_kx8_scalar(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out) {
  for (int r = 0; r < 8; ++r)
    out[r] = 0.0f;
  for (int64_t i = 0; i < nsb; ++i, g += k_q2kx8_block, ++x)
    for (int r = 0; r < 8; ++r) {
      int32_t sumq = 0, summ = 0;
      for (int s = 0; s < 16; ++s) {
        const uint8_t sb = g[32 + 32 * (s / 4) + 4 * r + s % 4];
        int32_t acc = 0;
        for (int col = 16 * s; col < 16 * s + 16; ++col)
          acc += q2_kx8_q(g, r, col) * x->qs[col];
        sumq += (sb & 0xF) * acc;
        summ += (sb >> 4) * x->bsums[s];
      }
      out[r] +=
          x->d * (f16(g + 2 * r) * static_cast<float>(sumq) - f16(g + 16 + 2 * r) * static_cast<float>(summ));
    }
}

// ---- IQ4_XS repacked in groups of 8 rows ("iq4_xsx8") ----
// Per group of 8 rows and super-block, 1088 bytes (the GGUF size): d[8] (f16, row r at r); each row's
// scales_l[4] as one 32-byte vector (dword r) and its u16 scales_h (row r at 2r) (48); per sub-block k of 32
// columns four 32-byte vectors c whose dword r is row r's index bytes 16k + 4c..4c+3 (low nibbles: columns
// 32k + 4c..4c+3, high: 32k + 16 + 4c..) (1024).
// (k_iq4xsx8_block: kernels_internal.hpp)

void put_iq4_xs(const uint8_t* blk, int r, uint8_t* out) {
  std::memcpy(out + 2 * r, blk, 2);
  std::memcpy(out + 16 + 4 * r, blk + 4, 4);
  std::memcpy(out + 48 + 2 * r, blk + 2, 2);
  for (int k = 0; k < 8; ++k)
    for (int c = 0; c < 4; ++c)
      std::memcpy(out + 64 + 128 * k + 32 * c + 4 * r, blk + 8 + 16 * k + 4 * c, 4);
}

// Row r (0..7) of a repacked super-block back to its GGUF IQ4_XS super-block (zeroed by the caller).
void get_iq4_xs(const uint8_t* g, int r, uint8_t* blk) {
  std::memcpy(blk, g + 2 * r, 2);
  std::memcpy(blk + 4, g + 16 + 4 * r, 4);
  std::memcpy(blk + 2, g + 48 + 2 * r, 2);
  for (int k = 0; k < 8; ++k)
    for (int c = 0; c < 4; ++c)
      std::memcpy(blk + 8 + 16 * k + 4 * c, g + 64 + 128 * k + 32 * c + 4 * r, 4);
}

void gemv_iq4_xsx8_scalar(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out) {
  uint8_t blk[136];
  for (int r = 0; r < 8; ++r)
    out[r] = 0.0f;
  for (int64_t i = 0; i < nsb; ++i, ++x)
    for (int r = 0; r < 8; ++r) {
      get_iq4_xs(g + static_cast<size_t>(i) * k_iq4xsx8_block, r, blk);
      uint16_t sh;
      std::memcpy(&sh, blk + 2, 2);
      int32_t sumq = 0;
      for (int k = 0; k < 8; ++k) {
        const int ls = ((blk[4 + k / 2] >> (4 * (k % 2))) & 0xF) | (((sh >> (2 * k)) & 3) << 4);
        int32_t acc = 0;
        for (int j = 0; j < 16; ++j) {
          const uint8_t q = blk[8 + 16 * k + j];
          acc += dtype_detail::k_iq4nl_values[q & 0xF] * x->qs[32 * k + j] +
                 dtype_detail::k_iq4nl_values[q >> 4] * x->qs[32 * k + 16 + j];
        }
        sumq += (ls - 32) * acc;
      }
      out[r] += x->d * f16(blk) * static_cast<float>(sumq);
    }
}

// A k-quant's 8-row layout: its GGUF super-block's and repacked super-block's bytes (8 rows), row r's GGUF
// super-block into a zeroed repacked one (put) and back into a zeroed GGUF one (get), and the scalar
// one-token kernel.
struct KLayout {
  size_t src_bytes, bytes;
  void (*put)(const uint8_t* blk, int r, uint8_t* out);
  void (*get)(const uint8_t* g, int r, uint8_t* blk);
  void (*scalar)(const uint8_t* g, const BlockQ8K* x, int64_t nsb, float* out);
};
KLayout k_layout(DType type) {
  switch (type) {
  case DType::q2_k:
    return {84, k_q2kx8_block, put_q2_k, get_q2_k, gemv_q2_kx8_scalar};
  case DType::q3_k:
    return {110, k_q3kx8_block, put_q3_k, get_q3_k, gemv_q3_kx8_scalar};
  case DType::q4_k:
    return {144, k_q4kx8_block, put_q4_k, get_q4_k, gemv_q4_kx8_scalar};
  case DType::q5_k:
    return {176, k_q5kx8_block, put_q5_k, get_q5_k, gemv_q5_kx8_scalar};
  case DType::iq4_xs:
    return {136, k_iq4xsx8_block, put_iq4_xs, get_iq4_xs, gemv_iq4_xsx8_scalar};
  default:
    return {210, k_q6kx8_block, put_q6_k, get_q6_k, gemv_q6_kx8_scalar};
  }
}

// Rows [0, 8) of a k-quant (rb bytes apart, nsb super-blocks each) into one repacked group.
void repack_group_k(const KLayout& L, const uint8_t* w, size_t rb, int64_t nsb, uint8_t* out) {
  for (int64_t i = 0; i < nsb; ++i, out += L.bytes) {
    std::memset(out, 0, L.bytes);
    for (int r = 0; r < 8; ++r)
      L.put(w + static_cast<size_t>(r) * rb + static_cast<size_t>(i) * L.src_bytes, r, out);
  }
}

// Row r (0..7) of a repacked group back to its nsb GGUF super-blocks.
void unpack_row_k(const KLayout& L, const uint8_t* g, int64_t nsb, int r, uint8_t* out) {
  for (int64_t i = 0; i < nsb; ++i, g += L.bytes, out += L.src_bytes) {
    std::memset(out, 0, L.src_bytes);
    L.get(g, r, out);
  }
}

// ---- run-time dispatch to the kernels of each level ----

// Four f32/f16/bf16 rows, rb bytes apart, against one token: the AVX-512 loop at that level, else AVX2.
void rows4_plain(Isa isa, DType type, const uint8_t* w, size_t rb, const float* x, int64_t K, float* out) {
  const bool wide = at_least(isa, Isa::avx512);
  if (type == DType::f32)
    (wide ? rows4_avx512<DType::f32> : rows4_f32_avx2)(w, rb, x, K, out);
  else if (type == DType::f16)
    (wide ? rows4_avx512<DType::f16> : rows4_half_avx2<DType::f16>)(w, rb, x, K, out);
  else
    (wide ? rows4_avx512<DType::bf16> : rows4_half_avx2<DType::bf16>)(w, rb, x, K, out);
}

// Token tiles at least this tall run on AMX (smaller ones: the VNNI kernel, whose setup is cheaper).
constexpr int64_t k_amx_min_tokens = 8;

// A tile of tokens in pieces of 16, 8, 4, 2 and 1 (the k-quants' int8 GEMMs, kernels_vnni.cpp).
template <class Kernel16, class Kernel8, class Kernel4, class Kernel2, class Kernel1>
void tiles_of_tokens(int64_t T, Kernel16 k16, Kernel8 k8, Kernel4 k4, Kernel2 k2, Kernel1 k1) {
  int64_t t = 0;
  for (; t + 16 <= T; t += 16)
    k16(t);
  if (t + 8 <= T) {
    k8(t);
    t += 8;
  }
  if (t + 4 <= T) {
    k4(t);
    t += 4;
  }
  if (t + 2 <= T) {
    k2(t);
    t += 2;
  }
  if (t < T) k1(t);
}

// A k-quant's one-token kernel for one group of 8 rows (below avx2: the scalar ones).
using GemvK = void (*)(const uint8_t*, const BlockQ8K*, int64_t, float*);
GemvK gemv_kx8(DType type, bool avx2) {
  if (avx2) switch (type) {
    case DType::q2_k:
      return gemv_q2_kx8_avx2;
    case DType::q3_k:
      return gemv_q3_kx8_avx2;
    case DType::q4_k:
      return gemv_q4_kx8_avx2;
    case DType::q5_k:
      return gemv_q5_kx8_avx2;
    case DType::q6_k:
      return gemv_q6_kx8_avx2;
    case DType::iq4_xs:
      return gemv_iq4_xsx8_avx2;
    default:
      break;
    }
  return k_layout(type).scalar;
}

// The same kernels over four groups read side by side (the k-quants with AVX2 kernels).
using GemvK4 = void (*)(const uint8_t* const*, const BlockQ8K*, int64_t, float* const*);
GemvK4 gemv_kx8_p4(DType type) {
  switch (type) {
  case DType::q2_k:
    return gemv_q2_kx8_avx2_p<4>;
  case DType::q3_k:
    return gemv_q3_kx8_avx2_p<4>;
  case DType::q4_k:
    return gemv_q4_kx8_avx2_p<4, false>;
  case DType::q5_k:
    return gemv_q4_kx8_avx2_p<4, true>;
  case DType::iq4_xs:
    return gemv_iq4_xsx8_avx2_p<4>;
  default:
    return gemv_q6_kx8_avx2_p<4>;
  }
}

bool cpu_has(Isa level) noexcept {
  __builtin_cpu_init(); // libgcc's cpuid model also checks that the OS saves the YMM / ZMM state (XCR0)
  switch (level) {
  case Isa::scalar:
    return true;
  case Isa::avx2:
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  case Isa::avx512:
    return cpu_has(Isa::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  case Isa::avx512_vnni:
    return cpu_has(Isa::avx512) && __builtin_cpu_supports("avx512vnni");
  case Isa::avx512_bf16:
    return cpu_has(Isa::avx512_vnni) && __builtin_cpu_supports("avx512bf16");
  case Isa::amx: {
    // Linux hands out the AMX tile state only on request (without it the first tile instruction
    // faults); the request holds for the whole process, so once is enough
    static const bool granted =
        __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") &&
        __builtin_cpu_supports("amx-bf16") &&
        syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    return cpu_has(Isa::avx512_bf16) && granted;
  }
  }
  return false;
}

} // namespace

bool isa_supported(Isa level) noexcept {
  return cpu_has(level);
}

Isa cpu_isa() noexcept {
  Isa best = Isa::scalar;
  for (Isa l : k_isa_levels)
    if (cpu_has(l)) best = l;
  return best;
}

Isa detect_isa() {
  const Isa have = cpu_isa();
  const char* e = std::getenv("LOOM_CPU_ISA");
  if (!e || !*e) return have;
  const std::string s(e);
  std::string names;
  for (Isa l : k_isa_levels) {
    if (s == isa_name(l)) {
      if (!cpu_has(l))
        fail(Errc::unsupported, "cpu",
             std::string("LOOM_CPU_ISA=") + s + ": this CPU lacks it (it runs up to " + isa_name(have) +
                 "); unset LOOM_CPU_ISA or name a lower level");
      return l;
    }
    names += (names.empty() ? "" : ", ") + std::string(isa_name(l));
  }
  fail(Errc::invalid_argument, "cpu",
       "LOOM_CPU_ISA=" + s + ": unknown level; expected one of " + names +
           " (or unset: the best this CPU runs)");
}

const char* isa_name(Isa isa) noexcept {
  switch (isa) {
  case Isa::scalar:
    return "scalar";
  case Isa::avx2:
    return "avx2";
  case Isa::avx512:
    return "avx512";
  case Isa::avx512_vnni:
    return "avx512_vnni";
  case Isa::avx512_bf16:
    return "avx512_bf16";
  case Isa::amx:
    return "amx";
  }
  return "?";
}

void dequantize(Isa isa, DType type, const uint8_t* w, float* y, int64_t n) {
  if (at_least(isa, Isa::avx2)) {
    switch (type) {
    case DType::f16:
      return dequant_f16_avx2(w, y, n);
    case DType::q8_0:
      if (n % 32 == 0) return dequant_q8_0_avx2(w, y, n / 32);
      break;
    case DType::q4_0:
      if (n % 32 == 0) return dequant_q4_0_avx2(w, y, n / 32);
      break;
    default:
      if (dq_supports(isa, type) && n % dtype_traits(type).block_size == 0)
        return dequantize_dq(type, w, y, n);
      break;
    }
  }
  dequantize_row(type, w, y, n);
}

bool repackable(Isa isa, DType type, int64_t K, int64_t N) noexcept {
  return repacked_kernels(isa, type) && K % dtype_traits(type).block_size == 0 && N % 8 == 0;
}

namespace {
size_t group_bytes(DType type, int64_t K) {
  return b32(type) ? static_cast<size_t>(K / 32) * b32_block_bytes(type)
                   : static_cast<size_t>(K / 256) * k_layout(type).bytes;
}
} // namespace

size_t repacked_bytes(DType type, int64_t K, int64_t N) {
  return static_cast<size_t>(N / 8) * group_bytes(type, K);
}

void repack(DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, uint8_t* out) {
  const size_t gb = group_bytes(type, K);
  if (b32(type)) { // pairs of groups, an odd last group alone
    const int64_t units = (N / 8 + 1) / 2;
#pragma omp parallel for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      const int H = 2 * u + 1 < N / 8 ? 2 : 1;
      repack_groups_b32(type, w + static_cast<size_t>(16 * u) * row_bytes, row_bytes, K / 32, H,
                        out + static_cast<size_t>(2 * u) * gb);
    }
    return;
  }
  const KLayout layout = k_layout(type);
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < N / 8; ++g)
    repack_group_k(layout, w + static_cast<size_t>(8 * g) * row_bytes, row_bytes, K / 256,
                   out + static_cast<size_t>(g) * gb);
}

void dequantize_repacked(Isa isa, DType type, const uint8_t* wp, int64_t K, int64_t N, int64_t row,
                         float* y) {
  uint8_t blocks[16 * 210]; // a few GGUF blocks at a time, no allocation
  if (b32(type)) {
    const int64_t u = row / 16; // its pair, or the odd last group
    const int H = 2 * u + 1 < N / 8 ? 2 : 1;
    const uint8_t* g = wp + static_cast<size_t>(2 * u) * group_bytes(type, K);
    for (int64_t b0 = 0; b0 < K / 32; b0 += 16) {
      const int64_t n = std::min<int64_t>(16, K / 32 - b0);
      unpack_row_b32(type, g + static_cast<size_t>(b0 * H) * b32_block_bytes(type), n,
                     static_cast<int>(row % 16), H, blocks);
      dequantize(isa, type, blocks, y + 32 * b0, 32 * n);
    }
  } else {
    const KLayout layout = k_layout(type);
    const uint8_t* g = wp + static_cast<size_t>(row / 8) * group_bytes(type, K);
    const int r = static_cast<int>(row % 8);
    if ((type == DType::q2_k || type == DType::q3_k || type == DType::q5_k) && at_least(isa, Isa::avx2)) {
      dequantize_kx8_row(type, g, r, K, y); // read in place (unpacking their bit fields costs more)
      return;
    }
    for (int64_t i0 = 0; i0 < K / 256; i0 += 16) {
      const int64_t n = std::min<int64_t>(16, K / 256 - i0);
      unpack_row_k(layout, g + static_cast<size_t>(i0) * layout.bytes, n, r, blocks);
      dequantize(isa, type, blocks, y + 256 * i0, 256 * n);
    }
  }
}

namespace {
// Inside a parallel region: this thread's share of y = W·x for one token and one repacked matrix, with
// no barrier (the matrices of gemv_repacked_multi follow each other without waiting). xq / xqk: the token
// quantized in blocks of 32 (q4_0 / q8_0) or 256 (k-quants).
void gemv_share_repacked(Isa isa, const Gemv& m, int64_t K, const BlockQ8* xq, const BlockQ8K* xqk) {
  const DType type = m.type;
  const bool kquant = dtype_traits(type).block_size == 256;
  const int64_t nb = kquant ? K / 256 : K / 32, N = m.N;
  const size_t gb = group_bytes(type, K);
  const bool avx2 = at_least(isa, Isa::avx2);
  const int nt = omp_get_num_threads(), id = omp_get_thread_num();
  constexpr int P = 4;
  if (!kquant) { // Q4_0 / Q8_0: pairs of groups (16 rows) and an odd last group
    const int64_t pairs = N / 16;
    int64_t u_from = 0;         // units (pairs, then the odd group) before it are done
    if (int8_gemm(isa, type)) { // P runs of pairs per thread, P streams
      const int64_t units = pairs / P;
      runs_side_by_side<P>(P * (units * id / nt), P * (units * (id + 1) / nt), [&](const int64_t(&pr)[P]) {
        const uint8_t* g[P];
        float* yo[P];
        for (int h = 0; h < P; ++h) {
          g[h] = m.w + static_cast<size_t>(2 * pr[h]) * gb;
          yo[h] = m.y + 16 * pr[h];
        }
        pairs_kernel4(type)(g, xq, nb, yo);
      });
      for (int64_t pr = P * units + id; pr < pairs; pr += nt) { // the last pairs, fewer than P per thread
        const uint8_t* g[1] = {m.w + static_cast<size_t>(2 * pr) * gb};
        float* yo[1] = {m.y + 16 * pr};
        pairs_kernel1(type)(g, xq, nb, yo);
      }
      u_from = pairs;
    }
    // The rest a unit at a time, split in contiguous runs (one stream each) over the threads.
    const int64_t n_units = (N / 8 + 1) / 2, rest = n_units - u_from;
    for (int64_t u = u_from + rest * id / nt; u < u_from + rest * (id + 1) / nt; ++u) {
      const uint8_t* wg = m.w + static_cast<size_t>(2 * u) * gb;
      float* out = m.y + 16 * u;
      gemv_b32(type, avx2, u < pairs)(wg, xq, nb, out);
    }
    return;
  }
  int64_t g_from = 0;         // groups before it are done
  if (int8_gemm(isa, type)) { // the VNNI kernel, pairs of groups (16 rows) in contiguous runs per thread
    // (prefetching 8 super-blocks ahead it beats the AVX2 kernel below at Q4_K and Q6_K too: s110 decode
    // 447 → 496–515 and 320 → 331–345 tok/s on this Xeon; the same floats)
    const int64_t pairs = N / 16;
    const GemmK one = ktiles(type).t1;
    for (int64_t pr = pairs * id / nt; pr < pairs * (id + 1) / nt; ++pr) {
      const uint8_t* g0 = m.w + static_cast<size_t>(2 * pr) * gb;
      one(g0, g0 + gb, xqk, nb, m.y + 16 * pr, N);
    }
    g_from = 2 * pairs;
  } else if (avx2) { // P runs of 8-row groups per thread, read side by side
    const int64_t groups = N / 8, units = groups / P;
    const GemvK4 kernel = gemv_kx8_p4(type);
    runs_side_by_side<P>(P * (units * id / nt), P * (units * (id + 1) / nt), [&](const int64_t(&g)[P]) {
      const uint8_t* gs[P];
      float* outs[P];
      for (int h = 0; h < P; ++h) {
        gs[h] = m.w + static_cast<size_t>(g[h]) * gb;
        outs[h] = m.y + 8 * g[h];
      }
      kernel(gs, xqk, nb, outs);
    });
    g_from = P * units;
  }
  // The rest one group at a time: split in contiguous runs (one stream each) over the threads.
  const int64_t rest = N / 8 - g_from;
  for (int64_t g = g_from + rest * id / nt; g < g_from + rest * (id + 1) / nt; ++g) {
    gemv_kx8(type, avx2)(m.w + static_cast<size_t>(g) * gb, xqk, nb, m.y + 8 * g);
  }
}

// Q4_1 / Q5_x / IQ4_NL / Q2_K / Q3_K / Q5_K / IQ4_XS rows on the int8 route: this thread's contiguous run of
// 4-row blocks, as matmul_i8dq() splits them (so the same floats).
void gemv_share_i8dq(const Gemv& m, int64_t K, const BlockQ8* xq, const BlockQ8K* xqk) {
  const int nt = omp_get_num_threads(), id = omp_get_thread_num();
  const int64_t n_blk = (m.N + 3) / 4;
  const int64_t j0 = std::min(m.N, 4 * (n_blk * id / nt)), j1 = std::min(m.N, 4 * (n_blk * (id + 1) / nt));
  i8dq_rows(m.type, m.w, m.row_bytes, i8dq_superblocks(m.type) ? static_cast<const void*>(xqk) : xq, K, j0,
            j1, m.y);
}

// Rows [j0, j1) of a row-major F32 / F16 / BF16 matrix (AVX2 and up) against one token, four at a time from
// four runs side by side (runs_side_by_side). Reading each 4-row block at once instead (four streams 2–6 KB
// long, the next block prefetched) ran at 27–28 GB/s on a 2-core Xeon that reads 31–32 with four long
// streams a thread: SmolLM2 F32 decode 47.5–49 → 50–52 tok/s. The last (j1 - j0) % 4 rows are the window of
// four ending at j1 (rows of a matrix of fewer than four: one at a time); a row's result is the same
// whatever the split.
void rows_plain_side_by_side(Isa isa, const Gemv& m, int64_t K, const float* x, int64_t j0, int64_t j1) {
  const auto at = [&](int64_t r) { return m.w + static_cast<size_t>(r) * m.row_bytes; };
  float out[4];
  const int64_t rest = runs_side_by_side<4>(j0, j1, [&](const int64_t(&r)[4]) {
    rows4_plain(isa, m.type, at(r[0]), static_cast<size_t>(r[1] - r[0]) * m.row_bytes, x, K, out);
    for (int s = 0; s < 4; ++s)
      m.y[r[s]] = out[s];
  });
  if (rest == j1) return;
  if (m.N < 4) {
    for (int64_t r = rest; r < j1; ++r)
      m.y[r] = m.type == DType::f32   ? dot_f32_avx2(at(r), x, K)
               : m.type == DType::f16 ? dot_f16_avx2(at(r), x, K)
                                      : dot_bf16_avx2(at(r), x, K);
    return;
  }
  rows4_plain(isa, m.type, at(j1 - 4), m.row_bytes, x, K, out);
  for (int64_t r = rest; r < j1; ++r)
    m.y[r] = out[r - (j1 - 4)];
}

// This thread's equal share of m's rows (in runs of four) for rows_plain_side_by_side.
void gemv_share_plain(Isa isa, const Gemv& m, int64_t K, const float* x) {
  const int nt = omp_get_num_threads(), id = omp_get_thread_num();
  const int64_t n_blk = (m.N + 3) / 4;
  rows_plain_side_by_side(isa, m, K, x, std::min(m.N, 4 * (n_blk * id / nt)),
                          std::min(m.N, 4 * (n_blk * (id + 1) / nt)));
}

} // namespace

bool gemv_multi_supports(Isa isa, DType type, bool repacked) noexcept {
  if (repacked && type == DType::bf16) return at_least(isa, Isa::avx512_bf16);
  if (repacked && type == DType::f16) return at_least(isa, Isa::avx512);
  if (repacked) return repacked_kernels(isa, type);
  return at_least(isa, Isa::avx2) &&
         (type == DType::f32 || type == DType::f16 || type == DType::bf16 || dq_supports(isa, type));
}

namespace {

// gemv_multi's distinct activations (x, and those of matrices with their own: a mixture of experts' down
// projections), each converted once to what its matrices' kernels read; act_of[i]: matrix i's.
struct GemvActs {
  struct Act {
    const float* x = nullptr;
    bool blocks32 = false, blocks256 = false, bf16 = false;
    std::vector<BlockQ8> xq;
    std::vector<BlockQ8K> xqk;
    std::vector<uint16_t> xb;
  };
  std::vector<Act> acts;
  std::vector<int> act_of;

  GemvActs(Isa isa, const Gemv* mats, int n_mats, int64_t K, const float* x) {
    act_of.resize(static_cast<size_t>(n_mats));
    for (int i = 0; i < n_mats; ++i) {
      const float* xi = mats[i].x ? mats[i].x : x;
      auto it = std::find_if(acts.begin(), acts.end(), [&](const Act& a) { return a.x == xi; });
      if (it == acts.end()) {
        acts.emplace_back();
        acts.back().x = xi;
        it = acts.end() - 1;
      }
      act_of[static_cast<size_t>(i)] = static_cast<int>(it - acts.begin());
      if (mats[i].i8) (i8dq_superblocks(mats[i].type) ? it->blocks256 : it->blocks32) = true;
      const bool kquant = dtype_traits(mats[i].type).block_size == 256;
      if (mats[i].row_bytes == 0 && mats[i].type != DType::f16)
        (mats[i].type == DType::bf16 ? it->bf16 : kquant ? it->blocks256 : it->blocks32) = true;
    }
    // Each token quantized on this thread (a few µs at most): a parallel loop over one row has nothing to
    // share.
    for (Act& a : acts) {
      if (a.bf16) {
        a.xb.resize(static_cast<size_t>(K));
        to_bf16(isa, a.x, a.xb.data(), K);
      }
      if (a.blocks32) {
        a.xq.resize(static_cast<size_t>(K / 32));
        quantize_rows(isa, a.x, K, 1, a.xq.data(), 1);
      }
      if (a.blocks256) {
        a.xqk.resize(static_cast<size_t>(K / 256));
        quantize_rows_k(isa, a.x, K, 1, a.xqk.data(), 1);
      }
    }
  }
  const Act& of(int i) const { return acts[static_cast<size_t>(act_of[static_cast<size_t>(i)])]; }
};

} // namespace

void gemv_multi(Isa isa, const Gemv* mats, int n_mats, int64_t K, const float* x, int n_threads) {
  int64_t work = 0;
  for (int i = 0; i < n_mats; ++i) {
    if (mats[i].i8 ? !i8dq_supports(isa, mats[i].type) || K % dtype_traits(mats[i].type).block_size != 0
                   : !gemv_multi_supports(isa, mats[i].type, mats[i].row_bytes == 0))
      std::abort(); // a caller's bug
    work += mats[i].N * K;
  }
  const GemvActs acts(isa, mats, n_mats, K, x);
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
#pragma omp parallel num_threads(threads) if (work > 32768)
  for (int i = 0; i < n_mats; ++i) {
    const GemvActs::Act& a = acts.of(i);
    if (mats[i].row_bytes == 0 && mats[i].type == DType::bf16)
      gemv_share_bf16x64(reinterpret_cast<const uint16_t*>(mats[i].w), K, mats[i].N, a.xb.data(), mats[i].y);
    else if (mats[i].row_bytes == 0 && mats[i].type == DType::f16)
      gemv_share_f16x64(reinterpret_cast<const uint16_t*>(mats[i].w), K, mats[i].N, a.x, mats[i].y);
    else if (mats[i].row_bytes == 0)
      gemv_share_repacked(isa, mats[i], K, a.xq.data(), a.xqk.data());
    else if (mats[i].i8)
      gemv_share_i8dq(mats[i], K, a.xq.data(), a.xqk.data());
    else if (mats[i].type != DType::f32 && mats[i].type != DType::f16 && mats[i].type != DType::bf16)
      gemv_share_dq(mats[i].type, mats[i].w, mats[i].row_bytes, K, mats[i].N, a.x, mats[i].y);
    else
      gemv_share_plain(isa, mats[i], K, a.x);
  }
}

void matmul_repacked(Isa isa, DType type, const uint8_t* wp, int64_t K, int64_t N, const float* x, int64_t T,
                     float* y, int n_threads) {
  if (T == 1) { // decode
    const Gemv m{type, wp, 0, N, y};
    gemv_multi(isa, &m, 1, K, x, n_threads);
    return;
  }
  const size_t gb = group_bytes(type, K);
  const bool kquant = dtype_traits(type).block_size == 256;
  const int64_t nb = kquant ? K / 256 : K / 32;
  std::vector<BlockQ8> xq;
  std::vector<BlockQ8K> xqk;
  const bool avx2 = at_least(isa, Isa::avx2);
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
  if (!kquant) {
    xq.resize(static_cast<size_t>(T * nb));
    quantize_rows(isa, x, K, T, xq.data(), threads);
  } else {
    xqk.resize(static_cast<size_t>(T * nb));
    quantize_rows_k(isa, x, K, T, xqk.data(), threads);
  }
  int64_t g_from = 0;         // groups before it are done
  if (int8_gemm(isa, type)) { // 16 rows against ≤ 16 tokens
    const int64_t pairs = N / 16;
    const bool amx = at_least(isa, Isa::amx);
    // Blocked for the caches: a chunk of row pairs (≈ 128 KiB of weights, kept in L2) against each tile
    // of 16 tokens in turn (their activations stay in L1 across the chunk's pairs).
    // The chunks are a multiple of the threads in number and equal to a pair, so the threads' shares
    // are too (3 chunks of 7 pairs for 2 threads left one waiting a third of a k/v projection).
    const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>((128u << 10) / (2 * gb)));
    const int64_t per_thread = (pairs + threads - 1) / threads;
    const int64_t n_chunks = std::min<int64_t>(pairs, threads * ((per_thread + chunk - 1) / chunk));
    const auto tb = [&](int64_t t) { return static_cast<size_t>(t) * static_cast<size_t>(nb); };
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K * T > 32768)
    for (int64_t c = 0; c < n_chunks; ++c)
      for (int64_t t0 = 0; t0 < T; t0 += 16)
        for (int64_t gp = pairs * c / n_chunks; gp < pairs * (c + 1) / n_chunks; ++gp) {
          const uint8_t* g0 = wp + static_cast<size_t>(2 * gp) * gb;
          const uint8_t* g1 = g0 + gb; // (the k-quants' groups; Q4_0 / Q8_0 pairs start at g0)
          const int64_t tt = std::min<int64_t>(16, T - t0);
          float* yt = y + t0 * N + 16 * gp;
          if (amx && tt >= k_amx_min_tokens && type == DType::q4_0)
            gemm_x16_amx<true>(g0, xq.data() + tb(t0), nb, static_cast<int>(tt), yt, N);
          else if (amx && tt >= k_amx_min_tokens && type == DType::q8_0)
            gemm_x16_amx<false>(g0, xq.data() + tb(t0), nb, static_cast<int>(tt), yt, N);
          else if (b32(type))
            tokens_kernel(type)(g0, xq.data() + tb(t0), nb, tt, yt, N);
          else {
            const BlockQ8K* xk = xqk.data() + tb(t0);
            const KTiles k = ktiles(type);
            const auto run = [&](GemmK kernel) {
              return [&, kernel](int64_t t) { kernel(g0, g1, xk + tb(t), nb, yt + t * N, N); };
            };
            tiles_of_tokens(tt, run(k.t16), run(k.t8), run(k.t4), run(k.t2), run(k.t1));
          }
        }
    g_from = 2 * pairs; // an odd last group: the AVX2 kernel below
  }
  if (g_from == N / 8) return;
  if (!kquant) { // pairs (16 rows) and an odd last group, a unit's weights kept in cache across the tokens
    const int64_t pairs = N / 16;
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K * T > 32768)
    for (int64_t u = g_from / 2; u < (N / 8 + 1) / 2; ++u)
      for (int64_t t = 0; t < T; ++t) {
        const uint8_t* wg = wp + static_cast<size_t>(2 * u) * gb;
        const bool pair = u < pairs;
        float out[16];
        gemv_b32(type, avx2, pair)(wg, xq.data() + t * nb, nb, out);
        std::memcpy(y + t * N + 16 * u, out, (pair ? 16 : 8) * sizeof(float));
      }
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K * T > 32768)
  for (int64_t g = g_from; g < N / 8; ++g)
    for (int64_t t = 0; t < T; ++t) { // a group's weights stay in cache across the tokens
      float out[8];
      gemv_kx8(type, avx2)(wp + static_cast<size_t>(g) * gb, xqk.data() + t * nb, nb, out);
      std::memcpy(y + t * N + 8 * g, out, sizeof out);
    }
}

namespace {
// n elements of v from a 64-byte boundary (v grown to hold them): tile rows that straddle cache lines load at
// about two thirds of the speed.
template <class T> T* aligned64(std::vector<T>& v, size_t n) {
  v.resize(n + 64 / sizeof(T));
  const auto at = reinterpret_cast<uintptr_t>(v.data());
  return v.data() + ((64 - at % 64) % 64) / sizeof(T);
}
} // namespace

bool exact_tiles(Isa isa, DType type, int64_t N) noexcept {
  return at_least(isa, Isa::amx) && type == DType::q4_1 && N % 16 == 0;
}

void matmul_repacked_exact(DType type, const uint8_t* wp, int64_t K, int64_t N, const float* x, int64_t T,
                           float* y, int n_threads, ExactTilesWork& work, bool same_x) {
  if (type != DType::q4_1 || N % 16 != 0 || K % 32 != 0) std::abort(); // callers check exact_tiles
  const int64_t nb = K / 32, pairs = N / 16;
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
  // each thread's pairs (an equal share) in chunks whose B tiles (1 KiB a block) stay in L2 across the token
  // tiles, taken 4, then 2, then 1 at a time
  const int64_t chunk = std::max<int64_t>(4, (256 << 10) / (nb << 10));
  const int64_t per_thread = (pairs + threads - 1) / threads;
  const int64_t n_chunks = std::min<int64_t>(pairs, threads * ((per_thread + chunk - 1) / chunk));
  // work: the tokens' A tiles (per tile of 16: nb blocks × 3 parts × 512), their block sums, and each
  // thread's B tiles for a chunk — each from a 64-byte boundary
  const auto up64 = [](size_t n) { return (n + 31) / 32 * 32; };
  const size_t tile_vals = static_cast<size_t>(nb) * 3 * 512, tb = static_cast<size_t>(nb) * 512;
  const size_t a_vals = up64(static_cast<size_t>((T + 15) / 16) * tile_vals);
  const size_t s_vals = up64(2 * static_cast<size_t>(T * nb));
  const size_t b_vals = static_cast<size_t>((pairs + n_chunks - 1) / n_chunks) * tb;
  const size_t a_size = work.a.size();
  uint16_t* xa = aligned64(work.a, a_vals + s_vals); // (the same size: no reallocation, the same split)
  auto* sx = reinterpret_cast<float*>(xa + a_vals);
  uint16_t* bq_all = aligned64(work.b, static_cast<size_t>(threads) * b_vals);
  if (!same_x || work.a.size() != a_size)
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t t = 0; t < T; ++t)
      split_bf16x3(x + t * K, K, static_cast<int>(t % 16), xa + static_cast<size_t>(t / 16) * tile_vals,
                   sx + t * nb);
  const size_t gb = static_cast<size_t>(nb) * 2 * k_q41x8_block;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t g0 = pairs * c / n_chunks, g1 = pairs * (c + 1) / n_chunks;
    uint16_t* bq = bq_all + static_cast<size_t>(omp_get_thread_num()) * b_vals;
    for (int64_t g = g0; g < g1; ++g)
      q4_1_pair_tiles(wp + static_cast<size_t>(g) * gb, nb, bq + static_cast<size_t>(g - g0) * tb);
    for (int64_t t0 = 0; t0 < T; t0 += 16) {
      const int tt = static_cast<int>(std::min<int64_t>(16, T - t0));
      const uint16_t* a = xa + static_cast<size_t>(t0 / 16) * tile_vals;
      for (int64_t g = g0; g < g1;) {
        const auto run = [&](auto kernel, int n) {
          kernel(wp + static_cast<size_t>(g) * gb, gb, bq + static_cast<size_t>(g - g0) * tb, tb, a,
                 sx + t0 * nb, nb, tt, y + t0 * N + 16 * g, N);
          g += n;
        };
        if (g + 4 <= g1)
          run(gemm_q4_1_amx_exact<4>, 4);
        else if (g + 2 <= g1)
          run(gemm_q4_1_amx_exact<2>, 2);
        else
          run(gemm_q4_1_amx_exact<1>, 1);
      }
    }
  }
}

bool int8_gemm(Isa isa, DType type) noexcept {
  return at_least(isa, Isa::avx512_vnni) && repacked_type(type);
}

bool repacked_loop_light(Isa isa, DType type) noexcept {
  return int8_gemm(isa, type) || repack_level(type) == Isa::scalar;
}

bool i8dq_supports(Isa isa, DType type) noexcept {
  return at_least(isa, Isa::avx2) &&
         (type == DType::q4_1 || type == DType::q5_0 || type == DType::q5_1 || type == DType::iq4_nl ||
          type == DType::q5_k || type == DType::iq4_xs || type == DType::q2_k || type == DType::q3_k);
}

void matmul_i8dq(Isa isa, DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N,
                 const float* x, int64_t T, float* y, int n_threads) {
  if (!i8dq_supports(isa, type) || K % dtype_traits(type).block_size != 0)
    std::abort(); // callers check; reaching here is a bug
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
  // the token's 8-bit blocks: of 256 for the super-block types, of 32 for the others
  const bool k = i8dq_superblocks(type);
  std::vector<BlockQ8> xq(k ? 0 : static_cast<size_t>(T * (K / 32)));
  std::vector<BlockQ8K> xqk(k ? static_cast<size_t>(T * (K / 256)) : 0);
  if (k)
    quantize_rows_k(isa, x, K, T, xqk.data(), threads);
  else
    quantize_rows(isa, x, K, T, xq.data(), threads);
  const auto token = [&](int64_t t) -> const void* {
    return k ? static_cast<const void*>(xqk.data() + t * (K / 256)) : xq.data() + t * (K / 32);
  };
#pragma omp parallel num_threads(threads) if (N * K * T > 32768)
  {
    // contiguous runs of 4-row blocks per thread, as gemv_share_i8dq splits them
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t n_blk = (N + 3) / 4;
    const int64_t j0 = std::min(N, 4 * (n_blk * id / nt)), j1 = std::min(N, 4 * (n_blk * (id + 1) / nt));
    // A tile of rows at a time, every token against it while it is in cache: a batch reads the weights
    // once, not once per token (the same products in the same order: the same floats).
    constexpr int64_t kTile = 128; // rows (a multiple of 4): ≤ 150 KiB of Q5_1 rows at K = 1536
    for (int64_t a = j0; a < j1; a += kTile) {
      const int64_t b = std::min(j1, a + kTile);
      for (int64_t t = 0; t < T; ++t)
        i8dq_rows(type, w, row_bytes, token(t), K, a, b, y + t * N);
    }
  }
}

bool has_kernel(DType t) noexcept {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::q8_0 || t == DType::q4_0 ||
         t == DType::q4_k || t == DType::q6_k;
}

namespace {

// What every row of one matmul() call shares: the activations, quantized once per call for the integer
// types (shared by every weight row), and one weight row's dot product with one token.
struct MatmulInput {
  MatmulInput(Isa isa_, DType type_, const float* x_, int64_t K_, int64_t T, int threads)
      : isa(isa_), type(type_), x(x_), K(K_), nb(K_ / 32), nsb(K_ / 256),
        kquant(type_ == DType::q4_k || type_ == DType::q6_k),
        integer(type_ == DType::q8_0 || type_ == DType::q4_0 || kquant), avx2(at_least(isa_, Isa::avx2)) {
    if (kquant) { // activations quantized once per call, shared by every weight row
      xqk.resize(static_cast<size_t>(T * nsb));
      quantize_rows_k(isa, x, K, T, xqk.data(), threads);
    } else if (integer) {
      xq.resize(static_cast<size_t>(T * nb));
      quantize_rows(isa, x, K, T, xq.data(), threads);
    }
  }

  // One row against one token.
  float one(const uint8_t* wr, int64_t t) const {
    const float* xr = x + t * K;
    const BlockQ8* xb = integer && !kquant ? xq.data() + t * nb : nullptr;
    const BlockQ8K* xk = kquant ? xqk.data() + t * nsb : nullptr;
    switch (type) {
    case DType::f32:
      return avx2 ? dot_f32_avx2(wr, xr, K) : dot_f32_scalar(wr, xr, K);
    case DType::f16:
      return avx2 ? dot_f16_avx2(wr, xr, K) : dot_f16_scalar(wr, xr, K);
    case DType::bf16:
      return avx2 ? dot_bf16_avx2(wr, xr, K) : dot_bf16_scalar(wr, xr, K);
    case DType::q8_0:
      return avx2 ? dot_q8_0_avx2(wr, xb, nb) : dot_q8_0_scalar(wr, xb, nb);
    case DType::q4_0:
      return avx2 ? dot_q4_0_avx2(wr, xb, nb) : dot_q4_0_scalar(wr, xb, nb);
    case DType::q4_k:
      return avx2 ? dot_q4_k_avx2(wr, xk, nsb) : dot_q4_k_scalar(wr, xk, nsb);
    case DType::q6_k:
      return avx2 ? dot_q6_k_avx2(wr, xk, nsb) : dot_q6_k_scalar(wr, xk, nsb);
    default:
      return NAN; // unreachable: matmul() rejects types without a kernel before the loop
    }
  }

  const Isa isa;
  const DType type;
  const float* const x;
  const int64_t K, nb, nsb; // nb: blocks of 32 per row, nsb: blocks of 256
  const bool kquant, integer, avx2;
  std::vector<BlockQ8> xq;   // q8_0 / q4_0 activations: blocks of 32
  std::vector<BlockQ8K> xqk; // k-quant activations: blocks of 256
};

// A small batch of plain rows (f32, f16, bf16) with AVX2: four rows against two tokens per weight load.
void matmul_plain_4x2(const MatmulInput& in, const uint8_t* w, size_t row_bytes, int64_t N, int64_t T,
                      float* y, int threads) {
  const DType type = in.type;
  const float* x = in.x;
  const int64_t K = in.K;
  const int64_t n_blk = (N + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K * T > 32768)
  for (int64_t jb = 0; jb < n_blk; ++jb) {
    const int64_t j = jb * 4;
    const uint8_t* wr = w + static_cast<size_t>(j) * row_bytes;
    if (j + 4 > N) {
      for (int64_t r = j; r < N; ++r)
        for (int64_t t = 0; t < T; ++t)
          y[t * N + r] = in.one(w + static_cast<size_t>(r) * row_bytes, t);
      continue;
    }
    int64_t t = 0;
    for (; t + 2 <= T; t += 2) {
      float out[8];
      if (type == DType::f32)
        rows4x2_avx2<DType::f32>(wr, row_bytes, x + t * K, K, out);
      else if (type == DType::f16)
        rows4x2_avx2<DType::f16>(wr, row_bytes, x + t * K, K, out);
      else
        rows4x2_avx2<DType::bf16>(wr, row_bytes, x + t * K, K, out);
      std::memcpy(y + t * N + j, out, 4 * sizeof(float));
      std::memcpy(y + (t + 1) * N + j, out + 4, 4 * sizeof(float));
    }
    if (t < T) {
      float out[4];
      if (type == DType::f32)
        rows4_f32_avx2(wr, row_bytes, x + t * K, K, out);
      else if (type == DType::f16)
        rows4_half_avx2<DType::f16>(wr, row_bytes, x + t * K, K, out);
      else
        rows4_half_avx2<DType::bf16>(wr, row_bytes, x + t * K, K, out);
      std::memcpy(y + t * N + j, out, sizeof out);
    }
  }
}

// Decode with AVX2: four rows at a time, one token at a time.
void matmul_rows4(const MatmulInput& in, const uint8_t* w, size_t row_bytes, int64_t N, int64_t T, float* y,
                  int threads) {
  const DType type = in.type;
  const int64_t K = in.K, nb = in.nb, nsb = in.nsb;
  const int64_t n_blk = (N + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K * T > 32768)
  for (int64_t jb = 0; jb < n_blk; ++jb) {
    const int64_t j = jb * 4;
    const uint8_t* wr = w + static_cast<size_t>(j) * row_bytes;
    for (int64_t t = 0; t < T; ++t) {
      if (j + 4 > N) {
        for (int64_t r = j; r < N; ++r)
          y[t * N + r] = in.one(w + static_cast<size_t>(r) * row_bytes, t);
        continue;
      }
      float out[4];
      if (type == DType::q4_k)
        rows4_k_avx2<DType::q4_k>(wr, row_bytes, in.xqk.data() + t * nsb, nsb, out);
      else if (type == DType::q6_k)
        rows4_k_avx2<DType::q6_k>(wr, row_bytes, in.xqk.data() + t * nsb, nsb, out);
      else if (type == DType::q8_0)
        rows4_q_avx2<DType::q8_0>(wr, row_bytes, in.xq.data() + t * nb, nb, out);
      else
        rows4_q_avx2<DType::q4_0>(wr, row_bytes, in.xq.data() + t * nb, nb, out);
      std::memcpy(y + t * N + j, out, sizeof out);
    }
  }
}

// Everything else: row by row (with AVX2, prefill below the GEMM threshold takes four tokens per weight
// load).
void matmul_rows(const MatmulInput& in, const uint8_t* w, size_t row_bytes, int64_t N, int64_t T, float* y,
                 int threads) {
  const DType type = in.type;
  const float* x = in.x;
  const int64_t K = in.K, nb = in.nb;
#pragma omp parallel for num_threads(threads) schedule(static) if (N * K * T > 32768)
  for (int64_t j = 0; j < N; ++j) {
    const uint8_t* wr = w + static_cast<size_t>(j) * row_bytes;
    int64_t t0 = 0;
    if (in.avx2 && type != DType::bf16 && !in.kquant)
      for (; t0 + 4 <= T; t0 += 4) { // prefill below the GEMM threshold: four tokens per weight load
        float out[4];
        switch (type) {
        case DType::f32:
          dot4_f32_avx2(wr, x + t0 * K, K, out);
          break;
        case DType::f16:
          dot4_f16_avx2(wr, x + t0 * K, K, out);
          break;
        default:
          dot4_q_avx2(type, wr, in.xq.data() + t0 * nb, nb, out);
          break;
        }
        for (int u = 0; u < 4; ++u)
          y[(t0 + u) * N + j] = out[u];
      }
    for (int64_t t = t0; t < T; ++t)
      y[t * N + j] = in.one(wr, t);
  }
}

} // namespace

void matmul(Isa isa, DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, const float* x,
            int64_t T, float* y, int n_threads) {
  if (!has_kernel(type)) std::abort(); // callers check has_kernel(); reaching here is a bug
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
  const MatmulInput in(isa, type, x, K, T, threads);
  const bool plain = type == DType::f32 || type == DType::f16 || type == DType::bf16;
  if (in.avx2 && plain && T >= 2) // a small batch: four rows against two tokens per weight load
    matmul_plain_4x2(in, w, row_bytes, N, T, y, threads);
  else if (in.avx2 && plain) { // decode: rows_plain_side_by_side
    const Gemv m{type, w, row_bytes, N, y};
    gemv_multi(isa, &m, 1, K, x, threads);
  } else if (in.avx2 && T < 4) // decode: four rows at a time, one token at a time
    matmul_rows4(in, w, row_bytes, N, T, y, threads);
  else
    matmul_rows(in, w, row_bytes, N, T, y, threads);
}

void to_bf16(Isa isa, const float* x, uint16_t* y, int64_t n) {
  if (at_least(isa, Isa::avx512_bf16)) return to_bf16_avx512(x, y, n);
  for (int64_t i = 0; i < n; ++i)
    y[i] = fp32_to_bf16(x[i]);
}

} // namespace loom::cpu
