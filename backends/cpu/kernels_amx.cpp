// The cpu backend's AMX kernels: the int8 GEMM of repacked Q8_0 / Q4_0 on tiles, and the exact GEMM of
// repacked Q4_1 on bf16 tiles.
#include "avx512_gcc_warnings.hpp"
#include "kernels_internal.hpp"

#include <immintrin.h>

namespace loom::cpu {

// ---- AMX: the int8 GEMM of repacked Q8_0 / Q4_0 on tiles ----

namespace {

// The tile registers' shapes (palette 1): 0, 1 accumulators C (tt tokens × 16 int32, one per row of the
// pair); 2, 3 activations A (tt tokens × 32 int8 of one block); 4, 5 weights B (the block's 32 columns
// as 8 rows of 4 columns × 16 rows, the VNNI layout).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// gemm_x16_amx's steps (lambdas would not inherit the target attributes).
// The B tile of block b: 8 rows (4 columns each) × 16 weight rows as bytes.
template <bool Q4>
LOOM_AMX inline __attribute__((always_inline)) void amx_prep(const uint8_t* p, int64_t b,
                                                             uint8_t (&bb)[8][64]) {
  const uint8_t* a = p + static_cast<size_t>(b) * 2 * (Q4 ? k_q4x8_block : k_q8x8_block);
  if constexpr (Q4) {
    const __m512i mask = _mm512_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m512i v = pair_vec(a, c);
      _mm512_store_si512(bb[c], _mm512_and_si512(v, mask));
      _mm512_store_si512(bb[4 + c], _mm512_and_si512(_mm512_srli_epi16(v, 4), mask));
    }
  } else {
    for (int c = 0; c < 8; ++c)
      _mm512_store_si512(bb[c], pair_vec(a, c));
  }
}

// The tile product of block b into accumulator tile b & 1.
template <bool Q4>
LOOM_AMX inline __attribute__((always_inline)) void amx_product(const BlockQ8* x, int64_t b, size_t xstride,
                                                                uint8_t (&bbuf)[2][8][64]) {
  const int8_t* xa = x[b].qs;
  if (b & 1) {
    _tile_zero(1);
    _tile_loadd(3, xa, xstride);
    _tile_loadd(5, bbuf[1], 64);
    if constexpr (Q4)
      _tile_dpbsud(1, 3, 5);
    else
      _tile_dpbssd(1, 3, 5);
  } else {
    _tile_zero(0);
    _tile_loadd(2, xa, xstride);
    _tile_loadd(4, bbuf[0], 64);
    if constexpr (Q4)
      _tile_dpbsud(0, 2, 4);
    else
      _tile_dpbssd(0, 2, 4);
  }
}

// Block b's integer sums (cbuf) scaled into the accumulators: gemm_x16_vnni's float steps.
template <bool Q4>
LOOM_AMX inline __attribute__((always_inline)) void
amx_scale(const uint8_t* p, const BlockQ8* x, int64_t nb, int64_t b, int tt, const int32_t (&cbuf)[16][16],
          __m512 (&acc)[16]) {
  const __m512 dw = pair_scales(p + static_cast<size_t>(b) * 2 * (Q4 ? k_q4x8_block : k_q8x8_block));
  for (int t = 0; t < tt; ++t) {
    const BlockQ8& xb = x[static_cast<size_t>(t) * static_cast<size_t>(nb) + static_cast<size_t>(b)];
    const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(cbuf[t]));
    if constexpr (Q4)
      acc[t] = _mm512_fmadd_ps(dw, _mm512_fmsub_ps(_mm512_set1_ps(xb.d), s, _mm512_set1_ps(xb.s8)), acc[t]);
    else
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb.d)), s, acc[t]);
  }
}

} // namespace

// 16 rows (a pair of groups, p) against tt ≤ 16 tokens, as gemm_x16_vnni<tt, Q4> computes them: per block of
// 32 columns one tile product gives every (token, row) integer sum Σ q·x (Q8_0: signed × signed) or Σ
// nibble·x (Q4_0: signed activations × unsigned nibbles), then the same float steps per block, so the same
// floats. Two blocks in flight (tiles 0/2/4 and 1/3/5): the product of one runs while the other's sums are
// scaled.
template <bool Q4>
LOOM_AMX void gemm_x16_amx(const uint8_t* p, const BlockQ8* x, int64_t nb, int tt, float* y, int64_t ldy) {
  TileConfig cfg;
  for (int i = 0; i < 2; ++i) {
    cfg.rows[i] = static_cast<uint8_t>(tt);
    cfg.colsb[i] = 64;
    cfg.rows[2 + i] = static_cast<uint8_t>(tt);
    cfg.colsb[2 + i] = 32;
    cfg.rows[4 + i] = 8;
    cfg.colsb[4 + i] = 64;
  }
  _tile_loadconfig(&cfg);
  alignas(64) uint8_t bbuf[2][8][64];
  alignas(64) int32_t cbuf[16][16];
  __m512 acc[16];
  for (auto& a : acc)
    a = _mm512_setzero_ps();
  const size_t xstride = static_cast<size_t>(nb) * sizeof(BlockQ8);
  amx_prep<Q4>(p, 0, bbuf[0]);
  amx_product<Q4>(x, 0, xstride, bbuf);
  for (int64_t b = 0; b < nb; ++b) {
    if (b + 1 < nb) { // the next block's product runs while this one's sums are scaled
      amx_prep<Q4>(p, b + 1, bbuf[(b + 1) & 1]);
      amx_product<Q4>(x, b + 1, xstride, bbuf);
    }
    if (b & 1)
      _tile_stored(1, cbuf, 64);
    else
      _tile_stored(0, cbuf, 64);
    amx_scale<Q4>(p, x, nb, b, tt, cbuf, acc);
  }
  _tile_release();
  for (int t = 0; t < tt; ++t)
    _mm512_storeu_ps(y + static_cast<size_t>(t) * static_cast<size_t>(ldy), acc[t]);
}

// ---- AMX bf16: the exact Q4_1 GEMM ----
//
// A Q4_1 weight is d·q + m with q a 4-bit integer: exact in bf16. An f32 activation is the sum of three bf16
// parts (8 + 8 + 8 bits of its 24). So Σ_k (d·q_k + m)·x_k = d·Σ_k q_k·(x₁ + x₂ + x₃)_k + m·Σ_k x_k, per
// block of 32 and row: three bf16 tile products of exact terms summed in f32 (as an f32 GEMM sums exact
// products), then the block's scale and min in f32 FMAs. The products oneDNN's f32 GEMM of the dequantized
// rows would take, at 1.3× its speed for a 512-token SmolLM2 prompt here, 2.2–3× for 64–16 tokens
// (docs/benchmarks.md). A non-finite activation makes its row's sums NaN (its parts: Inf − Inf), non-finite
// as the f32 GEMM's would be.

// (The tile intrinsics take their tile's number as text: literal numbers only.)
#define LOOM_AMX_PAIR(h)                                                                                     \
  do {                                                                                                       \
    _tile_zero(h);                                                                                           \
    _tile_loadd(7, bq + (h)*stride, 64);                                                                     \
    _tile_dpbf16ps(h, 4, 7);                                                                                 \
    _tile_dpbf16ps(h, 5, 7);                                                                                 \
    _tile_dpbf16ps(h, 6, 7);                                                                                 \
  } while (false)

namespace {
// P = 1, 2 or 4 pairs of a block: each pair's B tile (tile 7; bq + h·stride) by the three parts (tiles 4, 5,
// 6) into tile h, then every pair's sums stored (after all the products: a store waits for its tile's last
// one).
template <int P>
LOOM_AMX inline __attribute__((always_inline)) void amx_pair_sums(const uint16_t* bq, size_t stride,
                                                                  float (&cbuf)[P][16][16]) {
  LOOM_AMX_PAIR(0);
  if constexpr (P >= 2) LOOM_AMX_PAIR(1);
  if constexpr (P == 4) {
    LOOM_AMX_PAIR(2);
    LOOM_AMX_PAIR(3);
    _tile_stored(2, cbuf[2], 64);
    _tile_stored(3, cbuf[3], 64);
  }
  if constexpr (P >= 2) _tile_stored(1, cbuf[1], 64);
  _tile_stored(0, cbuf[0], 64);
}
} // namespace
#undef LOOM_AMX_PAIR

void split_bf16x3(const float* x, int64_t K, int row, uint16_t* tiles, float* sums) {
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  alignas(64) uint16_t odd[32]; // the high words of 32 floats in two vectors
  for (uint16_t i = 0; i < 32; ++i)
    odd[i] = static_cast<uint16_t>(2 * i + 1);
  const __m512i words = _mm512_load_si512(odd);
  for (int64_t b = 0; b < K / 32; ++b) {
    __m512 r0 = _mm512_loadu_ps(x + 32 * b), r1 = _mm512_loadu_ps(x + 32 * b + 16);
    sums[b] = _mm512_reduce_add_ps(_mm512_add_ps(r0, r1));
    for (int i = 0; i < 3; ++i) { // the remainders' leading 8 bits (truncated): r − those is exact
      _mm512_store_si512(tiles + (3 * b + i) * 512 + 32 * row,
                         _mm512_permutex2var_epi16(_mm512_castps_si512(r0), words, _mm512_castps_si512(r1)));
      r0 = _mm512_sub_ps(r0, _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r0), hi)));
      r1 = _mm512_sub_ps(r1, _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r1), hi)));
    }
  }
}

void q4_1_pair_tiles(const uint8_t* p, int64_t nb, uint16_t* out) {
  // bf16 of 0..15 (a word's low 4 bits index it), and the dwords of two rows' words in B-tile order: vector
  // c's bytes 4r..4r+3 (row r) hold elements 4c..4c+3 (low nibbles; high: 16 + 4c..): B row 2c takes elements
  // 4c, 4c+1 of every row, row 2c+1 elements 4c+2, 4c+3 (rows 8 + … the high nibbles').
  alignas(64) uint16_t levels[32];
  for (int i = 0; i < 32; ++i)
    levels[i] = fp32_to_bf16(static_cast<float>(i % 16));
  const __m512i table = _mm512_load_si512(levels), mask = _mm512_set1_epi8(0x0F);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t b = 0; b < nb; ++b, out += 512) {
    const uint8_t* a = p + static_cast<size_t>(b) * 2 * k_q41x8_block;
    for (int c = 0; c < 4; ++c) {
      const __m512i v = pair_vec(a, c, b32_head(DType::q4_1));
      for (int half = 0; half < 2; ++half) { // low nibbles: B rows 2c, 2c+1; high: 8 + 2c, 8 + 2c + 1
        const __m512i n =
            half == 0 ? _mm512_and_si512(v, mask) : _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
        const __m512i w0 = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(n)), table);
        const __m512i w1 =
            _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(n, 1)), table);
        uint16_t* row = out + 32 * (8 * half + 2 * c);
        _mm512_storeu_si512(row, _mm512_permutex2var_epi32(w0, even, w1));
        _mm512_storeu_si512(row + 32, _mm512_permutex2var_epi32(w0, odd, w1));
      }
    }
  }
}

template <int P>
void gemm_q4_1_amx_exact(const uint8_t* p, size_t pair_bytes, const uint16_t* bq, size_t bq_stride,
                         const uint16_t* xa, const float* sums, int64_t nb, int tt, float* y, int64_t ldy) {
  // tiles 0..P−1: block sums C of the P pairs (tt tokens × 16 rows, f32); 4, 5, 6: the parts A (tt × 32
  // bf16); 7: a pair's B
  TileConfig cfg;
  for (int i = 0; i < 7; ++i) {
    cfg.rows[i] = static_cast<uint8_t>(tt);
    cfg.colsb[i] = 64;
  }
  cfg.rows[7] = 16;
  cfg.colsb[7] = 64;
  _tile_loadconfig(&cfg);
  alignas(64) float cbuf[P][16][16];
  alignas(64) float acc[P][16][16] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint16_t* a = xa + 3 * 512 * b;
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a + 512, 64);
    _tile_loadd(6, a + 1024, 64);
    amx_pair_sums<P>(bq + 512 * b, bq_stride, cbuf);
    const float* sb = sums + b;
    for (int h = 0; h < P; ++h) {
      const uint8_t* blk = p + h * pair_bytes + static_cast<size_t>(b) * 2 * k_q41x8_block;
      const __m512 dw = pair_scales(blk), mw = pair_mins(blk);
      for (int t = 0; t < tt; ++t) {
        __m512 v = _mm512_fmadd_ps(_mm512_load_ps(cbuf[h][t]), dw, _mm512_load_ps(acc[h][t]));
        v = _mm512_fmadd_ps(_mm512_set1_ps(sb[static_cast<size_t>(t) * static_cast<size_t>(nb)]), mw, v);
        _mm512_store_ps(acc[h][t], v);
      }
    }
  }
  _tile_release();
  for (int h = 0; h < P; ++h)
    for (int t = 0; t < tt; ++t)
      _mm512_storeu_ps(y + static_cast<size_t>(t) * static_cast<size_t>(ldy) + 16 * h,
                       _mm512_load_ps(acc[h][t]));
}

// The specializations that kernels.cpp calls.
template void gemm_x16_amx<true>(const uint8_t*, const BlockQ8*, int64_t, int, float*, int64_t);
template void gemm_x16_amx<false>(const uint8_t*, const BlockQ8*, int64_t, int, float*, int64_t);
template void gemm_q4_1_amx_exact<4>(const uint8_t*, size_t, const uint16_t*, size_t, const uint16_t*,
                                     const float*, int64_t, int, float*, int64_t);
template void gemm_q4_1_amx_exact<2>(const uint8_t*, size_t, const uint16_t*, size_t, const uint16_t*,
                                     const float*, int64_t, int, float*, int64_t);
template void gemm_q4_1_amx_exact<1>(const uint8_t*, size_t, const uint16_t*, size_t, const uint16_t*,
                                     const float*, int64_t, int, float*, int64_t);

} // namespace loom::cpu
