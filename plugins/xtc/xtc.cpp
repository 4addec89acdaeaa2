// plugins/xtc/xtc.cpp — the "sampler_extra" plugin: the samplers "xtc" and "mirostat_v2".
//
// Built only against the SDK (loom/sdk/plugin.hpp); see plugins/README.md for the TOML.
//
// xtc (Exclude Top Choices, after text-generation-webui PR #6335 and llama.cpp's XTC sampler):
//   with probability `probability`, every token whose probability is >= `threshold` is removed
//   except the least probable of them, so at least one "viable" choice remains. It transforms the
//   candidate list (it never selects). One uniform is drawn per apply() whether or not it fires, so
//   the request's RNG stream does not depend on the logits.
//
// mirostat_v2 (Basu et al., "Mirostat: a neural text decoding algorithm that directly controls
//   perplexity", algorithm 2): truncates the tokens whose surprise -log2(p) exceeds mu (keeping at
//   least one), renormalises, draws a token, then steers mu towards the target surprise tau:
//   mu -= eta * (surprise - tau), where surprise is that of the chosen token in the truncated,
//   renormalised distribution (as llama.cpp does). mu starts at 2 * tau; reset() restores it.
#include "loom/sdk/plugin.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>

namespace {

using loom::Candidates;
using loom::SamplerContext;
using loom::TokenData;
using loom::sdk::Config;
using loom::sdk::Error;

// Sorts the candidates by logit (descending) and makes p = softmax(logit) over data[0..size).
// When the host already provides both, nothing is recomputed.
void ensure_sorted_probs(Candidates& c) {
  const std::span<TokenData> d = c.data;
  const size_t n = d.size();
  if (!c.sorted) {
    std::stable_sort(d.begin(), d.end(),
                     [](const TokenData& a, const TokenData& b) { return a.logit > b.logit; });
    c.sorted = true;
  }
  if (c.has_probs || n == 0) {
    c.has_probs = true;
    return;
  }
  const float max_logit = d[0].logit; // sorted: the first is the largest
  if (std::isinf(max_logit)) {
    // All -inf (nothing is preferred: uniform) or some +inf (they share all the mass).
    size_t n_top = 0;
    for (size_t i = 0; i < n; ++i)
      n_top += d[i].logit == max_logit ? 1 : 0;
    const float share = 1.0f / static_cast<float>(n_top);
    for (size_t i = 0; i < n; ++i)
      d[i].p = d[i].logit == max_logit ? share : 0.0f;
  } else {
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
      const double e = std::exp(static_cast<double>(d[i].logit) - static_cast<double>(max_logit));
      d[i].p = static_cast<float>(e);
      sum += e;
    }
    for (size_t i = 0; i < n; ++i)
      d[i].p = static_cast<float>(static_cast<double>(d[i].p) / sum);
  }
  c.has_probs = true;
}

// Rescales p over data to sum to 1 (after the list shrank; the order is unchanged).
void renormalise(Candidates& c) {
  double sum = 0.0;
  for (const TokenData& t : c.data)
    sum += static_cast<double>(t.p);
  if (!(sum > 0.0)) return;
  for (TokenData& t : c.data)
    t.p = static_cast<float>(static_cast<double>(t.p) / sum);
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Reads a number key and checks it against a range; `range` is the text for the error message.
double read_f64_in(const Config& cfg, const char* sampler, const char* key, double def, bool (*ok)(double),
                   const char* range) {
  const double v = cfg.get_f64(key, def);
  if (!std::isfinite(v) || !ok(v))
    throw Error(std::string(sampler) + ": `" + key + "` must be a number in " + range + ", got " + number(v));
  return v;
}

// ---- xtc ------------------------------------------------------------------------------------

class Xtc final : public loom::Sampler {
public:
  explicit Xtc(const Config& cfg)
      : probability_(read_f64_in(
            cfg, "xtc", "probability", 0.5, [](double v) { return v >= 0.0 && v <= 1.0; }, "[0, 1]")),
        threshold_(read_f64_in(
            cfg, "xtc", "threshold", 0.1, [](double v) { return v >= 0.0 && v <= 0.5; }, "[0, 0.5]")) {
    const int64_t min_keep = cfg.get_i64("min_keep", 1);
    if (min_keep < 1) throw Error("xtc: `min_keep` must be an integer >= 1, got " + std::to_string(min_keep));
    min_keep_ = static_cast<size_t>(min_keep);
  }

  void apply(Candidates& c, const SamplerContext& ctx) override {
    const double chance = ctx.uniform(); // always drawn: the RNG stream must not depend on the data
    if (c.selected >= 0 || c.data.size() < 2 || !(chance < probability_)) return;

    ensure_sorted_probs(c);
    // The tokens at or above the threshold form a prefix of the sorted list; keep its last one.
    size_t n_above = 0;
    while (n_above < c.data.size() && static_cast<double>(c.data[n_above].p) >= threshold_)
      ++n_above;
    if (n_above < 2) return; // zero or one top choice: nothing to exclude
    const size_t n_removed = n_above - 1;
    if (c.data.size() - n_removed < min_keep_) return;

    std::move(c.data.begin() + static_cast<std::ptrdiff_t>(n_removed), c.data.end(), c.data.begin());
    c.data = c.data.first(c.data.size() - n_removed);
    renormalise(c); // p stays softmax(logit) over what is left
  }

  std::unique_ptr<loom::Sampler> clone() const override { return std::make_unique<Xtc>(*this); }

private:
  double probability_;
  double threshold_;
  size_t min_keep_ = 1;
};

// ---- mirostat v2 ----------------------------------------------------------------------------

class MirostatV2 final : public loom::Sampler {
public:
  explicit MirostatV2(const Config& cfg)
      : tau_(read_f64_in(
            cfg, "mirostat_v2", "tau", 5.0, [](double v) { return v > 0.0; }, "(0, inf)")),
        eta_(read_f64_in(
            cfg, "mirostat_v2", "eta", 0.1, [](double v) { return v > 0.0; }, "(0, inf)")),
        mu_(2.0 * tau_) {}

  void apply(Candidates& c, const SamplerContext& ctx) override {
    const double u = ctx.uniform(); // drawn first, unconditionally
    if (c.data.empty()) throw Error("mirostat_v2: empty candidate list", loom::Errc::internal);

    ensure_sorted_probs(c);
    // Sorted by p descending, so the surprise ascends: keep the prefix with surprise <= mu.
    size_t keep = 0;
    while (keep < c.data.size() && surprise(c.data[keep].p) <= mu_)
      ++keep;
    c.data = c.data.first(std::max<size_t>(keep, 1));
    renormalise(c);

    double total = 0.0;
    for (const TokenData& t : c.data)
      total += static_cast<double>(t.p);
    const double target = u * total;
    size_t idx = c.data.size() - 1;
    double cum = 0.0;
    for (size_t i = 0; i < c.data.size(); ++i) {
      cum += static_cast<double>(c.data[i].p);
      if (target < cum) {
        idx = i;
        break;
      }
    }
    while (idx > 0 && !(c.data[idx].p > 0.0f))
      --idx; // rounding fallback: never a zero-mass token
    c.selected = static_cast<int64_t>(idx);

    const double s = surprise(c.data[idx].p);
    if (std::isfinite(s)) mu_ -= eta_ * (s - tau_);
  }

  void reset() override { mu_ = 2.0 * tau_; }
  std::unique_ptr<loom::Sampler> clone() const override { return std::make_unique<MirostatV2>(*this); }
  bool selects() const noexcept override { return true; }

private:
  static double surprise(float p) { return -std::log2(static_cast<double>(p)); }

  double tau_;
  double eta_;
  double mu_;
};

} // namespace

LOOM_PLUGIN_DEFINE("sampler_extra", "1.0.0", LOOM_SAMPLER("xtc", Xtc),
                   LOOM_SAMPLER("mirostat_v2", MirostatV2));
