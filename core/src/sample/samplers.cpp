// sample/samplers.cpp — the built-in samplers (llama.cpp semantics) and their registry: each one's
// schema (builtin_samplers) and create_sampler, which validates a spec and builds the sampler.
//
// Decisions worth knowing:
//  * Samplers are stateless: `penalties` reads its history from SamplerContext (prompt + generated,
//    the last `last_n` of them) on every call. llama.cpp keeps a ring buffer of accepted tokens, and
//    its tools accept the prompt tokens too, so the window is the same; being stateless makes clone()
//    and reset() trivial and a request's result independent of how its chain was copied.
//  * `logit_bias` ids that are not among the candidates (beyond the vocabulary, or filtered out by an
//    earlier sampler) are skipped: the vocabulary size is unknown when the sampler is created.
//    Duplicate ids add up.
//  * `dist` draws exactly one 64-bit number from the request's RNG per call (rng_uniform) and maps it
//    to [0, 1) with 53 bits ((x >> 11) · 2⁻⁵³) rather than std::uniform_real_distribution, whose
//    algorithm differs between standard libraries: a seed gives the same tokens with libstdc++ and libc++.
//  * A filter that reorders or shrinks the list keeps `selected` pointing at the same token (or -1 if
//    the token was removed); the chain runs `dist` at the end only when nothing is selected then.
//  * Ties in logit are broken by the lower token id everywhere (sorting, greedy, temperature 0), so
//    results never depend on the order of the candidate list.
#include "loom/error.hpp"
#include "loom/sample/json_constraint.hpp"
#include "loom/sample/sampler.hpp"
#include "sample/dist.hpp"
#include "sample/params.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace loom {

namespace sample {

// Four sets of 16 lanes, each holding the greatest key it has seen and the first index holding it: written
// with GCC's vector extension because the compiler does not vectorize a scalar `l > m ? l : m` (it keeps
// NaN's semantics; the scalar max ran as 16 cmov chains, the largest host cost of a greedy decode step, and
// the greedy pick then looked for the max's index in a second, scalar pass), four so that latencies overlap.
LOOM_VOCAB_LOOP size_t arg_max_key(std::span<const float> logits) {
  using v16 = float __attribute__((vector_size(64)));
  using i16 = int32_t __attribute__((vector_size(64)));
  constexpr int32_t w = 16, k = 4;
  v16 best[k];
  i16 at[k], idx[k];
  for (int32_t q = 0; q < k; ++q)
    for (int32_t j = 0; j < w; ++j) {
      best[q][j] = kNegInf;
      at[q][j] = idx[q][j] = q * w + j;
    }
  const size_t n = logits.size() / (w * k) * (w * k); // (a vocabulary is far below 2^31 entries)
  for (size_t i = 0; i < n; i += w * k)
    for (int32_t q = 0; q < k; ++q) {
      v16 l;
      std::memcpy(&l, logits.data() + i + static_cast<size_t>(q * w), sizeof l);
      const i16 gt = l > best[q]; // (NaN: never greater, as order_key's -inf)
      best[q] = gt ? l : best[q];
      at[q] = gt ? idx[q] : at[q];
      idx[q] += w * k;
    }
  float mx = kNegInf;
  size_t arg = 0;
  bool any = false;
  for (int32_t q = 0; q < k; ++q) // the greatest key, the lowest index among its lanes
    for (int32_t j = 0; j < w && n > 0; ++j) {
      const auto a = static_cast<size_t>(at[q][j]);
      if (!any || best[q][j] > mx || (best[q][j] == mx && a < arg)) {
        mx = best[q][j];
        arg = a;
        any = true;
      }
    }
  for (size_t i = n; i < logits.size(); ++i) // the tail's indices come after every lane's
    if (!any || Candidates::order_key(logits[i]) > mx) {
      mx = Candidates::order_key(logits[i]);
      arg = i;
      any = true;
    }
  return arg;
}

float max_key(std::span<const float> logits) {
  return logits.empty() ? kNegInf : Candidates::order_key(logits[arg_max_key(logits)]);
}

// Two passes (the greatest key, then the lowest id that has it): a greedy step's whole cost over a
// vocabulary of 10⁵ candidates, so the first pass is a plain max the compiler vectorizes.
size_t best_index(std::span<const TokenData> d) {
  float mx = -std::numeric_limits<float>::infinity();
  for (const TokenData& t : d)
    mx = std::max(mx, Candidates::order_key(t.logit));
  size_t best = 0;
  bool found = false;
  for (size_t i = 0; i < d.size(); ++i)
    if (Candidates::order_key(d[i].logit) == mx && (!found || d[i].id < d[best].id)) {
      best = i;
      found = true;
    }
  return best;
}

void dist_select(Candidates& c, const SamplerContext& ctx) {
  const double u = ctx.uniform(); // one draw, in [0, 1)
  if (c.data.empty()) {
    c.selected = -1;
    return;
  }
  c.compute_probs();
  c.has_probs = true;
  // Cumulative scan in list order; strict '>' never lands on a zero-probability token.
  double cum = 0.0;
  int64_t last_nonzero = -1;
  for (size_t i = 0; i < c.data.size(); ++i) {
    if (c.data[i].p <= 0.0f) continue;
    last_nonzero = static_cast<int64_t>(i);
    cum += static_cast<double>(c.data[i].p);
    if (cum > u) {
      c.selected = static_cast<int64_t>(i);
      return;
    }
  }
  // Rounding left the total just under u (or every p is 0, e.g. NaN logits): last candidate with mass.
  c.selected = last_nonzero >= 0 ? last_nonzero : static_cast<int64_t>(best_index(c.data));
}

} // namespace sample

namespace {

using sample::best_index;
using sample::dist_select;
using sample::fail_arg;
using sample::integer;
using sample::kNegInf;
using sample::number;
using sample::Params;
using sample::required;
using sample::with_max;
using sample::with_min;

// Calls f(token_data, value) for every candidate whose id is a key of `m`. Uses the identity layout
// of a fresh list (data[id].id == id) where it holds and falls back to one scan for the rest.
template <class V, class F> void for_each_id(Candidates& c, const std::unordered_map<TokenId, V>& m, F&& f) {
  std::unordered_map<TokenId, V> rest;
  const size_t n = c.data.size();
  for (const auto& [id, v] : m) {
    if (id >= 0 && static_cast<size_t>(id) < n && c.data[static_cast<size_t>(id)].id == id)
      f(c.data[static_cast<size_t>(id)], v);
    else
      rest.emplace(id, v);
  }
  if (rest.empty()) return;
  // Ids are unique in a candidate list, so none of `rest` was handled above.
  for (auto& t : c.data)
    if (auto it = rest.find(t.id); it != rest.end()) f(t, it->second);
}

// ---------------------------------------------------------------------------------------------
// The samplers.

class Temperature final : public Sampler {
public:
  explicit Temperature(float t) : t_(t) {}
  std::string_view name() const noexcept override { return "temperature"; }
  bool selects() const noexcept override { return t_ <= 0.0f; }
  std::unique_ptr<Sampler> clone() const override { return std::make_unique<Temperature>(*this); }

  void apply(Candidates& c, const SamplerContext& /*ctx*/) override {
    if (c.data.empty()) return;
    if (t_ <= 0.0f) {
      // Greedy: keep only the arg-max (others -inf) and select it, so whatever follows picks it too.
      const size_t best = best_index(c.data);
      for (size_t i = 0; i < c.data.size(); ++i)
        if (i != best) c.data[i].logit = kNegInf;
      c.selected = static_cast<int64_t>(best);
    } else {
      for (auto& t : c.data)
        t.logit /= t_;
    }
    c.sorted = false;
    c.has_probs = false;
  }

private:
  float t_;
};

class TopK final : public Sampler {
public:
  explicit TopK(int32_t k) : k_(k) {}
  std::string_view name() const noexcept override { return "top_k"; }
  std::unique_ptr<Sampler> clone() const override { return std::make_unique<TopK>(*this); }

  void apply(Candidates& c, const SamplerContext& /*ctx*/) override {
    if (k_ <= 0 || static_cast<size_t>(k_) >= c.data.size()) return;
    const TokenId sel = c.selected_id();
    const auto k = static_cast<size_t>(k_);
    if (!c.sorted) {
      std::partial_sort(c.data.begin(), c.data.begin() + static_cast<std::ptrdiff_t>(k), c.data.end(),
                        Candidates::before);
      c.sorted = true; // the kept prefix is in order
    }
    c.data = c.data.first(k);
    c.has_probs = false;
    c.reselect(sel);
  }

private:
  int32_t k_;
};

class TopP final : public Sampler {
public:
  TopP(float p, size_t min_keep) : p_(p), min_keep_(min_keep) {}
  std::string_view name() const noexcept override { return "top_p"; }
  std::unique_ptr<Sampler> clone() const override { return std::make_unique<TopP>(*this); }

  void apply(Candidates& c, const SamplerContext& /*ctx*/) override {
    if (p_ >= 1.0f || c.data.empty()) return;
    const TokenId sel = c.selected_id();
    c.compute_probs();
    // Sort lazily: most of the mass is usually in the first few hundred tokens.
    const size_t n = c.data.size();
    size_t sorted_to = n;
    if (!c.sorted) {
      sorted_to = std::min<size_t>(n, n > 1024 ? 256 : n);
      std::partial_sort(c.data.begin(), c.data.begin() + static_cast<std::ptrdiff_t>(sorted_to), c.data.end(),
                        Candidates::before);
    }
    float cum = 0.0f;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      if (i == sorted_to) { // ran past the sorted prefix: sort the rest (all ≤ the prefix)
        std::sort(c.data.begin() + static_cast<std::ptrdiff_t>(i), c.data.end(), Candidates::before);
        sorted_to = n;
      }
      cum += c.data[i].p;
      if (cum >= p_ && i + 1 >= min_keep_) {
        keep = i + 1;
        break;
      }
    }
    c.data = c.data.first(keep);
    c.sorted = true;
    c.has_probs = keep == n;
    c.reselect(sel);
  }

private:
  float p_;
  size_t min_keep_;
};

class MinP final : public Sampler {
public:
  MinP(float p, size_t min_keep) : p_(p), min_keep_(min_keep) {}
  std::string_view name() const noexcept override { return "min_p"; }
  std::unique_ptr<Sampler> clone() const override { return std::make_unique<MinP>(*this); }

  void apply(Candidates& c, const SamplerContext& /*ctx*/) override {
    if (p_ <= 0.0f || c.data.empty()) return;
    const TokenId sel = c.selected_id();
    float mx = kNegInf;
    for (const auto& t : c.data)
      mx = std::max(mx, Candidates::order_key(t.logit));
    const float min_logit = mx + std::log(p_); // p_i ≥ p · p_max  ⇔  logit_i ≥ max + log p
    const auto pass = [&](const TokenData& t) { return Candidates::order_key(t.logit) >= min_logit; };
    const auto n_pass = static_cast<size_t>(std::count_if(c.data.begin(), c.data.end(), pass));
    const size_t n = c.data.size();
    if (n_pass >= min_keep_ && n_pass > 0) {
      // Keep the passing tokens in their current order (a sorted list stays sorted).
      const auto end =
          std::remove_if(c.data.begin(), c.data.end(), [&](const TokenData& t) { return !pass(t); });
      c.data = c.data.first(static_cast<size_t>(end - c.data.begin()));
    } else {
      c.sort_desc();
      c.data = c.data.first(std::min(n, std::max<size_t>({n_pass, min_keep_, 1})));
    }
    if (c.data.size() != n) c.has_probs = false;
    c.reselect(sel);
  }

private:
  float p_;
  size_t min_keep_;
};

// Locally typical sampling (Meister et al. 2022): keep the tokens whose surprise −log p is closest to
// the entropy, in that order, until their mass exceeds p.
class TypicalP final : public Sampler {
public:
  TypicalP(float p, size_t min_keep) : p_(p), min_keep_(min_keep) {}
  std::string_view name() const noexcept override { return "typical_p"; }
  std::unique_ptr<Sampler> clone() const override { return std::make_unique<TypicalP>(*this); }

  void apply(Candidates& c, const SamplerContext& /*ctx*/) override {
    if (p_ >= 1.0f || c.data.empty()) return;
    const TokenId sel = c.selected_id();
    c.softmax();
    const size_t n = c.data.size();
    float entropy = 0.0f;
    for (const auto& t : c.data)
      if (t.p > 0.0f) entropy -= t.p * std::log(t.p);
    std::vector<float> score(n);
    for (size_t i = 0; i < n; ++i)
      score[i] = c.data[i].p > 0.0f ? std::fabs(-std::log(c.data[i].p) - entropy)
                                    : std::numeric_limits<float>::infinity();
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score[a] < score[b]; });
    float cum = 0.0f;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += c.data[order[i]].p;
      if (cum > p_ && i + 1 >= min_keep_) {
        keep = i + 1;
        break;
      }
    }
    std::vector<TokenData> kept;
    kept.reserve(keep);
    for (size_t i = 0; i < keep; ++i)
      kept.push_back(c.data[order[i]]);
    std::copy(kept.begin(), kept.end(), c.data.begin());
    c.data = c.data.first(keep);
    c.sorted = false;
    c.has_probs = keep == n;
    c.reselect(sel);
  }

private:
  float p_;
  size_t min_keep_;
};

class Penalties final : public Sampler {
public:
  Penalties(float repeat, float frequency, float presence, int32_t last_n)
      : repeat_(repeat), frequency_(frequency), presence_(presence), last_n_(last_n) {}
  std::string_view name() const noexcept override { return "penalties"; }
  std::unique_ptr<Sampler> clone() const override { return std::make_unique<Penalties>(*this); }

  void apply(Candidates& c, const SamplerContext& ctx) override {
    if (last_n_ == 0 || (repeat_ == 1.0f && frequency_ == 0.0f && presence_ == 0.0f)) return;
    // The window: the last `last_n` tokens of prompt + generated (all of them for -1).
    const size_t total = ctx.prompt.size() + ctx.generated.size();
    const size_t window = last_n_ < 0 ? total : std::min(total, static_cast<size_t>(last_n_));
    std::unordered_map<TokenId, int32_t> count;
    for (size_t i = total - window; i < total; ++i) {
      const TokenId t = i < ctx.prompt.size() ? ctx.prompt[i] : ctx.generated[i - ctx.prompt.size()];
      ++count[t];
    }
    if (count.empty()) return;
    for_each_id(c, count, [&](TokenData& t, int32_t n) {
      // Dividing a negative logit would raise it: multiply instead (llama.cpp, CTRL paper fix).
      if (t.logit <= 0.0f)
        t.logit *= repeat_;
      else
        t.logit /= repeat_;
      t.logit -= static_cast<float>(n) * frequency_ + (n > 0 ? presence_ : 0.0f);
    });
    c.sorted = false;
    c.has_probs = false;
  }

private:
  float repeat_, frequency_, presence_;
  int32_t last_n_;
};

class LogitBias final : public Sampler {
public:
  explicit LogitBias(std::unordered_map<TokenId, float> bias) : bias_(std::move(bias)) {}
  std::string_view name() const noexcept override { return "logit_bias"; }
  std::unique_ptr<Sampler> clone() const override { return std::make_unique<LogitBias>(*this); }

  void apply(Candidates& c, const SamplerContext& /*ctx*/) override {
    if (bias_.empty()) return;
    for_each_id(c, bias_, [](TokenData& t, float b) { t.logit += b; });
    c.sorted = false;
    c.has_probs = false;
  }

private:
  std::unordered_map<TokenId, float> bias_;
};

class Greedy final : public Sampler {
public:
  std::string_view name() const noexcept override { return "greedy"; }
  bool selects() const noexcept override { return true; }
  std::unique_ptr<Sampler> clone() const override { return std::make_unique<Greedy>(*this); }
  void apply(Candidates& c, const SamplerContext& /*ctx*/) override {
    c.selected = c.data.empty() ? -1 : static_cast<int64_t>(best_index(c.data));
  }
};

} // namespace

bool sample::is_greedy(const Sampler& s) {
  return dynamic_cast<const Greedy*>(&s) != nullptr;
}

namespace {

class Dist final : public Sampler {
public:
  std::string_view name() const noexcept override { return "dist"; }
  bool selects() const noexcept override { return true; }
  std::unique_ptr<Sampler> clone() const override { return std::make_unique<Dist>(*this); }
  void apply(Candidates& c, const SamplerContext& ctx) override { dist_select(c, ctx); }
  bool distribution(Candidates& c, const SamplerContext& /*ctx*/) override {
    c.compute_probs();
    c.has_probs = true;
    return true;
  }
};

// ---------------------------------------------------------------------------------------------
// The registry: each built-in's name, help and parameter schemas.

std::vector<SamplerInfo> make_builtins() {
  using Kind = ParamSchema::Kind;
  const ParamSchema min_keep = with_min(integer("min_keep", "keep at least this many tokens (default 1)"), 1);
  std::vector<SamplerInfo> v;
  v.push_back({"temperature",
               "divide the logits by the temperature; 0 = greedy (select the most likely token)",
               {required(with_min(number("value", "temperature ≥ 0 (0 = greedy, 1 = unchanged)"), 0))}});
  v.push_back({"top_k",
               "keep the k most likely tokens",
               {required(with_min(integer("k", "k ≥ 0 (0 = keep all)"), 0))}});
  v.push_back(
      {"top_p",
       "nucleus sampling: keep the most likely tokens until their probability mass reaches p",
       {required(with_max(with_min(number("p", "p ∈ (0, 1] (1 = keep all)"), 0, true), 1)), min_keep}});
  v.push_back({"min_p",
               "keep the tokens whose probability is at least p times that of the most likely one",
               {required(with_max(with_min(number("p", "p ∈ [0, 1] (0 = keep all)"), 0), 1)), min_keep}});
  v.push_back(
      {"typical_p",
       "locally typical sampling: keep the tokens whose surprise is closest to the entropy, up to mass p",
       {required(with_max(with_min(number("p", "p ∈ (0, 1] (1 = keep all)"), 0, true), 1)), min_keep}});
  v.push_back(
      {"penalties",
       "penalise tokens that occur in the last last_n tokens of the prompt and the generated text",
       {with_min(number("repeat", "repetition penalty > 0 (1 = off; positive logits are divided, others "
                                  "multiplied; default 1)"),
                 0, true),
        number("frequency", "subtracted once per occurrence (0 = off; default 0)"),
        number("presence", "subtracted once if the token occurs (0 = off; default 0)"),
        with_min(
            integer("last_n", "how many of the latest tokens to look at (-1 = all, 0 = off; default 64)"),
            -1)}});
  ParamSchema tokens = required(with_min(integer("tokens", "token ids, each ≥ 0 (ids beyond the vocabulary "
                                                           "are ignored)"),
                                         0));
  tokens.kind = Kind::int_list;
  ParamSchema values = required(number("values", "one bias per token, added to its logit (-inf bans it)"));
  values.kind = Kind::number_list;
  v.push_back({"logit_bias", "add a bias to the logits of the listed tokens", {tokens, values}});
  v.push_back({"greedy", "select the most likely token", {}});
  v.push_back({"dist", "draw a token from the distribution with the request's seeded RNG", {}});
  ParamSchema schema;
  schema.key = "schema";
  schema.kind = Kind::string;
  schema.help = "a JSON schema; empty or left out = any JSON object";
  v.push_back({"json_schema",
               "constrained decoding: keep only the tokens that continue a JSON value of the schema (put it "
               "before the selecting stages)",
               {schema}});
  return v;
}

int32_t clamp_i32(int64_t x) {
  return static_cast<int32_t>(
      std::clamp<int64_t>(x, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
}

} // namespace

double rng_uniform(void* mt19937_64) noexcept {
  return static_cast<double>((*static_cast<std::mt19937_64*>(mt19937_64))() >> 11) * 0x1.0p-53;
}

const std::vector<SamplerInfo>& builtin_samplers() {
  static const std::vector<SamplerInfo> v = make_builtins();
  return v;
}

std::unique_ptr<Sampler> create_sampler(const SamplerSpec& spec) {
  const auto& all = builtin_samplers();
  const auto it =
      std::find_if(all.begin(), all.end(), [&](const SamplerInfo& i) { return i.name == spec.name; });
  if (it == all.end()) {
    std::string msg = "unknown sampler '" + spec.name + "'; expected one of:";
    for (size_t i = 0; i < all.size(); ++i)
      msg += (i ? ", " : " ") + all[i].name;
    fail_arg(msg);
  }
  const Params p(*it, spec);
  const std::string& n = spec.name;
  const auto min_keep = [&] { return static_cast<size_t>(clamp_i32(p.integer("min_keep", 1))); };
  if (n == "temperature") return std::make_unique<Temperature>(static_cast<float>(p.num("value", 1.0)));
  if (n == "top_k") return std::make_unique<TopK>(clamp_i32(p.integer("k", 0)));
  if (n == "top_p") return std::make_unique<TopP>(static_cast<float>(p.num("p", 1.0)), min_keep());
  if (n == "min_p") return std::make_unique<MinP>(static_cast<float>(p.num("p", 0.0)), min_keep());
  if (n == "typical_p") return std::make_unique<TypicalP>(static_cast<float>(p.num("p", 1.0)), min_keep());
  if (n == "penalties")
    return std::make_unique<Penalties>(
        static_cast<float>(p.num("repeat", 1.0)), static_cast<float>(p.num("frequency", 0.0)),
        static_cast<float>(p.num("presence", 0.0)), clamp_i32(p.integer("last_n", 64)));
  if (n == "logit_bias") {
    const auto tokens = p.int_list("tokens");
    const auto values = p.number_list("values");
    if (tokens.size() != values.size())
      fail_arg("logit_bias: tokens has " + std::to_string(tokens.size()) + " entries but values has " +
               std::to_string(values.size()) + "; expected one value per token");
    std::unordered_map<TokenId, float> bias;
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] <= std::numeric_limits<TokenId>::max()) // larger ids can never be in a vocabulary
        bias[static_cast<TokenId>(tokens[i])] += static_cast<float>(values[i]);
    return std::make_unique<LogitBias>(std::move(bias));
  }
  if (n == "greedy") return std::make_unique<Greedy>();
  if (n == "dist") return std::make_unique<Dist>();
  if (n == "json_schema") {
    try {
      return make_json_schema_sampler(p.str("schema", ""));
    } catch (const Error& e) {
      fail_arg(std::string("json_schema: ") + e.what());
    }
  }
  fail(Errc::internal, "sampler", "no implementation for built-in sampler '" + n + "'");
}

} // namespace loom
