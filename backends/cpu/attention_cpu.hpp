// The cpu backend's attention entry point: tiled online softmax over the KV cache (attention_cpu.cpp).
#pragma once

#include "kernels.hpp"
#include "loom/sdk/executor.hpp"

#include <cstdint>

namespace loom::cpu {

// The attention kernel on its own (tests compare it with attention::reference_attention):
// q [T][n_head][D], out [T][n_head][D]; the batch's K/V rows must already be in `kv`.
void flash_attention(const AttentionParams& p, const float* q, int32_t n_tokens, const Pos* pos,
                     const KVRows& kv, float* out, Isa isa);

} // namespace loom::cpu
