// backends/cpu/cpu_backend.hpp — the cpu backend's executor: every op of the graph on one OpenMP
// pool, matrix products on oneDNN (prefill, weights dequantized a panel at a time, never kept
// twice) or on our own kernels (decode, and at AVX-512 VNNI the quantized types' prompts: weights read from
// their GGUF blocks, or from a copy repacked 8 rows at a time that replaces the file's pages), attention as
// a tiled online-softmax kernel over the KV cache (FlashAttention-style, GQA-aware).
#pragma once

#include "attention_cpu.hpp" // flash_attention
#include "kernels.hpp"
#include "loom/sdk/executor.hpp"

#include <memory>

namespace loom::cpu {

struct CpuOptions {
  int threads = 0;        // 0: every core
  Isa isa = Isa::scalar;  // our kernels' path (detect_isa())
  int gemm_min_rows = 16; // f32/f16/bf16 matmuls with at least this many token rows go to oneDNN (0: never)
  // Repacked quantized matrices: our integer kernel reads the weights once for every row, oneDNN needs
  // them dequantized first, which pays off only for long batches (on Q4_0 tinyllama, 2 threads: 80 vs
  // 22 tok/s at 16 rows, even at 128, 100 vs 74 at 512).
  int gemm_min_rows_quant = 256;
  // F16 matrices in their f16x64 copy (AVX-512): the exact kernel converts each weight once per 3 tokens,
  // oneDNN needs the panels dequantized first — on SmolLM2-135M F16 (2 threads, the Zen 4 of
  // docs/benchmarks.md) the kernel prefills 16 tokens at 485 tok/s against 276, 64 at 619 against 500, and
  // oneDNN wins from ≈ 128 (658 against 619). Speculative verification batches (5–32 rows) stay on
  // the kernel.
  int gemm_min_rows_f16 = 96;
  // Quantized matrices (rows a multiple of 8; Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K at every level, and Q5_1,
  // IQ4_NL, Q2_K, Q3_K, Q5_K, IQ4_XS at avx512_vnni: cpu::repackable) repacked on first use into the 8-row
  // layout of the int8 kernels; the file's pages of a repacked tensor are released (and its rows read from
  // the copy), so its weights stay resident once.
  // Weight data must stay valid and unchanged for the backend's lifetime (a model's always does).
  bool repack = true;
  // BF16 matrices in batches of at least gemm_min_rows tokens: oneDNN's bf16 matmul (AVX512-BF16, or AMX
  // where the CPU has it) on the activations rounded to bf16 — 2.5–3× the f32 GEMM, at a relative error
  // of the activations' rounding (2⁻⁹). Only at Isa::avx512_bf16 and when oneDNN has a native kernel;
  // false: the exact f32 GEMM on converted panels.
  bool bf16_gemm = true;
  // BF16 matrices (K % 16 == 0, N % 64 == 0) repacked on first use 64 rows at a time (bf16x64,
  // kernels_bf16.cpp; the file's pages released) and multiplied for decode and small batches by vdpbf16ps
  // on the activations rounded to bf16 — ≈ 1.3× the exact f32 loop's decode, at bf16_gemm's error. The
  // copy is oneDNN's blocked bf16 weight layout, so prefill's bf16 matmul reads it in place (without
  // bf16_gemm: the exact f32 GEMM on panels converted from it). Only at Isa::avx512_bf16; false: the
  // exact f32 kernels on the GGUF rows.
  bool bf16_gemv = true;
  // F16 matrices rounded to BF16 when repacked (3 of F16's 10 mantissa bits lost per weight, as
  // ik_llama.cpp's run-time repacking does) and then every BF16 route above: bf16 prefill and decode.
  // Only at Isa::avx512_bf16; false (the default): F16 weights stay exact.
  bool f16_as_bf16 = false;
  // F16 matrices (not rounded) repacked 64 rows at a time ("f16x64": the bf16x64 layout with the F16
  // values as they are) for decode and small batches: the weights widened to f32 and f32 FMAs, one
  // sequential stream per thread. Only at Isa::avx512 and up; false: the F16 rows in place.
  bool f16_gemv = true;
  // Decode (one token): the matmuls of q, k, v (and of gate, up) that read the same activation run in one
  // parallel region (gemv_multi), the threads going from one matrix to the next without a barrier — the
  // same kernels, so the same floats; false: one region per matmul.
  bool fused_decode = true;
  // The logits' matmul (the output head) multiplies the f32 hidden state exactly, whatever the head's type
  // (kernels_dq.cpp at avx2: weights unpacked to their exact values, f32 FMAs), where the int8 kernels
  // would round the activations to 8 bits per block of 32: one matrix of the model, and the one whose
  // errors decide between near-tied tokens (SmolLM2's outlier dimension makes them ≈ 1 % of the logits).
  // false: the head takes its type's route like any other matrix.
  bool exact_logits = true;
  // Under exact_logits, a block-type head runs on its own (int8) kernels for the whole vocabulary and only
  // each row's this-many highest logits are recomputed exactly (greedy and top-k up to this see exact
  // logits; the rest carry the int8 route's error); 0: the whole head exact.
  int logits_rescore = 64;
  // Every matrix multiplied exactly (what exact_logits does for the head, for all of them): the block types
  // with int8 kernels take the exact f32 route too, so no activation is rounded
  // anywhere and the logits are the reference backend's up to summation order — for checking a model, or
  // where the int8 routes' rounding matters (Gemma 3's residual outliers move its logits by up to ≈ 0.6 on
  // them). Slower at decode (the int8 kernels are ≈ 1.3–2× the f32 FMAs on the same weights).
  bool exact_matmul = false;
  // Every node (a fused group of decode GEMVs as one) timed with the host's clock, and a table by op kind
  // on stderr when the backend goes (loom/sdk/op_profile.hpp; `loom bench --profile`).
  bool profile = false;
};

std::unique_ptr<Backend> make_cpu_backend(const CpuOptions& opt);
// Repacked matrices of read-only file mappings that some cpu backend of the process holds now; backends
// that run the same mapped matrix the same way (ISA, layout) hold one copy between them.
size_t shared_repacked_matrices();

} // namespace loom::cpu
