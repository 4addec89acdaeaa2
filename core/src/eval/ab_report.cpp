// An A/B experiment's report (loom/eval/ab_experiment.hpp): the JSON document, with every row so every
// aggregate can be recomputed (tests/ab/check_ab_json.py does), and the terminal table made from it.
// The HTML page is ab_report_html.cpp.
#include "eval/ab_format.hpp"
#include "loom/eval/ab_experiment.hpp"
#include "loom/sample/stop.hpp"

#include <cstdarg>

namespace loom::ab {

namespace {

nlohmann::json nullable(const std::optional<double>& x) {
  return x ? nlohmann::json(*x) : nlohmann::json();
}

nlohmann::json settings_json(const Options& o) {
  return {{"seed", o.seed},
          {"runs", o.runs},
          {"bootstrap", o.bootstrap},
          {"ci", ci_name(o.ci)},
          {"level", 0.95},
          {"rng", "splitmix64"},
          {"answer_regex", o.answer_regex},
          {"chat", o.chat},
          {"system", o.system ? nlohmann::json(*o.system) : nlohmann::json()},
          {"seed_rule", "run r of prompt i: seed + i*runs + r"},
          {"bootstrap_seed_rule", "seed + 1000003*(pair+1) + metric index (in metric_names)"}};
}

nlohmann::json row_json(const Row& row) {
  nlohmann::json jr = {
      {"variant", row.variant}, {"prompt", row.prompt}, {"run", row.run}, {"seed", row.seed}, {"ok", row.ok}};
  if (!row.ok) jr["error"] = row.error;
  jr["text"] = row.result.text;
  jr["tokens"] = row.result.tokens;
  jr["stop_reason"] = std::string(stop_reason_name(row.result.stop_reason));
  jr["metrics"] = row.metrics;
  if (row.correct) {
    jr["answer"] = row.answer;
    jr["correct"] = *row.correct;
  }
  return jr;
}

nlohmann::json per_prompt_json(const Aggregates& a) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& m : a.metric_names) {
    nlohmann::json by_variant = nlohmann::json::array();
    for (const auto& values : a.per_prompt.at(m)) {
      nlohmann::json col = nlohmann::json::array();
      for (double x : values)
        col.push_back(std::isfinite(x) ? nlohmann::json(x) : nlohmann::json());
      by_variant.push_back(col);
    }
    out[m] = by_variant;
  }
  return out;
}

nlohmann::json summary_json(const std::string& name, const VariantSummary& s) {
  nlohmann::json agg = {{"variant", name}};
  for (const auto& [m, x] : s.metrics)
    agg["metrics"][m] = {{"mean", nullable(x.mean)}, {"sd", x.sd}, {"n", x.n}};
  agg["stop_reasons"] = s.stop_reasons;
  agg["failed_runs"] = s.failed_runs;
  return agg;
}

nlohmann::json pair_json(const std::vector<Variant>& variants, const Pair& p) {
  nlohmann::json pr = {{"a", variants[0].name}, {"b", variants[p.b].name}};
  pr["prompts_paired"] = p.prompts_paired;
  pr["same_vocabulary"] = p.same_vocabulary;
  for (const auto& [m, x] : p.metrics)
    pr["metrics"][m] = {
        {"diff", x.diff}, {"ci", {x.ci.lo, x.ci.hi}},          {"p", x.p}, {"n", x.n}, {"verdict", x.verdict},
        {"note", x.note}, {"bootstrap_seed", x.bootstrap_seed}};
  pr["mcnemar"] = {
      {"a_only_correct", p.a_only_correct}, {"b_only_correct", p.b_only_correct}, {"p", p.mcnemar_p}};
  pr["agreement"] = nullable(p.agreement);
  if (p.greedy_identical)
    pr["greedy_identical"] = {{"runs", p.greedy_identical->runs},
                              {"identical", p.greedy_identical->identical},
                              {"differing_prompts", p.greedy_identical->differing_prompts}};
  pr["answer_agreement"] = nullable(p.answer_agreement);
  pr["logprob_win_tie_loss"] = {p.wins, p.ties, p.losses};
  return pr;
}

nlohmann::json sweep_json(const Result& r) {
  const Sweep& sweep = r.options.sweep;
  nlohmann::json sw = {{"key", sweep.key}, {"values", sweep.values}, {"curves", nlohmann::json::array()}};
  for (const SweepCurve& c : r.aggregates.curves) {
    nlohmann::json curve = {{"config", r.options.configs[c.config]}, {"points", nlohmann::json::array()}};
    for (const SweepPoint& p : c.points) {
      nlohmann::json pt = {{"variant", r.variants[p.variant].name},
                           {"value", sweep.values[r.variants[p.variant].sweep_index]},
                           {"runs", p.runs},
                           {"tokens_evaluated", p.tokens_evaluated},
                           {"tokens_per_run", nullable(p.tokens_per_run)},
                           {"wall_s", p.wall_s}};
      if (p.accuracy) {
        pt["accuracy"] = *p.accuracy;
        pt["ci"] = {p.ci.lo, p.ci.hi};
        pt["n"] = p.n;
      }
      if (p.gain)
        pt["gain"] = {{"diff", p.gain->diff},
                      {"ci", {p.gain->ci.lo, p.gain->ci.hi}},
                      {"p", p.gain->p},
                      {"pays", p.gain->pays}};
      curve["points"].push_back(pt);
    }
    curve["stops_paying_after"] =
        c.stops_paying_after ? nlohmann::json(*c.stops_paying_after) : nlohmann::json();
    sw["curves"].push_back(curve);
  }
  return sw;
}

// printf onto a string.
[[gnu::format(printf, 2, 3)]] void appendf(std::string& out, const char* format, ...) {
  va_list ap, again;
  va_start(ap, format);
  va_copy(again, ap);
  const int n = std::vsnprintf(nullptr, 0, format, ap);
  va_end(ap);
  if (n > 0) {
    const size_t at = out.size();
    out.resize(at + static_cast<size_t>(n) + 1);
    std::vsnprintf(out.data() + at, static_cast<size_t>(n) + 1, format, again);
    out.resize(at + static_cast<size_t>(n));
  }
  va_end(again);
}

// Per metric: each variant's mean, then each pair's difference with its interval and verdict.
void text_summary(std::string& out, const nlohmann::json& J, const std::vector<std::string>& names) {
  const size_t V = names.size();
  appendf(out, "%-32s", "metric");
  for (const auto& n : names)
    appendf(out, " %14.14s", n.c_str());
  for (size_t b = 1; b < V; ++b)
    appendf(out, "   %-34.34s", (names[b] + " − " + names[0] + " [95% CI]").c_str());
  appendf(out, "\n");
  for (const auto& m : J["metric_names"]) {
    const std::string metric = m.get<std::string>();
    if (!has_data(J, metric)) continue;
    appendf(out, "%-32.32s", metric.c_str());
    for (size_t v = 0; v < V; ++v) {
      const auto& mm = J["aggregates"][v]["metrics"][metric]["mean"];
      appendf(out, " %14s", mm.is_null() ? "-" : fmt(mm.get<double>()).c_str());
    }
    for (size_t b = 1; b < V; ++b) {
      const nlohmann::json& pr_b = J["pairs"][b - 1];
      if (!pr_b.contains("metrics") || !pr_b["metrics"].contains(metric)) {
        appendf(out, "   %-34s", "-");
        continue;
      }
      const auto& x = pr_b["metrics"][metric];
      const bool sig = x["verdict"] != "inconclusive"; // the interval excludes 0 and p < 0.05
      const std::string cell = (sig ? "*" : " ") + fmt(x["diff"].get<double>()) + " [" +
                               fmt(x["ci"][0].get<double>()) + ", " + fmt(x["ci"][1].get<double>()) + "] " +
                               x["verdict"].get<std::string>();
      appendf(out, "   %-34s", cell.c_str());
    }
    appendf(out, "\n");
  }
}

// Per pair: agreement, win/tie/loss, McNemar, greedy identity and the underpowered notes.
void text_pairs(std::string& out, const nlohmann::json& J, const std::vector<std::string>& names) {
  for (size_t b = 1; b < names.size(); ++b) {
    const nlohmann::json& pr = J["pairs"][b - 1];
    appendf(out, "\n%s vs %s: agreement %.3f, mean log-prob win/tie/loss %d/%d/%d, McNemar p %.4f\n",
            names[b].c_str(), names[0].c_str(),
            pr["agreement"].is_null() ? std::nan("") : pr["agreement"].get<double>(),
            pr["logprob_win_tie_loss"][0].get<int>(), pr["logprob_win_tie_loss"][1].get<int>(),
            pr["logprob_win_tie_loss"][2].get<int>(), pr["mcnemar"]["p"].get<double>());
    if (!pr["same_vocabulary"].get<bool>())
      appendf(out,
              "  different vocabularies: only time and exact match are compared (token counts, log-probs "
              "and distinct-n are per model)\n");
    if (pr.contains("greedy_identical")) {
      const auto& gi = pr["greedy_identical"];
      const auto n_same = gi["identical"].get<int64_t>(), n_runs = gi["runs"].get<int64_t>();
      std::string ids;
      for (const auto& d : gi["differing_prompts"])
        ids += (ids.empty() ? "" : ", ") + d.get<std::string>();
      appendf(out, "  greedy outputs identical (tokens): %lld of %lld runs%s\n",
              static_cast<long long>(n_same), static_cast<long long>(n_runs),
              n_same == n_runs ? "" : ("; differing: " + ids).c_str());
    }
    if (pr.contains("metrics"))
      for (const auto& [m, x] : pr["metrics"].items())
        if (!x["note"].get<std::string>().empty())
          appendf(out, "  %s: %s\n", m.c_str(), x["note"].get<std::string>().c_str());
  }
}

// Per swept config: accuracy with its interval against compute, and where more compute stops paying.
void text_sweep(std::string& out, const nlohmann::json& sw) {
  for (const auto& cv : sw["curves"]) {
    appendf(out, "\nsweep %s (%s): accuracy against compute, 95%% CI over prompts\n",
            sw["key"].get<std::string>().c_str(), cv["config"].get<std::string>().c_str());
    appendf(out, "  %-12s %-24s %16s %10s %9s   %s\n", "value", "accuracy [95% CI]", "tokens evaluated",
            "per run", "wall s", "gain over the previous [95% CI]");
    for (const auto& p : cv["points"]) {
      const std::string acc = p.contains("accuracy")
                                  ? fmt(p["accuracy"].get<double>()) + " [" + fmt(p["ci"][0].get<double>()) +
                                        ", " + fmt(p["ci"][1].get<double>()) + "]"
                                  : std::string("-");
      const std::string gain =
          p.contains("gain")
              ? (p["gain"]["pays"].get<bool>() ? "*" : " ") + fmt(p["gain"]["diff"].get<double>()) + " [" +
                    fmt(p["gain"]["ci"][0].get<double>()) + ", " + fmt(p["gain"]["ci"][1].get<double>()) + "]"
              : std::string("");
      appendf(out, "  %-12s %-24s %16.0f %10s %9.2f   %s\n", p["value"].get<std::string>().c_str(),
              acc.c_str(), p["tokens_evaluated"].get<double>(),
              p["tokens_per_run"].is_null() ? "-" : fmt(p["tokens_per_run"].get<double>(), 1).c_str(),
              p["wall_s"].get<double>(), gain.c_str());
    }
    if (cv["stops_paying_after"].is_null())
      appendf(out, "  every step up in compute paid (its gain resolved above 0)\n");
    else
      appendf(out, "  more compute stops paying after %s = %s\n", sw["key"].get<std::string>().c_str(),
              cv["stops_paying_after"].get<std::string>().c_str());
  }
}

} // namespace

nlohmann::json report_json(const Result& r) {
  nlohmann::json J;
  J["settings"] = settings_json(r.options);
  J["interrupted"] = r.interrupted;
  J["metric_names"] = r.aggregates.metric_names;
  J["variants"] = nlohmann::json::array();
  for (const Variant& v : r.variants) {
    nlohmann::json jv = {{"name", v.name}, {"config", v.config}, {"vocabulary", v.vocabulary}};
    if (!v.chat_template.empty()) jv["chat_template"] = v.chat_template;
    if (!r.options.sweep.values.empty()) jv["sweep_value"] = r.options.sweep.values[v.sweep_index];
    J["variants"].push_back(jv);
  }
  J["prompts"] = nlohmann::json::array();
  for (const auto& p : r.prompts) {
    nlohmann::json jp = {{"id", p.id},
                         {"prompt", p.prompt},
                         {"expected", p.expected ? nlohmann::json(*p.expected) : nlohmann::json()}};
    if (p.chat) jp["messages"] = nlohmann::json::parse(p.chat->messages.dump());
    J["prompts"].push_back(std::move(jp));
  }
  J["rows"] = nlohmann::json::array();
  for (const auto& row : r.rows)
    J["rows"].push_back(row_json(row));
  J["per_prompt"] = per_prompt_json(r.aggregates);
  J["aggregates"] = nlohmann::json::array();
  for (size_t v = 0; v < r.variants.size(); ++v)
    J["aggregates"].push_back(summary_json(r.variants[v].name, r.aggregates.variants[v]));
  J["pairs"] = nlohmann::json::array();
  for (const Pair& p : r.aggregates.pairs)
    J["pairs"].push_back(pair_json(r.variants, p));
  if (!r.options.sweep.values.empty()) J["sweep"] = sweep_json(r);
  return J;
}

std::string report_text(const Result& r, const nlohmann::json& doc) {
  std::vector<std::string> names;
  for (const Variant& v : r.variants)
    names.push_back(v.name);
  std::string out;
  for (const Variant& v : r.variants)
    if (!v.chat_template.empty())
      appendf(out, "%s: conversations rendered with %s\n", v.name.c_str(), v.chat_template.c_str());
  text_summary(out, doc, names);
  text_pairs(out, doc, names);
  if (doc.contains("sweep")) text_sweep(out, doc["sweep"]);
  const int runs = r.options.runs;
  appendf(out,
          "* resolved: the 95%% interval excludes 0 and the permutation p < 0.05. %zu prompts × %d "
          "runs; seeds %llu + i·%d + r.%s\n",
          r.prompts.size(), runs, static_cast<unsigned long long>(r.options.seed), runs,
          r.interrupted ? " Interrupted: partial results." : "");
  return out;
}

} // namespace loom::ab
