// loom/eval/ab_stats.hpp — the paired statistics of `loom ab`: per-prompt differences between two
// variants, their bootstrap confidence intervals (percentile and BCa), a sign-flip permutation test,
// McNemar's exact test, and the text metrics (distinct-n, repetition) computed on each output.
// Plain functions over spans; every random choice comes from a seed, so a report is reproducible.
#pragma once

#include "loom/sdk/types.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace loom::ab {

double mean(std::span<const double> x);
// The q-quantile (q in [0, 1]) of x, linear between order statistics (type 7); 0 for no values.
// Also the latency percentiles of the engine's metrics and `loom bench`.
double quantile(std::vector<double> x, double q);
double stddev(std::span<const double> x); // sample standard deviation (n − 1); 0 for n < 2

struct Interval {
  double lo = 0, hi = 0;
  bool covers(double v) const noexcept { return lo <= v && v <= hi; }
};

enum class CiMethod { percentile, bca };

// A paired bootstrap interval for the mean of the per-prompt differences d (the prompts are
// resampled with replacement, `resamples` times, from `seed`). BCa corrects the percentile interval
// for bias and skew (Efron 1987; acceleration from the jackknife). All-equal differences give [d, d].
Interval bootstrap_mean_ci(std::span<const double> d, int resamples, uint64_t seed, double level = 0.95,
                           CiMethod method = CiMethod::percentile);

// Two-sided p-value of the paired sign-flip permutation test of mean(d) = 0: exact over all 2^n sign
// patterns for n ≤ 16 nonzero differences, else Monte Carlo with `resamples` patterns ((k+1)/(B+1)).
double sign_flip_p(std::span<const double> d, int resamples, uint64_t seed);

// McNemar's exact test (two-sided binomial on the discordant pairs): b = A right & B wrong,
// c = A wrong & B right. 1 when there are none.
double mcnemar_exact_p(int64_t b, int64_t c);

// Prompts that would give a ±|effect| half-width at 95% with this spread: (1.96·sd / |effect|)².
int64_t prompts_to_resolve(double sd, double effect);

// Standard normal CDF and its inverse.
double normal_cdf(double z);
double normal_quantile(double p);

// Text metrics on a generated token sequence.
double distinct_n(std::span<const TokenId> t, int n); // distinct n-grams / n-grams (1 when there are none)
double repetition_rate(std::span<const TokenId> t, int n = 4); // n-grams that occurred before / n-grams

// The answer of a text: the first capture group of `regex` (ECMAScript) at its first match, or the
// last number in the text when regex is "last_number" (self_consistency's rules). Empty: none.
std::string extract_answer(const std::string& text, const std::string& regex);

} // namespace loom::ab
