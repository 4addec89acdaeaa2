// loom/eval/ab_experiment.hpp — `loom ab` as a library: an A/B experiment of pipelines on the same prompts
// and seeds, in four phases.
//   runs:      the variants (one per config, times each sweep value) and the runs: every variant runs
//              every prompt R times, run r of prompt i with seed S + i·R + r, so comparisons are paired;
//   run:       Experiment loads a pipeline per variant and generates each listed run, scoring exact
//              match against the prompt's expected answer (the rows);
//   aggregate: per-prompt means, per-variant summaries, each variant against the first with the paired
//              statistics of loom/eval/ab_stats.hpp, and a sweep's accuracy against compute;
//   report:    the JSON document (every row, so every aggregate can be recomputed), and the HTML and
//              text views of it.
// The library prints nothing: progress goes through a callback; the caller writes the reports.
#pragma once

#include "loom/chat/chat.hpp"
#include "loom/eval/ab_stats.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "loom/pipeline/pipeline_config.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace loom::ab {

// ---- runs ------------------------------------------------------------------------------------------

// A prompt, or a task with its expected answer. A conversation (`chat`) is rendered with each variant's own
// chat template, as `loom run --messages` renders it; raw text (`prompt` alone) is tokenized as it is.
struct Prompt {
  std::string id;
  std::string prompt; // raw text; a conversation's: its last user turn's text (what the reports show)
  std::optional<std::string> expected;
  std::string task; // JSONL: the whole line, the [verifier]'s task (e.g. program_tests' "tests")
  std::optional<chat::RenderInput> chat;
};

// A prompts file's text: plain (one prompt a line; blank lines skipped) or JSONL (`prompt` or `messages`
// with optional `tools`, optional `expected` or `answer`, `id`, `tests`). Bad input is a loom::Error
// (invalid_argument, no component) naming `path` and the line.
std::vector<Prompt> parse_prompts(const std::string& text, const std::string& path);

// `--chat` (as lm-eval-harness's --apply_chat_template): every raw prompt becomes one user message; with
// `system`, every conversation that has no system turn gets one first.
void apply_chat(std::vector<Prompt>& prompts, bool raw_too, const std::optional<std::string>& system);

// A variant per value of one key (each value a TOML value, as an override takes it). No values: no sweep.
struct Sweep {
  std::string key;
  std::vector<std::string> values;
};

struct Options {
  std::vector<std::string> configs;      // pipeline TOML files: a variant each (per sweep value)
  std::vector<ConfigOverride> overrides; // applied to every variant, before the sweep's value
  std::optional<int> max_tokens;         // replaces each [stop] max_tokens (≥ 1)
  std::vector<std::string> plugin_paths; // added to each variant's [plugins] paths
  Sweep sweep;
  int runs = 1;      // per prompt and variant
  uint64_t seed = 0; // S
  int bootstrap = 1000;
  CiMethod ci = CiMethod::percentile;
  std::string answer_regex = "last_number"; // see extract_answer
  bool chat = false;                        // --chat: raw prompts rendered as one user message
  std::optional<std::string> system;        // --system: a system turn for conversations without one
};

struct Variant {
  std::string name;                         // the config's stem (+ " key=value"), "#2" … when taken
  std::string config;                       // its file
  size_t config_index = 0, sweep_index = 0; // its config and sweep value in Options
  bool greedy = false; // its chain selects deterministically (known once its pipeline is loaded)
  // Known once its pipeline is loaded: the first variant whose model has the same vocabulary (token
  // metrics and log-probs compare only within one), and the chat template that rendered the
  // conversations ("" when there were none).
  size_t vocabulary = 0;
  std::string chat_template;
};

// The variants: per config, per sweep value.
std::vector<Variant> expand_variants(const Options& o);

struct RunSpec {
  size_t variant = 0, prompt = 0, run = 0;
  uint64_t seed = 0;
};

// Per prompt, per run, every variant (interleaved, so drift on the machine hits all alike), the
// variants' order rotated per (prompt, run); run r of prompt i has seed `seed` + i·runs + r.
std::vector<RunSpec> list_runs(size_t variants, size_t prompts, size_t runs, uint64_t seed);

// ---- run -------------------------------------------------------------------------------------------

// One run's outcome: a row of the report.
struct Row : RunSpec {
  bool ok = false;
  std::string error;
  GenerationResult result;
  std::map<std::string, double> metrics; // run_metrics of the result (ok rows)
  std::string answer;                    // extracted, when the prompt has an expected answer
  std::optional<bool> correct;
};

// The metrics of one output (names as in metric_names; decoder metrics as "decoder.<name>"). A metric
// undefined for this output (TPOT of one token, distinct-2 of one token …) is left out, not scored.
std::map<std::string, double> run_metrics(const GenerationResult& r, const std::optional<bool>& correct);

struct Progress {
  size_t done = 0, total = 0; // runs finished, runs listed
  const RunSpec* run = nullptr;
  const Variant* variant = nullptr;
};

// ---- aggregate -------------------------------------------------------------------------------------

struct MetricSummary {
  std::optional<double> mean; // over the prompts that have the metric
  double sd = 0;
  size_t n = 0;
};

struct VariantSummary {
  std::map<std::string, MetricSummary> metrics;
  std::map<std::string, int> stop_reasons; // "failed" for failed runs
  size_t failed_runs = 0;
};

// A metric of variant b against the first, over the paired prompts.
struct MetricDiff {
  double diff = 0;
  Interval ci;
  double p = 1;
  size_t n = 0;
  std::string verdict, note; // better / worse / higher / lower / inconclusive; "underpowered: …"
  uint64_t bootstrap_seed = 0;
};

struct GreedyIdentity {
  int64_t runs = 0, identical = 0;
  std::vector<std::string> differing_prompts; // ids
};

struct Pair {
  size_t b = 0;              // the variant compared with the first
  size_t prompts_paired = 0; // prompts both completed in all their runs
  std::map<std::string, MetricDiff> metrics;
  int64_t a_only_correct = 0, b_only_correct = 0; // McNemar's discordant pairs
  double mcnemar_p = 1;
  std::optional<double> agreement, answer_agreement;
  std::optional<GreedyIdentity> greedy_identical; // both variants greedy, one vocabulary
  bool same_vocabulary = true; // else the token metrics, log-prob wins and greedy identity are not compared
  int wins = 0, ties = 0, losses = 0; // by mean log-prob
};

struct SweepGain {
  double diff = 0;
  Interval ci;
  double p = 1;
  bool pays = false;
};

struct SweepPoint {
  size_t variant = 0, runs = 0;
  double tokens_evaluated = 0, wall_s = 0;
  std::optional<double> tokens_per_run, accuracy;
  Interval ci; // of accuracy, over n prompts
  size_t n = 0;
  std::optional<SweepGain> gain; // over the previous value, paired by prompt
};

struct SweepCurve {
  size_t config = 0;
  std::vector<SweepPoint> points;
  std::optional<std::string> stops_paying_after;
};

struct Aggregates {
  std::vector<std::string> metric_names;
  std::map<std::string, std::vector<std::vector<double>>> per_prompt; // metric → [variant][prompt], NaN: none
  std::vector<VariantSummary> variants;
  std::vector<Pair> pairs;        // each variant against the first
  std::vector<SweepCurve> curves; // per config, with a sweep
};

Aggregates aggregate(const Options& o, const std::vector<Variant>& variants,
                     const std::vector<Prompt>& prompts, const std::vector<Row>& rows);

// Everything a report shows.
struct Result {
  Options options;
  std::vector<Variant> variants;
  std::vector<Prompt> prompts;
  std::vector<Row> rows;
  bool interrupted = false;
  Aggregates aggregates;
};

// ---- the experiment --------------------------------------------------------------------------------

class Experiment {
public:
  // Loads a pipeline per variant (pipelines that name the same model file share it) and renders the
  // conversations with each variant's chat template (a template error names the variant and prompt).
  Experiment(Options options, std::vector<Prompt> prompts);
  ~Experiment();

  const std::vector<Variant>& variants() const noexcept { return variants_; }

  // Every listed run, in order; once `stop` is set, no further run starts (the rows so far).
  // `progress` is called before each run.
  std::vector<Row> run(const std::function<void(const Progress&)>& progress = {},
                       const std::atomic<bool>* stop = nullptr);
  // The rows aggregated, with everything a report needs.
  Result result(std::vector<Row> rows, bool interrupted) const;

private:
  Options options_;
  std::vector<Prompt> prompts_;
  std::vector<Variant> variants_;
  std::vector<std::unique_ptr<Pipeline>> pipes_;
  std::vector<std::vector<std::vector<TokenId>>> rendered_; // [variant][prompt]: a conversation's tokens
};

// ---- report ----------------------------------------------------------------------------------------

// The JSON document: settings, variants, prompts, every row, per-prompt means, aggregates, pairs, sweep.
nlohmann::json report_json(const Result& r);
// Its views: a self-contained HTML page and the terminal table. `doc` is report_json(r).
std::string report_html(const Result& r, const nlohmann::json& doc);
std::string report_text(const Result& r, const nlohmann::json& doc);

} // namespace loom::ab
