// `loom ab`: A/B comparison of pipelines on the same prompts and seeds (docs/ab.md). The experiment is
// the library's (loom/eval/ab_experiment.hpp: plan, run, aggregate, report); here are its options, the
// Ctrl-C handling, the progress line, and the report written: a terminal table, --json with every row
// (so every aggregate can be recomputed: tests/ab/check_ab_json.py does), --html OUT (one
// self-contained file).
#include "cli.hpp"
#include "loom/error.hpp"
#include "loom/eval/ab_experiment.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>

namespace loom::cli {

namespace {

std::atomic<bool> g_ab_interrupted{false};
extern "C" void on_sigint(int) {
  g_ab_interrupted.store(true);
  std::signal(SIGINT, SIG_DFL); // a second Ctrl-C ends the process at once (signal() is async-signal-safe)
}

// --sweep KEY=V1,V2,…: the values, each a TOML value as --set takes it.
ab::Sweep parse_sweep(const std::string& sw) {
  ab::Sweep out;
  const size_t eq = sw.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UsageError("--sweep: expected KEY=V1,V2,… (e.g. decoder.expansions=1,2,4,8), got '" + sw + "'");
  out.key = sw.substr(0, eq);
  std::string cur;
  for (size_t i = eq + 1; i <= sw.size(); ++i) {
    if (i == sw.size() || sw[i] == ',') {
      const size_t b = cur.find_first_not_of(' '), e = cur.find_last_not_of(' ');
      if (b == std::string::npos) throw UsageError("--sweep " + sw + ": an empty value");
      out.values.push_back(cur.substr(b, e - b + 1));
      cur.clear();
    } else {
      cur += sw[i];
    }
  }
  if (out.values.size() < 2) throw UsageError("--sweep " + sw + ": give at least two values (KEY=V1,V2,…)");
  for (size_t i = 0; i < out.values.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (out.values[i] == out.values[j])
        throw UsageError("--sweep " + sw + ": the value " + out.values[i] + " is given twice");
  return out;
}

// The experiment's settings from the flags, each checked in the order its usage error is reported.
ab::Options experiment_options(const po::variables_map& vm) {
  ab::Options o;
  o.configs = vm.count("config") ? vm["config"].as<std::vector<std::string>>() : std::vector<std::string>{};
  if (vm.count("sweep")) o.sweep = parse_sweep(vm["sweep"].as<std::string>());
  if (o.configs.empty() || (o.configs.size() < 2 && o.sweep.values.empty()))
    throw UsageError(
        "give at least two pipelines to compare (-c A.toml -c B.toml), or one with --sweep, got " +
        std::to_string(o.configs.size()));
  if (!vm.count("prompts")) throw UsageError("give the prompts with --prompts FILE");
  o.runs = vm["runs"].as<int>();
  o.bootstrap = vm["bootstrap"].as<int>();
  if (o.runs < 1 || o.runs > 1000)
    throw UsageError("--runs must be in 1..1000, got " + std::to_string(o.runs));
  if (o.bootstrap < 100 || o.bootstrap > 1'000'000)
    throw UsageError("--bootstrap must be in 100..1000000, got " + std::to_string(o.bootstrap));
  const std::string ci_name = vm["ci"].as<std::string>();
  if (ci_name != "percentile" && ci_name != "bca")
    throw UsageError("--ci must be percentile or bca, got '" + ci_name + "'");
  o.ci = ci_name == "bca" ? ab::CiMethod::bca : ab::CiMethod::percentile;
  o.seed = parse_seed(vm["seed"].as<std::string>(), "--seed");
  o.answer_regex = vm["answer-regex"].as<std::string>();
  (void)ab::extract_answer("", o.answer_regex); // a regex that does not compile fails here, before any run
  if (vm.count("plugin-path")) o.plugin_paths = vm["plugin-path"].as<std::vector<std::string>>();
  o.chat = vm.count("chat") != 0;
  if (vm.count("system")) o.system = vm["system"].as<std::string>();
  return o;
}

// The prompts file; what is wrong in it is misuse (exit 2), an unreadable file an error.
std::vector<ab::Prompt> load_prompts(const std::string& path) {
  const std::string text = read_input_file(path, "--prompts");
  try {
    return ab::parse_prompts(text, path);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

// The flags read once the run is about to start (--set, -n), in the order they were checked before.
void add_variant_flags(const po::variables_map& vm, ab::Options& o) {
  if (vm.count("set"))
    for (const auto& s : vm["set"].as<std::vector<std::string>>())
      o.overrides.push_back(parse_override(s));
  if (vm.count("n-predict")) {
    const int n = vm["n-predict"].as<int>();
    if (n < 1) throw UsageError("-n must be ≥ 1, got " + std::to_string(n));
    o.max_tokens = n;
  }
}

// On a terminal: the run about to start and the time left.
std::function<void(const ab::Progress&)> progress_line(size_t prompts, size_t runs) {
  if (!stderr_is_tty()) return {};
  const auto t0 = std::chrono::steady_clock::now();
  return [=](const ab::Progress& p) {
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double eta = p.done ? el / static_cast<double>(p.done) * static_cast<double>(p.total - p.done) : 0;
    std::fprintf(stderr, "\r[%zu/%zu] %-16.16s prompt %zu/%zu run %zu/%zu  ETA %.0fs   ", p.done + 1, p.total,
                 p.variant->name.c_str(), p.run->prompt + 1, prompts, p.run->run + 1, runs, eta);
  };
}

// The report: --html to its file, then --json or the table on stdout, then each failed run on stderr.
void write_report(const po::variables_map& vm, const ab::Result& res) {
  const nlohmann::json J = ab::report_json(res);
  if (vm.count("html")) {
    const std::string h = ab::report_html(res, J);
    std::ofstream f(vm["html"].as<std::string>(), std::ios::binary);
    if (!f) throw UsageError("cannot write --html " + vm["html"].as<std::string>());
    f << h;
  }
  if (vm.count("json"))
    std::cout << J.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  else
    std::cout << ab::report_text(res, J);
  for (const auto& row : res.rows)
    if (!row.ok)
      std::cerr << "loom: " << res.variants[row.variant].name << ", prompt " << row.prompt + 1 << ": "
                << row.error << "\n";
}

} // namespace

int cmd_ab(const std::vector<std::string>& args) {
  po::options_description desc("loom ab options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("config,c", po::value<std::vector<std::string>>()->composing(), "a variant's pipeline TOML (give two or more)")
    ("prompts", po::value<std::string>(), "prompts: one a line, or JSONL {prompt | messages, expected?, id?}")
    ("chat", "render raw prompts as one user message with each variant's chat template")
    ("system", po::value<std::string>(), "a system turn for every conversation that has none (with --chat or messages)")
    ("runs", po::value<int>()->default_value(1), "runs per prompt and variant (seeds S + i·R + r)")
    ("seed", po::value<std::string>()->default_value("0"), "base seed S")
    ("n-predict,n", po::value<int>(), "new tokens per run (overrides each [stop] max_tokens)")
    ("bootstrap", po::value<int>()->default_value(1000), "bootstrap resamples")
    ("ci", po::value<std::string>()->default_value("percentile"), "percentile | bca")
    ("answer-regex", po::value<std::string>()->default_value("last_number"),
     "answer extraction for exact match: a regex with one capture group, or last_number")
    ("set", po::value<std::vector<std::string>>()->composing(), "override a key in every variant: section.key=value")
    ("sweep", po::value<std::string>(), "KEY=V1,V2,…: a variant per value (of each -c); accuracy against compute")
    ("plugin-path", po::value<std::vector<std::string>>()->composing(), "a plugin directory (repeatable)")
    ("html", po::value<std::string>(), "write a self-contained HTML report")
    ("json", "print one JSON object with every row and aggregate");
  // clang-format on
  po::variables_map vm;
  if (!parse_args(
          args, desc, vm,
          "usage: loom ab -c A.toml -c B.toml [-c C.toml …] --prompts FILE [--runs R] [--seed S] [--json]\n"
          "               [--html OUT] [--bootstrap N] [--ci percentile|bca] [--set …] [--chat [--system "
          "T]]\n"
          "       loom ab -c A.toml --sweep decoder.expansions=1,2,4,8 --prompts TASKS.jsonl [...]\n"
          "Runs every variant on the same prompts with the same seeds and compares each with the first:\n"
          "speed (TTFT, TPOT, tok/s) and quality (mean log-prob, distinct-n, repetition, exact match),\n"
          "with paired bootstrap confidence intervals and permutation tests. --sweep makes a variant per\n"
          "value of one key and reports accuracy (with its CI) against tokens evaluated and wall time,\n"
          "and where more compute stops paying (TASKS.jsonl: {\"prompt\", \"answer\"} a line).\n"
          "A JSONL line may hold OpenAI-style \"messages\" (and \"tools\") instead of \"prompt\": each "
          "variant\n"
          "renders them with its model's chat template, as `loom run --messages` does; --chat does the same\n"
          "for raw prompts (one user message each), --system TEXT adds a system turn."))
    return k_exit_ok;
  ab::Options o = experiment_options(vm);
  auto prompts = load_prompts(vm["prompts"].as<std::string>());
  if (o.system && !o.chat &&
      std::none_of(prompts.begin(), prompts.end(), [](const ab::Prompt& p) { return p.chat.has_value(); }))
    throw UsageError("--system goes with --chat (or a prompts file with \"messages\" lines)");
  if (!o.sweep.values.empty() && std::none_of(prompts.begin(), prompts.end(),
                                              [](const ab::Prompt& p) { return p.expected.has_value(); }))
    throw UsageError("--sweep plots accuracy against compute: give a task set with answers (JSONL "
                     "{\"prompt\": …, \"answer\": …} a line)");
  if (vm.count("html")) { // refuse an unwritable report path before any run
    std::ofstream probe(vm["html"].as<std::string>(), std::ios::binary | std::ios::app);
    if (!probe) throw UsageError("cannot write --html " + vm["html"].as<std::string>());
  }
  // From here Ctrl-C stops after the current generation and the report covers what was measured.
  g_ab_interrupted = false;
  auto old_handler = std::signal(SIGINT, on_sigint);
  add_variant_flags(vm, o);
  const size_t P = prompts.size(), R = static_cast<size_t>(o.runs);
  ab::Experiment experiment(std::move(o), std::move(prompts));
  std::vector<ab::Row> rows = experiment.run(progress_line(P, R), &g_ab_interrupted);
  std::signal(SIGINT, old_handler);
  if (stderr_is_tty()) std::fprintf(stderr, "\r%*s\r", 90, "");
  const bool interrupted = g_ab_interrupted.load();
  write_report(vm, experiment.result(std::move(rows), interrupted));
  return interrupted ? 130 : k_exit_ok;
}

} // namespace loom::cli
