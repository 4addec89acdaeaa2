// An A/B experiment's aggregates (loom/eval/ab_experiment.hpp): the per-prompt means of every metric, each
// variant's summary, each variant against the first (paired bootstrap intervals, sign-flip p-values,
// McNemar, agreement, win/tie/loss) and a sweep's accuracy against compute.
#include "eval/ab_format.hpp"
#include "loom/eval/ab_experiment.hpp"
#include "loom/sample/stop.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::ab {

namespace {

// The metrics compared. `better`: +1 higher is better, -1 lower is better, 0 neither. `any_vocabulary`:
// the metric means the same whatever the tokens are (time, exact match), so it compares variants whose
// models tokenize differently; the others count or score tokens of one vocabulary.
struct MetricDef {
  const char* name;
  int better;
  bool any_vocabulary;
};
const MetricDef k_metrics[] = {
    {"ttft_ms", -1, true},       {"tpot_ms", -1, false},
    {"tok_s", +1, false},        {"tokens", 0, false},
    {"mean_logprob", +1, false}, {"distinct_1", +1, false},
    {"distinct_2", +1, false},   {"repetition_4", -1, false},
    {"exact_match", +1, true},   {"tokens_evaluated", -1, false},
    {"total_ms", -1, true},
};

int better_of(const std::string& m) {
  for (const auto& d : k_metrics)
    if (m == d.name) return d.better;
  return 0;
}

// Whether a pair of variants whose vocabularies differ compares metric m (a decoder's metrics count
// tokens: no).
bool any_vocabulary(const std::string& m) {
  for (const auto& d : k_metrics)
    if (m == d.name) return d.any_vocabulary;
  return false;
}

using PerPrompt = std::map<std::string, std::vector<std::vector<double>>>;

// The fixed metrics, then the decoder's in the order the rows first report them.
std::vector<std::string> metric_names_of(const std::vector<Row>& rows) {
  std::vector<std::string> names;
  for (const auto& m : k_metrics)
    names.push_back(m.name);
  for (const auto& row : rows)
    for (const auto& [k, v] : row.metrics)
      if (k.rfind("decoder.", 0) == 0 && std::find(names.begin(), names.end(), k) == names.end())
        names.push_back(k);
  return names;
}

// Per prompt: the mean over its successful runs, per variant and metric (NaN: none).
PerPrompt per_prompt_means(const std::vector<std::string>& metric_names, const std::vector<Row>& rows,
                           size_t V, size_t P) {
  PerPrompt pp;
  for (const auto& m : metric_names) {
    auto& t = pp[m];
    t.assign(V, std::vector<double>(P, std::numeric_limits<double>::quiet_NaN()));
    std::vector<std::vector<std::pair<double, int>>> acc(V, std::vector<std::pair<double, int>>(P, {0.0, 0}));
    for (const auto& row : rows) {
      auto it = row.metrics.find(m);
      if (!row.ok || it == row.metrics.end()) continue;
      acc[row.variant][row.prompt].first += it->second;
      ++acc[row.variant][row.prompt].second;
    }
    for (size_t v = 0; v < V; ++v)
      for (size_t i = 0; i < P; ++i)
        if (acc[v][i].second > 0) t[v][i] = acc[v][i].first / acc[v][i].second;
  }
  return pp;
}

std::vector<double> finite_values(const std::vector<double>& x) {
  std::vector<double> out;
  for (double v : x)
    if (std::isfinite(v)) out.push_back(v);
  return out;
}

VariantSummary summarize_variant(size_t v, const std::vector<std::string>& metric_names, const PerPrompt& pp,
                                 const std::vector<Row>& rows) {
  VariantSummary s;
  for (const auto& m : metric_names) {
    const std::vector<double> xs = finite_values(pp.at(m)[v]);
    s.metrics[m] = {xs.empty() ? std::nullopt : std::optional<double>(mean(xs)), stddev(xs), xs.size()};
  }
  for (const auto& row : rows)
    if (row.variant == v) {
      if (!row.ok) ++s.failed_runs;
      ++s.stop_reasons[row.ok ? std::string(stop_reason_name(row.result.stop_reason)) : "failed"];
    }
  return s;
}

// What the pairs share: the per-prompt means and which prompts each variant completed in all its runs.
struct PairInput {
  const Options& o;
  const std::vector<Variant>& variants;
  const std::vector<Prompt>& prompts;
  const std::vector<Row>& rows;
  const std::vector<std::string>& metric_names;
  const PerPrompt& pp;
  std::vector<std::vector<size_t>> ok_runs; // [variant][prompt]
};

// One metric of b against the first over the paired prompts; nothing when no prompt has it in both.
std::optional<MetricDiff> compare_metric(const PairInput& in, size_t b, size_t mi,
                                         const std::vector<bool>& paired) {
  const std::string& m = in.metric_names[mi];
  const auto& x = in.pp.at(m);
  std::vector<double> d;
  for (size_t i = 0; i < paired.size(); ++i)
    if (paired[i] && std::isfinite(x[0][i]) && std::isfinite(x[b][i])) d.push_back(x[b][i] - x[0][i]);
  if (d.empty()) return std::nullopt;
  MetricDiff r;
  r.bootstrap_seed = in.o.seed + 1000003ull * b + mi;
  r.diff = mean(d);
  r.ci = bootstrap_mean_ci(d, in.o.bootstrap, r.bootstrap_seed, 0.95, in.o.ci);
  r.p = sign_flip_p(d, in.o.bootstrap, r.bootstrap_seed);
  r.n = d.size();
  r.verdict = "inconclusive";
  // Resolved when the interval excludes 0 and the permutation test agrees (p < 0.05): with a
  // handful of same-sign differences every bootstrap mean has that sign, but p = 2/2^n says the
  // sign could still be chance.
  if (!r.ci.covers(0) && r.p < 0.05) {
    const bool up = r.ci.lo > 0;
    const int dir = better_of(m);
    r.verdict = dir == 0 ? (up ? "higher" : "lower") : ((up ? 1 : -1) == dir ? "better" : "worse");
  } else if (r.diff != 0) {
    const int64_t need = std::max<int64_t>(prompts_to_resolve(stddev(d), r.diff), 6); // 2/2^6 < 0.05
    if (need > static_cast<int64_t>(d.size()))
      r.note = "underpowered: about " + std::to_string(need) + " prompts would resolve ±" +
               fmt(std::fabs(r.diff), 4);
  }
  return r;
}

// McNemar on exact match, per paired prompt (correct: at least half of its runs were, so repeated
// runs of a deterministic variant do not count as independent evidence); win/tie/loss by mean
// log-prob over paired prompts.
void compare_per_prompt(const PairInput& in, const std::vector<bool>& paired, Pair& pr) {
  const auto& em = in.pp.at("exact_match");
  const auto& lp = in.pp.at("mean_logprob");
  const size_t b = pr.b;
  for (size_t i = 0; i < paired.size(); ++i) {
    const double x = em[0][i], y = em[b][i];
    if (!paired[i] || !std::isfinite(x) || !std::isfinite(y)) continue;
    const bool ca = x >= 0.5, cb = y >= 0.5;
    if (ca && !cb) ++pr.a_only_correct;
    if (!ca && cb) ++pr.b_only_correct;
  }
  pr.mcnemar_p = mcnemar_exact_p(pr.a_only_correct, pr.b_only_correct);
  for (size_t i = 0; i < paired.size(); ++i) {
    const double x = lp[0][i], y = lp[b][i];
    if (!paired[i] || !pr.same_vocabulary || !std::isfinite(x) || !std::isfinite(y)) continue;
    (y > x ? pr.wins : y < x ? pr.losses : pr.ties)++;
  }
}

// Whether two outputs are the same tokens: identical, or identical as far as the shorter went when
// that one only hit its token budget (variants with different [stop] max_tokens; -n sets one for all).
bool same_tokens(const GenerationResult& a, const GenerationResult& b) {
  const auto& shorter = a.tokens.size() <= b.tokens.size() ? a : b;
  const auto& longer = a.tokens.size() <= b.tokens.size() ? b : a;
  const bool prefix = std::equal(shorter.tokens.begin(), shorter.tokens.end(), longer.tokens.begin()) &&
                      shorter.stop_reason == StopReason::max_tokens;
  return a.tokens == b.tokens || prefix;
}

// Agreement (same text) and answer agreement over (prompt, run); both greedy (e.g. plain against
// speculative decoding of one model): the outputs must be the same tokens — the runs that are, and
// the prompts that are not.
void compare_per_run(const PairInput& in, Pair& pr) {
  int64_t same = 0, both = 0, same_answer = 0, both_answered = 0, identical = 0;
  std::vector<std::string> differ; // prompts (ids) whose tokens differ in some run
  std::map<std::pair<size_t, size_t>, const Row*> a_rows;
  for (const auto& row : in.rows)
    if (row.variant == 0) a_rows[{row.prompt, row.run}] = &row;
  for (const auto& row : in.rows) {
    if (row.variant != pr.b) continue;
    auto it = a_rows.find({row.prompt, row.run});
    if (it == a_rows.end() || !it->second->ok || !row.ok) continue;
    const Row& a = *it->second;
    ++both;
    if (a.result.text == row.result.text) ++same;
    const std::string& id = in.prompts[row.prompt].id;
    if (same_tokens(a.result, row.result))
      ++identical;
    else if (std::find(differ.begin(), differ.end(), id) == differ.end())
      differ.push_back(id);
    if (row.correct && a.correct) {
      ++both_answered;
      if (row.answer == a.answer) ++same_answer;
    }
  }
  if (both) pr.agreement = static_cast<double>(same) / static_cast<double>(both);
  if (in.variants[0].greedy && in.variants[pr.b].greedy && pr.same_vocabulary)
    pr.greedy_identical = GreedyIdentity{both, identical, differ};
  // With `expected`: runs whose extracted answers are equal.
  if (both_answered)
    pr.answer_agreement = static_cast<double>(same_answer) / static_cast<double>(both_answered);
}

// A pair compares a prompt only where both variants completed all R runs of it (an interrupted run,
// or a failed one, would otherwise pair means over different seeds).
Pair compare_pair(const PairInput& in, size_t b) {
  Pair pr;
  pr.b = b;
  pr.same_vocabulary = in.variants[b].vocabulary == in.variants[0].vocabulary;
  const size_t P = in.prompts.size(), R = static_cast<size_t>(in.o.runs);
  std::vector<bool> paired(P);
  for (size_t i = 0; i < P; ++i) {
    paired[i] = in.ok_runs[0][i] == R && in.ok_runs[b][i] == R;
    pr.prompts_paired += paired[i] ? 1 : 0;
  }
  for (size_t mi = 0; mi < in.metric_names.size(); ++mi) {
    if (!pr.same_vocabulary && !any_vocabulary(in.metric_names[mi])) continue;
    if (auto d = compare_metric(in, b, mi, paired)) pr.metrics[in.metric_names[mi]] = std::move(*d);
  }
  compare_per_prompt(in, paired, pr);
  compare_per_run(in, pr);
  return pr;
}

// A sweep point: accuracy (mean over prompts of the per-prompt exact match, bootstrap CI over prompts)
// against the compute variant v spent.
SweepPoint sweep_point(const Options& o, const PerPrompt& pp, const std::vector<Row>& rows, size_t v) {
  SweepPoint pt;
  pt.variant = v;
  const std::vector<double> acc = finite_values(pp.at("exact_match")[v]);
  double wall_ms = 0;
  for (const auto& row : rows)
    if (row.variant == v && row.ok) {
      pt.tokens_evaluated += row.metrics.at("tokens_evaluated");
      wall_ms += row.metrics.at("total_ms");
      ++pt.runs;
    }
  if (pt.runs) pt.tokens_per_run = pt.tokens_evaluated / pt.runs;
  pt.wall_s = wall_ms / 1000.0;
  if (!acc.empty()) {
    pt.ci = bootstrap_mean_ci(acc, o.bootstrap, o.seed + 7919ull * (v + 1), 0.95, o.ci);
    pt.accuracy = mean(acc);
    pt.n = acc.size();
  }
  return pt;
}

// The paired gain of variant v's accuracy over variant prev's.
std::optional<SweepGain> sweep_gain(const Options& o, const PerPrompt& pp, size_t v, size_t prev) {
  const auto& em = pp.at("exact_match");
  std::vector<double> d;
  for (size_t i = 0; i < em[v].size(); ++i)
    if (std::isfinite(em[v][i]) && std::isfinite(em[prev][i])) d.push_back(em[v][i] - em[prev][i]);
  if (d.empty()) return std::nullopt;
  const uint64_t gseed = o.seed + 7919ull * (v + 1) + 1;
  SweepGain g;
  g.diff = mean(d);
  g.ci = bootstrap_mean_ci(d, o.bootstrap, gseed, 0.95, o.ci);
  g.p = sign_flip_p(d, o.bootstrap, gseed);
  g.pays = !g.ci.covers(0) && g.p < 0.05 && g.ci.lo > 0;
  return g;
}

// Per config, its variants in sweep order, each with its gain over the one before; more compute stops
// paying at the first gain that does not.
SweepCurve sweep_curve(const Options& o, const std::vector<Variant>& variants, const PerPrompt& pp,
                       const std::vector<Row>& rows, size_t c) {
  SweepCurve curve;
  curve.config = c;
  const size_t V = variants.size();
  size_t prev = V;
  for (size_t v = 0; v < V; ++v) {
    if (variants[v].config_index != c) continue;
    SweepPoint pt = sweep_point(o, pp, rows, v);
    if (prev < V) {
      pt.gain = sweep_gain(o, pp, v, prev);
      if (pt.gain && !pt.gain->pays && !curve.stops_paying_after)
        curve.stops_paying_after = o.sweep.values[variants[prev].sweep_index];
    }
    curve.points.push_back(std::move(pt));
    prev = v;
  }
  return curve;
}

} // namespace

Aggregates aggregate(const Options& o, const std::vector<Variant>& variants,
                     const std::vector<Prompt>& prompts, const std::vector<Row>& rows) {
  const size_t V = variants.size(), P = prompts.size();
  Aggregates a;
  a.metric_names = metric_names_of(rows);
  a.per_prompt = per_prompt_means(a.metric_names, rows, V, P);
  for (size_t v = 0; v < V; ++v)
    a.variants.push_back(summarize_variant(v, a.metric_names, a.per_prompt, rows));
  PairInput in{o,
               variants,
               prompts,
               rows,
               a.metric_names,
               a.per_prompt,
               std::vector<std::vector<size_t>>(V, std::vector<size_t>(P, 0))};
  for (const auto& row : rows)
    if (row.ok) ++in.ok_runs[row.variant][row.prompt];
  for (size_t b = 1; b < V; ++b)
    a.pairs.push_back(compare_pair(in, b));
  if (!o.sweep.values.empty())
    for (size_t c = 0; c < o.configs.size(); ++c)
      a.curves.push_back(sweep_curve(o, variants, a.per_prompt, rows, c));
  return a;
}

} // namespace loom::ab
