// backends/cpu/kernels.hpp — matrix kernels of the cpu backend: weights read straight from their
// GGUF blocks (or from a copy repacked 8 rows at a time: repackable()), activations
// quantized on the fly to 8 bits for the integer paths (blocks of 32; of 256 for the k-quants).
#pragma once

#include "loom/sdk/dtype.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace loom::cpu {

// Instruction-set levels, each including the ones before it: scalar (any x86-64); avx2 (+ FMA, F16C);
// avx512 (F, BW, VL, DQ); avx512_vnni (+ VNNI: int8 dot products, vpdpbusd); avx512_bf16 (+ BF16:
// vdpbf16ps); amx (+ AMX tiles with int8 and bf16 products, and Linux has granted this process the tile
// state: arch_prctl(ARCH_REQ_XCOMP_PERM), asked once by the detection). A kernel written for a level runs
// on every higher one.
enum class Isa { scalar = 0, avx2 = 1, avx512 = 2, avx512_vnni = 3, avx512_bf16 = 4, amx = 5 };
inline bool at_least(Isa have, Isa level) noexcept {
  return static_cast<int>(have) >= static_cast<int>(level);
}
// The highest level this CPU and OS run (cpuid and the OS's saved register state, XCR0).
Isa cpu_isa() noexcept;
bool isa_supported(Isa level) noexcept;
// cpu_isa(), or the level $LOOM_CPU_ISA names (scalar, avx2, avx512, avx512_vnni, avx512_bf16, amx). Throws
// loom::Error for an unknown name or a level this CPU lacks.
Isa detect_isa();
const char* isa_name(Isa isa) noexcept;
// The levels, lowest first.
constexpr Isa k_isa_levels[] = {Isa::scalar,      Isa::avx2,        Isa::avx512,
                                Isa::avx512_vnni, Isa::avx512_bf16, Isa::amx};

// Types with a direct kernel; the backend dequantizes others (q4_1, q5_*) a row at a time.
bool has_kernel(DType t) noexcept;

// One row of n elements to f32: exactly dequantize_row's values (AVX2 for f16, q8_0, q4_0).
void dequantize(Isa isa, DType type, const uint8_t* w, float* y, int64_t n);

// y[t][j] = Σ_k W[j][k] · x[t][k] for t < T, j < N.
//   w: N rows of K elements in `type`, `row_bytes` apart;  x: [T][K] f32;  y: [T][N] f32.
// Rows of W are split over the calling OpenMP team (n_threads ≤ 0: the OpenMP default).
void matmul(Isa isa, DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, const float* x,
            int64_t T, float* y, int n_threads);

// Q8_0, Q4_0, Q4_1, Q5_0, Q4_K and Q6_K repacked for decode in groups of 8 rows (layouts in kernels.cpp;
// the 32-value block types store two groups side by side, 16 rows, with an odd last group alone), and Q2_K,
// Q3_K and IQ4_XS too at avx512_vnni and up (their kernels there only): N % 8 == 0. A repacked matrix has the
// GGUF size.
bool repackable(Isa isa, DType type, int64_t K, int64_t N) noexcept;
size_t repacked_bytes(DType type, int64_t K, int64_t N);
// Rows [0, N) of w (row_bytes apart) into `out` (repacked_bytes(type, K, N) bytes); rows
// [16i, 16i + N) of a matrix go to offset repacked_bytes(type, K, 16i), so a matrix can be repacked in
// slices of a multiple of 16 rows (the last one any multiple of 8).
void repack(DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, uint8_t* out);
// Row `row` of a repacked matrix of N rows to f32 (exactly dequantize_row's values).
void dequantize_repacked(Isa isa, DType type, const uint8_t* wp, int64_t K, int64_t N, int64_t row, float* y);
// Whether matmul_repacked() runs the int8 GEMM for this type (AVX-512 VNNI: the repacked types), which
// beats dequantizing to an f32 GEMM at every batch size.
bool int8_gemm(Isa isa, DType type) noexcept;
// Otherwise matmul_repacked() runs the one-token kernels token by token, each group's weights kept in cache
// across the batch. Whether that beats an f32 GEMM on dequantized panels up to gemm_min_rows_quant tokens
// (Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K), or only below gemm_min_rows (Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS at
// avx2: their kernels unpack bit planes or look up levels per token, and the GEMM wins from ≈ 32 tokens).
bool repacked_loop_light(Isa isa, DType type) noexcept;
// Exact products of a repacked matrix for a batch, faster than its rows dequantized into an f32 GEMM: at
// Isa::amx, Q4_1 (N % 16 == 0) on bf16 tiles — each weight and each f32 activation exact (the activation as
// three bf16 parts), the sums f32 (kernels_amx.cpp). Whether this type has it here:
bool exact_tiles(Isa isa, DType type, int64_t N) noexcept;
// Its scratch, grown to what a call needs: the activations split into A tiles (a), kept for the next call on
// the same activations, and each thread's B tiles (b).
struct ExactTilesWork {
  std::vector<uint16_t> a, b;
  size_t bytes() const noexcept { return (a.size() + b.size()) * sizeof(uint16_t); }
};
// same_x: x is the previous call's activations (same K and T, unchanged since), whose split work.a still
// holds — q, k and v (gate and up) of a layer share one split.
void matmul_repacked_exact(DType type, const uint8_t* wp, int64_t K, int64_t N, const float* x, int64_t T,
                           float* y, int n_threads, ExactTilesWork& work, bool same_x = false);
// matmul() on a repacked matrix: the same integer sums as matmul() on the GGUF rows.
void matmul_repacked(Isa isa, DType type, const uint8_t* wp, int64_t K, int64_t N, const float* x, int64_t T,
                     float* y, int n_threads);

// One token (T = 1) against several matrices of the same width K (q, k, v; gate, up): the activation
// quantized once per block kind, every matrix's rows shared among the threads in one parallel region with
// no barrier between the matrices. The kernels and sums of matmul_repacked / matmul for one token, so
// their floats. A matrix is repacked (row_bytes 0; the repackable() types, BF16 as bf16x64 at
// avx512_bf16, the token rounded to bf16 once, or F16 as f16x64 at avx512) or, at avx2 and up, F32 /
// F16 / BF16 rows row_bytes apart (gemv_multi_supports says which).
struct Gemv {
  DType type;
  const uint8_t* w;
  size_t row_bytes; // 0: repacked (N % 8 == 0; bf16 / f16: the bf16x64 / f16x64 layout, N % 64 == 0)
  int64_t N;
  float* y; // N outputs
  bool i8 =
      false; // Q4_1 / Q5_x / IQ4_NL / Q2_K / Q3_K / Q5_K / IQ4_XS rows on the int8 route (i8dq_supports)
  const float* x = nullptr; // its own activation (K values); nullptr: gemv_multi's x
};
bool gemv_multi_supports(Isa isa, DType type, bool repacked) noexcept;
void gemv_multi(Isa isa, const Gemv* mats, int n_mats, int64_t K, const float* x, int n_threads);

// BF16 matrices (and F16 ones rounded to BF16, when asked) repacked 64 rows at a time for AVX512-BF16
// ("bf16x64", layout in kernels_bf16.cpp; oneDNN's BA16a64b2a weights): K % 16 == 0, N % 64 == 0; the
// repacked matrix has the BF16 size. The products run on the activations rounded to bf16 (to_bf16), only
// at Isa::avx512_bf16.
bool bf16x64_repackable(DType type, int64_t K, int64_t N) noexcept;
size_t bf16x64_bytes(int64_t K, int64_t N);
// Rows [0, N) of a BF16 or F16 matrix (row_bytes apart) into `out` (bf16x64_bytes(K, N) bytes); rows
// [64i, 64i + N) of a matrix go to element offset 64i·K.
void repack_bf16x64(DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, uint16_t* out);
// Row `row` of a repacked matrix to f32 (exact).
void dequantize_bf16x64(const uint16_t* wp, int64_t K, int64_t row, float* y);
// y[t][j] = Σ_k W[j][k] · bf16(x[t][k]) for t < T (a few tokens; a long batch is a GEMM's job).
void matmul_bf16x64(Isa isa, const uint16_t* wp, int64_t K, int64_t N, const float* x, int64_t T, float* y,
                    int n_threads);
// Inside a parallel region: this thread's share of one token (xb: its K bf16 values) against a repacked
// matrix, no barrier (gemv_multi).
void gemv_share_bf16x64(const uint16_t* wp, int64_t K, int64_t N, const uint16_t* xb, float* y);

// Exact F16 matrices in the same 64-row layout ("f16x64", kernels_bf16.cpp), for AVX-512 CPUs (no F16
// product instruction needed: the weights widen to f32 and the products and sums are f32 FMAs):
// bf16x64_repackable(f16, K, N), bf16x64_bytes(K, N) bytes. Only at Isa::avx512 and up.
void repack_f16x64(const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, uint16_t* out);
void dequantize_f16x64(Isa isa, const uint16_t* wp, int64_t K, int64_t row, float* y);
// Rows [row, row + n) to f32, K apart in y (whole 64-row groups transposed a block at a time).
void dequantize_f16x64_rows(Isa isa, const uint16_t* wp, int64_t K, int64_t row, int64_t n, float* y);
// y[t][j] = Σ_k W[j][k] · x[t][k] for t < T (a few tokens), in f32.
void matmul_f16x64(Isa isa, const uint16_t* wp, int64_t K, int64_t N, const float* x, int64_t T, float* y,
                   int n_threads);
// Inside a parallel region: this thread's share of one token against an f16x64 matrix (gemv_multi).
void gemv_share_f16x64(const uint16_t* wp, int64_t K, int64_t N, const float* x, float* y);

// Exact products for the block types read in place (kernels_dq.cpp): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS at avx2 and up. Each weight is unpacked in registers to
// dequantize_row's value and multiplied by the f32 activation with an FMA: no activation is rounded.
bool dq_supports(Isa isa, DType type) noexcept;
// One row of n values (a multiple of the type's block) to f32: exactly dequantize_row's values.
void dequantize_dq(DType type, const uint8_t* w, float* y, int64_t n);
// y[t][j] = Σ_k W[j][k] · x[t][k] for t < T (a few tokens: each row is read once for every four), rows split
// over n_threads.
void matmul_dq(DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, const float* x,
               int64_t T, float* y, int n_threads);
// Inside a parallel region: this thread's share of one token's rows (gemv_multi).
void gemv_share_dq(DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N, const float* x,
                   float* y);

// The int8 route of Q4_1, Q5_0, Q5_1, IQ4_NL, Q5_K and IQ4_XS at avx2 and up, on their GGUF rows: each
// block's weights (the K-quants: each 32-value sub-block's) unpacked in registers to small integers and
// multiplied by the activations rounded to 8 bits per block of 32 (as for Q4_0 / Q8_0, and as llama.cpp
// computes these types) — about twice the exact f32 FMAs' speed.
bool i8dq_supports(Isa isa, DType type) noexcept;
// Of those, the types whose rows are super-blocks of 256 (Q2_K, Q3_K, Q5_K, IQ4_XS): their activations are
// quantized in blocks of 256 (one scale, and the sums of each 16), the others' in blocks of 32.
inline bool i8dq_superblocks(DType t) noexcept {
  return t == DType::q2_k || t == DType::q3_k || t == DType::q5_k || t == DType::iq4_xs;
}
// y[t][j] = Σ_k W[j][k] · x[t][k] for t < T (decode and small batches), rows split over n_threads; K a
// multiple of the type's block.
void matmul_i8dq(Isa isa, DType type, const uint8_t* w, size_t row_bytes, int64_t K, int64_t N,
                 const float* x, int64_t T, float* y, int n_threads);

// n floats to bf16, rounded to nearest even (fp32_to_bf16's values; NaN stays NaN), vectorized with
// AVX512-BF16 at that level (which flushes denormal inputs to zero).
void to_bf16(Isa isa, const float* x, uint16_t* y, int64_t n);

} // namespace loom::cpu
