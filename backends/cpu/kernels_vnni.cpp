// The cpu backend's AVX-512 VNNI kernels: the int8 GEMMs of repacked Q8_0, Q4_0, Q4_1, Q5_0, Q2_K, Q3_K,
// Q4_K, Q6_K and IQ4_XS.
#include "avx512_gcc_warnings.hpp"
#include "kernels_internal.hpp"

#include <immintrin.h>

namespace loom::cpu {

// ---- AVX-512 VNNI: the int8 GEMM of repacked Q8_0 / Q4_0 / Q4_1 against several tokens ----

namespace {

// Blocks ahead that the one- and two-token kernels prefetch.
constexpr size_t k_prefetch_blocks = 8;

// Q8_0 and IQ4_NL weights are signed: the kernels take u = q + 128 (Q8_0: the sign bit flipped; IQ4_NL: the
// level looked up + 128) and start each block's sum from −128 · Σ x.
constexpr bool signed_levels(DType Q) {
  return Q == DType::q8_0 || Q == DType::iq4_nl;
}

// The 16 IQ4 levels + 128 as unsigned bytes, in every 128-bit lane (a vpshufb table).
LOOM_AVX512VNNI inline __m512i iq4_levels_u8() {
  return _mm512_broadcast_i32x4(_mm_xor_si128(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(dtype_detail::k_iq4nl_values)), _mm_set1_epi8(-128)));
}

// kernels_internal.hpp's float step of one block, 16 rows.
template <DType Q>
LOOM_AVX512VNNI inline __m512 block_step(__m512 acc, __m512 dw, __m512 mw, const BlockQ8& xb, __m512i s) {
  if constexpr (Q == DType::q8_0 || Q == DType::iq4_nl)
    return _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb.d)), _mm512_cvtepi32_ps(s), acc);
  else if constexpr (Q == DType::q4_0)
    return _mm512_fmadd_ps(
        dw, _mm512_fmsub_ps(_mm512_set1_ps(xb.d), _mm512_cvtepi32_ps(s), _mm512_set1_ps(xb.s8)), acc);
  else if constexpr (Q == DType::q5_0)
    return _mm512_fmadd_ps(
        dw, _mm512_fmsub_ps(_mm512_set1_ps(xb.d), _mm512_cvtepi32_ps(s), _mm512_set1_ps(2.0f * xb.s8)), acc);
  else
    return _mm512_fmadd_ps(
        mw, _mm512_set1_ps(0.125f * xb.s8),
        _mm512_fmadd_ps(dw, _mm512_mul_ps(_mm512_set1_ps(xb.d), _mm512_cvtepi32_ps(s)), acc));
}

// 16 rows (a pair of repacked groups, p) against TT tokens: y[t·ldy + r] = Σ_k W[r][k] · x[t][k].
// x: the tokens' blocks, nb per token (with Σ qs of each). Per block the 16 rows' weights are
// unpacked once, as unsigned bytes u (Q4_0 / Q4_1: the nibbles, Q4_0's u = q + 8; Q8_0: u = q + 128, the
// sign bit flipped), into eight 64-byte vectors whose dword lane r holds row r's bytes of 4 columns; each
// token broadcasts its 4 matching activation bytes and one vpdpbusd adds u·x of those 4 columns to lane r.
// Σ u·x − offset · Σ x = Σ q·x exactly, in int32 (|Σ| ≤ 32 · 255 · 128); then the same float steps as
// the AVX2 kernel per block (block_step), so the results are those of gemv_q8_0x8_avx2 / gemv_q4x8_avx2,
// bit for bit.
template <int TT, DType Q>
LOOM_AVX512VNNI void gemm_x16_vnni(const uint8_t* p, const BlockQ8* x, int64_t nb, float* y, int64_t ldy) {
  constexpr size_t blk = 2 * b32_block_bytes(Q), head = b32_head(Q);
  __m512 acc[TT];
  for (int t = 0; t < TT; ++t)
    acc[t] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(static_cast<char>(0x80)),
                bit4 = _mm512_set1_epi8(0x10);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* a = p + static_cast<size_t>(b) * blk;
    if constexpr (TT <= 2) // decode reads the weights once: keep more lines in flight than the prefetchers do
      for (size_t c = 0; c < blk; c += 64)
        _mm_prefetch(reinterpret_cast<const char*>(a + k_prefetch_blocks * blk + c), _MM_HINT_T0);
    __m512i w[8];
    if constexpr (Q != DType::q8_0) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) { // low nibbles: columns 4c..4c+3; high: 16 + 4c..
        const __m512i v = pair_vec(a, c, head);
        w[c] = _mm512_and_si512(v, mask);
        w[4 + c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
        if constexpr (b32_fifth(Q)) { // the fifth bits: 16 where the mask's bit is set
          w[c] = _mm512_or_si512(w[c], _mm512_maskz_mov_epi8(pair_hmask(Q, a, c, 0), bit4));
          w[4 + c] = _mm512_or_si512(w[4 + c], _mm512_maskz_mov_epi8(pair_hmask(Q, a, c, 1), bit4));
        }
        if constexpr (Q == DType::iq4_nl) { // the levels + 128, unsigned
          w[c] = _mm512_shuffle_epi8(iq4_levels_u8(), w[c]);
          w[4 + c] = _mm512_shuffle_epi8(iq4_levels_u8(), w[4 + c]);
        }
      }
    } else {
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c)
        w[c] = _mm512_xor_si512(pair_vec(a, c), flip);
    }
    const __m512 dw = pair_scales(a);
    const __m512 mw = b32_mins(Q) ? pair_mins(a) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) {
      const BlockQ8& xb = x[static_cast<size_t>(t) * static_cast<size_t>(nb) + static_cast<size_t>(b)];
      const auto* xw = reinterpret_cast<const int32_t*>(xb.qs);
      // Q8_0 starts from −128 · Σ x (exact: Σ q·x then); Q4_0 / Q4_1 from 0 (Σ nibble · x), Q4_0's −8 · Σ x
      // and Q4_1's min · Σ x taken in float as the AVX2 kernels do, so all give those kernels' very floats.
      __m512i s = signed_levels(Q) ? _mm512_set1_epi32(-128 * xb.sum) : _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c)
        s = _mm512_dpbusd_epi32(s, w[c], _mm512_set1_epi32(xw[c]));
      acc[t] = block_step<Q>(acc[t], dw, mw, xb, s);
    }
  }
  for (int t = 0; t < TT; ++t)
    _mm512_storeu_ps(y + static_cast<size_t>(t) * static_cast<size_t>(ldy), acc[t]);
}

} // namespace

// One token against P pairs (16·P rows) at once: P sequential weight streams per thread instead of one,
// which is what the machine's read bandwidth needs (`loom bench --bandwidth`: one stream per thread reads
// half of what four do). Each block's integer sum in two chains of vpdpbusd (exact either way); the same
// float steps as gemm_x16_vnni<1, Q> for each pair, so the same results.
template <DType Q, int P>
LOOM_AVX512VNNI void gemv_pairs_vnni(const uint8_t* const p[P], const BlockQ8* x, int64_t nb,
                                     float* const y[P]) {
  constexpr size_t blk = 2 * b32_block_bytes(Q), head = b32_head(Q);
  __m512 acc[P];
  for (auto& a : acc)
    a = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(static_cast<char>(0x80)),
                bit4 = _mm512_set1_epi8(0x10);
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8& xb = x[b];
    const auto* xw = reinterpret_cast<const int32_t*>(xb.qs);
#pragma GCC unroll 8
    for (int h = 0; h < P; ++h) {
      const uint8_t* a = p[h] + static_cast<size_t>(b) * blk;
      for (size_t c = 0; c < blk; c += 64)
        _mm_prefetch(reinterpret_cast<const char*>(a + k_prefetch_blocks * blk + c), _MM_HINT_T0);
      __m512i s0 = signed_levels(Q) ? _mm512_set1_epi32(-128 * xb.sum) : _mm512_setzero_si512(),
              s1 = _mm512_setzero_si512();
      if constexpr (Q != DType::q8_0) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const __m512i v = pair_vec(a, c, head);
          __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
          if constexpr (b32_fifth(Q)) {
            lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(pair_hmask(Q, a, c, 0), bit4));
            hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(pair_hmask(Q, a, c, 1), bit4));
          }
          if constexpr (Q == DType::iq4_nl) {
            lo = _mm512_shuffle_epi8(iq4_levels_u8(), lo);
            hi = _mm512_shuffle_epi8(iq4_levels_u8(), hi);
          }
          s0 = _mm512_dpbusd_epi32(s0, lo, _mm512_set1_epi32(xw[c]));
          s1 = _mm512_dpbusd_epi32(s1, hi, _mm512_set1_epi32(xw[4 + c]));
        }
      } else {
#pragma GCC unroll 4
        for (int c = 0; c < 8; c += 2) {
          s0 = _mm512_dpbusd_epi32(s0, _mm512_xor_si512(pair_vec(a, c), flip), _mm512_set1_epi32(xw[c]));
          s1 = _mm512_dpbusd_epi32(s1, _mm512_xor_si512(pair_vec(a, c + 1), flip),
                                   _mm512_set1_epi32(xw[c + 1]));
        }
      }
      const __m512 mw = b32_mins(Q) ? pair_mins(a) : _mm512_setzero_ps();
      acc[h] = block_step<Q>(acc[h], pair_scales(a), mw, xb, _mm512_add_epi32(s0, s1));
    }
  }
  for (int h = 0; h < P; ++h)
    _mm512_storeu_ps(y[h], acc[h]);
}

template <DType Q>
void gemm_x16_tokens(const uint8_t* p, const BlockQ8* x, int64_t nb, int64_t T, float* y, int64_t ldy) {
  int64_t t = 0;
  const auto at = [&](int64_t u) { return static_cast<size_t>(u) * static_cast<size_t>(nb); };
  for (; t + 16 <= T; t += 16)
    gemm_x16_vnni<16, Q>(p, x + at(t), nb, y + t * ldy, ldy);
  if (t + 8 <= T) {
    gemm_x16_vnni<8, Q>(p, x + at(t), nb, y + t * ldy, ldy);
    t += 8;
  }
  if (t + 4 <= T) {
    gemm_x16_vnni<4, Q>(p, x + at(t), nb, y + t * ldy, ldy);
    t += 4;
  }
  if (t + 2 <= T) {
    gemm_x16_vnni<2, Q>(p, x + at(t), nb, y + t * ldy, ldy);
    t += 2;
  }
  if (t < T) gemm_x16_vnni<1, Q>(p, x + at(t), nb, y + t * ldy, ldy);
}

// ---- AVX-512 VNNI: the int8 GEMM of repacked Q4_K / Q5_K / Q6_K against several tokens ----

// One or two tokens read a pair's weights once: prefetch the super-blocks k_prefetch_superblocks ahead of
// both groups, every line (decode of the s110 synths on this Xeon, tok/s at 2 / 8 ahead: Q5_K 336 / 377, Q3_K
// 444 / 511, IQ4_XS 446 / 509; 4 to 16 alike).
constexpr size_t k_prefetch_superblocks = 8;
LOOM_AVX512VNNI inline void prefetch_superblocks(const uint8_t* a0, const uint8_t* a1, size_t block) {
  for (size_t c = 0; c < block; c += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(a0 + k_prefetch_superblocks * block + c), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(a1 + k_prefetch_superblocks * block + c), _MM_HINT_T0);
  }
}
// The same integer sums as gemv_q4_kx8_avx2 / gemv_q6_kx8_avx2, and their float steps per super-block,
// so the results are theirs bit for bit. 16 rows (two 8-row groups g0, g1) per 64-byte vector; the
// weights of one scale's columns are unpacked once (unsigned: Q4_K's nibbles, Q6_K's 6-bit values
// 0..63) and shared by the TT tokens; vpdpbusd sums 4 columns per lane, vpmulld applies the rows' scale
// (a 6-bit or int8 integer), and the mins (Q4_K) or the −32 offset (Q6_K) come from the tokens' bsums.

// Group g of 16 columns of a pair (q: its four 4-column vectors of unsigned values, 16 rows) against TT
// tokens (xs: the first token's BlockQ8K of this super-block, the others nsb apart): each token's OFF ·
// bsum_g + Σ u·x (OFF: the values' offset, Q3_K's −4; 0 where it is taken apart) times the rows' scales scs,
// into sumi[t].
template <int TT, int OFF>
LOOM_AVX512VNNI inline void group16(__m512i* sumi, const __m512i* q, __m512i scs, const BlockQ8K* xs,
                                    int64_t nsb, int g) {
#pragma GCC unroll 16
  for (int t = 0; t < TT; ++t) {
    const BlockQ8K& xb = xs[static_cast<size_t>(t) * static_cast<size_t>(nsb)];
    const auto* xw = reinterpret_cast<const int32_t*>(xb.qs) + 4 * g;
    __m512i is = _mm512_set1_epi32(OFF * xb.bsums[g]);
    for (int c = 0; c < 4; ++c)
      is = _mm512_dpbusd_epi32(is, q[c], _mm512_set1_epi32(xw[c]));
    sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(is, scs));
  }
}

// The float step of a super-block of a k-quant without mins (Q3_K, IQ4_XS) for TT tokens: the rows' d · x.d
// times each token's integer sums into its acc (xs: the first token's BlockQ8K of this super-block, the
// others nsb apart).
template <int TT>
LOOM_AVX512VNNI inline void scales_step(__m512* acc, __m512 d, const BlockQ8K* xs, int64_t nsb,
                                        const __m512i* sumi) {
#pragma GCC unroll 16
  for (int t = 0; t < TT; ++t) {
    const float x_d = xs[static_cast<size_t>(t) * static_cast<size_t>(nsb)].d;
    acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(x_d)), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
  }
}

// The float step of a super-block of a k-quant with mins (Q2_K, Q4_K, Q5_K) for one token: d · x.d times the
// integer sums into acc, dmin · x.d times Σ_s m_s · b_s into accm (subtracted at the end). mn[h]: dword r
// holds row r's mins 4h..4h+3 as bytes; b: the token's H·4 sums those mins weigh (Q4_K: of each 32 values, H
// = 2; Q2_K: of each 16, H = 4), taken two at a time by madd.
template <int H>
LOOM_AVX512VNNI inline void mins_step(__m512& acc, __m512& accm, __m512 d, __m512 dmin, float x_d,
                                      __m512i sumi, const __m512i* mn, const int32_t* b) {
  const __m512i lo16 = _mm512_set1_epi32(0x00FF00FF);
  __m512i summ = _mm512_setzero_si512();
  for (int h = 0; h < H; ++h) {
    const int32_t* bh = b + 4 * h;
    summ = _mm512_add_epi32(summ, _mm512_madd_epi16(_mm512_and_si512(mn[h], lo16),
                                                    _mm512_set1_epi32((bh[2] << 16) | (bh[0] & 0xFFFF))));
    summ = _mm512_add_epi32(summ, _mm512_madd_epi16(_mm512_srli_epi16(mn[h], 8),
                                                    _mm512_set1_epi32((bh[3] << 16) | (bh[1] & 0xFFFF))));
  }
  const __m512 xd = _mm512_set1_ps(x_d);
  acc = _mm512_fmadd_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(sumi), acc);
  accm = _mm512_fmadd_ps(_mm512_mul_ps(dmin, xd), _mm512_cvtepi32_ps(summ), accm);
}

// acc/accm (Q4_K) and acc (Q6_K) per token stay in memory: they change once per super-block.
// Q5_K (q5_kx8: q4_kx8 and a plane of fifth bits) is Q4_K with 5-bit values: bit c of a fifth-bit byte
// belongs to the nibble of the same byte of vector c, moved to bit 4.
template <int TT, DType Q>
LOOM_AVX512VNNI void gemm_k4_x16_vnni(const uint8_t* g0, const uint8_t* g1, const BlockQ8K* x, int64_t nsb,
                                      float* y, int64_t ldy) {
  constexpr size_t block = Q == DType::q5_k ? k_q5kx8_block : k_q4kx8_block;
  __m512 acc[TT], accm[TT];
  for (int t = 0; t < TT; ++t)
    acc[t] = accm[t] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi32(0x3f3f3f3f),
                m4 = _mm512_set1_epi32(0x0f0f0f0f), m2 = _mm512_set1_epi32(0x30303030),
                byte = _mm512_set1_epi32(0xFF);
  for (int64_t i = 0; i < nsb; ++i) {
    const uint8_t* a0 = g0 + static_cast<size_t>(i) * block;
    const uint8_t* a1 = g1 + static_cast<size_t>(i) * block;
    if constexpr (TT <= 2) // two super-blocks ahead (as gemm_x16_vnni)
      prefetch_superblocks(a0, a1, block);
    // the 16 rows' scales and mins as in gemv_q4_kx8_avx2: dword r of sc[h] holds row r's scales
    // 4h..4h+3 as bytes, of mn[h] its mins
    const __m512i u0 = pair256(a0 + 32, a1 + 32), u1 = pair256(a0 + 64, a1 + 64),
                  u2 = pair256(a0 + 96, a1 + 96);
    const __m512i sc[2] = {
        _mm512_and_si512(u0, m6),
        _mm512_or_si512(_mm512_and_si512(u2, m4), _mm512_and_si512(_mm512_srli_epi32(u0, 2), m2))};
    const __m512i mn[2] = {_mm512_and_si512(u1, m6),
                           _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),
                                           _mm512_and_si512(_mm512_srli_epi32(u1, 2), m2))};
    __m512i sumi[TT];
    for (int t = 0; t < TT; ++t)
      sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int s = 0; s < 8; ++s) { // sub-block s: columns 32s..32s+31, nibbles (s & 1) of chunk s / 2
      const uint8_t* q0 = a0 + 128 + 256 * (s / 2);
      const uint8_t* q1 = a1 + 128 + 256 * (s / 2);
      __m512i w[8];
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512i v = pair256(q0 + 32 * c, q1 + 32 * c);
        w[c] = _mm512_and_si512((s & 1) ? _mm512_srli_epi16(v, 4) : v, mask);
      }
      if constexpr (Q == DType::q5_k) { // the fifth bits of sub-block s: plane (s / 2, s & 1)
        const size_t at = k_q4kx8_block + 64 * static_cast<size_t>(s / 2) + 32 * static_cast<size_t>(s & 1);
        const __m512i h = pair256(a0 + at, a1 + at), bit4 = _mm512_set1_epi8(0x10);
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) {
          const __m512i hc = c < 4   ? _mm512_slli_epi16(h, static_cast<unsigned>(4 - c))
                             : c > 4 ? _mm512_srli_epi16(h, static_cast<unsigned>(c - 4))
                                     : h;
          w[c] = _mm512_or_si512(w[c], _mm512_and_si512(hc, bit4));
        }
      }
      const __m512i scs = _mm512_and_si512(_mm512_srli_epi32(sc[s / 4], 8 * (s % 4)), byte);
#pragma GCC unroll 16
      for (int t = 0; t < TT; ++t) {
        const auto* xw =
            reinterpret_cast<const int32_t*>(
                x[static_cast<size_t>(t) * static_cast<size_t>(nsb) + static_cast<size_t>(i)].qs) +
            8 * s;
        __m512i is = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c)
          is = _mm512_dpbusd_epi32(is, w[c], _mm512_set1_epi32(xw[c]));
        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(is, scs));
      }
    }
    const __m512 d = pair_f16(a0, a1);
    const __m512 dmin = pair_f16(a0 + 16, a1 + 16);
#pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) {
      const BlockQ8K& xb = x[static_cast<size_t>(t) * static_cast<size_t>(nsb) + static_cast<size_t>(i)];
      int32_t b[8];
      for (int s = 0; s < 8; ++s)
        b[s] = xb.bsums[2 * s] + xb.bsums[2 * s + 1];
      mins_step<2>(acc[t], accm[t], d, dmin, xb.d, sumi[t], mn, b);
    }
  }
  for (int t = 0; t < TT; ++t)
    _mm512_storeu_ps(y + static_cast<size_t>(t) * static_cast<size_t>(ldy), _mm512_sub_ps(acc[t], accm[t]));
}

template <int TT>
LOOM_AVX512VNNI void gemm_q6_k_x16_vnni(const uint8_t* g0, const uint8_t* g1, const BlockQ8K* x, int64_t nsb,
                                        float* y, int64_t ldy) {
  __m512 acc[TT];
  for (int t = 0; t < TT; ++t)
    acc[t] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  for (int64_t i = 0; i < nsb; ++i) {
    const uint8_t* a0 = g0 + static_cast<size_t>(i) * k_q6kx8_block;
    const uint8_t* a1 = g1 + static_cast<size_t>(i) * k_q6kx8_block;
    if constexpr (TT <= 2) prefetch_superblocks(a0, a1, k_q6kx8_block);
    __m512i sumi[TT];
    for (int t = 0; t < TT; ++t)
      sumi[t] = _mm512_setzero_si512();
    __m512i scales[8]; // dword r: row r's scales of groups 2p, 2p+1 as int16
    for (int p = 0; p < 8; ++p)
      scales[p] = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a0 + 16 + 16 * p))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(a1 + 16 + 16 * p)), 1));
#pragma GCC unroll 1
    for (int p = 0; p < 8; ++p) { // groups 2p, 2p+1 of 16 columns
      const __m512i scp = scales[p];
#pragma GCC unroll 1
      for (int e = 0; e < 2; ++e) {
        const int g = 2 * p + e;
        const __m512i v0 = pair256(a0 + 144 + 64 * g, a1 + 144 + 64 * g);
        const __m512i v1 = pair256(a0 + 176 + 64 * g, a1 + 176 + 64 * g);
        const __m512i h = pair256(a0 + 1168 + 32 * g, a1 + 1168 + 32 * g);
        const __m512i q[4] = {
            _mm512_or_si512(_mm512_and_si512(v0, m4), _mm512_and_si512(_mm512_slli_epi16(h, 4), m30)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v0, 4), m4),
                            _mm512_and_si512(_mm512_slli_epi16(h, 2), m30)),
            _mm512_or_si512(_mm512_and_si512(v1, m4), _mm512_and_si512(h, m30)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v1, 4), m4),
                            _mm512_and_si512(_mm512_srli_epi16(h, 2), m30))};
        const __m512i scs =
            e ? _mm512_srai_epi32(scp, 16) : _mm512_srai_epi32(_mm512_slli_epi32(scp, 16), 16);
        group16<TT, 0>(sumi, q, scs, x + i, nsb, g);
      }
    }
    const __m512 d = pair_f16(a0, a1);
#pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) {
      const BlockQ8K& xb = x[static_cast<size_t>(t) * static_cast<size_t>(nsb) + static_cast<size_t>(i)];
      __m512i off = _mm512_setzero_si512();
      for (int p = 0; p < 8; ++p)
        off = _mm512_add_epi32(off,
                               _mm512_madd_epi16(scales[p], _mm512_set1_epi32((xb.bsums[2 * p + 1] << 16) |
                                                                              (xb.bsums[2 * p] & 0xFFFF))));
      const __m512i si = _mm512_sub_epi32(sumi[t], _mm512_slli_epi32(off, 5));
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xb.d)), _mm512_cvtepi32_ps(si), acc[t]);
    }
  }
  for (int t = 0; t < TT; ++t)
    _mm512_storeu_ps(y + static_cast<size_t>(t) * static_cast<size_t>(ldy), acc[t]);
}

// q3_kx8 (kernels.cpp): per group of 16 columns one vector of low bits and half a vector of third bits give
// the 16 rows' unsigned values u = 0..7 of four 4-column chunks; each token's sum starts from −4 · bsum (the
// u − 4 offset), four vpdpbusd add u·x, vpmulld applies the rows' scale − 32. One token (TT = 1) is decode.
template <int TT>
LOOM_AVX512VNNI void gemm_q3_k_x16_vnni(const uint8_t* g0, const uint8_t* g1, const BlockQ8K* x, int64_t nsb,
                                        float* y, int64_t ldy) {
  __m512 acc[TT];
  for (int t = 0; t < TT; ++t)
    acc[t] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi32(0x0f0f0f0f), m2 = _mm512_set1_epi32(0x03030303),
                three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4), byte = _mm512_set1_epi32(0xFF),
                c32 = _mm512_set1_epi32(32);
  for (int64_t i = 0; i < nsb; ++i) {
    const uint8_t* a0 = g0 + static_cast<size_t>(i) * k_q3kx8_block;
    const uint8_t* a1 = g1 + static_cast<size_t>(i) * k_q3kx8_block;
    if constexpr (TT <= 2) // two super-blocks ahead (as gemm_x16_vnni)
      prefetch_superblocks(a0, a1, k_q3kx8_block);
    // the 16 rows' 6-bit scales (q3_k_scale, + 32): dword r of sc[h] holds row r's scales 4h..4h+3 as bytes
    const __m512i u0 = pair256(a0 + 16, a1 + 16), u1 = pair256(a0 + 48, a1 + 48),
                  u2 = pair256(a0 + 80, a1 + 80);
    const __m512i sc[4] = {
        _mm512_or_si512(_mm512_and_si512(u0, m4), _mm512_slli_epi32(_mm512_and_si512(u2, m2), 4)),
        _mm512_or_si512(_mm512_and_si512(u1, m4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u2, 2), m2), 4)),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u0, 4), m4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m2), 4)),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u1, 4), m4),
                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u2, 6), m2), 4))};
    __m512i sumi[TT];
    for (int t = 0; t < TT; ++t)
      sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int p = 0; p < 8; ++p) { // groups 2p, 2p+1 of 16 columns
      const __m512i h = pair256(a0 + 624 + 32 * p, a1 + 624 + 32 * p);
#pragma GCC unroll 2
      for (int e = 0; e < 2; ++e) {
        const int g = 2 * p + e;
        const __m512i v = pair256(a0 + 112 + 32 * g, a1 + 112 + 32 * g);
        __m512i q[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          const int s = 4 * e + k; // the third bit's position, moved to bit 2
          const __m512i third = s > 2   ? _mm512_srli_epi16(h, static_cast<unsigned>(s - 2))
                                : s < 2 ? _mm512_slli_epi16(h, static_cast<unsigned>(2 - s))
                                        : h;
          q[k] = _mm512_or_si512(
              _mm512_and_si512(k ? _mm512_srli_epi16(v, static_cast<unsigned>(2 * k)) : v, three),
              _mm512_and_si512(third, four));
        }
        const __m512i scs =
            _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(sc[g / 4], 8 * (g % 4)), byte), c32);
        group16<TT, -4>(sumi, q, scs, x + i, nsb, g);
      }
    }
    scales_step<TT>(acc, pair_f16(a0, a1), x + i, nsb, sumi);
  }
  for (int t = 0; t < TT; ++t)
    _mm512_storeu_ps(y + static_cast<size_t>(t) * static_cast<size_t>(ldy), acc[t]);
}

// q2_kx8 (kernels.cpp): per group of 16 columns one vector gives the 16 rows' 2-bit values of four 4-column
// chunks; four vpdpbusd, vpmulld by the rows' 4-bit scale; the mins' part Σ_s m_s · bsum_s per row, as
// gemm_q4_k_x16_vnni's, in madd pairs.
template <int TT>
LOOM_AVX512VNNI void gemm_q2_k_x16_vnni(const uint8_t* g0, const uint8_t* g1, const BlockQ8K* x, int64_t nsb,
                                        float* y, int64_t ldy) {
  __m512 acc[TT], accm[TT];
  for (int t = 0; t < TT; ++t)
    acc[t] = accm[t] = _mm512_setzero_ps();
  const __m512i three = _mm512_set1_epi8(3), m4 = _mm512_set1_epi32(0x0f0f0f0f),
                nib = _mm512_set1_epi32(0x0F);
  for (int64_t i = 0; i < nsb; ++i) {
    const uint8_t* a0 = g0 + static_cast<size_t>(i) * k_q2kx8_block;
    const uint8_t* a1 = g1 + static_cast<size_t>(i) * k_q2kx8_block;
    if constexpr (TT <= 2) prefetch_superblocks(a0, a1, k_q2kx8_block);
    // dword r of u[h]: row r's scale bytes 4h..4h+3 (scale in the low nibble, min in the high one)
    __m512i u[4];
    for (int h = 0; h < 4; ++h)
      u[h] = pair256(a0 + 32 + 32 * h, a1 + 32 + 32 * h);
    __m512i sumi[TT];
    for (int t = 0; t < TT; ++t)
      sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int g = 0; g < 16; ++g) {
      const __m512i v = pair256(a0 + 160 + 32 * g, a1 + 160 + 32 * g);
      const __m512i q[4] = {_mm512_and_si512(v, three), _mm512_and_si512(_mm512_srli_epi16(v, 2), three),
                            _mm512_and_si512(_mm512_srli_epi16(v, 4), three),
                            _mm512_and_si512(_mm512_srli_epi16(v, 6), three)};
      const __m512i scs = _mm512_and_si512(_mm512_srli_epi32(u[g / 4], 8 * (g % 4)), nib);
      group16<TT, 0>(sumi, q, scs, x + i, nsb, g);
    }
    const __m512 d = pair_f16(a0, a1), dmin = pair_f16(a0 + 16, a1 + 16);
    __m512i mn[4]; // dword r: row r's mins 4h..4h+3 as bytes
    for (int h = 0; h < 4; ++h)
      mn[h] = _mm512_and_si512(_mm512_srli_epi32(u[h], 4), m4);
#pragma GCC unroll 16
    for (int t = 0; t < TT; ++t) {
      const BlockQ8K& xb = x[static_cast<size_t>(t) * static_cast<size_t>(nsb) + static_cast<size_t>(i)];
      int32_t b[16];
      for (int g = 0; g < 16; ++g)
        b[g] = xb.bsums[g];
      mins_step<4>(acc[t], accm[t], d, dmin, xb.d, sumi[t], mn, b);
    }
  }
  for (int t = 0; t < TT; ++t)
    _mm512_storeu_ps(y + static_cast<size_t>(t) * static_cast<size_t>(ldy), _mm512_sub_ps(acc[t], accm[t]));
}

// iq4_xsx8 (kernels.cpp): per sub-block of 32 columns four vectors of index bytes; each nibble looked up
// (vpshufb) as its IQ4 level + 128 (1..241, unsigned for vpdpbusd), each token's sum starting from
// −128 · its sub-block's Σ x; vpmulld by the rows' scale − 32.
template <int TT>
LOOM_AVX512VNNI void gemm_iq4_xs_x16_vnni(const uint8_t* g0, const uint8_t* g1, const BlockQ8K* x,
                                          int64_t nsb, float* y, int64_t ldy) {
  __m512 acc[TT];
  for (int t = 0; t < TT; ++t)
    acc[t] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0F), nib = _mm512_set1_epi32(0x0F), three = _mm512_set1_epi32(3),
                c32 = _mm512_set1_epi32(32);
  const __m512i lut = iq4_levels_u8();
  for (int64_t i = 0; i < nsb; ++i) {
    const uint8_t* a0 = g0 + static_cast<size_t>(i) * k_iq4xsx8_block;
    const uint8_t* a1 = g1 + static_cast<size_t>(i) * k_iq4xsx8_block;
    if constexpr (TT <= 2) prefetch_superblocks(a0, a1, k_iq4xsx8_block);
    const __m512i sl = pair256(a0 + 16, a1 + 16); // dword r: row r's scales_l
    const __m512i sh = _mm512_cvtepu16_epi32(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a0 + 48))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(a1 + 48)), 1)); // lane r: row r's scales_h
    __m512i sumi[TT];
    for (int t = 0; t < TT; ++t)
      sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int k = 0; k < 8; ++k) {
      __m512i w[8];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const uint8_t* at0 = a0 + 64 + 128 * k + 32 * c;
        const __m512i v = pair256(at0, a1 + (at0 - a0));
        w[c] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, mask));
        w[4 + c] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), mask));
      }
      const __m512i ls =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(sl, 8 * (k / 2) + 4 * (k % 2)), nib),
                          _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(sh, 2 * k), three), 4));
      const __m512i scs = _mm512_sub_epi32(ls, c32);
#pragma GCC unroll 16
      for (int t = 0; t < TT; ++t) {
        const BlockQ8K& xb = x[static_cast<size_t>(t) * static_cast<size_t>(nsb) + static_cast<size_t>(i)];
        const auto* xw = reinterpret_cast<const int32_t*>(xb.qs) + 8 * k;
        __m512i is = _mm512_set1_epi32(-128 * (xb.bsums[2 * k] + xb.bsums[2 * k + 1]));
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c)
          is = _mm512_dpbusd_epi32(is, w[c], _mm512_set1_epi32(xw[c]));
        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(is, scs));
      }
    }
    scales_step<TT>(acc, pair_f16(a0, a1), x + i, nsb, sumi);
  }
  for (int t = 0; t < TT; ++t)
    _mm512_storeu_ps(y + static_cast<size_t>(t) * static_cast<size_t>(ldy), acc[t]);
}

// The specializations that kernels.cpp calls.

// The b32 kernels by type (the tables kernels.cpp dispatches through).
template <int P> GemvPairs<P> pairs_kernel(DType type) {
  switch (type) {
  case DType::q4_0:
    return gemv_pairs_vnni<DType::q4_0, P>;
  case DType::q4_1:
    return gemv_pairs_vnni<DType::q4_1, P>;
  case DType::q5_0:
    return gemv_pairs_vnni<DType::q5_0, P>;
  case DType::q5_1:
    return gemv_pairs_vnni<DType::q5_1, P>;
  case DType::iq4_nl:
    return gemv_pairs_vnni<DType::iq4_nl, P>;
  default:
    return gemv_pairs_vnni<DType::q8_0, P>;
  }
}
GemvPairs<4> pairs_kernel4(DType type) {
  return pairs_kernel<4>(type);
}
GemvPairs<1> pairs_kernel1(DType type) {
  return pairs_kernel<1>(type);
}
GemmB32 tokens_kernel(DType type) {
  switch (type) {
  case DType::q4_0:
    return gemm_x16_tokens<DType::q4_0>;
  case DType::q4_1:
    return gemm_x16_tokens<DType::q4_1>;
  case DType::q5_0:
    return gemm_x16_tokens<DType::q5_0>;
  case DType::q5_1:
    return gemm_x16_tokens<DType::q5_1>;
  case DType::iq4_nl:
    return gemm_x16_tokens<DType::iq4_nl>;
  default:
    return gemm_x16_tokens<DType::q8_0>;
  }
}

// The k-quant kernels by type.
KTiles ktiles(DType type) {
  if (type == DType::q4_k)
    return {gemm_k4_x16_vnni<16, DType::q4_k>, gemm_k4_x16_vnni<8, DType::q4_k>,
            gemm_k4_x16_vnni<4, DType::q4_k>, gemm_k4_x16_vnni<2, DType::q4_k>,
            gemm_k4_x16_vnni<1, DType::q4_k>};
  if (type == DType::q5_k)
    return {gemm_k4_x16_vnni<16, DType::q5_k>, gemm_k4_x16_vnni<8, DType::q5_k>,
            gemm_k4_x16_vnni<4, DType::q5_k>, gemm_k4_x16_vnni<2, DType::q5_k>,
            gemm_k4_x16_vnni<1, DType::q5_k>};
  if (type == DType::q3_k)
    return {gemm_q3_k_x16_vnni<16>, gemm_q3_k_x16_vnni<8>, gemm_q3_k_x16_vnni<4>, gemm_q3_k_x16_vnni<2>,
            gemm_q3_k_x16_vnni<1>};
  if (type == DType::q2_k)
    return {gemm_q2_k_x16_vnni<16>, gemm_q2_k_x16_vnni<8>, gemm_q2_k_x16_vnni<4>, gemm_q2_k_x16_vnni<2>,
            gemm_q2_k_x16_vnni<1>};
  if (type == DType::iq4_xs)
    return {gemm_iq4_xs_x16_vnni<16>, gemm_iq4_xs_x16_vnni<8>, gemm_iq4_xs_x16_vnni<4>,
            gemm_iq4_xs_x16_vnni<2>, gemm_iq4_xs_x16_vnni<1>};
  return {gemm_q6_k_x16_vnni<16>, gemm_q6_k_x16_vnni<8>, gemm_q6_k_x16_vnni<4>, gemm_q6_k_x16_vnni<2>,
          gemm_q6_k_x16_vnni<1>};
}

} // namespace loom::cpu
