// The cpu backend's AMX kernel: the int8 GEMM of repacked Q8_0 / Q4_0 on tiles.
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

// The specializations that kernels.cpp calls.
template void gemm_x16_amx<true>(const uint8_t*, const BlockQ8*, int64_t, int, float*, int64_t);
template void gemm_x16_amx<false>(const uint8_t*, const BlockQ8*, int64_t, int, float*, int64_t);

} // namespace loom::cpu
