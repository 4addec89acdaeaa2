// The cpu backend's attention entry point: tiled online softmax over the KV cache (attention_cpu.cpp).
#pragma once

#include "kernels.hpp"
#include "loom/sdk/executor.hpp"

#include <cstdint>

namespace loom::cpu {

// The attention kernel on its own (tests compare it with attention::reference_attention):
// q [T][n_head][D], out [T][n_head][D]; the batch's K/V rows must already be in `kv`. Token-tree rows
// (rope, tree_base, tree_mask non-null: BatchView's) attend what loom::tree_attends allows; each runs as a
// decode row over the list of exactly its keys. sink_logits: the node's learned sink logits (n_head), or
// null.
void flash_attention(const AttentionParams& p, const float* q, int32_t n_tokens, const Pos* pos,
                     const KVRows& kv, float* out, Isa isa, const Pos* rope = nullptr,
                     const Pos* tree_base = nullptr, const uint64_t* tree_mask = nullptr,
                     const float* sink_logits = nullptr);

} // namespace loom::cpu
