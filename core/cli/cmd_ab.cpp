// `loom ab`: A/B comparison of pipelines on the same prompts and seeds. Every variant runs every
// prompt R times, run r of prompt i with seed S + i·R + r, so comparisons are paired; per variant the
// speed and quality metrics, per pair (each variant against the first) the differences with paired
// bootstrap CIs, sign-flip permutation p-values, McNemar's exact test on exact match, win/tie/loss by
// mean log-prob, output agreement and a verdict. A terminal table, --json with every row (so every
// aggregate can be recomputed: tests/ab/check_ab_json.py does), --html OUT (one self-contained file).
#include "cli.hpp"
#include "loom/ab_stats.hpp"
#include "loom/error.hpp"
#include "loom/pipeline.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

namespace loom::cli {

namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) {
  g_interrupted.store(true);
  std::signal(SIGINT, SIG_DFL); // a second Ctrl-C ends the process at once (signal() is async-signal-safe)
}

// Whether a pipeline's sampler chain selects deterministically: a greedy stage, or temperature 0 (which
// selects the arg-max itself), before any stage that draws. Two such variants of one model must give the
// same tokens when they only decode differently (speculative decoding, a batch): `loom ab` checks it.
bool greedy_chain(const PipelineConfig& cfg) {
  for (const SamplerSpec& sp : cfg.samplers) {
    if (sp.name == "greedy") return true;
    if (sp.name == "dist") return false;
    if (sp.name == "temperature")
      for (const auto& [k, v] : sp.params)
        if (k == "value") {
          const double t = std::holds_alternative<double>(v)    ? std::get<double>(v)
                           : std::holds_alternative<int64_t>(v) ? static_cast<double>(std::get<int64_t>(v))
                                                                : 1.0;
          if (t == 0.0) return true;
        }
  }
  return false;
}

struct PromptItem {
  std::string id, prompt;
  std::optional<std::string> expected;
  std::string task; // JSONL: the whole line, the [verifier]'s task (e.g. program_tests' "tests")
};

// Plain text (one prompt a line; blank lines skipped) or JSONL (`prompt`, optional `expected`, `id`).
std::vector<PromptItem> load_prompts(const std::string& path) {
  const std::string text = read_input_file(path, "--prompts");
  std::istringstream in(text);
  std::string line;
  std::vector<PromptItem> out;
  bool jsonl = false, decided = false;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lineno == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3); // a UTF-8 byte-order mark
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (!decided) {
      jsonl = line[line.find_first_not_of(" \t")] == '{';
      decided = true;
    }
    const std::string where = path + ":" + std::to_string(lineno);
    if (!jsonl) {
      out.push_back({std::to_string(out.size() + 1), line, std::nullopt, {}});
      continue;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      throw UsageError(where +
                       ": not a JSON object (JSONL: one {\"prompt\": …} a line, as the first line is)");
    }
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      throw UsageError(where +
                       ": expected an object with a string \"prompt\" (and optional \"expected\", \"id\")");
    PromptItem p;
    p.prompt = j["prompt"].get<std::string>();
    p.task = j.dump();
    p.id = std::to_string(out.size() + 1);
    if (j.contains("id")) p.id = j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump();
    if (j.contains("answer") && j.contains("expected"))
      throw UsageError(where + ": give \"expected\" or \"answer\" (the same thing), not both");
    if (j.contains("answer")) j["expected"] = j["answer"]; // a task set's answer
    if (j.contains("expected")) {
      if (j["expected"].is_string())
        p.expected = j["expected"].get<std::string>();
      else if (j["expected"].is_number_integer())
        p.expected = j["expected"].dump();
      else if (j["expected"].is_number()) { // 3.0 → "3", as a text's last number would read
        const double x = j["expected"].get<double>();
        p.expected = x == std::floor(x) && std::fabs(x) < 1e15 ? std::to_string(static_cast<int64_t>(x))
                                                               : j["expected"].dump();
      } else
        throw UsageError(where + ": \"expected\" must be a string or a number");
    }
    for (const auto& [k, v] : j.items())
      if (k != "prompt" && k != "expected" && k != "answer" && k != "id" && k != "tests")
        throw UsageError(where + ": unknown key \"" + k +
                         "\" (expected prompt, expected or answer, id, tests)");
    out.push_back(std::move(p));
  }
  if (out.empty()) throw UsageError(path + ": no prompts (expected one prompt a line, or JSONL)");
  return out;
}

// The metrics compared. `better`: +1 higher is better, -1 lower is better, 0 neither.
struct MetricDef {
  const char* name;
  int better;
};
const MetricDef k_metrics[] = {
    {"ttft_ms", -1},      {"tpot_ms", -1},          {"tok_s", +1},      {"tokens", 0},
    {"mean_logprob", +1}, {"distinct_1", +1},       {"distinct_2", +1}, {"repetition_4", -1},
    {"exact_match", +1},  {"tokens_evaluated", -1}, {"total_ms", -1},
};

struct Row {
  size_t variant = 0, prompt = 0, run = 0;
  uint64_t seed = 0;
  bool ok = false;
  std::string error;
  GenerationResult result;
  std::map<std::string, double> metrics;
  std::string answer;
  std::optional<bool> correct;
};

std::map<std::string, double> row_metrics(const GenerationResult& r, const std::optional<bool>& correct) {
  std::map<std::string, double> m;
  // A metric that is undefined for this output (TPOT of one token, log-prob or distinct-n of an output
  // too short) is left out — missing, not a perfect score.
  const size_t n = r.tokens.size();
  if (r.metrics.n_generated > 0) m["ttft_ms"] = r.metrics.ttft_ms;
  if (r.metrics.n_generated > 1) m["tpot_ms"] = r.metrics.tpot_ms;
  if (r.metrics.total_ms > 0) m["tok_s"] = 1000.0 * r.metrics.n_generated / r.metrics.total_ms;
  m["tokens"] = static_cast<double>(n);
  if (!r.logprobs.empty()) {
    double lp = 0;
    for (float x : r.logprobs)
      lp += static_cast<double>(x);
    m["mean_logprob"] = lp / static_cast<double>(r.logprobs.size());
  }
  if (n >= 1) m["distinct_1"] = ab::distinct_n(r.tokens, 1);
  if (n >= 2) m["distinct_2"] = ab::distinct_n(r.tokens, 2);
  if (n >= 4) m["repetition_4"] = ab::repetition_rate(r.tokens, 4);
  if (correct) m["exact_match"] = *correct ? 1.0 : 0.0;
  // The compute a run spent: token rows evaluated (target, draft model and a verifier's model such as
  // model_judge) and its wall time.
  m["tokens_evaluated"] = static_cast<double>(r.metrics.tokens_evaluated + r.metrics.draft_tokens_evaluated +
                                              r.metrics.verifier_tokens_evaluated);
  m["total_ms"] = r.metrics.total_ms;
  for (const auto& [k, v] : r.metrics.decoder)
    m["decoder." + k] = v;
  return m;
}

std::string html_escape(std::string_view s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
    case '&':
      o += "&amp;";
      break;
    case '<':
      o += "&lt;";
      break;
    case '>':
      o += "&gt;";
      break;
    case '"':
      o += "&quot;";
      break;
    default:
      o += ch;
    }
  }
  return o;
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> w;
  std::string cur;
  for (char ch : s) {
    cur += ch;
    if (ch == ' ' || ch == '\n') {
      w.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) w.push_back(cur);
  return w;
}

// `b` as HTML with the words not in the longest common subsequence with `a` marked.
std::string marked_diff(const std::string& a, const std::string& b) {
  const auto wa = words(a), wb = words(b);
  const size_t n = wa.size(), m = wb.size();
  if (n * m > 4'000'000) return html_escape(b); // too long to align: shown plain
  std::vector<std::vector<uint32_t>> L(n + 1, std::vector<uint32_t>(m + 1, 0));
  for (size_t i = n; i-- > 0;)
    for (size_t j = m; j-- > 0;)
      L[i][j] = wa[i] == wb[j] ? L[i + 1][j + 1] + 1 : std::max(L[i + 1][j], L[i][j + 1]);
  std::string out;
  size_t i = 0, j = 0;
  while (j < m) {
    if (i < n && wa[i] == wb[j]) {
      out += html_escape(wb[j]);
      ++i, ++j;
    } else if (i < n && L[i + 1][j] >= L[i][j + 1]) {
      ++i;
    } else {
      out += "<mark>" + html_escape(wb[j]) + "</mark>";
      ++j;
    }
  }
  return out;
}

std::string fmt(double v, int prec = 3) {
  if (!std::isfinite(v)) return "—";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

// A strip plot of per-prompt values per variant (inline SVG).
std::string svg_strip(const std::string& title, const std::vector<std::string>& names,
                      const std::vector<std::vector<double>>& values) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& v : values)
    for (double x : v)
      if (std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi == lo) hi = lo + 1;
  const int W = 560, row = 28, left = 140, H = 40 + row * static_cast<int>(names.size());
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' role='img'><title>"
    << html_escape(title) << "</title><text x='4' y='16' font-size='13'>" << html_escape(title) << "</text>";
  const auto X = [&](double x) { return left + (x - lo) / (hi - lo) * (W - left - 20); };
  for (size_t v = 0; v < names.size(); ++v) {
    const int y = 40 + row * static_cast<int>(v);
    o << "<text x='4' y='" << y + 4 << "' font-size='12'>" << html_escape(names[v]) << "</text>";
    o << "<line x1='" << left << "' x2='" << W - 20 << "' y1='" << y << "' y2='" << y << "' stroke='#ddd'/>";
    std::vector<double> xs;
    for (double x : values[v])
      if (std::isfinite(x)) {
        xs.push_back(x);
        o << "<circle cx='" << X(x) << "' cy='" << y << "' r='3' fill='#3060c0' fill-opacity='0.5'/>";
      }
    if (!xs.empty()) {
      const double mu = ab::mean(xs);
      o << "<line x1='" << X(mu) << "' x2='" << X(mu) << "' y1='" << y - 9 << "' y2='" << y + 9
        << "' stroke='#c03030' stroke-width='2'/>";
    }
  }
  o << "<text x='" << left << "' y='" << H - 4 << "' font-size='11'>" << fmt(lo) << "</text><text x='"
    << W - 80 << "' y='" << H - 4 << "' font-size='11'>" << fmt(hi) << "</text></svg>";
  return o.str();
}

// Accuracy against a compute measure, one polyline per curve, a point per sweep value with its 95%
// interval as an error bar (inline SVG; a log2 x axis when the measure spans more than 4×).
struct CurvePoint {
  double x, y, lo, hi;
  std::string label;
};
std::string svg_curve(const std::string& title, const std::string& xlabel,
                      const std::vector<std::pair<std::string, std::vector<CurvePoint>>>& curves) {
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo;
  for (const auto& [n, pts] : curves)
    for (const auto& p : pts)
      if (p.x > 0) xlo = std::min(xlo, p.x), xhi = std::max(xhi, p.x);
  if (!std::isfinite(xlo)) xlo = 1, xhi = 2;
  const bool logx = xhi / xlo > 4;
  const auto tx = [&](double x) { return logx ? std::log2(std::max(x, 1e-12)) : x; };
  double a = tx(xlo), b = tx(xhi);
  if (b == a) a -= 0.5, b += 0.5;
  const int W = 620, H = 340, left = 60, right = 20, top = 30, bottom = 50;
  const auto X = [&](double x) { return left + (tx(x) - a) / (b - a) * (W - left - right); };
  const auto Y = [&](double y) { return top + (1.0 - y) * (H - top - bottom); };
  static const char* colors[] = {"#3060c0", "#c03030", "#2a8a2a", "#a060c0", "#c08020"};
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' class='sweep' width='" << W << "' height='" << H
    << "' role='img'><title>" << html_escape(title) << "</title><text x='4' y='16' font-size='13'>"
    << html_escape(title) << "</text>";
  for (int k = 0; k <= 4; ++k) { // accuracy grid
    const double y = k / 4.0;
    o << "<line x1='" << left << "' x2='" << W - right << "' y1='" << Y(y) << "' y2='" << Y(y)
      << "' stroke='#eee'/><text x='" << left - 34 << "' y='" << Y(y) + 4 << "' font-size='11'>" << fmt(y, 2)
      << "</text>";
  }
  o << "<text x='" << left << "' y='" << H - 8 << "' font-size='11'>" << html_escape(xlabel)
    << (logx ? " (log scale)" : "") << ": " << fmt(xlo, 0) << " … " << fmt(xhi, 0) << "</text>";
  size_t c = 0;
  for (const auto& [name, pts] : curves) {
    const char* col = colors[c++ % 5];
    std::string poly;
    for (const auto& p : pts)
      if (std::isfinite(p.y)) poly += fmt(X(p.x), 1) + "," + fmt(Y(p.y), 1) + " ";
    o << "<polyline fill='none' stroke='" << col << "' stroke-width='2' points='" << poly << "'/>";
    for (const auto& p : pts) {
      if (!std::isfinite(p.y)) continue;
      o << "<line x1='" << X(p.x) << "' x2='" << X(p.x) << "' y1='" << Y(p.lo) << "' y2='" << Y(p.hi)
        << "' stroke='" << col << "'/><circle cx='" << X(p.x) << "' cy='" << Y(p.y) << "' r='4' fill='" << col
        << "'/><text x='" << X(p.x) + 6 << "' y='" << Y(p.y) - 6 << "' font-size='11'>"
        << html_escape(p.label) << "</text>";
    }
    o << "<text x='" << W - 200 << "' y='" << top + 14 * static_cast<int>(c) << "' font-size='11' fill='"
      << col << "'>" << html_escape(name) << "</text>";
  }
  o << "</svg>";
  return o.str();
}

} // namespace

int cmd_ab(const std::vector<std::string>& args) {
  po::options_description desc("loom ab options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("config,c", po::value<std::vector<std::string>>()->composing(), "a variant's pipeline TOML (give two or more)")
    ("prompts", po::value<std::string>(), "prompts: one a line, or JSONL {prompt, expected?, id?}")
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
          "               [--html OUT] [--bootstrap N] [--ci percentile|bca] [--set …]\n"
          "       loom ab -c A.toml --sweep decoder.expansions=1,2,4,8 --prompts TASKS.jsonl [...]\n"
          "Runs every variant on the same prompts with the same seeds and compares each with the first:\n"
          "speed (TTFT, TPOT, tok/s) and quality (mean log-prob, distinct-n, repetition, exact match),\n"
          "with paired bootstrap confidence intervals and permutation tests. --sweep makes a variant per\n"
          "value of one key and reports accuracy (with its CI) against tokens evaluated and wall time,\n"
          "and where more compute stops paying (TASKS.jsonl: {\"prompt\", \"answer\"} a line)."))
    return k_exit_ok;
  const auto configs =
      vm.count("config") ? vm["config"].as<std::vector<std::string>>() : std::vector<std::string>{};
  // --sweep KEY=V1,V2,…: the values, each a TOML value as --set takes it.
  std::string sweep_key;
  std::vector<std::string> sweep_values;
  if (vm.count("sweep")) {
    const std::string sw = vm["sweep"].as<std::string>();
    const size_t eq = sw.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("--sweep: expected KEY=V1,V2,… (e.g. decoder.expansions=1,2,4,8), got '" + sw + "'");
    sweep_key = sw.substr(0, eq);
    std::string cur;
    for (size_t i = eq + 1; i <= sw.size(); ++i) {
      if (i == sw.size() || sw[i] == ',') {
        const size_t b = cur.find_first_not_of(' '), e = cur.find_last_not_of(' ');
        if (b == std::string::npos) throw UsageError("--sweep " + sw + ": an empty value");
        sweep_values.push_back(cur.substr(b, e - b + 1));
        cur.clear();
      } else {
        cur += sw[i];
      }
    }
    if (sweep_values.size() < 2)
      throw UsageError("--sweep " + sw + ": give at least two values (KEY=V1,V2,…)");
    for (size_t i = 0; i < sweep_values.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (sweep_values[i] == sweep_values[j])
          throw UsageError("--sweep " + sw + ": the value " + sweep_values[i] + " is given twice");
  }
  if (configs.empty() || (configs.size() < 2 && sweep_values.empty()))
    throw UsageError(
        "give at least two pipelines to compare (-c A.toml -c B.toml), or one with --sweep, got " +
        std::to_string(configs.size()));
  if (!vm.count("prompts")) throw UsageError("give the prompts with --prompts FILE");
  const int runs = vm["runs"].as<int>(), boots = vm["bootstrap"].as<int>();
  if (runs < 1 || runs > 1000) throw UsageError("--runs must be in 1..1000, got " + std::to_string(runs));
  if (boots < 100 || boots > 1'000'000)
    throw UsageError("--bootstrap must be in 100..1000000, got " + std::to_string(boots));
  const std::string ci_name = vm["ci"].as<std::string>();
  if (ci_name != "percentile" && ci_name != "bca")
    throw UsageError("--ci must be percentile or bca, got '" + ci_name + "'");
  const ab::CiMethod ci = ci_name == "bca" ? ab::CiMethod::bca : ab::CiMethod::percentile;
  const uint64_t S = parse_seed(vm["seed"].as<std::string>(), "--seed");
  const std::string answer_regex = vm["answer-regex"].as<std::string>();
  (void)ab::extract_answer("", answer_regex); // a regex that does not compile fails here, before any run
  const auto prompts = load_prompts(vm["prompts"].as<std::string>());
  if (!sweep_values.empty() && std::none_of(prompts.begin(), prompts.end(),
                                            [](const PromptItem& p) { return p.expected.has_value(); }))
    throw UsageError("--sweep plots accuracy against compute: give a task set with answers (JSONL "
                     "{\"prompt\": …, \"answer\": …} a line)");

  if (vm.count("html")) { // refuse an unwritable report path before any run
    std::ofstream probe(vm["html"].as<std::string>(), std::ios::binary | std::ios::app);
    if (!probe) throw UsageError("cannot write --html " + vm["html"].as<std::string>());
  }
  // From here Ctrl-C stops after the current generation and the report covers what was measured.
  g_interrupted = false;
  auto old_handler = std::signal(SIGINT, on_sigint);

  // Variants: one pipeline each (pipelines that name the same model file share it).
  std::vector<std::string> names;
  std::vector<std::unique_ptr<Pipeline>> pipes;
  std::vector<bool> greedy; // each variant's chain selects deterministically
  std::vector<ConfigOverride> overrides;
  if (vm.count("set"))
    for (const auto& s : vm["set"].as<std::vector<std::string>>())
      overrides.push_back(parse_override(s));
  std::vector<size_t> variant_config, variant_value; // each variant's -c and --sweep value (index)
  std::vector<std::string> variant_path;
  for (size_t ci_ = 0; ci_ < configs.size(); ++ci_)
    for (size_t vi = 0; vi < std::max<size_t>(1, sweep_values.size()); ++vi) {
      variant_config.push_back(ci_);
      variant_value.push_back(vi);
      variant_path.push_back(configs[ci_]);
    }
  for (size_t vv = 0; vv < variant_path.size(); ++vv) {
    const std::string& path = variant_path[vv];
    std::vector<ConfigOverride> ov = overrides;
    if (!sweep_values.empty()) ov.push_back({sweep_key, sweep_values[variant_value[vv]]});
    PipelineConfig cfg = load_pipeline(path, ov);
    if (vm.count("n-predict")) {
      const int n = vm["n-predict"].as<int>();
      if (n < 1) throw UsageError("-n must be ≥ 1, got " + std::to_string(n));
      cfg.stop.max_tokens = n;
    }
    if (vm.count("plugin-path"))
      for (const auto& d : vm["plugin-path"].as<std::vector<std::string>>())
        cfg.plugins.paths.push_back(d);
    std::string stem = std::filesystem::path(path).stem().string();
    if (!sweep_values.empty())
      stem += " " + sweep_key.substr(sweep_key.rfind('.') + 1) + "=" + sweep_values[variant_value[vv]];
    std::string name = stem;
    for (int k = 2; std::find(names.begin(), names.end(), name) != names.end(); ++k)
      name = stem + "#" + std::to_string(k);
    names.push_back(name);
    greedy.push_back(greedy_chain(cfg));
    pipes.push_back(Pipeline::create(cfg));
  }
  const Tokenizer& tok0 = pipes[0]->tokenizer();
  for (size_t v = 1; v < pipes.size(); ++v) {
    const Tokenizer& t = pipes[v]->tokenizer();
    bool same = t.vocab_size() == tok0.vocab_size();
    for (TokenId i = 0; same && i < t.vocab_size(); ++i)
      same = t.piece(i) == tok0.piece(i);
    if (!same)
      fail(Errc::invalid_argument, "ab",
           variant_path[v] + " uses a model whose vocabulary differs from " + variant_path[0] +
               "'s: token metrics (distinct-n, repetition) and log-probs would not compare; give variants of "
               "one "
               "model family");
  }

  // Runs: per prompt, per run, every variant (interleaved, so drift on the machine hits all alike).
  const bool tty = stderr_is_tty();
  const size_t V = pipes.size(), P = prompts.size(), R = static_cast<size_t>(runs);
  std::vector<Row> rows;
  const auto t0 = std::chrono::steady_clock::now();
  size_t done = 0;
  const size_t total = V * P * R;
  for (size_t i = 0; i < P && !g_interrupted; ++i)
    for (size_t r = 0; r < R && !g_interrupted; ++r)
      for (size_t k = 0; k < V && !g_interrupted; ++k) {
        // The variants' order rotates per (prompt, run): whichever runs first pays for what the
        // others then find warm (a prompt length's graph in a shared model, caches), in turn.
        const size_t v = (k + i * R + r) % V;
        if (tty) {
          const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          const double eta = done ? el / static_cast<double>(done) * static_cast<double>(total - done) : 0;
          std::fprintf(stderr, "\r[%zu/%zu] %-16.16s prompt %zu/%zu run %zu/%zu  ETA %.0fs   ", done + 1,
                       total, names[v].c_str(), i + 1, P, r + 1, R, eta);
        }
        Row row;
        row.variant = v, row.prompt = i, row.run = r;
        row.seed = S + i * R + r;
        GenerationRequest req;
        req.prompt = prompts[i].prompt;
        req.seed = row.seed;
        req.task = prompts[i].task;
        try {
          row.result = pipes[v]->generate(req);
          row.ok = row.result.message.empty();
          row.error = row.result.message;
        } catch (const std::exception& e) {
          row.ok = false;
          row.error = e.what();
        }
        if (row.ok) {
          if (prompts[i].expected) {
            row.answer = ab::extract_answer(row.result.text, answer_regex);
            std::string want = *prompts[i].expected;
            if (answer_regex == "last_number") {
              const std::string w = ab::extract_answer(want, "last_number");
              if (!w.empty()) want = w;
            }
            row.correct = !row.answer.empty() && row.answer == want;
          }
          row.metrics = row_metrics(row.result, row.correct);
        }
        rows.push_back(std::move(row));
        ++done;
      }
  std::signal(SIGINT, old_handler);
  if (tty) std::fprintf(stderr, "\r%*s\r", 90, "");
  const bool interrupted = g_interrupted.load();

  // Per prompt: the mean over its successful runs, per variant and metric (NaN: none).
  std::vector<std::string> metric_names;
  for (const auto& m : k_metrics)
    metric_names.push_back(m.name);
  for (const auto& row : rows)
    for (const auto& [k, v] : row.metrics)
      if (k.rfind("decoder.", 0) == 0 &&
          std::find(metric_names.begin(), metric_names.end(), k) == metric_names.end())
        metric_names.push_back(k);
  const auto better_of = [](const std::string& m) {
    for (const auto& d : k_metrics)
      if (m == d.name) return d.better;
    return 0;
  };
  std::map<std::string, std::vector<std::vector<double>>> pp; // metric → [variant][prompt]
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

  nlohmann::json J;
  J["settings"] = {{"seed", S},
                   {"runs", runs},
                   {"bootstrap", boots},
                   {"ci", ci_name},
                   {"level", 0.95},
                   {"rng", "splitmix64"},
                   {"answer_regex", answer_regex},
                   {"seed_rule", "run r of prompt i: seed + i*runs + r"},
                   {"bootstrap_seed_rule", "seed + 1000003*(pair+1) + metric index (in metric_names)"}};
  J["interrupted"] = interrupted;
  J["metric_names"] = metric_names;
  J["variants"] = nlohmann::json::array();
  for (size_t v = 0; v < V; ++v) {
    nlohmann::json jv = {{"name", names[v]}, {"config", variant_path[v]}};
    if (!sweep_values.empty()) jv["sweep_value"] = sweep_values[variant_value[v]];
    J["variants"].push_back(jv);
  }
  J["prompts"] = nlohmann::json::array();
  for (const auto& p : prompts)
    J["prompts"].push_back({{"id", p.id},
                            {"prompt", p.prompt},
                            {"expected", p.expected ? nlohmann::json(*p.expected) : nlohmann::json()}});
  J["rows"] = nlohmann::json::array();
  for (const auto& row : rows) {
    nlohmann::json jr = {{"variant", row.variant},
                         {"prompt", row.prompt},
                         {"run", row.run},
                         {"seed", row.seed},
                         {"ok", row.ok}};
    if (!row.ok) jr["error"] = row.error;
    jr["text"] = row.result.text;
    jr["tokens"] = row.result.tokens;
    jr["stop_reason"] = std::string(stop_reason_name(row.result.stop_reason));
    jr["metrics"] = row.metrics;
    if (row.correct) {
      jr["answer"] = row.answer;
      jr["correct"] = *row.correct;
    }
    J["rows"].push_back(jr);
  }
  const auto nullable = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(); };
  J["per_prompt"] = nlohmann::json::object();
  for (const auto& m : metric_names) {
    nlohmann::json a = nlohmann::json::array();
    for (size_t v = 0; v < V; ++v) {
      nlohmann::json col = nlohmann::json::array();
      for (double x : pp[m][v])
        col.push_back(nullable(x));
      a.push_back(col);
    }
    J["per_prompt"][m] = a;
  }
  J["aggregates"] = nlohmann::json::array();
  for (size_t v = 0; v < V; ++v) {
    nlohmann::json agg = {{"variant", names[v]}};
    for (const auto& m : metric_names) {
      std::vector<double> xs;
      for (double x : pp[m][v])
        if (std::isfinite(x)) xs.push_back(x);
      agg["metrics"][m] = {{"mean", xs.empty() ? nlohmann::json() : nlohmann::json(ab::mean(xs))},
                           {"sd", ab::stddev(xs)},
                           {"n", xs.size()}};
    }
    std::map<std::string, int> stops;
    size_t failed = 0;
    for (const auto& row : rows)
      if (row.variant == v) {
        if (!row.ok) ++failed;
        ++stops[row.ok ? std::string(stop_reason_name(row.result.stop_reason)) : "failed"];
      }
    agg["stop_reasons"] = stops;
    agg["failed_runs"] = failed;
    J["aggregates"].push_back(agg);
  }
  // A pair compares a prompt only where both variants completed all R runs of it (an interrupted run,
  // or a failed one, would otherwise pair means over different seeds).
  std::vector<std::vector<size_t>> ok_runs(V, std::vector<size_t>(P, 0));
  for (const auto& row : rows)
    if (row.ok) ++ok_runs[row.variant][row.prompt];
  J["pairs"] = nlohmann::json::array();
  for (size_t b = 1; b < V; ++b) {
    nlohmann::json pr = {{"a", names[0]}, {"b", names[b]}};
    std::vector<bool> paired(P);
    size_t n_paired = 0;
    for (size_t i = 0; i < P; ++i) {
      paired[i] = ok_runs[0][i] == R && ok_runs[b][i] == R;
      n_paired += paired[i] ? 1 : 0;
    }
    pr["prompts_paired"] = n_paired;
    for (size_t mi = 0; mi < metric_names.size(); ++mi) {
      const std::string& m = metric_names[mi];
      std::vector<double> d;
      for (size_t i = 0; i < P; ++i)
        if (paired[i] && std::isfinite(pp[m][0][i]) && std::isfinite(pp[m][b][i]))
          d.push_back(pp[m][b][i] - pp[m][0][i]);
      if (d.empty()) continue;
      const uint64_t bseed = S + 1000003ull * b + mi;
      const double diff = ab::mean(d);
      const ab::Interval iv = ab::bootstrap_mean_ci(d, boots, bseed, 0.95, ci);
      const double p = ab::sign_flip_p(d, boots, bseed);
      const int dir = better_of(m);
      std::string verdict = "inconclusive", note;
      // Resolved when the interval excludes 0 and the permutation test agrees (p < 0.05): with a
      // handful of same-sign differences every bootstrap mean has that sign, but p = 2/2^n says the
      // sign could still be chance.
      if (!iv.covers(0) && p < 0.05) {
        const bool up = iv.lo > 0;
        verdict = dir == 0 ? (up ? "higher" : "lower") : ((up ? 1 : -1) == dir ? "better" : "worse");
      } else if (diff != 0) {
        const int64_t need =
            std::max<int64_t>(ab::prompts_to_resolve(ab::stddev(d), diff), 6); // 2/2^6 < 0.05
        if (need > static_cast<int64_t>(d.size()))
          note = "underpowered: about " + std::to_string(need) + " prompts would resolve ±" +
                 fmt(std::fabs(diff), 4);
      }
      pr["metrics"][m] = {{"diff", diff},           {"ci", {iv.lo, iv.hi}}, {"p", p},
                          {"n", d.size()},          {"verdict", verdict},   {"note", note},
                          {"bootstrap_seed", bseed}};
    }
    // McNemar on exact match, per paired prompt (correct: at least half of its runs were, so repeated
    // runs of a deterministic variant do not count as independent evidence); agreement and answer
    // agreement over (prompt, run); win/tie/loss by mean log-prob over paired prompts.
    int64_t mb = 0, mc = 0, same = 0, both = 0, same_answer = 0, both_answered = 0, same_tokens = 0;
    std::vector<std::string> differ; // prompts (ids) whose tokens differ in some run
    for (size_t i = 0; i < P; ++i) {
      const double x = pp["exact_match"][0][i], y = pp["exact_match"][b][i];
      if (!paired[i] || !std::isfinite(x) || !std::isfinite(y)) continue;
      const bool ca = x >= 0.5, cb = y >= 0.5;
      if (ca && !cb) ++mb;
      if (!ca && cb) ++mc;
    }
    std::map<std::pair<size_t, size_t>, const Row*> a_rows;
    for (const auto& row : rows)
      if (row.variant == 0) a_rows[{row.prompt, row.run}] = &row;
    for (const auto& row : rows) {
      if (row.variant != b) continue;
      auto it = a_rows.find({row.prompt, row.run});
      if (it == a_rows.end() || !it->second->ok || !row.ok) continue;
      ++both;
      if (it->second->result.text == row.result.text) ++same;
      // Identical, or identical as far as the shorter went when that one only hit its token budget
      // (variants with different [stop] max_tokens; -n sets one for all).
      const auto& ta = it->second->result.tokens;
      const auto& tb = row.result.tokens;
      const auto& shorter = ta.size() <= tb.size() ? it->second->result : row.result;
      const bool prefix = std::equal(shorter.tokens.begin(), shorter.tokens.end(),
                                     (ta.size() <= tb.size() ? tb : ta).begin()) &&
                          shorter.stop_reason == StopReason::max_tokens;
      if (ta == tb || prefix)
        ++same_tokens;
      else if (std::find(differ.begin(), differ.end(), prompts[row.prompt].id) == differ.end())
        differ.push_back(prompts[row.prompt].id);
      if (row.correct && it->second->correct) {
        ++both_answered;
        if (row.answer == it->second->answer) ++same_answer;
      }
    }
    pr["mcnemar"] = {{"a_only_correct", mb}, {"b_only_correct", mc}, {"p", ab::mcnemar_exact_p(mb, mc)}};
    pr["agreement"] =
        both ? nlohmann::json(static_cast<double>(same) / static_cast<double>(both)) : nlohmann::json();
    // Both greedy (e.g. plain against speculative decoding of one model): the outputs must be the same
    // tokens; the runs that are, and the prompts that are not.
    if (greedy[0] && greedy[b])
      pr["greedy_identical"] = {{"runs", both}, {"identical", same_tokens}, {"differing_prompts", differ}};
    // With `expected`: runs whose extracted answers are equal (none extracted counts as equal).
    pr["answer_agreement"] =
        both_answered ? nlohmann::json(static_cast<double>(same_answer) / static_cast<double>(both_answered))
                      : nlohmann::json();
    int w = 0, t = 0, l = 0;
    for (size_t i = 0; i < P; ++i) {
      const double x = pp["mean_logprob"][0][i], y = pp["mean_logprob"][b][i];
      if (!paired[i] || !std::isfinite(x) || !std::isfinite(y)) continue;
      (y > x ? w : y < x ? l : t)++;
    }
    pr["logprob_win_tie_loss"] = {w, t, l};
    J["pairs"].push_back(pr);
  }

  // The sweep: per -c, accuracy (mean over prompts of the per-prompt exact match, bootstrap CI over
  // prompts) against the compute spent, and the paired gain of each value over the one before.
  if (!sweep_values.empty()) {
    nlohmann::json sw = {{"key", sweep_key}, {"values", sweep_values}, {"curves", nlohmann::json::array()}};
    for (size_t c = 0; c < configs.size(); ++c) {
      nlohmann::json curve = {{"config", configs[c]}, {"points", nlohmann::json::array()}};
      std::optional<std::string> stops;
      size_t prev = V;
      for (size_t v = 0; v < V; ++v) {
        if (variant_config[v] != c) continue;
        std::vector<double> acc;
        for (double x : pp["exact_match"][v])
          if (std::isfinite(x)) acc.push_back(x);
        double tokens = 0, wall_ms = 0;
        size_t n_rows = 0;
        for (const auto& row : rows)
          if (row.variant == v && row.ok) {
            tokens += row.metrics.at("tokens_evaluated");
            wall_ms += row.metrics.at("total_ms");
            ++n_rows;
          }
        nlohmann::json pt = {{"variant", names[v]},
                             {"value", sweep_values[variant_value[v]]},
                             {"runs", n_rows},
                             {"tokens_evaluated", tokens},
                             {"tokens_per_run", n_rows ? nlohmann::json(tokens / n_rows) : nlohmann::json()},
                             {"wall_s", wall_ms / 1000.0}};
        if (!acc.empty()) {
          const ab::Interval iv = ab::bootstrap_mean_ci(acc, boots, S + 7919ull * (v + 1), 0.95, ci);
          pt["accuracy"] = ab::mean(acc);
          pt["ci"] = {iv.lo, iv.hi};
          pt["n"] = acc.size();
        }
        if (prev < V) { // the gain over the previous value, paired by prompt
          std::vector<double> d;
          for (size_t i = 0; i < P; ++i)
            if (std::isfinite(pp["exact_match"][v][i]) && std::isfinite(pp["exact_match"][prev][i]))
              d.push_back(pp["exact_match"][v][i] - pp["exact_match"][prev][i]);
          if (!d.empty()) {
            const uint64_t gseed = S + 7919ull * (v + 1) + 1;
            const ab::Interval iv = ab::bootstrap_mean_ci(d, boots, gseed, 0.95, ci);
            const double p = ab::sign_flip_p(d, boots, gseed);
            const bool pays = !iv.covers(0) && p < 0.05 && iv.lo > 0;
            pt["gain"] = {{"diff", ab::mean(d)}, {"ci", {iv.lo, iv.hi}}, {"p", p}, {"pays", pays}};
            if (!pays && !stops) stops = sweep_values[variant_value[prev]];
          }
        }
        curve["points"].push_back(pt);
        prev = v;
      }
      curve["stops_paying_after"] = stops ? nlohmann::json(*stops) : nlohmann::json();
      sw["curves"].push_back(curve);
    }
    J["sweep"] = sw;
  }

  // Output. Metrics no variant has (exact_match without `expected`) are left out of the tables.
  const auto has_data = [&](const std::string& m) {
    for (size_t v = 0; v < V; ++v)
      if (!J["aggregates"][v]["metrics"][m]["mean"].is_null()) return true;
    return false;
  };
  if (vm.count("html")) {
    std::ostringstream h;
    h << "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>loom ab</title><style>"
         "body{font-family:sans-serif;margin:24px;max-width:1200px}table{border-collapse:collapse;margin:"
         "12px 0}"
         "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}"
         "td.l{text-align:left}.better{background:#e3f6e3}.worse{background:#fbe3e3}mark{background:#ffe28a}"
         ".out{white-space:pre-wrap;text-align:left;vertical-align:top;font-family:monospace;font-size:12px}"
         ".right{color:#1a7a1a;font-weight:bold}.wrong{color:#b02020;font-weight:bold}"
         "</style></head><body><h1>loom ab</h1>";
    h << "<p>" << P << " prompts × " << runs << " runs × " << V << " variants; seeds " << S << " + i·" << runs
      << " + r; " << boots << " bootstrap resamples (" << ci_name << "), 95% intervals"
      << (interrupted ? "; <b>interrupted</b>: partial results" : "") << ".</p>";
    h << "<table id='summary'><tr><th>metric</th>";
    for (const auto& n : names)
      h << "<th>" << html_escape(n) << "</th>";
    for (size_t b = 1; b < V; ++b)
      h << "<th>" << html_escape(names[b]) << " − " << html_escape(names[0]) << " [95% CI]</th>";
    h << "</tr>";
    for (const auto& m : metric_names) {
      if (!has_data(m)) continue;
      h << "<tr><td class='l'>" << html_escape(m) << "</td>";
      for (size_t v = 0; v < V; ++v) {
        const auto& mm = J["aggregates"][v]["metrics"][m]["mean"];
        h << "<td>" << (mm.is_null() ? "—" : fmt(mm.get<double>())) << "</td>";
      }
      for (size_t b = 1; b < V; ++b) {
        const nlohmann::json& pr_b = std::as_const(J)["pairs"][b - 1];
        if (!pr_b.contains("metrics") || !pr_b["metrics"].contains(m)) {
          h << "<td>—</td>";
          continue;
        }
        const auto& pm = pr_b["metrics"];
        const auto& x = pm[m];
        const std::string verdict = x["verdict"].get<std::string>();
        h << "<td class='" << verdict << "'>" << fmt(x["diff"].get<double>()) << " ["
          << fmt(x["ci"][0].get<double>()) << ", " << fmt(x["ci"][1].get<double>()) << "] "
          << html_escape(verdict) << "</td>";
      }
      h << "</tr>";
    }
    h << "</table>";
    std::vector<std::vector<double>> tpot(V), len(V);
    for (size_t v = 0; v < V; ++v) {
      tpot[v] = pp["tpot_ms"][v];
      len[v] = pp["tokens"][v];
    }
    h << "<h2>Distributions (per prompt; red: mean)</h2>" << svg_strip("TPOT (ms)", names, tpot)
      << svg_strip("output length (tokens)", names, len);
    // CI bars of the differences, one panel per pair.
    for (size_t b = 1; b < V; ++b) {
      const nlohmann::json& prb = std::as_const(J)["pairs"][b - 1];
      const nlohmann::json pm = prb.contains("metrics") ? prb["metrics"] : nlohmann::json::object();
      std::ostringstream o;
      const int W = 620, row = 24, left = 170, H = 40 + row * static_cast<int>(pm.size());
      o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
        << "' role='img'><title>"
        << "differences " << html_escape(names[b]) << " − " << html_escape(names[0]) << "</title>";
      int k = 0;
      for (const auto& [m, x] : pm.items()) {
        const double lo = x["ci"][0].get<double>(), hi = x["ci"][1].get<double>(),
                     d = x["diff"].get<double>();
        const double span = std::max({std::fabs(lo), std::fabs(hi), std::fabs(d), 1e-12});
        const auto X = [&](double v) { return left + (v / span * 0.5 + 0.5) * (W - left - 20); };
        const int y = 30 + row * k++;
        const std::string color = x["verdict"] == "better"  ? "#2a8a2a"
                                  : x["verdict"] == "worse" ? "#b02a2a"
                                                            : "#666";
        o << "<text x='4' y='" << y + 4 << "' font-size='12'>" << html_escape(m) << "</text>"
          << "<line x1='" << X(0) << "' x2='" << X(0) << "' y1='" << y - 10 << "' y2='" << y + 10
          << "' stroke='#aaa'/><line x1='" << X(lo) << "' x2='" << X(hi) << "' y1='" << y << "' y2='" << y
          << "' stroke='" << color << "' stroke-width='3'/><circle cx='" << X(d) << "' cy='" << y
          << "' r='4' fill='" << color << "'/>";
      }
      o << "</svg>";
      h << "<h2>" << html_escape(names[b]) << " − " << html_escape(names[0])
        << " (95% CI; each metric scaled to its own range, the grey line is 0)</h2>" << o.str();
      const auto& pr = J["pairs"][b - 1];
      h << "<p>agreement (same text): "
        << (pr["agreement"].is_null() ? std::string("—") : fmt(pr["agreement"].get<double>()))
        << "; win/tie/loss by mean log-prob: " << pr["logprob_win_tie_loss"][0] << "/"
        << pr["logprob_win_tie_loss"][1] << "/" << pr["logprob_win_tie_loss"][2]
        << "; McNemar exact p on exact match: " << fmt(pr["mcnemar"]["p"].get<double>()) << "</p>";
      if (pr.contains("greedy_identical")) {
        const auto& gi = pr["greedy_identical"];
        h << "<p class='" << (gi["identical"] == gi["runs"] ? "better" : "worse")
          << "'>greedy outputs identical (tokens): " << gi["identical"].get<int64_t>() << " of "
          << gi["runs"].get<int64_t>() << " runs";
        for (const auto& d : gi["differing_prompts"])
          h << (&d == &gi["differing_prompts"].front() ? "; differing: " : ", ")
            << html_escape(d.get<std::string>());
        h << "</p>";
      }
    }
    if (J.contains("sweep")) {
      const nlohmann::json& sw = std::as_const(J)["sweep"];
      std::vector<std::pair<std::string, std::vector<CurvePoint>>> by_tokens, by_wall;
      h << "<h2>Accuracy against compute: " << html_escape(sw["key"].get<std::string>())
        << "</h2><table id='sweep'><tr><th>config</th><th>value</th><th>accuracy [95% CI]</th>"
           "<th>tokens evaluated</th><th>per run</th><th>wall s</th><th>gain over the previous [95% "
           "CI]</th></tr>";
      for (const auto& cv : sw["curves"]) {
        const std::string cname = std::filesystem::path(cv["config"].get<std::string>()).stem().string();
        std::vector<CurvePoint> pt, pw;
        for (const auto& p : cv["points"]) {
          const bool has = p.contains("accuracy");
          const double y = has ? p["accuracy"].get<double>() : std::nan("");
          const double lo = has ? p["ci"][0].get<double>() : y, hi = has ? p["ci"][1].get<double>() : y;
          const std::string label = p["value"].get<std::string>();
          pt.push_back({p["tokens_evaluated"].get<double>(), y, lo, hi, label});
          pw.push_back({p["wall_s"].get<double>(), y, lo, hi, label});
          h << "<tr><td class='l'>" << html_escape(cname) << "</td><td>" << html_escape(label) << "</td><td>"
            << (has ? fmt(y) + " [" + fmt(lo) + ", " + fmt(hi) + "]" : std::string("—")) << "</td><td>"
            << fmt(p["tokens_evaluated"].get<double>(), 0) << "</td><td>"
            << (p["tokens_per_run"].is_null() ? std::string("—") : fmt(p["tokens_per_run"].get<double>(), 1))
            << "</td><td>" << fmt(p["wall_s"].get<double>(), 2) << "</td>";
          if (p.contains("gain"))
            h << "<td class='" << (p["gain"]["pays"].get<bool>() ? "better" : "") << "'>"
              << fmt(p["gain"]["diff"].get<double>()) << " [" << fmt(p["gain"]["ci"][0].get<double>()) << ", "
              << fmt(p["gain"]["ci"][1].get<double>()) << "]</td>";
          else
            h << "<td>—</td>";
          h << "</tr>";
        }
        by_tokens.emplace_back(cname, pt);
        by_wall.emplace_back(cname, pw);
      }
      h << "</table>";
      for (const auto& cv : sw["curves"])
        h << "<p>" << html_escape(std::filesystem::path(cv["config"].get<std::string>()).stem().string())
          << ": "
          << (cv["stops_paying_after"].is_null()
                  ? std::string("every step up in compute paid (its accuracy gain resolved above 0)")
                  : "more compute stops paying after " + html_escape(sw["key"].get<std::string>()) + " = " +
                        html_escape(cv["stops_paying_after"].get<std::string>()) +
                        " (the next gain's interval is not above 0)")
          << "</p>";
      h << svg_curve("accuracy against tokens evaluated (95% CI)", "tokens evaluated", by_tokens)
        << svg_curve("accuracy against wall time (95% CI)", "wall seconds", by_wall);
    }
    const bool any_expected = std::any_of(prompts.begin(), prompts.end(),
                                          [](const PromptItem& p) { return p.expected.has_value(); });
    h << "<h2>Outputs (run 1; marked: words not in " << html_escape(names[0]) << "'s output"
      << (any_expected ? "; ✓ right, ✗ wrong: the extracted answer against the expected one" : "")
      << ")</h2><table id='outputs'><tr><th>prompt</th>";
    if (any_expected) h << "<th>expected</th>";
    for (const auto& n : names)
      h << "<th>" << html_escape(n) << "</th>";
    h << "</tr>";
    for (size_t i = 0; i < P; ++i) {
      std::vector<const Row*> rr(V, nullptr);
      for (const auto& row : rows)
        if (row.prompt == i && row.run == 0) rr[row.variant] = &row;
      h << "<tr><td class='out'>" << html_escape(prompts[i].prompt) << "</td>";
      if (any_expected) h << "<td class='out'>" << html_escape(prompts[i].expected.value_or("")) << "</td>";
      for (size_t v = 0; v < V; ++v) {
        if (!rr[v]) {
          h << "<td class='out'>—</td>";
        } else if (!rr[v]->ok) {
          h << "<td class='out'>failed: " << html_escape(rr[v]->error) << "</td>";
        } else {
          const std::string base = rr[0] && rr[0]->ok ? rr[0]->result.text : std::string();
          std::string mark;
          if (rr[v]->correct)
            mark = std::string("<div class='") + (*rr[v]->correct ? "right'>✓ " : "wrong'>✗ ") +
                   html_escape(rr[v]->answer.empty() ? std::string("(no answer)") : rr[v]->answer) + "</div>";
          h << "<td class='out'>" << mark
            << (v == 0 ? html_escape(rr[v]->result.text) : marked_diff(base, rr[v]->result.text)) << "</td>";
        }
      }
      h << "</tr>";
    }
    h << "</table></body></html>\n";
    std::ofstream f(vm["html"].as<std::string>(), std::ios::binary);
    if (!f) throw UsageError("cannot write --html " + vm["html"].as<std::string>());
    f << h.str();
  }
  if (vm.count("json")) {
    std::cout << J.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::printf("%-32s", "metric");
    for (const auto& n : names)
      std::printf(" %14.14s", n.c_str());
    for (size_t b = 1; b < V; ++b)
      std::printf("   %-34.34s", (names[b] + " − " + names[0] + " [95% CI]").c_str());
    std::printf("\n");
    for (const auto& m : metric_names) {
      if (!has_data(m)) continue;
      std::printf("%-32.32s", m.c_str());
      for (size_t v = 0; v < V; ++v) {
        const auto& mm = J["aggregates"][v]["metrics"][m]["mean"];
        std::printf(" %14s", mm.is_null() ? "-" : fmt(mm.get<double>()).c_str());
      }
      for (size_t b = 1; b < V; ++b) {
        const nlohmann::json& pr_b = std::as_const(J)["pairs"][b - 1];
        if (!pr_b.contains("metrics") || !pr_b["metrics"].contains(m)) {
          std::printf("   %-34s", "-");
          continue;
        }
        const auto& pm = pr_b["metrics"];
        const auto& x = pm[m];
        const bool sig = x["verdict"] != "inconclusive"; // the interval excludes 0 and p < 0.05
        const std::string cell = (sig ? "*" : " ") + fmt(x["diff"].get<double>()) + " [" +
                                 fmt(x["ci"][0].get<double>()) + ", " + fmt(x["ci"][1].get<double>()) + "] " +
                                 x["verdict"].get<std::string>();
        std::printf("   %-34s", cell.c_str());
      }
      std::printf("\n");
    }
    for (size_t b = 1; b < V; ++b) {
      const nlohmann::json& pr = std::as_const(J)["pairs"][b - 1];
      std::printf("\n%s vs %s: agreement %.3f, mean log-prob win/tie/loss %d/%d/%d, McNemar p %.4f\n",
                  names[b].c_str(), names[0].c_str(),
                  pr["agreement"].is_null() ? std::nan("") : pr["agreement"].get<double>(),
                  pr["logprob_win_tie_loss"][0].get<int>(), pr["logprob_win_tie_loss"][1].get<int>(),
                  pr["logprob_win_tie_loss"][2].get<int>(), pr["mcnemar"]["p"].get<double>());
      if (pr.contains("greedy_identical")) {
        const auto& gi = pr["greedy_identical"];
        const auto n_same = gi["identical"].get<int64_t>(), n_runs = gi["runs"].get<int64_t>();
        std::string ids;
        for (const auto& d : gi["differing_prompts"])
          ids += (ids.empty() ? "" : ", ") + d.get<std::string>();
        std::printf("  greedy outputs identical (tokens): %lld of %lld runs%s\n",
                    static_cast<long long>(n_same), static_cast<long long>(n_runs),
                    n_same == n_runs ? "" : ("; differing: " + ids).c_str());
      }
      if (pr.contains("metrics"))
        for (const auto& [m, x] : pr["metrics"].items())
          if (!x["note"].get<std::string>().empty())
            std::printf("  %s: %s\n", m.c_str(), x["note"].get<std::string>().c_str());
    }
    if (J.contains("sweep")) {
      const nlohmann::json& sw = std::as_const(J)["sweep"];
      for (const auto& cv : sw["curves"]) {
        std::printf("\nsweep %s (%s): accuracy against compute, 95%% CI over prompts\n",
                    sw["key"].get<std::string>().c_str(), cv["config"].get<std::string>().c_str());
        std::printf("  %-12s %-24s %16s %10s %9s   %s\n", "value", "accuracy [95% CI]", "tokens evaluated",
                    "per run", "wall s", "gain over the previous [95% CI]");
        for (const auto& p : cv["points"]) {
          const std::string acc = p.contains("accuracy") ? fmt(p["accuracy"].get<double>()) + " [" +
                                                               fmt(p["ci"][0].get<double>()) + ", " +
                                                               fmt(p["ci"][1].get<double>()) + "]"
                                                         : std::string("-");
          const std::string gain = p.contains("gain") ? (p["gain"]["pays"].get<bool>() ? "*" : " ") +
                                                            fmt(p["gain"]["diff"].get<double>()) + " [" +
                                                            fmt(p["gain"]["ci"][0].get<double>()) + ", " +
                                                            fmt(p["gain"]["ci"][1].get<double>()) + "]"
                                                      : std::string("");
          std::printf("  %-12s %-24s %16.0f %10s %9.2f   %s\n", p["value"].get<std::string>().c_str(),
                      acc.c_str(), p["tokens_evaluated"].get<double>(),
                      p["tokens_per_run"].is_null() ? "-" : fmt(p["tokens_per_run"].get<double>(), 1).c_str(),
                      p["wall_s"].get<double>(), gain.c_str());
        }
        if (cv["stops_paying_after"].is_null())
          std::printf("  every step up in compute paid (its gain resolved above 0)\n");
        else
          std::printf("  more compute stops paying after %s = %s\n", sw["key"].get<std::string>().c_str(),
                      cv["stops_paying_after"].get<std::string>().c_str());
      }
    }
    std::printf("* resolved: the 95%% interval excludes 0 and the permutation p < 0.05. %zu prompts × %d "
                "runs; seeds %llu + i·%d + r.%s\n",
                P, runs, static_cast<unsigned long long>(S), runs,
                interrupted ? " Interrupted: partial results." : "");
  }
  for (const auto& row : rows)
    if (!row.ok)
      std::cerr << "loom: " << names[row.variant] << ", prompt " << row.prompt + 1 << ": " << row.error
                << "\n";
  return interrupted ? 130 : k_exit_ok;
}

} // namespace loom::cli
