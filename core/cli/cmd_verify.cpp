// `loom verify`: a verifier plugin on given candidates, without a model — to test a verifier and to
// A/B-check one against another on labelled candidates.
#include "cli.hpp"
#include "loom/chat/chat.hpp"
#include "loom/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace loom::cli {

namespace {

struct Task {
  size_t line = 0;
  std::string prompt, candidate;
  std::optional<bool> label;
  std::string json; // the whole line: the task a verifier may read (e.g. program_tests' "tests")
};

std::vector<Task> read_tasks(const std::string& path) {
  const std::string text = read_input_file(path, "--tasks");
  std::vector<Task> tasks;
  std::istringstream in(text);
  std::string line;
  size_t n = 0;
  const auto bad = [&](const std::string& what) {
    fail(Errc::invalid_argument, "verify",
         "--tasks " + user_value(path) + " line " + std::to_string(n) + ": " + what +
             "; expected one JSON object per line with \"candidate\" (a string), optionally \"prompt\" "
             "(a string) or OpenAI-style \"messages\", and \"label\" (true/false or 1/0)");
  };
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      bad(std::string("not JSON (") + e.what() + ")");
    }
    if (!j.is_object()) bad("not an object");
    if (!j.contains("candidate") || !j["candidate"].is_string()) bad("no \"candidate\" string");
    Task t;
    t.line = n;
    t.json = j.dump();
    t.candidate = j["candidate"].get<std::string>();
    if (j.contains("prompt") && j.contains("messages")) bad("give \"prompt\" or \"messages\", not both");
    if (j.contains("prompt")) {
      if (!j["prompt"].is_string()) bad("\"prompt\" is not a string");
      t.prompt = j["prompt"].get<std::string>();
    }
    if (j.contains("messages")) { // the conversation the candidate replies to: its last user turn
      const nlohmann::ordered_json m = j["messages"];
      if (const auto problem = chat::messages_problem(m)) bad("\"messages\": " + *problem);
      t.prompt = chat::last_user_text(m);
    }
    if (j.contains("label")) {
      const auto& l = j["label"];
      if (l.is_boolean())
        t.label = l.get<bool>();
      else if (l.is_number_integer() && (l.get<int64_t>() == 0 || l.get<int64_t>() == 1))
        t.label = l.get<int64_t>() == 1;
      else
        bad("\"label\" is " + l.dump() + ", not true/false or 1/0");
    }
    tasks.push_back(std::move(t));
  }
  if (tasks.empty())
    fail(Errc::invalid_argument, "verify",
         "--tasks " + user_value(path) + " has no tasks (one JSON object per line)");
  return tasks;
}

// The area under the ROC curve of scores against labels (ties count half); NaN without both classes.
double auc(const std::vector<std::pair<double, bool>>& v) {
  size_t pos = 0, neg = 0;
  for (const auto& [s, l] : v)
    (l ? pos : neg) += 1;
  if (pos == 0 || neg == 0) return std::nan("");
  double wins = 0;
  for (const auto& [sp, lp] : v)
    if (lp)
      for (const auto& [sn, ln] : v)
        if (!ln) wins += sp > sn ? 1.0 : sp == sn ? 0.5 : 0.0;
  return wins / (static_cast<double>(pos) * static_cast<double>(neg));
}

// The pipeline whose [verifier] and [plugins] are used: -c, --verifier, --set, then --plugin-path first.
PipelineConfig verify_config(const po::variables_map& vm) {
  std::vector<ConfigOverride> overrides;
  if (vm.count("verifier"))
    overrides.push_back({"verifier.name", nlohmann::json(vm["verifier"].as<std::string>()).dump()});
  PipelineConfig cfg = config_from_args(vm, overrides);
  if (vm.count("plugin-path"))
    for (const auto& d : vm["plugin-path"].as<std::vector<std::string>>())
      cfg.plugins.paths.insert(cfg.plugins.paths.begin(), d);
  if (cfg.verifier.name.empty())
    throw UsageError("--verifier NAME is required (or a [verifier] section in -c)");
  return cfg;
}

// Every task's result ({line, score, error?, label?}) and the counts the summary is made of: scores, and
// for labelled tasks the confusion matrix at the threshold.
struct Tally {
  nlohmann::json results = nlohmann::json::array();
  std::vector<std::pair<double, bool>> labelled;
  size_t errors = 0, tp = 0, fp = 0, fn = 0, tn = 0;
  double sum = 0;
  size_t scored = 0;
};

nlohmann::json tally_one(const Task& t, const VerifyOutcome& o, double threshold, Tally& c) {
  nlohmann::json r = {{"line", t.line}};
  if (o.error.empty()) {
    const double s = o.score;
    r["score"] = s;
    c.sum += s;
    ++c.scored;
    if (t.label) {
      c.labelled.emplace_back(s, *t.label);
      const bool acc = s >= threshold;
      (acc ? (*t.label ? c.tp : c.fp) : (*t.label ? c.fn : c.tn)) += 1;
    }
  } else {
    r["score"] = nullptr;
    r["error"] = o.error;
    ++c.errors;
    if (t.label) (*t.label ? c.fn : c.tn) += 1; // a failed verification accepts nothing
  }
  if (t.label) r["label"] = *t.label;
  return r;
}

// A task's line of the text report: its score (or error), its label and the candidate's start.
void print_result_line(const Task& t, const nlohmann::json& r) {
  std::string excerpt = one_line(t.candidate);
  if (excerpt.size() > 60) excerpt = excerpt.substr(0, 57) + "...";
  std::printf("%5zu  %-8s %-6s %s\n", t.line,
              r["score"].is_null() ? "error"
                                   : (std::to_string(r["score"].get<double>()).substr(0, 6)).c_str(),
              t.label ? (*t.label ? "right" : "wrong") : "", excerpt.c_str());
  if (r.contains("error")) std::printf("       %s\n", one_line(r["error"].get<std::string>()).c_str());
}

nlohmann::json verify_summary(const StandaloneVerifier& v, size_t n_tasks, const Tally& c, double threshold) {
  nlohmann::json summary = {
      {"verifier", v.name()},
      {"tasks", n_tasks},
      {"errors", c.errors},
      {"mean_score", c.scored ? nlohmann::json(c.sum / static_cast<double>(c.scored)) : nullptr}};
  if (v.name() == "model_judge") summary["judge_forwards"] = v.judge_forwards();
  const size_t nl = c.tp + c.fp + c.fn + c.tn;
  if (nl > 0) {
    const auto ratio = [](size_t a, size_t b) {
      return b ? nlohmann::json(static_cast<double>(a) / b) : nullptr;
    };
    summary["labelled"] = nl;
    summary["threshold"] = threshold;
    summary["accuracy"] = ratio(c.tp + c.tn, nl);
    summary["precision"] = ratio(c.tp, c.tp + c.fp);
    summary["recall"] = ratio(c.tp, c.tp + c.fn);
    const double a = auc(c.labelled);
    summary["auc"] = std::isfinite(a) ? nlohmann::json(a) : nullptr;
  }
  return summary;
}

void print_summary_text(const StandaloneVerifier& v, size_t n_tasks, const Tally& c,
                        const nlohmann::json& summary, double threshold) {
  std::printf("%s: %zu tasks, %zu errors, mean score %s\n", v.name().c_str(), n_tasks, c.errors,
              summary["mean_score"].is_null() ? "-"
                                              : std::to_string(summary["mean_score"].get<double>()).c_str());
  const size_t nl = c.tp + c.fp + c.fn + c.tn;
  if (nl == 0) return;
  const auto pct = [](const nlohmann::json& x) {
    return x.is_null() ? std::string("-") : std::to_string(100.0 * x.get<double>()).substr(0, 5) + "%";
  };
  std::printf("labelled %zu at threshold %.3g: accuracy %s, precision %s, recall %s, ROC AUC %s\n", nl,
              threshold, pct(summary["accuracy"]).c_str(), pct(summary["precision"]).c_str(),
              pct(summary["recall"]).c_str(),
              summary["auc"].is_null() ? "- (needs right and wrong labels)"
                                       : std::to_string(summary["auc"].get<double>()).substr(0, 5).c_str());
}

} // namespace

int cmd_verify(const std::vector<std::string>& args) {
  po::options_description desc("loom verify options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("verifier", po::value<std::string>(), "the verifier plugin (as [verifier] name)")
    ("tasks", po::value<std::string>(), "a JSONL file: {\"prompt\" or \"messages\", \"candidate\", \"label\"?} per line")
    ("config,c", po::value<std::string>(), "a pipeline TOML file whose [verifier] and [plugins] are used")
    ("set", po::value<std::vector<std::string>>()->composing(), "section.key=value (repeatable), e.g. verifier.scope='\"last_line\"'")
    ("plugin-path", po::value<std::vector<std::string>>()->composing(), "a plugin directory (repeatable)")
    ("threshold", po::value<double>()->default_value(0.5), "a candidate is accepted when its score ≥ this (with labels)")
    ("json", "print one JSON object");
  // clang-format on
  po::variables_map vm;
  if (!parse_args(
          args, desc, vm,
          "usage: loom verify --verifier NAME [--set verifier.KEY=V]... --tasks FILE.jsonl [--json]\n"
          "Scores given candidates with a verifier plugin, without a model: each line of FILE.jsonl is "
          "an object\nwith \"candidate\" (the text scored), optionally \"prompt\" (what it answers; or "
          "OpenAI-style "
          "\"messages\",\nwhose last user turn it answers) and \"label\" (whether the\ncandidate is right: "
          "then accuracy, precision and recall at --threshold "
          "and the ROC AUC are reported).\nThe whole line is the verifier's task (program_tests reads its "
          "\"tests\"). A verifier that fails on a candidate marks that line, not the "
          "run."))
    return k_exit_ok;
  if (!vm.count("tasks")) throw UsageError("--tasks FILE.jsonl is required (see --help)");
  const PipelineConfig cfg = verify_config(vm);
  const double threshold = vm["threshold"].as<double>();
  if (!(threshold >= 0 && threshold <= 1))
    throw UsageError("--threshold must be in [0, 1], found " + std::to_string(threshold));
  const auto tasks = read_tasks(vm["tasks"].as<std::string>());
  const auto v = StandaloneVerifier::create(cfg);

  const bool json = vm.count("json") > 0;
  std::vector<StandaloneVerifier::Item> items;
  for (const Task& t : tasks)
    items.push_back({t.prompt, t.candidate, t.json});
  const std::vector<VerifyOutcome> outcomes = v->score_all(items);
  Tally c;
  for (size_t i = 0; i < tasks.size(); ++i) {
    nlohmann::json r = tally_one(tasks[i], outcomes[i], threshold, c);
    if (!json) print_result_line(tasks[i], r);
    c.results.push_back(std::move(r));
  }
  const nlohmann::json summary = verify_summary(*v, tasks.size(), c, threshold);
  if (json) {
    std::cout << nlohmann::json{{"summary", summary}, {"results", c.results}}.dump(
                     2, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
    return k_exit_ok;
  }
  print_summary_text(*v, tasks.size(), c, summary, threshold);
  return k_exit_ok;
}

} // namespace loom::cli
