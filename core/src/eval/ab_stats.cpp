// The paired statistics of `loom ab` (loom/eval/ab_stats.hpp).
#include "loom/eval/ab_stats.hpp"

#include "loom/error.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <regex>
#include <set>

namespace loom::ab {

double mean(std::span<const double> x) {
  if (x.empty()) return 0;
  double s = 0;
  for (double v : x)
    s += v;
  return s / static_cast<double>(x.size());
}

double stddev(std::span<const double> x) {
  if (x.size() < 2) return 0;
  const double m = mean(x);
  double s = 0;
  for (double v : x)
    s += (v - m) * (v - m);
  return std::sqrt(s / static_cast<double>(x.size() - 1));
}

double normal_cdf(double z) {
  return 0.5 * std::erfc(-z / std::sqrt(2.0));
}

double normal_quantile(double p) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (!(p > 0 && p < 1)) return p <= 0 ? -inf : inf;
  double lo = -40, hi = 40; // bisection on the CDF: 100 halvings reach double precision
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (normal_cdf(mid) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

namespace {

// SplitMix64 (Steele, Lea, Flood 2014): five lines in any language, so a report's intervals can be
// recomputed exactly elsewhere (tests/ab/check_ab_json.py does, in Python).
struct SplitMix64 {
  uint64_t s;
  uint64_t operator()() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

// The q-quantile of sorted values, linear between order statistics (type 7).
double quantile_sorted(const std::vector<double>& s, double q) {
  if (s.empty()) return 0;
  q = std::clamp(q, 0.0, 1.0);
  const double h = q * static_cast<double>(s.size() - 1);
  const auto i = static_cast<size_t>(std::floor(h));
  const size_t j = std::min(i + 1, s.size() - 1);
  return s[i] + (h - static_cast<double>(i)) * (s[j] - s[i]);
}

} // namespace

Interval bootstrap_mean_ci(std::span<const double> d, int resamples, uint64_t seed, double level,
                           CiMethod method) {
  if (d.empty()) return {};
  const double m = mean(d);
  if (std::all_of(d.begin(), d.end(), [&](double v) { return v == d.front(); })) return {m, m};
  if (resamples < 1) fail(Errc::invalid_argument, "ab", "the bootstrap needs at least one resample");
  SplitMix64 rng{seed};
  std::vector<double> boots(static_cast<size_t>(resamples));
  for (auto& b : boots) { // index = next() mod n (the bias is below 2^-40 for any n here)
    double s = 0;
    for (size_t i = 0; i < d.size(); ++i)
      s += d[static_cast<size_t>(rng() % d.size())];
    b = s / static_cast<double>(d.size());
  }
  std::sort(boots.begin(), boots.end());
  const double alpha = 1 - level;
  double q_lo = alpha / 2, q_hi = 1 - alpha / 2;
  if (method == CiMethod::bca) {
    // Bias correction: the share of bootstrap means below the observed one (ties count half).
    double below = 0;
    for (double b : boots)
      below += b < m ? 1.0 : b == m ? 0.5 : 0.0;
    const double frac = std::clamp(below / static_cast<double>(boots.size()), 1e-9, 1 - 1e-9);
    const double z0 = normal_quantile(frac);
    // Acceleration from the jackknife means.
    const auto n = static_cast<double>(d.size());
    double total = 0;
    for (double v : d)
      total += v;
    std::vector<double> jack(d.size());
    for (size_t i = 0; i < d.size(); ++i)
      jack[i] = (total - d[i]) / (n - 1);
    const double jm = mean(jack);
    double num = 0, den = 0;
    for (double j : jack) {
      num += std::pow(jm - j, 3);
      den += std::pow(jm - j, 2);
    }
    const double a = den > 0 ? num / (6 * std::pow(den, 1.5)) : 0;
    const auto adjust = [&](double q) {
      const double z = normal_quantile(q);
      return normal_cdf(z0 + (z0 + z) / (1 - a * (z0 + z)));
    };
    q_lo = adjust(q_lo);
    q_hi = adjust(q_hi);
  }
  return {quantile_sorted(boots, q_lo), quantile_sorted(boots, q_hi)};
}

double sign_flip_p(std::span<const double> d, int resamples, uint64_t seed) {
  std::vector<double> nz;
  for (double v : d)
    if (v != 0) nz.push_back(v);
  if (nz.empty()) return 1.0;
  const double obs = std::fabs(mean(nz)) * (1 - 1e-12); // ties with the observed count as extreme
  const size_t n = nz.size();
  if (n <= 16) {
    const uint32_t patterns = 1u << n;
    uint32_t extreme = 0;
    for (uint32_t s = 0; s < patterns; ++s) {
      double sum = 0;
      for (size_t i = 0; i < n; ++i)
        sum += (s >> i) & 1u ? -nz[i] : nz[i];
      if (std::fabs(sum / static_cast<double>(n)) >= obs) ++extreme;
    }
    return static_cast<double>(extreme) / static_cast<double>(patterns);
  }
  SplitMix64 rng{seed};
  int64_t extreme = 0;
  for (int b = 0; b < resamples; ++b) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i)
      sum += (rng() >> 63) ? -nz[i] : nz[i];
    if (std::fabs(sum / static_cast<double>(n)) >= obs) ++extreme;
  }
  return static_cast<double>(extreme + 1) / static_cast<double>(resamples + 1);
}

double mcnemar_exact_p(int64_t b, int64_t c) {
  const int64_t n = b + c;
  if (n <= 0) return 1.0;
  const int64_t k = std::min(b, c);
  // 2 · P(X ≤ k), X ~ Binomial(n, 1/2), summed in logs.
  double p = 0;
  for (int64_t i = 0; i <= k; ++i)
    p += std::exp(std::lgamma(static_cast<double>(n + 1)) - std::lgamma(static_cast<double>(i + 1)) -
                  std::lgamma(static_cast<double>(n - i + 1)) - static_cast<double>(n) * std::log(2.0));
  return std::min(1.0, 2 * p);
}

int64_t prompts_to_resolve(double sd, double effect) {
  if (!(std::fabs(effect) > 0) || !(sd > 0)) return 0;
  const double n = std::pow(1.96 * sd / std::fabs(effect), 2);
  return static_cast<int64_t>(std::ceil(std::min(n, 1e12)));
}

double distinct_n(std::span<const TokenId> t, int n) {
  if (n < 1 || t.size() < static_cast<size_t>(n)) return 1.0;
  std::set<std::vector<TokenId>> seen;
  const size_t count = t.size() - static_cast<size_t>(n) + 1;
  for (size_t i = 0; i < count; ++i)
    seen.emplace(t.begin() + static_cast<std::ptrdiff_t>(i), t.begin() + static_cast<std::ptrdiff_t>(i) + n);
  return static_cast<double>(seen.size()) / static_cast<double>(count);
}

double repetition_rate(std::span<const TokenId> t, int n) {
  if (n < 1 || t.size() < static_cast<size_t>(n)) return 0.0;
  std::set<std::vector<TokenId>> seen;
  const size_t count = t.size() - static_cast<size_t>(n) + 1;
  size_t repeats = 0;
  for (size_t i = 0; i < count; ++i)
    if (!seen.emplace(t.begin() + static_cast<std::ptrdiff_t>(i),
                      t.begin() + static_cast<std::ptrdiff_t>(i) + n)
             .second)
      ++repeats;
  return static_cast<double>(repeats) / static_cast<double>(count);
}

std::string extract_answer(const std::string& text, const std::string& regex) {
  if (regex == "last_number") {
    static const std::regex num("-?[0-9]+(?:\\.[0-9]+)?", std::regex::ECMAScript);
    std::string last;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), num); it != std::sregex_iterator(); ++it)
      last = it->str();
    return last;
  }
  std::regex re;
  try {
    re = std::regex(regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail(Errc::invalid_argument, "ab",
         "--answer-regex does not compile (" + std::string(e.what()) +
             "); expected an ECMAScript regex with one capture group, or \"last_number\"");
  }
  if (re.mark_count() != 1)
    fail(Errc::invalid_argument, "ab",
         "--answer-regex must have exactly one capture group (the answer), it has " +
             std::to_string(re.mark_count()));
  std::smatch m;
  if (!std::regex_search(text, m, re)) return {};
  return m[1].str();
}

double quantile(std::vector<double> x, double q) {
  std::sort(x.begin(), x.end());
  return quantile_sorted(x, q);
}

} // namespace loom::ab
