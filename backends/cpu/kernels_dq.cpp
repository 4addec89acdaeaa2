// Exact products for the GGUF block types read in place ("dq": dequantized in registers): every 8 weights
// are unpacked with AVX2 into f32 values equal to dequantize_row's, then multiplied by the f32 activations
// with FMAs. No activation is rounded, so the only difference from the reference backend is the order of
// the sums. Covers Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (blocks of 32) and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// IQ4_XS (super-blocks of 256). The same unpacking writes rows to memory for the prefill GEMM's panels.
//
// This file is compiled with -ffp-contract=off: a value is scale·q − offset rounded twice, as the SDK's
// scalar dequantizers compute it, never fused into one FMA (which would round once and differ in the last
// bit). The FMAs of the dot products are explicit intrinsics.
#include "kernels_internal.hpp"

#include <cstring>
#include <immintrin.h>
#include <omp.h>

namespace loom::cpu {

namespace {

#define LOOM_DQ __attribute__((target("avx2,fma,f16c")))
#define LOOM_DQ_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

LOOM_DQ_INLINE float h2f(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

LOOM_DQ_INLINE __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// 16 bytes of nibbles as 32 bytes: the low nibbles (values 0..15 of a block), then the high ones (16..31).
LOOM_DQ_INLINE __m256i nibbles(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}

// Bit j of 32 bits as byte j: 0x10 when set, else 0 (Q5_0 / Q5_1's fifth bits).
LOOM_DQ_INLINE __m256i fifth_bits(const uint8_t* p) {
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                                        2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf);
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// IQ4's 16 levels, looked up by 32 indices (0..15).
LOOM_DQ_INLINE __m256i iq4_levels(__m256i idx) {
  const __m256i tbl = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(dtype_detail::k_iq4nl_values)));
  return _mm256_shuffle_epi8(tbl, idx);
}

// Byte k of a 32-byte vector, shifted right by s and masked (2-bit and 1-bit fields of the k-quants).
template <int S> LOOM_DQ_INLINE __m256i field(__m256i v, int mask) {
  return _mm256_and_si256(_mm256_srli_epi16(v, S), _mm256_set1_epi8(static_cast<char>(mask)));
}
LOOM_DQ_INLINE __m256i field_n(__m256i v, int s, int mask) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(s)),
                          _mm256_set1_epi8(static_cast<char>(mask)));
}

LOOM_DQ_INLINE __m256 f(__m128i v) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

// 32 signed 8-bit values (values k .. k + 31 of a row) to f32: the first 16 scaled by (dla, mla), the
// other 16 by (dlb, mlb): y = dl·q − ml, as the SDK computes each (two roundings). Sink::put receives
// each 8 values with their position and their index (0..3) within the 32.
template <class Sink>
LOOM_DQ_INLINE void emit32(Sink& s, int64_t k, __m256i q, float dla, float mla, float dlb, float mlb) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m256 da = _mm256_set1_ps(dla), ma = _mm256_set1_ps(mla), db = _mm256_set1_ps(dlb),
               mb = _mm256_set1_ps(mlb);
  s.template put<0>(k, _mm256_sub_ps(_mm256_mul_ps(da, f(lo)), ma));
  s.template put<1>(k + 8, _mm256_sub_ps(_mm256_mul_ps(da, f(_mm_srli_si128(lo, 8))), ma));
  s.template put<2>(k + 16, _mm256_sub_ps(_mm256_mul_ps(db, f(hi)), mb));
  s.template put<3>(k + 24, _mm256_sub_ps(_mm256_mul_ps(db, f(_mm_srli_si128(hi, 8))), mb));
}
template <class Sink> LOOM_DQ_INLINE void emit32(Sink& s, int64_t k, __m256i q, float dl, float ml) {
  emit32(s, k, q, dl, ml, dl, ml);
}

// Values [0, K) of one row of type T, 32 at a time, into s (the layouts: sdk/include/loom/sdk/dtype.hpp).
template <DType T, class Sink> LOOM_DQ_INLINE void visit_row(const uint8_t* b, int64_t K, Sink& s) {
  using namespace dtype_detail;
  if constexpr (T == DType::q4_0) {
    for (int64_t k = 0; k < K; k += 32, b += 18)
      emit32(s, k, _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8)), h2f(b), 0.0f);
  } else if constexpr (T == DType::q4_1) {
    for (int64_t k = 0; k < K; k += 32, b += 20) // q·d + m as d·q − (−m)
      emit32(s, k, nibbles(b + 4), h2f(b), -h2f(b + 2));
  } else if constexpr (T == DType::q5_0) {
    for (int64_t k = 0; k < K; k += 32, b += 22)
      emit32(s, k, _mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2)), _mm256_set1_epi8(16)),
             h2f(b), 0.0f);
  } else if constexpr (T == DType::q5_1) {
    for (int64_t k = 0; k < K; k += 32, b += 24)
      emit32(s, k, _mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4)), h2f(b), -h2f(b + 2));
  } else if constexpr (T == DType::q8_0) {
    for (int64_t k = 0; k < K; k += 32, b += 34)
      emit32(s, k, load32(b + 2), h2f(b), 0.0f);
  } else if constexpr (T == DType::iq4_nl) {
    for (int64_t k = 0; k < K; k += 32, b += 18)
      emit32(s, k, iq4_levels(nibbles(b + 2)), h2f(b), 0.0f);
  } else if constexpr (T == DType::q2_k) {
    for (int64_t k = 0; k < K; k += 256, b += 84) {
      const float d = h2f(b + 80), dmin = h2f(b + 82);
      for (int h = 0; h < 2; ++h) {
        const __m256i q = load32(b + 16 + 32 * h);
        for (int j = 0; j < 4; ++j) {
          const uint8_t sa = b[8 * h + 2 * j], sb = b[8 * h + 2 * j + 1];
          emit32(s, k + 128 * h + 32 * j, field_n(q, 2 * j, 3), d * static_cast<float>(sa & 0xF),
                 dmin * static_cast<float>(sa >> 4), d * static_cast<float>(sb & 0xF),
                 dmin * static_cast<float>(sb >> 4));
        }
      }
    }
  } else if constexpr (T == DType::q3_k) {
    for (int64_t k = 0; k < K; k += 256, b += 110) {
      const float d = h2f(b + 108);
      const uint8_t* sc = b + 96;
      const __m256i hm = load32(b);
      for (int h = 0; h < 2; ++h) {
        const __m256i q = load32(b + 32 + 32 * h);
        for (int j = 0; j < 4; ++j) { // q − 4 where the high bit is clear
          const __m256i high = field_n(hm, 4 * h + j, 1);
          const __m256i v = _mm256_sub_epi8(field_n(q, 2 * j, 3),
                                            _mm256_sub_epi8(_mm256_set1_epi8(4), _mm256_slli_epi16(high, 2)));
          emit32(s, k + 128 * h + 32 * j, v, d * static_cast<float>(q3_k_scale(sc, 8 * h + 2 * j)), 0.0f,
                 d * static_cast<float>(q3_k_scale(sc, 8 * h + 2 * j + 1)), 0.0f);
        }
      }
    }
  } else if constexpr (T == DType::q4_k || T == DType::q5_k) {
    constexpr size_t bytes = T == DType::q4_k ? 144 : 176;
    for (int64_t k = 0; k < K; k += 256, b += bytes) {
      const float d = h2f(b), dmin = h2f(b + 2);
      const uint8_t* ql = b + (T == DType::q4_k ? 16 : 48);
      const __m256i qh = T == DType::q5_k ? load32(b + 16) : _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) {
        uint8_t sc1, m1, sc2, m2;
        scale_min_k4(2 * j, b + 4, sc1, m1);
        scale_min_k4(2 * j + 1, b + 4, sc2, m2);
        const __m256i q = load32(ql + 32 * j);
        __m256i lo = _mm256_and_si256(q, _mm256_set1_epi8(0x0F)), hi = field<4>(q, 0x0F);
        if constexpr (T == DType::q5_k) {
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(field_n(qh, 2 * j, 1), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(field_n(qh, 2 * j + 1, 1), 4));
        }
        emit32(s, k + 64 * j, lo, d * static_cast<float>(sc1), dmin * static_cast<float>(m1));
        emit32(s, k + 64 * j + 32, hi, d * static_cast<float>(sc2), dmin * static_cast<float>(m2));
      }
    }
  } else if constexpr (T == DType::q6_k) {
    for (int64_t k = 0; k < K; k += 256, b += 210) {
      const float d = h2f(b + 208);
      for (int n = 0; n < 2; ++n) {
        const uint8_t* ql = b + 64 * n;
        const __m256i qa = load32(ql), qb = load32(ql + 32), qh = load32(b + 128 + 32 * n);
        const auto* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * n);
        const __m256i off = _mm256_set1_epi8(32);
        const __m256i m4 = _mm256_set1_epi8(0x0F);
        const __m256i v[4] = {
            _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_slli_epi16(field<0>(qh, 3), 4)),
                            off),
            _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(qb, m4), _mm256_slli_epi16(field<2>(qh, 3), 4)),
                            off),
            _mm256_sub_epi8(_mm256_or_si256(field<4>(qa, 0x0F), _mm256_slli_epi16(field<4>(qh, 3), 4)), off),
            _mm256_sub_epi8(_mm256_or_si256(field<4>(qb, 0x0F), _mm256_slli_epi16(field<6>(qh, 3), 4)), off)};
        for (int i = 0; i < 4; ++i)
          emit32(s, k + 128 * n + 32 * i, v[i], d * static_cast<float>(sc[2 * i]), 0.0f,
                 d * static_cast<float>(sc[2 * i + 1]), 0.0f);
      }
    }
  } else if constexpr (T == DType::iq4_xs) {
    for (int64_t k = 0; k < K; k += 256, b += 136) {
      const float d = h2f(b);
      uint16_t sh;
      std::memcpy(&sh, b + 2, 2);
      for (int ib = 0; ib < 8; ++ib) {
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
        emit32(s, k + 32 * ib, iq4_levels(nibbles(b + 8 + 16 * ib)), d * static_cast<float>(ls - 32), 0.0f);
      }
    }
  }
}

// Two groups' (32 columns') 2-bit or 1-bit fields of one row of a repacked group (q2_kx8 / q3_kx8), as 32
// bytes in column order: dword a (group g) and b (group g + 1) each hold a column's bits at bit `step`·k of
// byte i for column 16g + 4k + i; `next` the bit distance of group g + 1 within b (0 when b is its own
// dword).
LOOM_DQ_INLINE __m256i kx8_fields(uint32_t a, uint32_t b, int step, int next, int mask) {
  const __m256i v =
      _mm256_setr_epi32(static_cast<int>(a), static_cast<int>(a), static_cast<int>(a), static_cast<int>(a),
                        static_cast<int>(b), static_cast<int>(b), static_cast<int>(b), static_cast<int>(b));
  const __m256i shifts =
      _mm256_setr_epi32(0, step, 2 * step, 3 * step, next, next + step, next + 2 * step, next + 3 * step);
  return _mm256_and_si256(_mm256_srlv_epi32(v, shifts), _mm256_set1_epi8(static_cast<char>(mask)));
}

LOOM_DQ_INLINE uint32_t dword_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Row r of a repacked group of Q2_K, Q3_K or Q5_K rows (kernels.cpp's q2_kx8 / q3_kx8 / q5_kx8), values [0,
// K), into s: the values visit_row gives for its GGUF row.
template <DType T, class Sink>
LOOM_DQ_INLINE void visit_kx8_row(const uint8_t* g, int r, int64_t K, Sink& s) {
  constexpr size_t bytes = T == DType::q2_k   ? k_q2kx8_block
                           : T == DType::q3_k ? k_q3kx8_block
                                              : k_q5kx8_block;
  const size_t rw = 4 * static_cast<size_t>(r); // row r's dword in each 32-byte vector
  for (int64_t k = 0; k < K; k += 256, g += bytes) {
    const float d = h2f(g + 2 * r);
    if constexpr (T ==
                  DType::q5_k) { // q4_kx8's nibbles (its 8 vectors' dwords r: the GGUF qs) and fifth bits
      const float dmin = h2f(g + 16 + 2 * r);
      uint8_t sc[12]; // the row's GGUF scale bytes
      for (int u = 0; u < 3; ++u)
        std::memcpy(sc + 4 * u, g + 32 + 32 * u + rw, 4);
      for (int j = 0; j < 4; ++j) {
        const uint8_t* q = g + 128 + 256 * static_cast<size_t>(j) + rw;
        const __m256i qs =
            _mm256_setr_epi32(static_cast<int>(dword_at(q)), static_cast<int>(dword_at(q + 32)),
                              static_cast<int>(dword_at(q + 64)), static_cast<int>(dword_at(q + 96)),
                              static_cast<int>(dword_at(q + 128)), static_cast<int>(dword_at(q + 160)),
                              static_cast<int>(dword_at(q + 192)), static_cast<int>(dword_at(q + 224)));
        const uint32_t f0 = dword_at(g + k_q4kx8_block + 64 * static_cast<size_t>(j) + rw),
                       f1 = dword_at(g + k_q4kx8_block + 64 * static_cast<size_t>(j) + 32 + rw);
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(qs, _mm256_set1_epi8(0x0F)),
                                           _mm256_slli_epi16(kx8_fields(f0, f0, 1, 4, 1), 4));
        const __m256i hi =
            _mm256_or_si256(field<4>(qs, 0x0F), _mm256_slli_epi16(kx8_fields(f1, f1, 1, 4, 1), 4));
        uint8_t sc1, m1, sc2, m2;
        dtype_detail::scale_min_k4(2 * j, sc, sc1, m1);
        dtype_detail::scale_min_k4(2 * j + 1, sc, sc2, m2);
        emit32(s, k + 64 * j, lo, d * static_cast<float>(sc1), dmin * static_cast<float>(m1));
        emit32(s, k + 64 * j + 32, hi, d * static_cast<float>(sc2), dmin * static_cast<float>(m2));
      }
    } else if constexpr (T == DType::q2_k) {
      const float dmin = h2f(g + 16 + 2 * r);
      for (int p = 0; p < 8; ++p) { // groups 2p, 2p + 1
        const uint8_t sa = g[32 + 32 * (p / 2) + rw + 2 * (p % 2)],
                      sb = g[32 + 32 * (p / 2) + rw + 2 * (p % 2) + 1];
        const __m256i q = kx8_fields(dword_at(g + q2_vals_at(2 * p) + rw),
                                     dword_at(g + q2_vals_at(2 * p + 1) + rw), 2, 0, 3);
        emit32(s, k + 32 * p, q, d * static_cast<float>(sa & 0xF), dmin * static_cast<float>(sa >> 4),
               d * static_cast<float>(sb & 0xF), dmin * static_cast<float>(sb >> 4));
      }
    } else {
      uint8_t sc[12]; // the row's GGUF scale bytes
      for (int u = 0; u < 3; ++u)
        std::memcpy(sc + 4 * u, g + 16 + 32 * u + rw, 4);
      for (int p = 0; p < 8; ++p) { // groups 2p, 2p + 1: u − 4, u = low | third << 2
        const uint32_t third = dword_at(g + q3_high_at(p) + rw);
        const __m256i low =
            kx8_fields(dword_at(g + q3_low_at(2 * p) + rw), dword_at(g + q3_low_at(2 * p + 1) + rw), 2, 0, 3);
        const __m256i u = _mm256_or_si256(low, _mm256_slli_epi16(kx8_fields(third, third, 1, 4, 1), 2));
        emit32(s, k + 32 * p, _mm256_sub_epi8(u, _mm256_set1_epi8(4)),
               d * static_cast<float>(dtype_detail::q3_k_scale(sc, 2 * p)), 0.0f,
               d * static_cast<float>(dtype_detail::q3_k_scale(sc, 2 * p + 1)), 0.0f);
      }
    }
  }
}

struct StoreSink {
  float* y;
  template <int L> LOOM_DQ_INLINE void put(int64_t k, __m256 w) { _mm256_storeu_ps(y + k, w); }
};

// NT tokens (ldx apart) against one row: A independent accumulators per token hide the FMA latency.
template <int NT> struct DotSink {
  static constexpr int A = NT == 1 ? 4 : 2;
  const float* x;
  int64_t ldx;
  __m256 acc[NT][A];
  template <int L> LOOM_DQ_INLINE void put(int64_t k, __m256 w) {
    for (int t = 0; t < NT; ++t)
      acc[t][L % A] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + t * ldx + k), acc[t][L % A]);
  }
};

LOOM_DQ_INLINE float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

template <DType T, int NT>
LOOM_DQ void row_dot(const uint8_t* row, int64_t K, const float* x, int64_t ldx, float* out, int64_t ldo) {
  DotSink<NT> s{x, ldx, {}};
  for (auto& a : s.acc)
    for (auto& v : a)
      v = _mm256_setzero_ps();
  visit_row<T>(row, K, s);
  for (int t = 0; t < NT; ++t) {
    __m256 v = s.acc[t][0];
    for (int a = 1; a < DotSink<NT>::A; ++a)
      v = _mm256_add_ps(v, s.acc[t][a]);
    out[t * ldo] = hsum(v);
  }
}

template <DType T> LOOM_DQ void dequant_row(const uint8_t* w, float* y, int64_t n) {
  StoreSink s{y};
  visit_row<T>(w, n, s);
}

// Rows [j0, j1) of w against T tokens, four tokens per pass over a row.
template <DType T>
void rows_range(const uint8_t* w, size_t rb, int64_t K, int64_t j0, int64_t j1, const float* x, int64_t T_,
                float* y, int64_t N) {
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* r = w + static_cast<size_t>(j) * rb;
    int64_t t = 0;
    for (; t + 4 <= T_; t += 4)
      row_dot<T, 4>(r, K, x + t * K, K, y + t * N + j, N);
    switch (T_ - t) {
    case 3:
      row_dot<T, 3>(r, K, x + t * K, K, y + t * N + j, N);
      break;
    case 2:
      row_dot<T, 2>(r, K, x + t * K, K, y + t * N + j, N);
      break;
    case 1:
      row_dot<T, 1>(r, K, x + t * K, K, y + t * N + j, N);
      break;
    default:
      break;
    }
  }
}

using RowsFn = void (*)(const uint8_t*, size_t, int64_t, int64_t, int64_t, const float*, int64_t, float*,
                        int64_t);
using DequantFn = void (*)(const uint8_t*, float*, int64_t);

struct Entry {
  DType type;
  RowsFn rows;
  DequantFn dequant;
};

template <DType T> constexpr Entry entry() {
  return {T, &rows_range<T>, &dequant_row<T>};
}

constexpr Entry k_entries[] = {entry<DType::q4_0>(), entry<DType::q4_1>(), entry<DType::q5_0>(),
                               entry<DType::q5_1>(), entry<DType::q8_0>(), entry<DType::iq4_nl>(),
                               entry<DType::q2_k>(), entry<DType::q3_k>(), entry<DType::q4_k>(),
                               entry<DType::q5_k>(), entry<DType::q6_k>(), entry<DType::iq4_xs>()};

const Entry* find(DType t) noexcept {
  for (const Entry& e : k_entries)
    if (e.type == t) return &e;
  return nullptr;
}

} // namespace

bool dq_supports(Isa isa, DType type) noexcept {
  return at_least(isa, Isa::avx2) && find(type) != nullptr;
}

void dequantize_dq(DType type, const uint8_t* w, float* y, int64_t n) {
  find(type)->dequant(w, y, n);
}

LOOM_DQ void dequantize_kx8_row(DType type, const uint8_t* g, int r, int64_t K, float* y) {
  StoreSink s{y};
  if (type == DType::q2_k)
    visit_kx8_row<DType::q2_k>(g, r, K, s);
  else if (type == DType::q5_k)
    visit_kx8_row<DType::q5_k>(g, r, K, s);
  else
    visit_kx8_row<DType::q3_k>(g, r, K, s);
}

void matmul_dq(DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, const float* x,
               int64_t T, float* y, int n_threads) {
  const RowsFn f = find(type)->rows;
  const int threads = n_threads > 0 ? n_threads : omp_get_max_threads();
#pragma omp parallel num_threads(threads) if (N * K * T > 32768)
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    f(w, row_bytes, K, N * id / nt, N * (id + 1) / nt, x, T, y, N);
  }
}

void gemv_share_dq(DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, const float* x,
                   float* y) {
  const int nt = omp_get_num_threads(), id = omp_get_thread_num();
  find(type)->rows(w, row_bytes, K, N * id / nt, N * (id + 1) / nt, x, 1, y, N);
}

} // namespace loom::cpu
