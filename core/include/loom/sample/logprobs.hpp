// loom/sample/logprobs.hpp — log-probabilities under the model's raw distribution, softmax(logits): the
// logprobs of a result and OpenAI's top_logprobs. No sampler takes part.
#pragma once

#include "loom/sdk/types.hpp"

#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace loom {

// Log-probability of `token` under softmax(logits) (the model's raw distribution).
float token_logprob(std::span<const float> logits, TokenId token);
// The k most likely tokens under softmax(logits) and their log-probabilities, most likely first (ties:
// lower id first); NaN logits are left out. OpenAI's top_logprobs.
std::vector<std::pair<TokenId, float>> top_logprobs(std::span<const float> logits, size_t k);

} // namespace loom
