// sample/chain.cpp — SamplerChain (the samplers in TOML order, ending with `dist` when none selected),
// the distribution a chain draws from (sampling_distribution) and llama.cpp's default chain.
#include "loom/error.hpp"
#include "loom/sample/sampler.hpp"
#include "sample/dist.hpp"
#include "sample/params.hpp"

#include <algorithm>
#include <vector>

namespace loom {

using sample::best_index;
using sample::dist_select;
using sample::fail_arg;

void SamplerChain::add(std::unique_ptr<Sampler> s) {
  LOOM_ASSERT(s != nullptr, "SamplerChain::add(nullptr)");
  samplers_.push_back(std::move(s));
}

void SamplerChain::apply(Candidates& c, const SamplerContext& ctx) {
  for (auto& s : samplers_)
    s->apply(c, ctx);
  if (c.selected < 0) dist_select(c, ctx); // nothing selected: the chain ends with `dist`
}

void SamplerChain::apply_traced(Candidates& c, const SamplerContext& ctx,
                                const std::function<void(size_t, const Sampler*, const Candidates&)>& after) {
  for (size_t i = 0; i < samplers_.size(); ++i) {
    samplers_[i]->apply(c, ctx);
    after(i, samplers_[i].get(), c);
  }
  if (c.selected < 0) {
    dist_select(c, ctx);
    after(samplers_.size(), nullptr, c);
  }
}

void SamplerChain::accept(TokenId token) {
  for (auto& s : samplers_)
    s->accept(token);
}

void SamplerChain::reset() {
  for (auto& s : samplers_)
    s->reset();
}

std::unique_ptr<Sampler> SamplerChain::clone() const {
  auto out = std::make_unique<SamplerChain>();
  for (const auto& s : samplers_)
    out->add(s->clone());
  return out;
}

TokenId SamplerChain::sample(std::span<const float> logits, const SamplerContext& ctx) {
  if (logits.empty()) fail_arg("cannot sample from an empty vocabulary");
  std::vector<TokenData> storage;
  Candidates c = Candidates::from_logits(logits, storage);
  apply(c, ctx);
  if (c.selected < 0 || static_cast<size_t>(c.selected) >= c.data.size())
    fail(Errc::internal, "sampler", "the sampler chain selected no token");
  return c.data[static_cast<size_t>(c.selected)].id;
}

std::optional<TokenId> SamplerChain::greedy_choice(std::span<const float> logits) const {
  if (samplers_.size() != 1 || !sample::is_greedy(*samplers_[0]) || logits.empty()) return std::nullopt;
  return static_cast<TokenId>(sample::arg_max_key(logits));
}

bool SamplerChain::distribution(Candidates& c, const SamplerContext& ctx) {
  for (size_t i = 0; i < samplers_.size(); ++i) {
    if (!samplers_[i]->distribution(c, ctx)) continue;
    if (i + 1 == samplers_.size()) return true; // the chain's last stage: its distribution is the chain's
    // Samplers after a selecting one still run in apply() (they may filter the selection away, and
    // the chain then ends with dist): do exactly what apply() does — draw here if that stage left a
    // distribution, run the rest, dist if nothing is selected — and give one-hot at that draw,
    // which is exact for speculative sampling (the draw is the chain's own).
    if (c.selected < 0) dist_select(c, ctx);
    for (size_t j = i + 1; j < samplers_.size(); ++j)
      samplers_[j]->apply(c, ctx);
    if (c.selected < 0) dist_select(c, ctx);
    return true;
  }
  return false;
}

void sampling_distribution(Sampler& sampler, std::span<const float> logits, const SamplerContext& ctx,
                           std::span<float> out) {
  if (logits.empty() || out.size() < logits.size())
    fail_arg("distribution: empty vocabulary or short output");
  std::vector<TokenData> storage;
  Candidates c = Candidates::from_logits(logits, storage);
  const bool final = sampler.distribution(c, ctx);
  std::fill(out.begin(), out.end(), 0.0f);
  if (c.selected >= 0 && static_cast<size_t>(c.selected) < c.data.size()) {
    out[static_cast<size_t>(c.data[static_cast<size_t>(c.selected)].id)] = 1.0f;
    return;
  }
  if (c.data.empty()) fail(Errc::internal, "sampler", "the sampler chain removed every candidate");
  if (!final || !c.has_probs) c.compute_probs(); // the chain ends with dist
  double total = 0;
  for (const auto& t : c.data)
    total += static_cast<double>(t.p);
  if (!(total > 0)) { // every p is 0 (NaN logits): dist would take the arg-max
    out[static_cast<size_t>(c.data[best_index(c.data)].id)] = 1.0f;
    return;
  }
  for (const auto& t : c.data)
    out[static_cast<size_t>(t.id)] = t.p;
}

// ---------------------------------------------------------------------------------------------
// The default chain

std::vector<SamplerSpec> default_chain_specs(const SamplingParams& p) {
  const auto d = [](float x) { return ParamValue{static_cast<double>(x)}; };
  const auto i = [](int32_t x) { return ParamValue{static_cast<int64_t>(x)}; };
  const std::vector<SamplerSpec> all = {
      {"penalties",
       {{"repeat", d(p.repeat_penalty)},
        {"frequency", d(p.frequency_penalty)},
        {"presence", d(p.presence_penalty)},
        {"last_n", i(p.penalty_last_n)}}},
      {"top_k", {{"k", i(p.top_k)}}},
      {"typical_p", {{"p", d(p.typical_p)}}},
      {"top_p", {{"p", d(p.top_p)}}},
      {"min_p", {{"p", d(p.min_p)}}},
      {"temperature", {{"value", d(p.temperature)}}},
  };
  for (const auto& s : all) // every value is checked, also those of samplers left out below
    (void)create_sampler(s);
  const bool penalties_on =
      p.penalty_last_n != 0 &&
      (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f);
  const bool on[] = {penalties_on, p.top_k > 0,
                     p.typical_p<1.0f, p.top_p<1.0f, p.min_p> 0.0f, p.temperature> 0.0f};
  std::vector<SamplerSpec> out;
  for (size_t k = 0; k < all.size(); ++k)
    if (on[k]) out.push_back(all[k]);
  out.push_back(SamplerSpec{p.temperature > 0.0f ? "dist" : "greedy", {}});
  return out;
}

SamplerChain make_default_chain(const SamplingParams& p) {
  SamplerChain chain;
  for (const auto& s : default_chain_specs(p))
    chain.add(create_sampler(s));
  return chain;
}

} // namespace loom
