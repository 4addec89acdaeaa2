// sample/logprobs.cpp — log-probabilities under softmax(logits), the model's raw distribution: a
// token's (token_logprob) and the k most likely (top_logprobs).
#include "loom/sample/logprobs.hpp"

#include "loom/error.hpp"
#include "loom/sdk/sampler.hpp"
#include "sample/dist.hpp"
#include "sample/params.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace loom {

using sample::kNegInf;

namespace {

using sample::fail_arg;

} // namespace

float token_logprob(std::span<const float> logits, TokenId token) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size())
    fail_arg("token_logprob: token " + std::to_string(token) + " is outside the vocabulary of " +
             std::to_string(logits.size()));
  float mx = kNegInf;
  for (float l : logits)
    mx = std::max(mx, Candidates::order_key(l));
  if (!std::isfinite(mx)) { // all -inf, or some +inf: the maximal tokens share the mass
    if (Candidates::order_key(logits[static_cast<size_t>(token)]) != mx) return kNegInf;
    const auto ties =
        std::count_if(logits.begin(), logits.end(), [&](float l) { return Candidates::order_key(l) == mx; });
    return static_cast<float>(-std::log(static_cast<double>(ties)));
  }
  double sum = 0.0;
  for (float l : logits)
    if (!std::isnan(l)) sum += std::exp(static_cast<double>(l) - static_cast<double>(mx));
  const double lt = static_cast<double>(Candidates::order_key(logits[static_cast<size_t>(token)]));
  return static_cast<float>(lt - static_cast<double>(mx) - std::log(sum));
}

std::vector<std::pair<TokenId, float>> top_logprobs(std::span<const float> logits, size_t k) {
  std::vector<TokenId> ids;
  ids.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isnan(logits[i])) ids.push_back(static_cast<TokenId>(i));
  k = std::min(k, ids.size());
  const auto higher = [&](TokenId a, TokenId b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la != lb ? la > lb : a < b;
  };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), higher);
  std::vector<std::pair<TokenId, float>> out;
  out.reserve(k);
  for (size_t i = 0; i < k; ++i)
    out.emplace_back(ids[i], token_logprob(logits, ids[i]));
  return out;
}

} // namespace loom
