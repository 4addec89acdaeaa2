// loom/sdk/sampler.hpp — the Sampler interface: the built-in samplers and a plugin's implement it alike.
//
// A sampler either transforms/filters the candidate list (temperature, top_k, penalties, …) or selects
// a token (greedy, dist). The host runs a request's samplers in order (its chain) on one Candidates
// view; a plugin's sampler gets the same view over the same memory (the C ABI's loom_candidates).
// Header-only: plugins compile it in.
#pragma once

#include "loom/sdk/abi.h"
#include "loom/sdk/error.hpp"
#include "loom/sdk/types.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace loom {

class Tokenizer; // the host's vocabulary (built-in samplers only)

struct TokenData {
  TokenId id;
  float logit;
  float p; // probability; valid after a softmax was applied (see Candidates::has_probs)
};
static_assert(sizeof(TokenData) == sizeof(loom_token_data) &&
                  offsetof(TokenData, id) == offsetof(loom_token_data, id) &&
                  offsetof(TokenData, logit) == offsetof(loom_token_data, logit) &&
                  offsetof(TokenData, p) == offsetof(loom_token_data, p),
              "TokenData is loom_token_data in C++");

// The candidate list of one sampling step (llama_token_data_array): a view over memory its caller
// owns. A sampler may reorder and change `data`, shrink it (never grow it: `data = data.first(n)`),
// and select (`selected`, an index into data).
struct Candidates {
  std::span<TokenData> data;
  bool sorted = false;    // data sorted by logit, descending (ties: lower id first)
  bool has_probs = false; // p holds softmax(logit) over `data`
  int64_t selected = -1;  // index into data once a selecting sampler ran

  // Fills `storage` with ids 0..n-1 and their logits (unsorted) and views it.
  static Candidates from_logits(std::span<const float> logits, std::vector<TokenData>& storage) {
    storage.resize(logits.size());
    for (size_t i = 0; i < logits.size(); ++i)
      storage[i] = TokenData{static_cast<TokenId>(i), logits[i], 0.0f};
    return Candidates{std::span<TokenData>(storage)};
  }
  // The selected token's id, -1 when none is.
  TokenId selected_id() const noexcept {
    return selected >= 0 && static_cast<size_t>(selected) < data.size()
               ? data[static_cast<size_t>(selected)].id
               : -1;
  }
  // Points `selected` at token `id` again after a reorder or filter (-1 when it is gone).
  void reselect(TokenId id) noexcept {
    selected = -1;
    if (id < 0) return;
    for (size_t i = 0; i < data.size(); ++i)
      if (data[i].id == id) {
        selected = static_cast<int64_t>(i);
        return;
      }
  }
  // NaN logits order (and count) as -inf.
  static float order_key(float logit) noexcept {
    return std::isnan(logit) ? -std::numeric_limits<float>::infinity() : logit;
  }
  // Strict "a comes before b": higher logit first, then lower id.
  static bool before(const TokenData& a, const TokenData& b) noexcept {
    const float ka = order_key(a.logit), kb = order_key(b.logit);
    return ka != kb ? ka > kb : a.id < b.id;
  }
  void sort_desc() {
    if (sorted) return;
    const TokenId sel = selected_id();
    std::sort(data.begin(), data.end(), before);
    sorted = true;
    reselect(sel);
  }
  // p = softmax(logit) in list order (an infinite maximum shares the mass among the maximal tokens);
  // returns the sum of the unnormalised weights.
  double compute_probs() noexcept {
    if (data.empty()) return 0.0;
    float mx = -std::numeric_limits<float>::infinity();
    for (const auto& t : data)
      mx = std::max(mx, order_key(t.logit));
    double sum = 0.0;
    for (auto& t : data) {
      if (!std::isfinite(mx))
        t.p = order_key(t.logit) == mx ? 1.0f : 0.0f;
      else
        t.p = std::isnan(t.logit) ? 0.0f : std::exp(t.logit - mx);
      sum += static_cast<double>(t.p);
    }
    for (auto& t : data)
      t.p = static_cast<float>(static_cast<double>(t.p) / sum);
    return sum;
  }
  void softmax() { // sorts first
    sort_desc();
    compute_probs();
    has_probs = true;
  }
};

// What a sampler may read about the sequence it samples for, valid for one apply() call. The RNG is
// the request's, so a request's tokens never depend on its batch-mates.
struct SamplerContext {
  std::span<const TokenId> prompt;              // prompt tokens (BOS included)
  std::span<const TokenId> generated;           // tokens generated so far
  void* rng_state = nullptr;                    // the request's seeded RNG (opaque)
  double (*rng_uniform)(void* state) = nullptr; // one draw from it in [0, 1)
  const Tokenizer* tokenizer = nullptr;         // the vocabulary (host side only: nullptr in a plugin)

  double uniform() const {
    if (rng_uniform == nullptr || rng_state == nullptr)
      throw Error(Errc::internal, "sampler", "no RNG in this sampling context (SamplerContext::rng_state)");
    return rng_uniform(rng_state);
  }
};

class Sampler {
public:
  virtual ~Sampler() = default;
  // Filter/transform the candidates, or select one (set c.selected).
  virtual void apply(Candidates& c, const SamplerContext& ctx) = 0;
  virtual std::unique_ptr<Sampler> clone() const = 0;
  virtual void accept(TokenId /*token*/) {} // the token the request committed (stateful samplers)
  virtual void reset() {}
  virtual bool selects() const noexcept { return false; } // true when apply() always selects
  // The name in messages and `loom explain` (the host names a plugin's by its TOML name).
  virtual std::string_view name() const noexcept { return "sampler"; }
  // For speculative sampling: apply(), except that a sampler drawing from an explicit distribution
  // (dist) leaves that distribution in c (has_probs) instead of drawing. True when c now holds the
  // chain's final distribution: probabilities over c.data, or c.selected (one-hot). A sampler whose
  // draw is opaque draws here: one-hot at its draw is exact for speculative sampling, only less often
  // accepted.
  virtual bool distribution(Candidates& c, const SamplerContext& ctx) {
    apply(c, ctx);
    return c.selected >= 0;
  }
};

} // namespace loom
