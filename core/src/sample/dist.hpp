// sample/dist.hpp — private to core/src/sample/: the arg-max of a candidate list and `dist`'s draw,
// which the chain runs at its end when no stage selected a token.
#pragma once

#include "loom/sample/sampler.hpp"

#include <cstddef>
#include <limits>
#include <span>

namespace loom::sample {

// The logit of a candidate a stage removed.
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The index of the most likely candidate (ties: the lower token id).
size_t best_index(std::span<const TokenData> d);

// Selects a candidate by one draw of the request's RNG (ctx.uniform()), proportional to its
// probability; an empty list selects nothing (-1) but still draws.
void dist_select(Candidates& c, const SamplerContext& ctx);

} // namespace loom::sample
