// Unit tests for loom/sample/sampler.hpp: each sampler on small hand-computed examples, the chain, the
// registry's validation and the default chain.
#include "loom/error.hpp"
#include "loom/sample/logprobs.hpp"
#include "loom/sample/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <gtest/gtest.h>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace loom {
namespace {

// Candidates over storage that lives as long as the test process (tests keep the views past a call).
Candidates candidates(std::span<const float> logits) {
  static std::deque<std::vector<TokenData>> storage;
  return Candidates::from_logits(logits, storage.emplace_back());
}

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> logits_from_probs(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs)
    out.push_back(static_cast<float>(std::log(p)));
  return out;
}

SamplerSpec spec(std::string name, std::vector<std::pair<std::string, ParamValue>> params = {}) {
  return SamplerSpec{std::move(name), std::move(params)};
}

// Runs one sampler over fresh candidates built from `logits`.
Candidates run(Sampler& s, const std::vector<float>& logits, SamplerContext ctx = {}) {
  Candidates c = candidates(logits);
  s.apply(c, ctx);
  return c;
}

Candidates run(const SamplerSpec& sp, const std::vector<float>& logits, SamplerContext ctx = {}) {
  auto s = create_sampler(sp);
  return run(*s, logits, ctx);
}

std::vector<TokenId> ids(const Candidates& c) {
  std::vector<TokenId> out;
  for (const auto& t : c.data)
    out.push_back(t.id);
  return out;
}

std::vector<TokenId> sorted_ids(const Candidates& c) {
  auto out = ids(c);
  std::sort(out.begin(), out.end());
  return out;
}

float logit_of(const Candidates& c, TokenId id) {
  for (const auto& t : c.data)
    if (t.id == id) return t.logit;
  ADD_FAILURE() << "token " << id << " not among the candidates";
  return std::numeric_limits<float>::quiet_NaN();
}

float max_prob(Candidates c) {
  c.softmax();
  return c.data.front().p;
}

// Expects create_sampler(sp) to throw loom::Error(invalid_argument) whose message contains `needle`.
void expect_invalid(const SamplerSpec& sp, const std::string& needle) {
  try {
    (void)create_sampler(sp);
    ADD_FAILURE() << "no error for sampler '" << sp.name << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_EQ(e.component(), "sampler");
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Candidates

TEST(Candidates, FromLogitsKeepsIdsAndOrder) {
  const Candidates c = candidates(std::vector<float>{0.5f, -1.0f, 2.0f});
  ASSERT_EQ(c.data.size(), 3u);
  EXPECT_EQ(ids(c), (std::vector<TokenId>{0, 1, 2}));
  EXPECT_EQ(c.data[1].logit, -1.0f);
  EXPECT_FALSE(c.sorted);
  EXPECT_FALSE(c.has_probs);
  EXPECT_EQ(c.selected, -1);
}

TEST(Candidates, SortDescBreaksTiesByLowerId) {
  Candidates c = candidates(std::vector<float>{1.0f, 3.0f, 1.0f, 3.0f, 2.0f});
  std::reverse(c.data.begin(), c.data.end()); // ties must not depend on the input order
  c.sort_desc();
  EXPECT_TRUE(c.sorted);
  EXPECT_EQ(ids(c), (std::vector<TokenId>{1, 3, 4, 0, 2}));
}

TEST(Candidates, SoftmaxSortsAndNormalises) {
  Candidates c = candidates(logits_from_probs({0.2, 0.5, 0.3}));
  c.softmax();
  EXPECT_TRUE(c.has_probs);
  EXPECT_EQ(ids(c), (std::vector<TokenId>{1, 2, 0}));
  EXPECT_NEAR(static_cast<double>(c.data[0].p), 0.5, 1e-6);
  EXPECT_NEAR(static_cast<double>(c.data[1].p), 0.3, 1e-6);
  EXPECT_NEAR(static_cast<double>(c.data[2].p), 0.2, 1e-6);
}

TEST(Candidates, SoftmaxIsStableForHugeLogits) {
  Candidates c = candidates(std::vector<float>{1000.0f, 1000.0f, -kInf});
  c.softmax();
  EXPECT_FLOAT_EQ(c.data[0].p, 0.5f);
  EXPECT_FLOAT_EQ(c.data[1].p, 0.5f);
  EXPECT_FLOAT_EQ(c.data[2].p, 0.0f);
}

// ---------------------------------------------------------------------------------------------
// top_k

TEST(TopK, KeepsTheThreeHighest) {
  // A..E = ids 0..4
  const auto c = run(spec("top_k", {{"k", int64_t{3}}}), {5.0f, 4.0f, 3.0f, 2.0f, 1.0f});
  EXPECT_EQ(ids(c), (std::vector<TokenId>{0, 1, 2})); // A, B, C in order
  EXPECT_TRUE(c.sorted);
}

TEST(TopK, WorksOnUnsortedInputAndTiesKeepLowerId) {
  EXPECT_EQ(ids(run(spec("top_k", {{"k", int64_t{3}}}), {1.0f, 4.0f, 3.0f, 5.0f, 2.0f})),
            (std::vector<TokenId>{3, 1, 2}));
  EXPECT_EQ(ids(run(spec("top_k", {{"k", int64_t{2}}}), {0.0f, 2.0f, 2.0f, 2.0f, 1.0f})),
            (std::vector<TokenId>{1, 2}));
}

TEST(TopK, ZeroAndLargeKKeepAll) {
  const std::vector<float> l{1.0f, 2.0f, 3.0f};
  EXPECT_EQ(run(spec("top_k", {{"k", int64_t{0}}}), l).data.size(), 3u);
  EXPECT_EQ(run(spec("top_k", {{"k", int64_t{10}}}), l).data.size(), 3u);
}

// ---------------------------------------------------------------------------------------------
// top_p

TEST(TopP, WorkedExampleKeepsFour) {
  // cumulative: .40 .70 .85 .95 ≥ .9 → four tokens
  const auto c = run(spec("top_p", {{"p", 0.9}}), logits_from_probs({0.40, 0.30, 0.15, 0.10, 0.05}));
  EXPECT_EQ(ids(c), (std::vector<TokenId>{0, 1, 2, 3}));
}

TEST(TopP, SortsUnsortedInput) {
  const auto c = run(spec("top_p", {{"p", 0.9}}), logits_from_probs({0.05, 0.30, 0.40, 0.10, 0.15}));
  EXPECT_EQ(ids(c), (std::vector<TokenId>{2, 1, 4, 3}));
}

TEST(TopP, SmallPAndMinKeep) {
  const auto l = logits_from_probs({0.40, 0.30, 0.15, 0.10, 0.05});
  EXPECT_EQ(ids(run(spec("top_p", {{"p", 0.3}}), l)), (std::vector<TokenId>{0}));
  EXPECT_EQ(ids(run(spec("top_p", {{"p", 0.5}}), l)), (std::vector<TokenId>{0, 1}));
  EXPECT_EQ(run(spec("top_p", {{"p", 0.3}, {"min_keep", int64_t{3}}}), l).data.size(), 3u);
  EXPECT_EQ(run(spec("top_p", {{"p", int64_t{1}}}), l).data.size(), 5u); // 1 = off; an integer is a number
}

TEST(TopP, LargeVocabularyMatchesFullSort) {
  // > 1024 candidates takes the partial-sort path; the result must equal a plain sort's.
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> l(5000);
  for (auto& x : l)
    x = nd(rng);
  const auto c = run(spec("top_p", {{"p", 0.95}}), l);
  Candidates ref = candidates(l);
  ref.softmax();
  double cum = 0;
  size_t n = 0;
  while (n < ref.data.size() && cum < 0.95)
    cum += static_cast<double>(ref.data[n++].p);
  ASSERT_GT(n, 256u); // the sort really had to go past the first 256
  ASSERT_NEAR(static_cast<double>(c.data.size()), static_cast<double>(n), 1.0); // float vs double sums
  for (size_t i = 0; i < c.data.size(); ++i)
    EXPECT_EQ(c.data[i].id, ref.data[i].id) << i;
}

// ---------------------------------------------------------------------------------------------
// min_p

TEST(MinP, WorkedExample) {
  // p_max = .5, threshold .2·.5 = .1: .05 is dropped
  const auto l = logits_from_probs({0.5, 0.3, 0.15, 0.05});
  EXPECT_EQ(sorted_ids(run(spec("min_p", {{"p", 0.2}}), l)), (std::vector<TokenId>{0, 1, 2}));
  // threshold .4·.5 = .2: only .5 and .3 stay
  EXPECT_EQ(sorted_ids(run(spec("min_p", {{"p", 0.4}}), l)), (std::vector<TokenId>{0, 1}));
  EXPECT_EQ(run(spec("min_p", {{"p", 0.4}, {"min_keep", int64_t{3}}}), l).data.size(), 3u);
  EXPECT_EQ(run(spec("min_p", {{"p", 0.0}}), l).data.size(), 4u);
}

// ---------------------------------------------------------------------------------------------
// typical_p

TEST(TypicalP, WorkedExample) {
  // p = [.5 .2 .2 .1]; H = 1.2206 nats; |−ln p − H| = [.527 .389 .389 1.082]
  // order by that: ids 1, 2, 0, 3 with cumulative mass .2 .4 .9 1.0
  const auto l = logits_from_probs({0.5, 0.2, 0.2, 0.1});
  EXPECT_EQ(ids(run(spec("typical_p", {{"p", 0.5}}), l)), (std::vector<TokenId>{1, 2, 0}));
  // p = .3: the two "typical" tokens suffice — the most likely token is dropped.
  EXPECT_EQ(ids(run(spec("typical_p", {{"p", 0.3}}), l)), (std::vector<TokenId>{1, 2}));
  EXPECT_EQ(run(spec("typical_p", {{"p", 0.3}, {"min_keep", int64_t{4}}}), l).data.size(), 4u);
  EXPECT_EQ(run(spec("typical_p", {{"p", 1.0}}), l).data.size(), 4u);
}

// ---------------------------------------------------------------------------------------------
// temperature / greedy

TEST(Temperature, DividesLogits) {
  const auto c = run(spec("temperature", {{"value", 0.5}}), {1.0f, -2.0f, 3.0f});
  EXPECT_FLOAT_EQ(logit_of(c, 0), 2.0f);
  EXPECT_FLOAT_EQ(logit_of(c, 1), -4.0f);
  EXPECT_FLOAT_EQ(logit_of(c, 2), 6.0f);
  EXPECT_EQ(c.selected, -1);
}

TEST(Temperature, LowerSharpens) {
  const std::vector<float> l{1.0f, 2.0f, 0.5f, 1.5f};
  const float p_hot = max_prob(run(spec("temperature", {{"value", 2.0}}), l));
  const float p_one = max_prob(run(spec("temperature", {{"value", 1.0}}), l));
  const float p_cold = max_prob(run(spec("temperature", {{"value", 0.5}}), l));
  EXPECT_LT(p_hot, p_one);
  EXPECT_LT(p_one, p_cold);
}

TEST(Temperature, ZeroIsGreedy) {
  auto t0 = create_sampler(spec("temperature", {{"value", int64_t{0}}}));
  EXPECT_TRUE(t0->selects());
  const auto c = run(*t0, {0.1f, 2.0f, 1.9f, 2.0f});
  ASSERT_GE(c.selected, 0);
  EXPECT_EQ(c.data[static_cast<size_t>(c.selected)].id, 1); // tie with id 3: lower id
  EXPECT_EQ(logit_of(c, 0), -kInf);

  // Deterministic whatever follows, for any seed.
  SamplerChain chain;
  chain.add(create_sampler(spec("temperature", {{"value", 0.0}})));
  chain.add(create_sampler(spec("top_k", {{"k", int64_t{3}}})));
  chain.add(create_sampler(spec("dist")));
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 rng(seed);
    SamplerContext ctx{{}, {}, &rng, &rng_uniform};
    EXPECT_EQ(chain.sample(std::vector<float>{0.1f, 1.0f, 3.0f, 2.9f}, ctx), 2);
  }
}

TEST(Greedy, SelectsArgMaxLowerIdOnTies) {
  auto g = create_sampler(spec("greedy"));
  EXPECT_TRUE(g->selects());
  const auto c = run(*g, {1.0f, 7.0f, 3.0f, 7.0f});
  EXPECT_EQ(c.data[static_cast<size_t>(c.selected)].id, 1);
}

// ---------------------------------------------------------------------------------------------
// penalties

TEST(Penalties, WorkedExampleWithCounts) {
  // history = prompt {1, 2} + generated {2, 3, 2}: counts 1→1, 2→3, 3→1
  const std::vector<TokenId> prompt{1, 2}, gen{2, 3, 2};
  const std::vector<float> l{1.0f, 2.0f, 3.0f, -1.0f, 0.5f};
  const auto c = run(
      spec("penalties", {{"repeat", 2.0}, {"frequency", 0.1}, {"presence", 0.5}, {"last_n", int64_t{-1}}}), l,
      SamplerContext{prompt, gen, nullptr});
  EXPECT_FLOAT_EQ(logit_of(c, 0), 1.0f);                          // not in the history
  EXPECT_FLOAT_EQ(logit_of(c, 1), 2.0f / 2 - (0.1f * 1 + 0.5f));  // 0.4
  EXPECT_FLOAT_EQ(logit_of(c, 2), 3.0f / 2 - (0.1f * 3 + 0.5f));  // 0.7
  EXPECT_FLOAT_EQ(logit_of(c, 3), -1.0f * 2 - (0.1f * 1 + 0.5f)); // negative: multiplied, -2.6
  EXPECT_FLOAT_EQ(logit_of(c, 4), 0.5f);
}

TEST(Penalties, LastNWindowAndOff) {
  const std::vector<TokenId> prompt{1, 2}, gen{2, 3, 2};
  const std::vector<float> l{1.0f, 2.0f, 3.0f, -1.0f, 0.5f};
  // last 3 of [1 2 2 3 2] = [2 3 2]: counts 2→2, 3→1; token 1 is outside the window
  const auto c =
      run(spec("penalties", {{"repeat", 2.0}, {"frequency", 0.1}, {"presence", 0.5}, {"last_n", int64_t{3}}}),
          l, SamplerContext{prompt, gen, nullptr});
  EXPECT_FLOAT_EQ(logit_of(c, 1), 2.0f);
  EXPECT_FLOAT_EQ(logit_of(c, 2), 3.0f / 2 - (0.1f * 2 + 0.5f));
  EXPECT_FLOAT_EQ(logit_of(c, 3), -1.0f * 2 - (0.1f * 1 + 0.5f));

  const auto off = run(spec("penalties", {{"repeat", 2.0}, {"last_n", int64_t{0}}}), l,
                       SamplerContext{prompt, gen, nullptr});
  for (TokenId i = 0; i < 5; ++i)
    EXPECT_EQ(logit_of(off, i), l[static_cast<size_t>(i)]);
}

TEST(Penalties, WorksOnReorderedCandidates) {
  const std::vector<TokenId> prompt{}, gen{0, 0};
  SamplerChain chain;
  chain.add(create_sampler(spec("top_k", {{"k", int64_t{2}}}))); // sorts: ids 1, 0
  chain.add(create_sampler(spec("penalties", {{"repeat", 4.0}})));
  chain.add(create_sampler(spec("greedy")));
  SamplerContext ctx{prompt, gen, nullptr};
  // id 0 (logit 2) is penalised to 0.5 < 1.5 → id 1 wins
  EXPECT_EQ(chain.sample(std::vector<float>{2.0f, 1.5f, -3.0f}, ctx), 1);
}

// ---------------------------------------------------------------------------------------------
// logit_bias

TEST(LogitBias, AddsBiasesAndSkipsIdsOutsideTheVocabulary) {
  const auto c =
      run(spec("logit_bias",
               {{"tokens", std::vector<int64_t>{1, 3, 99, 1}},
                {"values", std::vector<double>{2.5, -std::numeric_limits<double>::infinity(), 7.0, 0.5}}}),
          {1.0f, 1.0f, 1.0f, 1.0f});
  EXPECT_FLOAT_EQ(logit_of(c, 0), 1.0f);
  EXPECT_FLOAT_EQ(logit_of(c, 1), 4.0f); // duplicates add up: 1 + 2.5 + 0.5
  EXPECT_FLOAT_EQ(logit_of(c, 2), 1.0f);
  EXPECT_EQ(logit_of(c, 3), -kInf);
  EXPECT_EQ(c.data.size(), 4u); // id 99 ignored
}

TEST(LogitBias, IntegerValuesAndBanning) {
  SamplerChain chain;
  chain.add(create_sampler(
      spec("logit_bias", {{"tokens", std::vector<int64_t>{2}}, {"values", std::vector<int64_t>{-100}}})));
  chain.add(create_sampler(spec("greedy")));
  SamplerContext ctx;
  EXPECT_EQ(chain.sample(std::vector<float>{0.0f, 1.0f, 5.0f}, ctx), 1);
}

TEST(LogitBias, MismatchedListsAreAnError) {
  expect_invalid(
      spec("logit_bias", {{"tokens", std::vector<int64_t>{1, 2}}, {"values", std::vector<double>{1.0}}}),
      "values");
  expect_invalid(
      spec("logit_bias", {{"tokens", std::vector<int64_t>{-1}}, {"values", std::vector<double>{1.0}}}),
      "tokens");
  expect_invalid(spec("logit_bias", {{"tokens", std::vector<int64_t>{1}}}), "missing key 'values'");
}

// ---------------------------------------------------------------------------------------------
// dist

std::vector<TokenId> draw(uint64_t seed, int n, const std::vector<float>& logits) {
  auto d = create_sampler(spec("dist"));
  std::mt19937_64 rng(seed);
  std::vector<TokenId> out;
  for (int i = 0; i < n; ++i) {
    Candidates c = candidates(logits);
    SamplerContext ctx{{}, {}, &rng, &rng_uniform};
    d->apply(c, ctx);
    out.push_back(c.data[static_cast<size_t>(c.selected)].id);
  }
  return out;
}

TEST(Dist, ReproducibleForASeedDifferentForAnother) {
  const auto l = logits_from_probs({0.3, 0.3, 0.2, 0.2});
  const auto a = draw(1234, 64, l), b = draw(1234, 64, l), other = draw(1235, 64, l);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
}

TEST(Dist, FrequenciesMatchProbabilities) {
  const std::vector<double> probs{0.5, 0.25, 0.15, 0.07, 0.03};
  const int n = 100000;
  const auto got = draw(42, n, logits_from_probs(probs));
  std::vector<int> count(probs.size());
  for (TokenId t : got)
    ++count[static_cast<size_t>(t)];
  for (size_t i = 0; i < probs.size(); ++i)
    EXPECT_NEAR(count[i] / static_cast<double>(n), probs[i], 0.01) << "token " << i; // seeded: deterministic
}

TEST(Dist, NeverSelectsMaskedTokens) {
  const auto got = draw(5, 2000, {-kInf, 0.0f, -kInf, 0.0f, -kInf});
  for (TokenId t : got)
    EXPECT_TRUE(t == 1 || t == 3) << t;
}

TEST(Dist, NeedsAnRng) {
  auto d = create_sampler(spec("dist"));
  Candidates c = candidates(std::vector<float>{1.0f, 2.0f});
  SamplerContext ctx;
  EXPECT_THROW(d->apply(c, ctx), Error);
}

// ---------------------------------------------------------------------------------------------
// chain

TEST(Chain, AppendsDistWhenNothingSelects) {
  SamplerChain chain;
  chain.add(create_sampler(spec("top_k", {{"k", int64_t{2}}})));
  EXPECT_EQ(chain.size(), 1u);
  const std::vector<float> l{0.0f, 1.0f, 1.1f, -1.0f};
  std::vector<int> seen(4);
  std::mt19937_64 rng(9);
  for (int i = 0; i < 200; ++i) {
    SamplerContext ctx{{}, {}, &rng, &rng_uniform};
    ++seen[static_cast<size_t>(chain.sample(l, ctx))];
  }
  EXPECT_EQ(seen[0] + seen[3], 0); // filtered by top_k
  EXPECT_GT(seen[1], 0);           // both survivors are drawn: a random draw happened
  EXPECT_GT(seen[2], 0);
  SamplerContext no_rng;
  EXPECT_THROW(chain.sample(l, no_rng), Error); // the implicit dist needs the RNG
}

TEST(Chain, CloneIsIndependent) {
  SamplerChain chain;
  chain.add(create_sampler(spec("penalties", {{"repeat", 1.3}})));
  chain.add(create_sampler(spec("top_k", {{"k", int64_t{3}}})));
  chain.add(create_sampler(spec("temperature", {{"value", 0.7}})));
  chain.add(create_sampler(spec("dist")));
  auto copy = chain.clone();
  auto* cc = dynamic_cast<SamplerChain*>(copy.get());
  ASSERT_NE(cc, nullptr);
  ASSERT_EQ(cc->size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NE(&cc->at(i), &chain.at(i));
    EXPECT_EQ(cc->at(i).name(), chain.at(i).name());
  }
  const std::vector<float> l{0.2f, 1.0f, 0.7f, 0.9f, -0.5f};
  const std::vector<TokenId> hist{1, 1};
  std::mt19937_64 r1(77), r2(77);
  for (int i = 0; i < 20; ++i) {
    SamplerContext c1{hist, {}, &r1, &rng_uniform}, c2{hist, {}, &r2, &rng_uniform};
    EXPECT_EQ(chain.sample(l, c1), cc->sample(l, c2));
  }
  chain.add(create_sampler(spec("greedy")));
  EXPECT_EQ(chain.size(), 5u);
  EXPECT_EQ(cc->size(), 4u);
}

// ---------------------------------------------------------------------------------------------
// registry and validation

TEST(Registry, ListsTheBuiltins) {
  std::vector<std::string> names;
  for (const auto& s : builtin_samplers()) {
    names.push_back(s.name);
    EXPECT_FALSE(s.help.empty()) << s.name;
    for (const auto& p : s.params)
      EXPECT_FALSE(p.help.empty()) << s.name << "." << p.key;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"temperature", "top_k", "top_p", "min_p", "typical_p",
                                             "penalties", "logit_bias", "greedy", "dist", "json_schema"}));
  // Each sampler reports its TOML name.
  const std::vector<SamplerSpec> minimal{
      spec("temperature", {{"value", 1.0}}),
      spec("top_k", {{"k", int64_t{1}}}),
      spec("top_p", {{"p", 0.5}}),
      spec("min_p", {{"p", 0.5}}),
      spec("typical_p", {{"p", 0.5}}),
      spec("penalties"),
      spec("logit_bias", {{"tokens", std::vector<int64_t>{}}, {"values", std::vector<double>{}}}),
      spec("greedy"),
      spec("dist")};
  for (const auto& sp : minimal)
    EXPECT_EQ(create_sampler(sp)->name(), sp.name);
}

TEST(Registry, DescribesExpectedForms) {
  const auto find = [](const std::string& s, const std::string& k) {
    for (const auto& i : builtin_samplers())
      if (i.name == s)
        for (const auto& p : i.params)
          if (p.key == k) return p;
    ADD_FAILURE() << s << "." << k;
    return ParamSchema{};
  };
  EXPECT_EQ(describe_expected(find("top_p", "p")), "a number in (0, 1]");
  EXPECT_EQ(describe_expected(find("min_p", "p")), "a number in [0, 1]");
  EXPECT_EQ(describe_expected(find("top_k", "k")), "an integer ≥ 0");
  EXPECT_EQ(describe_expected(find("temperature", "value")), "a number ≥ 0");
  EXPECT_EQ(describe_expected(find("penalties", "repeat")), "a number > 0");
  EXPECT_EQ(describe_expected(find("penalties", "last_n")), "an integer ≥ -1");
  EXPECT_EQ(describe_expected(find("logit_bias", "tokens")), "a list of integers, each ≥ 0");
  EXPECT_EQ(describe_expected(find("logit_bias", "values")), "a list of numbers");
}

TEST(CreateSampler, Errors) {
  expect_invalid(spec("top_q"), "unknown sampler 'top_q'");
  expect_invalid(spec("top_k", {{"k", int64_t{2}}, {"kk", int64_t{1}}}), "unknown key 'kk'");
  expect_invalid(spec("greedy", {{"x", true}}), "takes no parameters");
  expect_invalid(spec("top_k", {{"k", 2.5}}), "expected an integer");
  expect_invalid(spec("top_p", {{"p", std::string("high")}}), "expected a number in (0, 1]");
  expect_invalid(spec("top_p", {{"p", 0.0}}), "out of range");
  expect_invalid(spec("top_p", {{"p", 1.5}}), "expected a number in (0, 1]");
  expect_invalid(spec("temperature", {{"value", -0.5}}), "expected a number ≥ 0");
  expect_invalid(spec("top_k", {{"k", int64_t{-1}}}), "expected an integer ≥ 0");
  expect_invalid(spec("top_k", {}), "missing key 'k'");
  expect_invalid(spec("min_p", {{"p", std::nan("")}}), "not a finite number");
  expect_invalid(spec("top_p", {{"p", 0.5}, {"min_keep", int64_t{0}}}), "min_keep");
  expect_invalid(spec("top_k", {{"k", int64_t{1}}, {"k", int64_t{2}}}), "twice");
  expect_invalid(spec("penalties", {{"last_n", int64_t{-2}}}), "last_n");
}

// ---------------------------------------------------------------------------------------------
// default chain

std::vector<std::string> names_of(const SamplerChain& c) {
  std::vector<std::string> out;
  for (size_t i = 0; i < c.size(); ++i)
    out.emplace_back(c.at(i).name());
  return out;
}

TEST(DefaultChain, LlamaOrderWithNeutralSamplersLeftOut) {
  SamplingParams p; // temp .8, top_k 40, top_p .95, min_p .05, penalties neutral
  EXPECT_EQ(names_of(make_default_chain(p)),
            (std::vector<std::string>{"top_k", "top_p", "min_p", "temperature", "dist"}));
  p.repeat_penalty = 1.1f;
  p.typical_p = 0.9f;
  EXPECT_EQ(
      names_of(make_default_chain(p)),
      (std::vector<std::string>{"penalties", "top_k", "typical_p", "top_p", "min_p", "temperature", "dist"}));
  SamplingParams neutral;
  neutral.top_k = 0;
  neutral.top_p = 1.0f;
  neutral.min_p = 0.0f;
  neutral.repeat_penalty = 1.3f;
  neutral.penalty_last_n = 0; // off
  EXPECT_EQ(names_of(make_default_chain(neutral)), (std::vector<std::string>{"temperature", "dist"}));
}

TEST(DefaultChain, TemperatureZeroIsGreedy) {
  SamplingParams p;
  p.temperature = 0.0f;
  auto chain = make_default_chain(p);
  EXPECT_EQ(names_of(chain).back(), "greedy");
  SamplerContext ctx; // greedy needs no RNG
  EXPECT_EQ(chain.sample(std::vector<float>{0.0f, 3.0f, 2.0f}, ctx), 1);
}

TEST(DefaultChain, RejectsOutOfRange) {
  SamplingParams p;
  p.temperature = -1.0f;
  EXPECT_THROW(make_default_chain(p), Error);
  p = {};
  p.top_p = 0.0f;
  EXPECT_THROW(make_default_chain(p), Error);
  p = {};
  p.top_k = -3;
  EXPECT_THROW(make_default_chain(p), Error);
  p = {};
  p.penalty_last_n = -2;
  EXPECT_THROW(make_default_chain(p), Error);
}

// ---------------------------------------------------------------------------------------------
// token_logprob

TEST(TokenLogprob, HandComputed) {
  // log softmax([1,2,3])[0] = 1 − 3 − ln(e⁻² + e⁻¹ + 1) = −2 − ln(1.5032147) = −2.4076059
  EXPECT_NEAR(static_cast<double>(token_logprob(std::vector<float>{1.0f, 2.0f, 3.0f}, 0)), -2.4076059, 1e-6);
  EXPECT_NEAR(static_cast<double>(token_logprob(std::vector<float>{1000.0f, 1000.0f}, 1)), std::log(0.5),
              1e-6);
  EXPECT_EQ(token_logprob(std::vector<float>{0.0f, -kInf}, 1), -kInf);
  EXPECT_THROW((void)token_logprob(std::vector<float>{0.0f}, 1), Error);
}

// A vocabulary's worth (the vectorized passes, every lane and the tail), NaN and -inf among them: the
// log-probabilities are the double-precision formula's, and top_logprobs' are token_logprob's.
TEST(TokenLogprob, AVocabularyMatchesTheDoubleFormula) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 4.0f);
  std::vector<float> l(49157);
  for (float& v : l)
    v = d(rng);
  l[5] = std::nanf("");
  l[40000] = -kInf;
  double mx = -1e300, sum = 0.0;
  for (float v : l)
    if (!std::isnan(v)) mx = std::max(mx, static_cast<double>(v));
  for (float v : l)
    if (!std::isnan(v)) sum += std::exp(static_cast<double>(v) - mx);
  for (TokenId t : {0, 5, 123, 4000, 40000, 49156}) {
    const auto v = static_cast<double>(l[static_cast<size_t>(t)]);
    const double want = std::isnan(v) ? -std::numeric_limits<double>::infinity() : v - mx - std::log(sum);
    const auto got = static_cast<double>(token_logprob(l, t));
    if (std::isinf(want))
      EXPECT_EQ(got, want) << t;
    else
      EXPECT_NEAR(got, want, 2e-5) << t;
  }
  for (const auto& [id, lp] : top_logprobs(l, 20))
    EXPECT_EQ(lp, token_logprob(l, id)) << id;
}

// Greedy alone is the raw row's arg-max (ties: the lower id; NaN never; all -inf: the first), as the
// candidate list's greedy would choose; any other chain has no shortcut.
TEST(GreedyChoice, TheArgMaxAsGreedyWouldChoose) {
  SamplerChain greedy;
  greedy.add(create_sampler(SamplerSpec{"greedy", {}}));
  std::vector<float> l(1000, 0.5f);
  l[700] = 2.0f;
  l[300] = 2.0f;
  l[10] = std::nanf("");
  EXPECT_EQ(greedy.greedy_choice(l), std::optional<TokenId>(300));
  std::vector<TokenData> storage;
  Candidates c = Candidates::from_logits(l, storage);
  greedy.apply(c, SamplerContext{});
  EXPECT_EQ(c.selected_id(), 300);
  EXPECT_EQ(greedy.greedy_choice(std::vector<float>(40, -kInf)), std::optional<TokenId>(0));
  EXPECT_EQ(greedy.greedy_choice(std::vector<float>{1.0f, 3.0f, 3.0f}), std::optional<TokenId>(1));
  std::vector<float> tie(l.size(), 0.0f); // the maximum in a lane and in the tail: the lane's (lower) index
  tie[5] = tie[990] = 1.0f;
  EXPECT_EQ(greedy.greedy_choice(tie), std::optional<TokenId>(5));
  // The maximum in every lane of the vector passes and in the tail, a NaN in the same lane after it.
  for (size_t at = 0; at < l.size(); at += 37) {
    std::vector<float> one(l.size(), -1.0f);
    one[at] = 1.0f;
    one[(at + 64) % one.size()] = std::nanf("");
    EXPECT_EQ(greedy.greedy_choice(one), std::optional<TokenId>(static_cast<TokenId>(at))) << at;
  }
  SamplerChain sampled;
  sampled.add(create_sampler(SamplerSpec{"top_k", {{"k", int64_t{5}}}}));
  sampled.add(create_sampler(SamplerSpec{"greedy", {}}));
  EXPECT_EQ(sampled.greedy_choice(l), std::nullopt);
}

TEST(TopLogprobs, MostLikelyFirstTiesByIdNanLeftOut) {
  const std::vector<float> l{1.0f, 3.0f, std::nanf(""), 3.0f, 2.0f};
  const auto t = top_logprobs(l, 3);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].first, 1);
  EXPECT_EQ(t[1].first, 3); // the tie: lower id first
  EXPECT_EQ(t[2].first, 4);
  for (const auto& [id, lp] : t)
    EXPECT_FLOAT_EQ(lp, token_logprob(l, id));
  EXPECT_EQ(top_logprobs(l, 10).size(), 4u); // at most the non-NaN tokens
  EXPECT_TRUE(top_logprobs(l, 0).empty());
}

// ---- sampling_distribution: what speculative sampling and beam-sample take as the chain's p ----

SamplerChain chain_of(const std::vector<SamplerSpec>& specs) {
  SamplerChain c;
  for (const auto& sp : specs)
    c.add(create_sampler(sp));
  return c;
}

std::vector<float> random_logits(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> l(n);
  for (auto& x : l)
    x = nd(g);
  return l;
}

// For chains that end in their selecting stage, the distribution is what apply() draws from: the
// frequencies of 40000 draws agree with it (5 standard deviations), and no token outside it is drawn.
TEST(SamplingDistribution, IsWhatTheChainDraws) {
  const auto logits = random_logits(40, 7);
  const std::vector<TokenId> prompt{1, 2, 3}, generated{5, 5, 9};
  const std::vector<std::vector<SamplerSpec>> chains = {
      {spec("dist")},
      {spec("top_k", {{"k", int64_t{5}}}), spec("temperature", {{"value", 0.7}})},
      {spec("top_p", {{"p", 0.8}}), spec("min_p", {{"p", 0.05}}), spec("temperature", {{"value", 1.3}})},
      {spec("typical_p", {{"p", 0.9}}), spec("dist")},
      {spec("penalties", {{"repeat", 1.5}, {"frequency", 0.2}, {"last_n", int64_t{-1}}}), spec("dist")},
      {spec("logit_bias",
            {{"tokens", std::vector<int64_t>{0, 1}}, {"values", std::vector<double>{5.0, -100.0}}})},
      {spec("greedy")},
      {spec("temperature", {{"value", 0.0}}), spec("top_k", {{"k", int64_t{3}}})},
  };
  for (size_t ci = 0; ci < chains.size(); ++ci) {
    SCOPED_TRACE("chain " + std::to_string(ci));
    SamplerChain chain = chain_of(chains[ci]);
    std::mt19937_64 rng(1);
    SamplerContext ctx{prompt, generated, &rng, &rng_uniform};
    std::vector<float> p(logits.size());
    sampling_distribution(chain, logits, ctx, p);
    double total = 0;
    for (float x : p)
      total += static_cast<double>(x);
    EXPECT_NEAR(total, 1.0, 1e-5);
    const int n = 40000;
    std::vector<int> count(logits.size());
    for (int i = 0; i < n; ++i)
      ++count[static_cast<size_t>(chain.sample(logits, ctx))];
    for (size_t t = 0; t < logits.size(); ++t) {
      const double pt = static_cast<double>(p[t]);
      if (pt == 0) {
        EXPECT_EQ(count[t], 0) << "token " << t << " is outside the distribution but was drawn";
        continue;
      }
      const double sd = std::sqrt(n * pt * (1 - pt));
      EXPECT_NEAR(count[t], n * pt, 5 * sd + 1) << "token " << t;
    }
  }
}

// A sampler after the selecting one (apply() still runs it): the distribution is one-hot at the
// very token apply() draws with the same RNG state.
TEST(SamplingDistribution, SamplersAfterASelectorGiveOneHotAtTheChainsOwnDraw) {
  const auto logits = random_logits(30, 3);
  for (const auto& specs :
       std::vector<std::vector<SamplerSpec>>{{spec("greedy"), spec("dist")},
                                             {spec("dist"), spec("greedy")},
                                             {spec("dist"), spec("top_k", {{"k", int64_t{1}}})}}) {
    SamplerChain chain = chain_of(specs);
    std::set<TokenId> seen;
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      std::mt19937_64 a(seed), b(seed);
      SamplerContext ca{{}, {}, &a, &rng_uniform}, cb{{}, {}, &b, &rng_uniform};
      std::vector<float> p(logits.size());
      sampling_distribution(chain, logits, ca, p);
      const TokenId drawn = chain.sample(logits, cb);
      EXPECT_EQ(p[static_cast<size_t>(drawn)], 1.0f) << "seed " << seed;
      seen.insert(drawn);
    }
    if (specs.front().name == "greedy") {
      EXPECT_GT(seen.size(), 3u) << "greedy then dist: apply() redraws from the softmax";
    }
  }
}

} // namespace
} // namespace loom
