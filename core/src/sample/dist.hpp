// sample/dist.hpp — private to core/src/sample/: the arg-max of a candidate list and `dist`'s draw,
// which the chain runs at its end when no stage selected a token.
#pragma once

#include "loom/sample/sampler.hpp"

#include <cstddef>
#include <limits>
#include <span>

namespace loom::sample {

// Loops over a whole vocabulary, compiled for AVX-512 and AVX2 too and picked at load time (the library
// itself targets baseline x86-64). Not under ThreadSanitizer: its runtime is not up yet when the loader
// runs the clones' resolvers (the tsan build's tests crashed at start).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define LOOM_VOCAB_LOOP __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LOOM_VOCAB_LOOP
#endif

// The logit of a candidate a stage removed.
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The index of the most likely candidate (ties: the lower token id).
size_t best_index(std::span<const TokenData> d);
// The index of the greatest order key (NaN as -inf) of a non-empty row of logits, the lowest on ties (all
// -inf or NaN: 0), in vector lanes; and that key (-inf for an empty row).
size_t arg_max_key(std::span<const float> logits);
float max_key(std::span<const float> logits);
// Whether s is the built-in `greedy` sampler.
bool is_greedy(const Sampler& s);

// Selects a candidate by one draw of the request's RNG (ctx.uniform()), proportional to its
// probability; an empty list selects nothing (-1) but still draws.
void dist_select(Candidates& c, const SamplerContext& ctx);

} // namespace loom::sample
