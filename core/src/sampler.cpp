// sampler.cpp — the host-side samplers (llama.cpp semantics), their schemas and the default chain.
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
#include "loom/sampler.hpp"

#include "loom/error.hpp"
#include "loom/json_constraint.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace loom {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

size_t best_index(std::span<const TokenData> d) {
  size_t best = 0;
  for (size_t i = 1; i < d.size(); ++i)
    if (Candidates::before(d[i], d[best])) best = i;
  return best;
}

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

[[noreturn]] void fail_arg(const std::string& msg) {
  fail(Errc::invalid_argument, "sampler", msg);
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
// Schemas and validation.

ParamSchema number(std::string key, std::string help) {
  ParamSchema s;
  s.key = std::move(key);
  s.kind = ParamSchema::Kind::number;
  s.help = std::move(help);
  return s;
}

ParamSchema integer(std::string key, std::string help) {
  ParamSchema s = number(std::move(key), std::move(help));
  s.kind = ParamSchema::Kind::integer;
  return s;
}

ParamSchema with_min(ParamSchema s, double min, bool open = false) {
  s.has_min = true;
  s.min = min;
  s.min_open = open;
  return s;
}

ParamSchema with_max(ParamSchema s, double max, bool open = false) {
  s.has_max = true;
  s.max = max;
  s.max_open = open;
  return s;
}

ParamSchema required(ParamSchema s) {
  s.required = true;
  return s;
}

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

std::string fmt_num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

std::string value_type_name(const ParamValue& v) {
  switch (v.index()) {
  case 0:
    return "a boolean";
  case 1:
    return "an integer";
  case 2:
    return "a number";
  case 3:
    return "a string";
  case 4:
    return "a list of integers";
  default:
    return "a list of numbers";
  }
}

std::string value_text(const ParamValue& v) {
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return fmt_num(*d);
  if (const auto* s = std::get_if<std::string>(&v)) return "\"" + *s + "\"";
  return value_type_name(v);
}

[[noreturn]] void fail_value(const SamplerInfo& info, const ParamSchema& s, const std::string& what) {
  fail_arg(info.name + ": " + s.key + " " + what + "; expected " + describe_param(s));
}

// Checks one value against its schema (type, finiteness, range); throws with the sampler and key named.
void check_value(const SamplerInfo& info, const ParamSchema& s, const ParamValue& v) {
  using Kind = ParamSchema::Kind;
  const auto check_scalar = [&](double x, bool allow_inf, const std::string& shown) {
    if (std::isnan(x) || (!allow_inf && std::isinf(x)))
      fail_value(info, s, "= " + shown + " is not a finite number");
    if (!schema_accepts(s, x)) fail_value(info, s, "= " + shown + " is out of range");
  };
  switch (s.kind) {
  case Kind::boolean:
    if (!std::holds_alternative<bool>(v)) fail_value(info, s, "is " + value_type_name(v));
    return;
  case Kind::integer:
    if (!std::holds_alternative<int64_t>(v)) fail_value(info, s, "is " + value_type_name(v));
    check_scalar(static_cast<double>(std::get<int64_t>(v)), false, value_text(v));
    return;
  case Kind::number:
    if (const auto* i = std::get_if<int64_t>(&v))
      check_scalar(static_cast<double>(*i), false, value_text(v));
    else if (const auto* d = std::get_if<double>(&v))
      check_scalar(*d, false, value_text(v));
    else
      fail_value(info, s, "is " + value_type_name(v));
    return;
  case Kind::int_list:
    if (const auto* l = std::get_if<std::vector<int64_t>>(&v)) {
      for (size_t i = 0; i < l->size(); ++i)
        check_scalar(static_cast<double>((*l)[i]), false,
                     "[" + std::to_string(i) + "] " + std::to_string((*l)[i]));
    } else if (const auto* dl = std::get_if<std::vector<double>>(&v); !(dl && dl->empty())) {
      fail_value(info, s, "is " + value_type_name(v)); // an empty list has no element type: accepted
    }
    return;
  case Kind::string:
    if (!std::holds_alternative<std::string>(v)) fail_value(info, s, "is " + value_type_name(v));
    return;
  case Kind::number_list:
    if (const auto* l = std::get_if<std::vector<int64_t>>(&v)) {
      for (size_t i = 0; i < l->size(); ++i)
        check_scalar(static_cast<double>((*l)[i]), true,
                     "[" + std::to_string(i) + "] " + std::to_string((*l)[i]));
    } else if (const auto* dl = std::get_if<std::vector<double>>(&v)) {
      for (size_t i = 0; i < dl->size(); ++i)
        check_scalar((*dl)[i], true, "[" + std::to_string(i) + "] " + fmt_num((*dl)[i]));
    } else {
      fail_value(info, s, "is " + value_type_name(v));
    }
    return;
  }
}

// Validated parameters of one spec, by key.
class Params {
public:
  Params(const SamplerInfo& info, const SamplerSpec& spec) {
    for (const auto& kv : spec.params) {
      const std::string& k = kv.first;
      const ParamValue& v = kv.second;
      const auto it = std::find_if(info.params.begin(), info.params.end(),
                                   [&](const ParamSchema& s) { return s.key == k; });
      if (it == info.params.end()) {
        std::string msg = info.name + ": unknown key '" + k + "'; ";
        if (info.params.empty()) {
          msg += info.name + " takes no parameters";
        } else {
          msg += "expected one of:";
          for (size_t i = 0; i < info.params.size(); ++i)
            msg += (i ? ", " : " ") + info.params[i].key;
        }
        fail_arg(msg);
      }
      if (values_.count(k)) fail_arg(info.name + ": key '" + k + "' is given twice");
      check_value(info, *it, v);
      values_.emplace(k, v);
    }
    for (const auto& s : info.params)
      if (s.required && !values_.count(s.key))
        fail_arg(info.name + ": missing key '" + s.key + "'; expected " + describe_expected(s) + " (" +
                 s.help + ")");
  }

  double num(const std::string& k, double dflt) const {
    const auto it = values_.find(k);
    if (it == values_.end()) return dflt;
    if (const auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
    return std::get<double>(it->second);
  }

  int64_t integer(const std::string& k, int64_t dflt) const {
    const auto it = values_.find(k);
    return it == values_.end() ? dflt : std::get<int64_t>(it->second);
  }

  std::vector<int64_t> int_list(const std::string& k) const {
    const auto it = values_.find(k);
    if (it == values_.end()) return {};
    if (const auto* l = std::get_if<std::vector<int64_t>>(&it->second)) return *l;
    return {}; // an empty list of unknown type
  }

  std::string str(const std::string& k, std::string dflt) const {
    const auto it = values_.find(k);
    return it == values_.end() ? dflt : std::get<std::string>(it->second);
  }

  std::vector<double> number_list(const std::string& k) const {
    const auto it = values_.find(k);
    if (it == values_.end()) return {};
    if (const auto* l = std::get_if<std::vector<double>>(&it->second)) return *l;
    const auto& il = std::get<std::vector<int64_t>>(it->second);
    std::vector<double> out;
    out.reserve(il.size());
    for (int64_t x : il)
      out.push_back(static_cast<double>(x));
    return out;
  }

private:
  std::unordered_map<std::string, ParamValue> values_;
};

int32_t clamp_i32(int64_t x) {
  return static_cast<int32_t>(
      std::clamp<int64_t>(x, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
}

} // namespace

double rng_uniform(void* mt19937_64) noexcept {
  return static_cast<double>((*static_cast<std::mt19937_64*>(mt19937_64))() >> 11) * 0x1.0p-53;
}

// ---------------------------------------------------------------------------------------------
// Registry

std::string describe_expected(const ParamSchema& s) {
  using Kind = ParamSchema::Kind;
  std::string out;
  switch (s.kind) {
  case Kind::boolean:
    return "a boolean (true or false)";
  case Kind::integer:
    out = "an integer";
    break;
  case Kind::number:
    out = "a number";
    break;
  case Kind::int_list:
    out = "a list of integers";
    break;
  case Kind::number_list:
    out = "a list of numbers";
    break;
  case Kind::string:
    return "a string";
  }
  const bool list = s.kind == Kind::int_list || s.kind == Kind::number_list;
  if (s.has_min && s.has_max) {
    out += list ? ", each in " : " in ";
    out += (s.min_open ? "(" : "[") + fmt_num(s.min) + ", " + fmt_num(s.max) + (s.max_open ? ")" : "]");
  } else if (s.has_min) {
    out += (list ? ", each " : " ") + std::string(s.min_open ? "> " : "≥ ") + fmt_num(s.min);
  } else if (s.has_max) {
    out += (list ? ", each " : " ") + std::string(s.max_open ? "< " : "≤ ") + fmt_num(s.max);
  }
  return out;
}

bool schema_accepts(const ParamSchema& s, double x) noexcept {
  if (std::isnan(x)) return false;
  if (s.has_min && (s.min_open ? !(x > s.min) : !(x >= s.min))) return false;
  if (s.has_max && (s.max_open ? !(x < s.max) : !(x <= s.max))) return false;
  return true;
}

std::string describe_param(const ParamSchema& s) {
  return s.help.empty() ? describe_expected(s) : describe_expected(s) + " (" + s.help + ")";
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

// ---------------------------------------------------------------------------------------------
// SamplerChain

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
// Default chain, log-probabilities

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
