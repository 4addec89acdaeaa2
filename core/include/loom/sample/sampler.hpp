// loom/sample/sampler.hpp — llama.cpp's sampler-chain semantics, host side.
//
// A sampler either transforms/filters the candidate list (temperature, top_k, top_p, min_p,
// typical_p, penalties, logit_bias) or selects a token (greedy, dist). A SamplerChain applies its
// samplers in order (the TOML order); if the last one does not select, the chain ends with `dist`.
// `temperature = 0` means greedy: the temperature sampler then selects the arg-max itself (no
// division by zero), so a chain with temperature 0 is deterministic whatever follows.
// A sampler's parameters and their schemas are loom/sample/sampler_params.hpp's; log-probabilities of the
// model's raw distribution are loom/sample/logprobs.hpp's.
#pragma once

#include "loom/sample/sampler_params.hpp"
#include "loom/sdk/sampler.hpp"
#include "loom/sdk/types.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

// TokenData, Candidates, SamplerContext and Sampler are the SDK's (loom/sdk/sampler.hpp): the built-in
// samplers below implement the same interface as a plugin's. The host's RNG is a std::mt19937_64;
// rng_uniform(&rng) draws one 64-bit number and maps it to [0, 1) with 53 bits.
double rng_uniform(void* mt19937_64) noexcept;

struct SamplerInfo {
  std::string name;
  std::string help;
  std::vector<ParamSchema> params;
};

// The built-in samplers and their parameters:
//   temperature {value ≥ 0}            top_k {k ≥ 0, 0 = off}         top_p {p ∈ (0,1], min_keep ≥ 1}
//   min_p {p ∈ [0,1], min_keep}        typical_p {p ∈ (0,1], min_keep}
//   penalties {repeat > 0 (1 = off), frequency, presence, last_n ≥ -1 (-1 = whole history, 0 = off)}
//   logit_bias {tokens = [ids], values = [biases]}   greedy {}   dist {}
//   json_schema {schema = "JSON schema" ("" = any JSON object)}: only tokens that keep the text on
//     its way to a value of the schema (loom/sample/json_constraint.hpp); put it before the selecting stages
const std::vector<SamplerInfo>& builtin_samplers();
// Creates a sampler from a validated spec; throws loom::Error(invalid_argument) for an unknown name,
// unknown key, wrong type or out-of-range value (message names the sampler, the key and the range).
std::unique_ptr<Sampler> create_sampler(const SamplerSpec& spec);

class SamplerChain final : public Sampler {
public:
  SamplerChain() = default;
  void add(std::unique_ptr<Sampler> s); // takes ownership
  std::string_view name() const noexcept override { return "chain"; }
  void apply(Candidates& c, const SamplerContext& ctx) override; // runs all; appends dist if none selected
  // Each sampler's distribution() in order, to the final one.
  bool distribution(Candidates& c, const SamplerContext& ctx) override;
  // apply(), calling `after(stage, sampler, c)` after each stage — the implicit final dist included
  // (sampler nullptr) — with exactly apply()'s effect and RNG draws (`loom explain`).
  void apply_traced(Candidates& c, const SamplerContext& ctx,
                    const std::function<void(size_t stage, const Sampler* s, const Candidates& c)>& after);
  void accept(TokenId token) override;
  void reset() override;
  std::unique_ptr<Sampler> clone() const override;
  bool selects() const noexcept override { return true; }
  size_t size() const noexcept { return samplers_.size(); }
  const Sampler& at(size_t i) const { return *samplers_.at(i); }

  // Convenience: candidates from logits, apply, return the selected id.
  TokenId sample(std::span<const float> logits, const SamplerContext& ctx);
  // When the chain is `greedy` alone: its choice, the logits' arg-max (ties: the lower id), found without
  // a candidate list (a greedy step's host work over a vocabulary of 10⁵); otherwise nullopt.
  std::optional<TokenId> greedy_choice(std::span<const float> logits) const;

private:
  std::vector<std::unique_ptr<Sampler>> samplers_;
};

// The chain llama.cpp builds from the usual flags: penalties → top_k → typical_p → top_p → min_p →
// temperature → dist, with the neutral ones left out. temperature == 0 gives greedy.
struct SamplingParams {
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float typical_p = 1.0f;
  float repeat_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t penalty_last_n = 64;
};
// The default chain as specs (what `loom run`'s --temp/--top-k … edit) and built; both throw on
// out-of-range values. The one definition of the default chain.
std::vector<SamplerSpec> default_chain_specs(const SamplingParams& p = {});
SamplerChain make_default_chain(const SamplingParams& p); // throws on out-of-range values

// The distribution sampler.apply() would draw the next token from (distribution(), then dist's when
// no sampler was final): out[i] = probability of token i, 0 for the tokens the chain removed, one-hot
// at a deterministic (or opaque) selection.
void sampling_distribution(Sampler& sampler, std::span<const float> logits, const SamplerContext& ctx,
                           std::span<float> out);

} // namespace loom
