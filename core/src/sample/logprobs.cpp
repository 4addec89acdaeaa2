// sample/logprobs.cpp — log-probabilities under softmax(logits), the model's raw distribution: a
// token's (token_logprob) and the k most likely (top_logprobs).
#include "loom/sample/logprobs.hpp"

#include "loom/error.hpp"
#include "loom/sdk/sampler.hpp"
#include "sample/dist.hpp"
#include "sample/params.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace loom {

using sample::kNegInf;

namespace {

using sample::fail_arg;

// e^x for x ≤ 0 in float, 0 below -87 (and for -inf / NaN): 2^k · e^r with r = x - k·ln 2 in
// [-ln2/2, ln2/2] and a degree-7 Taylor polynomial (relative error < 2e-7), written without branches or
// library calls so that the loops below vectorize — the per-token log-probability reads the whole vocabulary.
inline float exp_nonpositive(float x) {
  const bool live = x >= -87.0f; // (false for NaN)
  x = live ? x : -87.0f;
  const float k = (x * 1.44269504f + 12582912.0f) - 12582912.0f; // round to nearest (|x·log2 e| < 2^22)
  const float r = (x - k * 0.693145752f) - k * 1.42860677e-6f;   // ln 2 split in two (Cody–Waite)
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const auto bits = static_cast<uint32_t>(static_cast<int32_t>(k) + 127) << 23; // 2^k (k ≥ -126: normal)
  return live ? p * std::bit_cast<float>(bits) : 0.0f;
}

// Σ e^(l - mx) over the logits (NaN: 0), in vector lanes.
LOOM_VOCAB_LOOP double sum_exp_below(std::span<const float> logits, float mx) {
  constexpr size_t w = 16; // partial sums the compiler keeps in vector lanes
  float acc[w] = {};
  const size_t n = logits.size() / w * w;
  for (size_t i = 0; i < n; i += w)
    for (size_t j = 0; j < w; ++j)
      acc[j] += exp_nonpositive(logits[i + j] - mx);
  double sum = 0.0;
  for (size_t i = n; i < logits.size(); ++i)
    sum += static_cast<double>(exp_nonpositive(logits[i] - mx));
  for (float a : acc)
    sum += static_cast<double>(a);
  return sum;
}

// softmax(logits)'s normalizer: max and log Σ e^(l - max), NaN logits left out; a vocabulary with no
// finite maximum (all -inf, or some +inf) has none: nullopt.
struct Normalizer {
  float max = kNegInf;
  double log_sum = 0.0;
};
std::optional<Normalizer> normalizer(std::span<const float> logits) {
  const float mx = sample::max_key(logits);
  if (!std::isfinite(mx)) return std::nullopt;
  return Normalizer{mx, std::log(sum_exp_below(logits, mx))};
}

void check_token(std::span<const float> logits, TokenId token) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size())
    fail_arg("token_logprob: token " + std::to_string(token) + " is outside the vocabulary of " +
             std::to_string(logits.size()));
}

// token's log-probability given the normalizer (or, without one, the maximal tokens sharing the mass).
float logprob_with(std::span<const float> logits, const std::optional<Normalizer>& z, TokenId token) {
  const float key = Candidates::order_key(logits[static_cast<size_t>(token)]);
  if (z) return static_cast<float>(static_cast<double>(key) - static_cast<double>(z->max) - z->log_sum);
  const float mx = sample::max_key(logits);
  if (key != mx) return kNegInf;
  const auto ties =
      std::count_if(logits.begin(), logits.end(), [&](float l) { return Candidates::order_key(l) == mx; });
  return static_cast<float>(-std::log(static_cast<double>(ties)));
}

} // namespace

float token_logprob(std::span<const float> logits, TokenId token) {
  check_token(logits, token);
  return logprob_with(logits, normalizer(logits), token);
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
  const std::optional<Normalizer> z = normalizer(logits); // once for the k of them
  std::vector<std::pair<TokenId, float>> out;
  out.reserve(k);
  for (size_t i = 0; i < k; ++i)
    out.emplace_back(ids[i], logprob_with(logits, z, ids[i]));
  return out;
}

} // namespace loom
