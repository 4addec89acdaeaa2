// An A/B experiment's variants and runs (loom/eval/ab_experiment.hpp): the variants and their pipelines, the
// paired runs in their rotating order, and each run's output scored into a row.
#include "loom/eval/ab_experiment.hpp"

#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/model/model.hpp"
#include "loom/sample/stop.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <filesystem>
#include <variant>

namespace loom::ab {

namespace {

// Whether a pipeline's sampler chain selects deterministically: a greedy stage, or temperature 0 (which
// selects the arg-max itself), before any stage that draws. Two such variants of one model must give the
// same tokens when they only decode differently (speculative decoding, a batch): the pairs check it.
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

// A variant's pipeline: its file, the overrides and the sweep's value, -n and the plugin paths.
PipelineConfig variant_config(const Options& o, const Variant& v) {
  std::vector<ConfigOverride> ov = o.overrides;
  if (!o.sweep.values.empty()) ov.push_back({o.sweep.key, o.sweep.values[v.sweep_index]});
  PipelineConfig cfg = load_pipeline(v.config, ov);
  if (o.max_tokens) {
    const int n = *o.max_tokens;
    if (n < 1) fail(Errc::invalid_argument, "ab", "max_tokens must be ≥ 1, got " + std::to_string(n));
    cfg.stop.max_tokens = n;
  }
  for (const auto& d : o.plugin_paths)
    cfg.plugins.paths.push_back(d);
  return cfg;
}

bool same_vocabulary(const Tokenizer& a, const Tokenizer& b) {
  if (&a == &b) return true;
  if (a.vocab_size() != b.vocab_size()) return false;
  for (TokenId i = 0; i < a.vocab_size(); ++i)
    if (a.piece(i) != b.piece(i)) return false;
  return true;
}

// Which template rendered a variant's conversations, as the reports name it.
std::string template_label(const chat::Template& t, const GgufFile& file) {
  const auto family = chat::builtin_for_vocabulary(file);
  if (t.name() == "tokenizer.chat_template")
    return family ? "tokenizer.chat_template (" + std::string(*family) + " turns)" : t.name();
  return family ? "built-in " + std::string(*family) + " (the file has no tokenizer.chat_template)"
                : t.name();
}

// Every conversation among the prompts as the variant's model reads it: its chat template (the file's,
// else the built-in one its vocabulary's turn tokens name), as `loom run --messages` renders it. Raw
// prompts get no tokens here (the request tokenizes them).
std::vector<std::vector<TokenId>> render_conversations(const Pipeline& pipe,
                                                       const std::vector<Prompt>& prompts, Variant& v) {
  std::vector<std::vector<TokenId>> out(prompts.size());
  if (std::none_of(prompts.begin(), prompts.end(), [](const Prompt& p) { return p.chat.has_value(); }))
    return out;
  const chat::Template t = chat::load_template("", &pipe.model().file());
  v.chat_template = template_label(t, pipe.model().file());
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!prompts[i].chat) continue;
    try {
      out[i] =
          chat::chat_prompt(t, *prompts[i].chat, pipe.tokenizer(), pipe.config().run.parse_special).tokens;
    } catch (const Error& e) {
      fail(Errc::invalid_argument, "ab",
           v.config + " (" + v.chat_template + "), prompt " + prompts[i].id + ": " + e.what());
    }
  }
  return out;
}

// Exact match: the answer extracted from the output against the expected one (with last_number, the
// expected text's own last number when it has one, so "3 apples" expects "3").
void score_answer(Row& row, const std::string& expected, const std::string& answer_regex) {
  row.answer = extract_answer(row.result.text, answer_regex);
  std::string want = expected;
  if (answer_regex == "last_number") {
    const std::string w = extract_answer(want, "last_number");
    if (!w.empty()) want = w;
  }
  row.correct = !row.answer.empty() && row.answer == want;
}

} // namespace

std::map<std::string, double> run_metrics(const GenerationResult& r, const std::optional<bool>& correct) {
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
  if (n >= 1) m["distinct_1"] = distinct_n(r.tokens, 1);
  if (n >= 2) m["distinct_2"] = distinct_n(r.tokens, 2);
  if (n >= 4) m["repetition_4"] = repetition_rate(r.tokens, 4);
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

std::vector<Variant> expand_variants(const Options& o) {
  std::vector<Variant> out;
  const std::string& key = o.sweep.key;
  for (size_t c = 0; c < o.configs.size(); ++c)
    for (size_t s = 0; s < std::max<size_t>(1, o.sweep.values.size()); ++s) {
      std::string stem = std::filesystem::path(o.configs[c]).stem().string();
      if (!o.sweep.values.empty()) stem += " " + key.substr(key.rfind('.') + 1) + "=" + o.sweep.values[s];
      std::string name = stem;
      const auto taken = [&](const std::string& n) {
        return std::any_of(out.begin(), out.end(), [&](const Variant& v) { return v.name == n; });
      };
      for (int k = 2; taken(name); ++k)
        name = stem + "#" + std::to_string(k);
      out.push_back({name, o.configs[c], c, s, false, 0, {}});
    }
  return out;
}

std::vector<RunSpec> list_runs(size_t variants, size_t prompts, size_t runs, uint64_t seed) {
  std::vector<RunSpec> out;
  out.reserve(variants * prompts * runs);
  for (size_t i = 0; i < prompts; ++i)
    for (size_t r = 0; r < runs; ++r)
      for (size_t k = 0; k < variants; ++k)
        // The variants' order rotates per (prompt, run): whichever runs first pays for what the
        // others then find warm (a prompt length's graph in a shared model, caches), in turn.
        out.push_back({(k + i * runs + r) % variants, i, r, seed + i * runs + r});
  return out;
}

Experiment::Experiment(Options options, std::vector<Prompt> prompts)
    : options_(std::move(options)), prompts_(std::move(prompts)), variants_(expand_variants(options_)) {
  if (options_.chat || options_.system) apply_chat(prompts_, options_.chat, options_.system);
  for (size_t k = 0; k < variants_.size(); ++k) {
    Variant& v = variants_[k];
    const PipelineConfig cfg = variant_config(options_, v);
    v.greedy = greedy_chain(cfg);
    pipes_.push_back(Pipeline::create(cfg));
    v.vocabulary = k;
    for (size_t u = 0; u < k && v.vocabulary == k; ++u)
      if (same_vocabulary(pipes_[u]->tokenizer(), pipes_[k]->tokenizer()))
        v.vocabulary = variants_[u].vocabulary;
    rendered_.push_back(render_conversations(*pipes_[k], prompts_, v));
  }
}

Experiment::~Experiment() = default;

std::vector<Row> Experiment::run(const std::function<void(const Progress&)>& progress,
                                 const std::atomic<bool>* stop) {
  const std::vector<RunSpec> specs =
      list_runs(variants_.size(), prompts_.size(), static_cast<size_t>(options_.runs), options_.seed);
  std::vector<Row> rows;
  for (const RunSpec& at : specs) {
    if (stop && stop->load()) break;
    if (progress) progress({rows.size(), specs.size(), &at, &variants_[at.variant]});
    const Prompt& prompt = prompts_[at.prompt];
    Row row;
    static_cast<RunSpec&>(row) = at;
    GenerationRequest req;
    req.prompt = prompt.prompt;
    if (prompt.chat) req.prompt_tokens = rendered_[at.variant][at.prompt];
    req.seed = row.seed;
    req.task = prompt.task;
    try {
      row.result = pipes_[at.variant]->generate(req);
      row.ok = row.result.message.empty();
      row.error = row.result.message;
    } catch (const std::exception& e) {
      row.ok = false;
      row.error = e.what();
    }
    if (row.ok) {
      if (prompt.expected) score_answer(row, *prompt.expected, options_.answer_regex);
      row.metrics = run_metrics(row.result, row.correct);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

Result Experiment::result(std::vector<Row> rows, bool interrupted) const {
  Result r{options_, variants_, prompts_, std::move(rows), interrupted, {}};
  r.aggregates = aggregate(r.options, r.variants, r.prompts, r.rows);
  return r;
}

} // namespace loom::ab
