// `loom explain`: the request's sampler chain step by step — for each generated token the top
// candidates with raw logit, softmax probability and probability after every stage of the chain,
// which stage cut which candidate, and the token chosen. The tokens are exactly `loom run`'s with the
// same pipeline and seed: the stages are the chain's own apply(), traced (SamplerChain::apply_traced).
#include "cli.hpp"
#include "loom/error.hpp"
#include "loom/pipeline/pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

namespace loom::cli {

namespace {

// After a stage, the candidates still in play: those in the list with a logit above -inf. Their
// probabilities are the softmax of their (transformed) logits, as a dist at that point would draw
// them; a stage that selected without a distribution (greedy, temperature 0) is a point mass at its
// pick; +inf logits share the mass, as the samplers' softmax does.
struct Stage {
  std::string name;
  std::map<TokenId, double> probs; // of the listed candidates that survive it
  size_t survivors = 0;
  TokenId selected = -1; // a selecting stage's choice
};
struct Step {
  std::vector<TokenId> listed;               // top `top` by raw logit (+ the chosen one)
  std::vector<std::pair<float, double>> raw; // their logit and softmax probability
  std::vector<Stage> stages;
  TokenId chosen = -1;
};

void fill_stage(Stage& st, const Candidates& c, const std::vector<TokenId>& listed) {
  const bool point = c.selected >= 0 && !c.has_probs && static_cast<size_t>(c.selected) < c.data.size();
  double mx = -std::numeric_limits<double>::infinity();
  size_t survivors = 0;
  for (const auto& t : c.data)
    if (!std::isnan(t.logit) && t.logit > -std::numeric_limits<float>::infinity()) {
      ++survivors;
      mx = std::max(mx, static_cast<double>(t.logit));
    }
  std::map<TokenId, double> want;
  for (TokenId id : listed)
    want[id] = -1;
  double z = 0;
  for (const auto& t : c.data) {
    if (std::isnan(t.logit) || t.logit == -std::numeric_limits<float>::infinity()) continue;
    const double e = std::isinf(mx) ? (static_cast<double>(t.logit) == mx ? 1.0 : 0.0)
                                    : std::exp(static_cast<double>(t.logit) - mx);
    z += e;
    if (auto it = want.find(t.id); it != want.end()) it->second = e;
  }
  const TokenId pick = point ? c.data[static_cast<size_t>(c.selected)].id : -1;
  for (const auto& [id, e] : want)
    if (e >= 0) st.probs[id] = point ? (id == pick ? 1.0 : 0.0) : (z > 0 ? e / z : 0.0);
  st.survivors = point ? 1 : survivors;
}

class ExplainDecoder final : public Decoder {
public:
  ExplainDecoder(std::vector<Step>* out, size_t top) : out_(out), top_(top) {}
  std::string_view name() const noexcept override { return "explain"; }
  void plan(Session& h) override {
    if (h.finished(0) == LOOM_STOP_NONE) h.plan(0);
  }
  // The chain's stages, traced: past the session table, to the request itself (host code may).
  void update(Session& h) override {
    DecodeSession& s = DecodeSession::of(h);
    if (s.finished(0) != StopReason::none || !s.logits(0)) return;
    const float* l = s.logits(0);
    const auto V = static_cast<size_t>(s.n_vocab());
    std::vector<TokenId> ids(V);
    for (size_t i = 0; i < V; ++i)
      ids[i] = static_cast<TokenId>(i);
    const size_t n = std::min(V, top_);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                      [&](TokenId a, TokenId b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    ids.resize(n);
    // The stages' snapshots live for this step only (the chosen token is known after the draw);
    // what is kept is O(top) per stage, not O(vocabulary).
    Step st;
    std::deque<std::vector<TokenData>> copies; // a stage's candidates, copied: the next stage changes them
    std::vector<Candidates> snapshots;
    const TokenId t = s.sample_traced(0, [&](size_t, const Sampler* smp, const Candidates& c) {
      Stage stage;
      stage.name = smp ? std::string(smp->name()) : "dist (chain end)";
      if (c.selected >= 0 && static_cast<size_t>(c.selected) < c.data.size())
        stage.selected = c.data[static_cast<size_t>(c.selected)].id;
      st.stages.push_back(std::move(stage));
      Candidates snap = c;
      snap.data = copies.emplace_back(c.data.begin(), c.data.end());
      snapshots.push_back(snap);
    });
    st.chosen = t;
    if (std::find(ids.begin(), ids.end(), t) == ids.end()) ids.push_back(t);
    for (size_t k = 0; k < snapshots.size(); ++k)
      fill_stage(st.stages[k], snapshots[k], ids);
    double mx = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < V; ++i)
      mx = std::max(mx, static_cast<double>(l[i]));
    double z = 0;
    for (size_t i = 0; i < V; ++i)
      z += std::exp(static_cast<double>(l[i]) - mx);
    st.listed = ids;
    for (TokenId id : ids)
      st.raw.emplace_back(l[id], std::exp(static_cast<double>(l[id]) - mx) / z);
    out_->push_back(std::move(st));
    s.append(0, t);
  }
  bool done(const Session& h) const override { return h.finished(0) != LOOM_STOP_NONE; }
  void results(Session& h) override { h.add_result(0, h.score(0)); }

private:
  std::vector<Step>* out_;
  size_t top_;
};

std::string shown(const Tokenizer& tok, TokenId id) {
  std::string piece = tok.piece(id);
  std::string out = "'";
  for (unsigned char ch : piece) {
    if (ch == '\n')
      out += "\\n";
    else if (ch < 0x20)
      out += "?";
    else
      out += static_cast<char>(ch);
  }
  return out + "'";
}

std::string fmt_num(double v, int prec) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

// s padded with spaces to `width` code points (UTF-8), or cut to width − 1 and an ellipsis.
std::string pad(const std::string& s, size_t width) {
  std::vector<size_t> starts; // byte offset of each code point
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) starts.push_back(i);
  if (starts.size() > width) return s.substr(0, starts[width - 1]) + "…";
  return s + std::string(width - starts.size(), ' ');
}

std::string one_line_text(const std::string& s, size_t width) {
  std::string o;
  for (unsigned char ch : s) {
    if (ch == '\n')
      o += "\\n";
    else if (ch < 0x20)
      o += "?";
    else
      o += static_cast<char>(ch);
  }
  return pad(o, width);
}

// The search tree as text: each candidate step under its parent, with its score, mean log-prob and fate;
// identical siblings folded into a count.
class SearchTreePrinter {
public:
  explicit SearchTreePrinter(const nlohmann::json& tree) {
    for (const auto& n : tree["nodes"])
      kids_[n["parent"].get<int64_t>()].push_back(&n);
  }

  void print(int64_t parent, int depth) const {
    auto it = kids_.find(parent);
    if (it == kids_.end()) return;
    for (const nlohmann::json* n : it->second) {
      if ((*n)["state"].get<std::string>() == "duplicate") continue;
      print_node(*n, it->second, depth);
      print((*n)["id"].get<int64_t>(), depth + 1);
    }
  }

private:
  static void print_node(const nlohmann::json& n, const std::vector<const nlohmann::json*>& siblings,
                         int depth) {
    size_t dups = 0;
    for (const nlohmann::json* m : siblings)
      dups += (*m)["state"] == "duplicate" && (*m)["text"] == n["text"] ? 1 : 0;
    std::string fate = n["state"].get<std::string>();
    if (n.contains("stop_reason")) fate += " (" + n["stop_reason"].get<std::string>() + ")";
    const std::string score = n["score"].is_null() ? "-" : fmt_num(n["score"].get<double>(), 3);
    const std::string lp = n["mean_logprob"].is_null() ? "-" : fmt_num(n["mean_logprob"].get<double>(), 3);
    std::printf("#%-5lld %7s %8s  %-22s %s%s%s\n", static_cast<long long>(n["id"].get<int64_t>()),
                score.c_str(), lp.c_str(), fate.c_str(),
                std::string(2 * static_cast<size_t>(depth), ' ').c_str(),
                one_line_text(n["text"].get<std::string>(), 60).c_str(),
                dups ? ("  ×" + std::to_string(dups + 1)).c_str() : "");
    if (n.contains("error")) std::printf("%38s%s\n", "", one_line(n["error"].get<std::string>()).c_str());
  }

  std::map<int64_t, std::vector<const nlohmann::json*>> kids_;
};

void print_search_tree(const nlohmann::json& tree, const std::string& prompt, uint64_t seed) {
  const SearchTreePrinter printer(tree);
  std::cout << "prompt: " << prompt << "   (seed " << seed << ")\n";
  std::cout << "search: " << tree["mode"].get<std::string>() << ", " << tree["rounds"].get<int64_t>()
            << " rounds, " << tree["expansions"].get<int64_t>() << " partial solutions expanded, "
            << tree["nodes"].size() << " candidate steps\n\n";
  std::printf("%-6s %7s %8s  %-22s %s\n", "node", "score", "mean lp", "state", "step");
  printer.print(0, 0);
}

// A search decoder's request (one that reports a `search` tree, such as step_search): its tree, each
// partial solution under its parent with its score, mean log-prob and fate; identical siblings
// folded into a count.
int explain_search(PipelineConfig cfg, const po::variables_map& vm) {
  if (!cfg.run.seed) cfg.run.seed = std::random_device{}();
  auto pipeline = Pipeline::create(cfg);
  announce_backend(*pipeline);
  GenerationRequest req;
  req.prompt = vm["prompt"].as<std::string>();
  const GenerationResult r = pipeline->generate(req);
  if (!r.message.empty()) {
    std::cerr << "loom: " << r.message << "\n";
    return k_exit_error;
  }
  const auto it =
      std::find_if(r.outputs.begin(), r.outputs.end(), [](const auto& kv) { return kv.first == "search"; });
  if (it == r.outputs.end())
    throw UsageError(
        "loom explain traces the built-in sample decoder, or prints the tree of a search decoder "
        "(one that reports `search`, such as step_search); this pipeline's decoder '" +
        cfg.decoder.name + "' reports none: use [decoder] name = \"sample\" or a search decoder");
  const nlohmann::json tree = nlohmann::json::parse(it->second);
  if (vm.count("json")) {
    nlohmann::json out = {{"prompt", req.prompt},
                          {"seed", *cfg.run.seed},
                          {"search", tree},
                          {"text", r.text},
                          {"tokens", r.tokens}};
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return k_exit_ok;
  }
  print_search_tree(tree, req.prompt, *cfg.run.seed);
  std::cout << "\ntext: " << r.text << "\n";
  return k_exit_ok;
}

// A traced step as JSON: the stages (survivors, selection) and each listed candidate's probability after
// every stage (null from the stage that cut it on).
nlohmann::json step_json(const Step& st, size_t si, const Tokenizer& tok) {
  nlohmann::json js = {{"step", si + 1}, {"chosen", st.chosen}, {"chosen_text", tok.piece(st.chosen)}};
  js["stages"] = nlohmann::json::array();
  for (const Stage& sg : st.stages)
    js["stages"].push_back({{"name", sg.name},
                            {"survivors", sg.survivors},
                            {"selected", sg.selected >= 0 ? nlohmann::json(sg.selected) : nlohmann::json()}});
  js["candidates"] = nlohmann::json::array();
  for (size_t li = 0; li < st.listed.size(); ++li) {
    const TokenId id = st.listed[li];
    nlohmann::json c = {
        {"id", id}, {"text", tok.piece(id)}, {"logit", st.raw[li].first}, {"p", st.raw[li].second}};
    c["after"] = nlohmann::json::array();
    nlohmann::json cut_by;
    for (const Stage& sg : st.stages) {
      auto it = sg.probs.find(id);
      if (it == sg.probs.end() || !cut_by.is_null()) { // cut here or earlier: out for good
        if (cut_by.is_null()) cut_by = sg.name;
        c["after"].push_back(nullptr);
      } else {
        c["after"].push_back(it->second);
      }
    }
    c["cut_by"] = cut_by;
    c["chosen"] = id == st.chosen;
    js["candidates"].push_back(c);
  }
  return js;
}

// A step of the text report: the token chosen, then a row per candidate with a column per stage.
void print_step_text(const nlohmann::json& js, const Tokenizer& tok) {
  std::cout << "\nstep " << js["step"].get<size_t>() << ": chose " << shown(tok, js["chosen"].get<TokenId>())
            << " (" << js["chosen"].get<TokenId>() << ")\n";
  std::printf("  %-16s %8s %8s", "candidate", "logit", "p");
  for (const auto& sg : js["stages"])
    std::printf(" %12.12s", sg["name"].get<std::string>().c_str());
  std::printf("\n");
  for (const auto& c : js["candidates"]) {
    const std::string label = pad(shown(tok, c["id"].get<TokenId>()), 16);
    std::printf("%s %s %8.3f %8.4f", c["chosen"].get<bool>() ? "*" : " ", label.c_str(),
                c["logit"].get<double>(), c["p"].get<double>());
    bool cut = false;
    for (const auto& a : c["after"]) {
      if (a.is_null()) {
        std::printf(" %12s", cut ? "" : "cut");
        cut = true;
      } else {
        std::printf(" %12.4f", a.get<double>());
      }
    }
    std::printf("\n");
  }
}

// The sample decoder's request, traced: `steps` tokens, each with its `top` candidates through the chain.
int explain_sampling(PipelineConfig cfg, const po::variables_map& vm, int steps, int top) {
  cfg.stop.max_tokens = steps;
  if (!cfg.run.seed) cfg.run.seed = std::random_device{}();
  auto pipeline = Pipeline::create(cfg);
  announce_backend(*pipeline);
  const Tokenizer& tok = pipeline->tokenizer();

  std::vector<Step> trace;
  GenerationRequest req;
  req.prompt = vm["prompt"].as<std::string>();
  req.decoder = [&trace, top] { return std::make_unique<ExplainDecoder>(&trace, static_cast<size_t>(top)); };
  const GenerationResult r = pipeline->generate(req);
  if (!r.message.empty()) {
    std::cerr << "loom: " << r.message << "\n";
    return k_exit_error;
  }

  nlohmann::json out = {{"prompt", req.prompt}, {"seed", *cfg.run.seed}, {"steps", nlohmann::json::array()}};
  for (size_t si = 0; si < trace.size(); ++si)
    out["steps"].push_back(step_json(trace[si], si, tok));
  out["text"] = r.text;
  out["tokens"] = r.tokens;
  if (vm.count("json")) {
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return k_exit_ok;
  }

  std::cout << "prompt: " << req.prompt << "   (seed " << *cfg.run.seed << ")\n";
  for (const auto& js : out["steps"])
    print_step_text(js, tok);
  std::cout << "\ntext: " << r.text << "\n";
  return k_exit_ok;
}

} // namespace

int cmd_explain(const std::vector<std::string>& args) {
  po::options_description desc("loom explain options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("config,c", po::value<std::string>(), "pipeline TOML file")
    ("model,m", po::value<std::string>(), "model file (GGUF); overrides [model] path")
    ("prompt,p", po::value<std::string>(), "prompt text")
    ("steps", po::value<int>()->default_value(5), "generated tokens to explain")
    ("top", po::value<int>()->default_value(8), "candidates listed per step (by raw logit)")
    ("temp", po::value<double>(), "temperature (0 = greedy)")
    ("top-k", po::value<long>(), "top-k (0 = off)")
    ("top-p", po::value<double>(), "top-p in (0, 1]")
    ("min-p", po::value<double>(), "min-p in [0, 1]")
    ("seed", po::value<std::string>(), "RNG seed (default: the pipeline's, else random; reported)")
    ("ignore-eos", "do not stop at end-of-generation tokens")
    ("ctx-size", po::value<int>(), "context window (tokens)")
    ("set", po::value<std::vector<std::string>>()->composing(), "override a pipeline key: section.key=value")
    ("plugin-path", po::value<std::vector<std::string>>()->composing(), "a plugin directory (repeatable)")
    ("json", "print one JSON object: every step's stages and candidates");
  // clang-format on
  po::variables_map vm;
  if (!parse_args(
          args, desc, vm,
          "usage: loom explain (-c PIPELINE.toml | -m MODEL.gguf) -p TEXT [--steps N] [--top N] [--json]\n"
          "For each generated token: the top candidates with their raw logit, softmax probability and\n"
          "probability after each stage of the request's sampler chain, the stage that cut each one, and\n"
          "the token chosen. The tokens are those `loom run` gives with the same pipeline and seed.\n"
          "With a search decoder (one that reports a `search` tree, such as step_search): the tree, each\n"
          "candidate step under its parent with its verifier score, mean log-prob and fate."))
    return k_exit_ok;
  if (!vm.count("config") && !vm.count("model"))
    throw UsageError("give a pipeline (-c FILE.toml) or a model (-m FILE.gguf)");
  if (!vm.count("prompt")) throw UsageError("give a prompt with -p TEXT");
  const int steps = vm["steps"].as<int>(), top = vm["top"].as<int>();
  if (steps < 1 || steps > 4096) throw UsageError("--steps must be in 1..4096, got " + std::to_string(steps));
  if (top < 1) throw UsageError("--top must be ≥ 1, got " + std::to_string(top));
  PipelineConfig cfg = run_config_from_args(vm);
  if (cfg.decoder.name != "sample") return explain_search(cfg, vm);
  return explain_sampling(cfg, vm, steps, top);
}

} // namespace loom::cli
