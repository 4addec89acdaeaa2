// decoders/speculative: greedy output token-identical to the target alone (target as its own draft,
// its Q8_0 and Q4_0 copies, the n-gram drafter; stories260K and a synth model; reference and cpu
// backends); exact speculative sampling — the output distribution over many seeds equals the sampler
// chain's own, by a chi-square test on a scripted model whose p and q are known (with a top-k /
// temperature chain too); acceptance 100% when draft == target; bad keys and draft files are one-line
// errors; every decoder gives inside a `--parallel 4` batch what it gives alone.
#include "fixtures/scripted_model.hpp"
#include "loom/attention.hpp"
#include "loom/model/model.hpp"
#include "loom/model/reference_backend.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "loom/pipeline/pipeline_config.hpp"
#include "test_util.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <gtest/gtest.h>
#include <map>
#include <nlohmann/json.hpp>

namespace {

using namespace loom;
namespace fs = std::filesystem;

test::CliResult loom_cli(const std::string& args) {
  const bool plugins = args.rfind("run ", 0) == 0;
  return test::run_loom(args + (plugins ? " --plugin-path " LOOM_BUILD_BIN_DIR : ""), false, 300);
}

fs::path tmp_dir() {
  const fs::path d = fs::temp_directory_path() / ("loom-spec-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

nlohmann::json run_json(const std::string& args) {
  const auto r = loom_cli("run " + args + " --json");
  EXPECT_EQ(r.code, 0) << r.err;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

// Greedy speculative output vs the target alone, for each drafter.
void expect_greedy_identity(const fs::path& model,
                            const std::vector<std::pair<std::string, std::string>>& drafters,
                            const std::string& backend, int n) {
  const std::string base = "-m " + model.string() + " -p 'Once upon a time' -n " + std::to_string(n) +
                           " --ignore-eos --temp 0 --set backend.name='\"" + backend + "\"'";
  const auto alone = run_json(base);
  ASSERT_TRUE(alone.contains("tokens"));
  ASSERT_EQ(alone["tokens"].size(), static_cast<size_t>(n));
  for (const auto& [label, set] : drafters) {
    SCOPED_TRACE(label + " on " + backend);
    const auto spec = run_json(base + " --decoder speculative " + set);
    ASSERT_TRUE(spec.contains("tokens"));
    EXPECT_EQ(spec["tokens"], alone["tokens"]);
    EXPECT_EQ(spec["text"], alone["text"]);
    const auto& m = spec["metrics"];
    for (const char* k : {"draft_tokens", "accepted_tokens", "acceptance_rate", "mean_accepted_len",
                          "target_forwards", "mean_draft_nodes", "row_cost", "verify_cost"})
      EXPECT_TRUE(m.contains(k)) << k;
    EXPECT_GT(m["draft_tokens"].get<double>(), 0);
    EXPECT_LE(m["target_forwards"].get<double>(), n + 1.0);
    if (label == "ngram wide tree") { // some rounds took another branch than the first: their tokens'
      EXPECT_GT(m["off_chain_tokens"].get<double>(), 0); // K/V were evaluated again, the output unchanged
    }
    if (label == "self") {
      EXPECT_EQ(m["acceptance_rate"].get<double>(), 1.0) << "a draft equal to the target is always accepted";
      EXPECT_LT(m["target_forwards"].get<double>(), n / 2.0);
      // No re-prefill: each model evaluates the prompt once and each token about once (the last
      // round's unused draft at most).
      const size_t n_prompt = spec["prompt_tokens"].size();
      EXPECT_LE(m["tokens_evaluated"].get<size_t>(), n_prompt + static_cast<size_t>(n) + 4);
      EXPECT_LE(m["draft_tokens_evaluated"].get<size_t>(), n_prompt + static_cast<size_t>(n) + 4);
    }
  }
}

std::string quantize(const fs::path& in, const std::string& type, const std::string& name) {
  const fs::path out = tmp_dir() / name;
  if (!fs::exists(out)) {
    const auto r = loom_cli("quantize " + in.string() + " --type " + type + " -o " + out.string());
    EXPECT_EQ(r.code, 0) << r.err;
  }
  return out.string();
}

TEST(Speculative, GreedyIsTheTargetsOwnOutputOnStories260K) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string q8 = quantize(model, "q8_0", "s260-q8_0.gguf"),
                    q4 = quantize(model, "q4_0", "s260-q4_0.gguf");
  const std::vector<std::pair<std::string, std::string>> drafters = {
      {"self", "--set decoder.draft='\"" + model.string() +
                   "\"' --set decoder.tree=false --set decoder.adaptive=false"},
      {"self tree", "--set decoder.draft='\"" + model.string() + "\"' --set decoder.width=3"},
      {"q8_0", "--set decoder.draft='\"" + q8 + "\"'"},
      {"q4_0", "--set decoder.draft='\"" + q4 + "\"' --set decoder.k=6"},
      {"q4_0 linear", "--set decoder.draft='\"" + q4 + "\"' --set decoder.tree=false"},
      {"q4_0 adaptive", "--set decoder.draft='\"" + q4 + "\"' --set decoder.adaptive=true"},
      {"ngram", "--set decoder.drafter='\"ngram\"' --set decoder.ngram_min=2"},
      {"ngram linear", "--set decoder.drafter='\"ngram\"' --set decoder.tree=false"},
      {"own first 2 layers", "--set decoder.draft_layers=2"},
      {"own first 3 layers, linear", "--set decoder.draft_layers=3 --set decoder.tree=false"},
      {"ngram wide tree",
       "--set decoder.drafter='\"ngram\"' --set decoder.width=8 --set decoder.k=8 "
       "--set decoder.ngram_min=1 --set decoder.max_nodes=64 --set decoder.adaptive=false"},
      {"ngram adaptive tree",
       "--set decoder.drafter='\"ngram\"' --set decoder.width=8 --set decoder.k_max=12"},
  };
  // The reference backend (floats independent of the batch's shape) for one drafter of each kind, the cpu
  // backend for all.
  std::vector<std::pair<std::string, std::string>> some;
  for (const auto& d : drafters)
    if (d.first == "self tree" || d.first == "q4_0 adaptive" || d.first == "ngram linear" ||
        d.first == "own first 2 layers" || d.first == "ngram wide tree")
      some.push_back(d);
  expect_greedy_identity(model, some, "reference", 120);
  expect_greedy_identity(model, drafters, "cpu", 120);
}

// A draft of the target's own first layers takes the K/V of the tokens the target evaluated (the prompt)
// from the target's store instead of evaluating them. Its proposals are still those of the first layers'
// forward: with k = 1 and greedy, the accepted drafts equal a written-out count — the 4-layer model's
// argmax after each committed prefix, compared with the target's next token.
TEST(Speculative, OwnLayersDraftTakesThePromptsKvFromTheTarget) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const int n_new = 40;
  const auto j = run_json("-m " + model.string() +
                          " -p 'Once upon a time there was a little girl named Lily. She loved to play' -n " +
                          std::to_string(n_new) +
                          " --temp 0 --decoder speculative --set decoder.draft_layers=4"
                          " --set decoder.adaptive=false --set decoder.k=1 --set decoder.tree=false"
                          " --set backend.name='\"reference\"'");
  const auto prompt = j["prompt_tokens"].get<std::vector<int32_t>>();
  const auto gen = j["tokens"].get<std::vector<int32_t>>();
  const auto& m = j["metrics"];
  ASSERT_TRUE(m.contains("draft_kv_copied")) << m.dump();
  // The prompt but its last token (whose row the draft needs), and each accepted draft (k = 1: the draft
  // never evaluated it; the target's verification did).
  EXPECT_EQ(m["draft_kv_copied"].get<double>(),
            static_cast<double>(prompt.size() - 1) + m["accepted_tokens"].get<double>());
  EXPECT_LE(m["draft_tokens_evaluated"].get<double>(), m["draft_tokens"].get<double>() + 1);

  // The written-out count: the first 4 layers' greedy proposal after each committed prefix.
  auto target = loom::Model::load(model.string());
  auto draft = target->with_layers(4);
  draft->set_attention(
      loom::make_attention_variant(draft->config(), loom::AttentionChoice{"model", "auto", 0, 0, {}}));
  auto be = loom::make_reference_backend();
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), gen.begin(), gen.end());
  auto kv = loom::make_contiguous_kv_cache(draft->kv_shape(256, 1));
  draft->load_into(*be);
  kv->memory().attach(be->alloc(kv->memory().layout().bytes(), BufferUsage::kv));
  ASSERT_TRUE(kv->allocate(0, static_cast<int32_t>(all.size())));
  std::vector<loom::Pos> pos(all.size());
  std::vector<loom::SeqId> seqs(all.size(), 0);
  std::vector<int32_t> outs(all.size());
  for (size_t i = 0; i < all.size(); ++i)
    pos[i] = static_cast<loom::Pos>(i), outs[i] = static_cast<int32_t>(i);
  const auto V = static_cast<size_t>(draft->config().n_vocab);
  std::vector<float> logits(all.size() * V);
  draft->forward(*be, loom::BatchView{all, pos, seqs, outs}, *kv, logits);
  const auto argmax_after = [&](size_t n) { // the proposal after all[0..n)
    const float* row = logits.data() + (n - 1) * V;
    return static_cast<int32_t>(std::max_element(row, row + V) - row);
  };
  // Round structure with k = 1: the first generated token comes from the prompt's pass; then each round
  // proposes one token after the committed ones; accepted: it and the target's next are committed.
  size_t n = prompt.size() + 1, accepted = 0;
  while (n < all.size()) {
    if (argmax_after(n) == all[n]) {
      ++accepted;
      n += 2;
    } else {
      n += 1;
    }
  }
  EXPECT_NEAR(m["accepted_tokens"].get<double>(), static_cast<double>(accepted), 1.0);
  EXPECT_GT(accepted, 3u) << "the case should accept some drafts";
}

// acceptance = "typical" (Medusa's, not exact): under a greedy chain only the target's own token passes,
// so the output is the target's; sampled, it says it is not exact and a seed still reproduces it.
TEST(Speculative, TypicalAcceptanceKeepsGreedyAndSaysItIsNotExact) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  expect_greedy_identity(
      model,
      {{"typical ngram", "--set decoder.drafter='\"ngram\"' --set decoder.acceptance='\"typical\"'"},
       {"typical ngram linear",
        "--set decoder.drafter='\"ngram\"' --set decoder.tree=false --set decoder.acceptance='\"typical\"'"},
       {"typical self tree", "--set decoder.draft='\"" + model.string() +
                                 "\"' --set decoder.width=3 --set decoder.acceptance='\"typical\"'"}},
      "reference", 60);
  const std::string sampled =
      "-m " + model.string() +
      " -p 'Once upon a time there was a girl. Once upon a time there was a girl. Once "
      "upon a time' -n 60 --temp 0.8 --seed 4 --decoder speculative"
      " --set decoder.drafter='\"ngram\"' --set decoder.acceptance='\"typical\"'";
  const auto a = run_json(sampled), b = run_json(sampled);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(a["metrics"]["exact"].get<double>(), 0.0);
  EXPECT_EQ(run_json("-m " + model.string() + " -p hi -n 8 --decoder speculative")["metrics"]["exact"]
                .get<double>(),
            1.0);
}

TEST(Speculative, GreedyIsTheTargetsOwnOutputOnASynthModel) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(vocab, "stories260K.gguf");
  const fs::path d = tmp_dir();
  std::map<std::string, std::string> files;
  for (const char* t : {"f16", "q8_0", "q4_0"}) { // the same seed: the same weights in three types
    const fs::path out = d / ("synth-" + std::string(t) + ".gguf");
    const auto r = loom_cli("synth --shape tiny-gqa --type " + std::string(t) + " --seed 7 --vocab-from " +
                            vocab.string() + " -o " + out.string());
    ASSERT_EQ(r.code, 0) << r.err;
    files[t] = out.string();
  }
  const std::vector<std::pair<std::string, std::string>> drafters = {
      {"self", "--set decoder.draft='\"" + files["f16"] +
                   "\"' --set decoder.tree=false --set decoder.adaptive=false"},
      {"q8_0", "--set decoder.draft='\"" + files["q8_0"] + "\"'"},
      {"q4_0", "--set decoder.draft='\"" + files["q4_0"] + "\"'"},
      {"ngram", "--set decoder.drafter='\"ngram\"'"},
  };
  expect_greedy_identity(files["f16"], drafters, "cpu", 48);
}

// ---- the distribution -------------------------------------------------------------------------

struct Chain {
  std::string name;
  std::string toml; // [[sampler]] entries
  int top_k = 0;    // 0 = all three tokens
  double temp = 1.0;
};

// p(token | history) of the chain on the scripted model: top-k by logit (ties: lower id), then
// softmax of logit / temp.
std::map<int32_t, double> chain_probs(const std::vector<int32_t>& history, const Chain& c) {
  std::vector<std::pair<float, int32_t>> l;
  for (int32_t t : scripted::k_tokens)
    l.emplace_back(scripted::logit(history, t), t);
  std::sort(l.begin(), l.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  if (c.top_k > 0) l.resize(static_cast<size_t>(c.top_k));
  double z = 0;
  for (const auto& [x, t] : l)
    z += std::exp(static_cast<double>(x) / c.temp);
  std::map<int32_t, double> p;
  for (const auto& [x, t] : l)
    p[t] = std::exp(static_cast<double>(x) / c.temp) / z;
  return p;
}

struct Counts {
  std::map<std::vector<int32_t>, int> seen;
  double acceptance = 0;
};

Counts sample_many(const fs::path& model, const Chain& chain, const std::string& decoder, int n, int len,
                   std::vector<TokenId>* prompt_out) {
  const std::string toml = "[model]\npath = \"" + model.string() +
                           "\"\nn_ctx = 32\n[backend]\nname = \"fixture_scripted\"\n"
                           "[kv_cache]\nmax_tokens = 2048\n[stop]\neos = false\nmax_tokens = " +
                           std::to_string(len) +
                           "\n[plugins]\npaths = [\"" LOOM_FIXTURE_DIR "\", \"" LOOM_BUILD_BIN_DIR "\"]\n" +
                           decoder + chain.toml;
  auto p = Pipeline::create(parse_pipeline(toml, "chi2.toml"));
  std::vector<GenerationRequest> reqs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    reqs[static_cast<size_t>(i)].prompt = "hi";
    reqs[static_cast<size_t>(i)].seed = 1000 + static_cast<uint64_t>(i);
  }
  const auto res = p->generate_all(reqs, 64);
  Counts c;
  double acc = 0;
  for (const auto& r : res) {
    EXPECT_TRUE(r.message.empty()) << r.message;
    EXPECT_EQ(r.tokens.size(), static_cast<size_t>(len));
    ++c.seen[std::vector<int32_t>(r.tokens.begin(), r.tokens.end())];
    for (const auto& [k, v] : r.metrics.decoder)
      if (k == "acceptance_rate") acc += v;
  }
  c.acceptance = acc / n;
  if (prompt_out) *prompt_out = res.front().prompt_tokens;
  return c;
}

// Pearson's chi-square of the observed sequences against the chain's exact distribution; cells with
// an expected count under 5 are pooled.
double chi_square(const Counts& c, const Chain& chain, const std::vector<TokenId>& prompt, int n, int len,
                  int* dof) {
  std::vector<std::pair<std::vector<int32_t>, double>> cells{{{}, 1.0}};
  for (int step = 0; step < len; ++step) {
    std::vector<std::pair<std::vector<int32_t>, double>> next;
    for (const auto& [seq, pr] : cells) {
      std::vector<int32_t> h(prompt.begin(), prompt.end());
      h.insert(h.end(), seq.begin(), seq.end());
      for (const auto& [t, q] : chain_probs(h, chain)) {
        auto s2 = seq;
        s2.push_back(t);
        next.emplace_back(s2, pr * q);
      }
    }
    cells = std::move(next);
  }
  double chi = 0, pooled_e = 0, pooled_o = 0;
  int k = 0, seen_total = 0;
  for (const auto& [seq, pr] : cells) {
    const double e = pr * n;
    const auto it = c.seen.find(seq);
    const double o = it == c.seen.end() ? 0 : it->second;
    seen_total += static_cast<int>(o);
    if (e < 5) {
      pooled_e += e;
      pooled_o += o;
      continue;
    }
    chi += (o - e) * (o - e) / e;
    ++k;
  }
  if (pooled_e > 0) {
    chi += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++k;
  }
  EXPECT_EQ(seen_total, n) << "every observed sequence is one the chain can produce";
  *dof = k - 1;
  return chi;
}

// Upper 0.1% point of chi-square with `dof` degrees of freedom (Wilson–Hilferty).
double chi_square_critical(int dof) {
  const double z = 3.0902; // standard normal 0.999 quantile
  const double d = dof;
  const double a = 1 - 2 / (9 * d) + z * std::sqrt(2 / (9 * d));
  return d * a * a * a;
}

TEST(Speculative, SamplingPreservesTheChainsDistribution) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const int n = 6000, len = 3;
  const std::vector<Chain> chains = {
      {"dist (temperature 1)", "[[sampler]]\nname = \"dist\"\n", 0, 1.0},
      {"top_k 2, temperature 0.7",
       "[[sampler]]\nname = \"top_k\"\nk = 2\n[[sampler]]\nname = \"temperature\"\nvalue = 0.7\n", 2, 0.7},
  };
  const std::vector<std::pair<std::string, std::string>> decoders = {
      {"plain sampling", "[decoder]\nname = \"sample\"\n"},
      // (k fixed: the fixtures' forward times, which adaptive drafting measures, are all alike)
      {"draft model (q != p)",
       "[decoder]\nname = \"speculative\"\ndraft = \"" + model.string() +
           "\"\ndraft_backend = \"fixture_scripted_draft\"\nk = 3\nadaptive = false\n"},
      {"adaptive k, the draft model's trees", "[decoder]\nname = \"speculative\"\ndraft = \"" +
                                                  model.string() +
                                                  "\"\ndraft_backend = \"fixture_scripted_draft\"\n"},
      {"draft model, linear (q != p)",
       "[decoder]\nname = \"speculative\"\ndraft = \"" + model.string() +
           "\"\ndraft_backend = \"fixture_scripted_draft\"\nk = 3\ntree = false\nadaptive = false\n"},
      {"n-gram drafter, trees", "[decoder]\nname = \"speculative\"\ndrafter = \"ngram\"\nk = 2\nwidth = 3\n"},
  };
  for (const auto& chain : chains)
    for (const auto& [label, dec] : decoders) {
      SCOPED_TRACE(label + " with " + chain.name);
      std::vector<TokenId> prompt;
      const Counts c = sample_many(model, chain, dec, n, len, &prompt);
      int dof = 0;
      const double chi = chi_square(c, chain, prompt, n, len, &dof);
      EXPECT_LT(chi, chi_square_critical(dof))
          << "chi-square " << chi << " with " << dof << " degrees of freedom";
      if (label.rfind("draft", 0) == 0) { // q differs from p: some drafts are rejected, many accepted
        // (a tree also counts its alternatives, most of them not taken)
        EXPECT_GT(c.acceptance, label.find("linear") != std::string::npos ? 0.2 : 0.1);
        EXPECT_LT(c.acceptance, 0.999);
      }
    }
}

TEST(Speculative, DraftEqualToTargetIsAlwaysAccepted) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const Chain chain{"top_k 2", "[[sampler]]\nname = \"top_k\"\nk = 2\n", 2, 1.0};
  const Counts c = sample_many(model, chain,
                               "[decoder]\nname = \"speculative\"\ndraft = \"" + model.string() +
                                   "\"\ndraft_backend = \"fixture_scripted\"\nk = 4\ntree = false\n",
                               200, 3, nullptr);
  EXPECT_EQ(c.acceptance, 1.0);
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(Speculative, BadKeysAndDraftFilesAreOneLineErrors) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const fs::path d = tmp_dir();
  { std::ofstream(d / "not.gguf") << "hello, not a model\n"; }
  const std::string base = "run -m " + model.string() + " -p hi -n 4 --decoder speculative";
  const auto other_vocab = test::models_dir() / "llama-2-tiny-random.gguf";
  struct Case {
    std::string args, expect;
  };
  std::vector<Case> cases = {
      {" --set decoder.k=0", "k must be an integer in [1, 64], got 0"},
      {" --set decoder.drafter='\"tree\"'", "drafter must be \"model\", \"ngram\" or \"auto\""},
      {" --set decoder.k_min=5 --set decoder.k=2", "expected k_min ≤ k ≤ k_max"},
      {" --set decoder.ngram_min=4", "expected ngram_min ≤ ngram_max"},
      {" --set decoder.tree='\"maybe\"'", "tree must be true, false or \"auto\", got \"maybe\""},
      {" --set decoder.draft_layers=5", "draft_layers = 5: expected fewer than the target's 5 layers"},
      {" --set decoder.draft_layers=2 --set decoder.draft='\"" + model.string() + "\"'",
       "either draft = \"x.gguf\" or draft_layers = N"},
      {" --set decoder.width=0", "width must be an integer in [1, 16], got 0"},
      {" --set decoder.max_nodes=65", "max_nodes must be an integer in [1, 64], got 65"},
      {" --set decoder.kk=3", "unknown key 'kk' for decoder 'speculative'"},
      {" --set decoder.draft='\"/nonexistent/d.gguf\"'", "no such file"},
      {" --set decoder.draft='\"" + (d / "not.gguf").string() + "\"'", "cannot be loaded"},
      {" --set decoder.draft_backend='\"cpu\"'",
       "a [decoder] draft = \"x.gguf\" (or draft_layers = N) for it"},
      {" --set decoder.drafter='\"model\"'", "needs a draft model"},
      {" --set decoder.acceptance='\"fast\"'", "acceptance must be \"exact\" or \"typical\""},
      {" --set decoder.acceptance='\"typical\"' --set decoder.typical_threshold=0",
       "typical_threshold must be in (0, 1], got 0"},
      {" --set decoder.typical_alpha=0.5", "apply to acceptance = \"typical\" only"},
  };
  if (fs::exists(other_vocab))
    cases.push_back({" --set decoder.draft='\"" + other_vocab.string() + "\"'",
                     "a draft must share the target's tokenizer"});
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const auto r = loom_cli(base + c.args);
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
  }
}

// ---- in a batch ---------------------------------------------------------------------------------

TEST(Decoders, EachGivesInAParallelBatchWhatItGivesAlone) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const fs::path d = tmp_dir();
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily and Ben", "One day"};
  {
    std::ofstream f(d / "prompts.txt");
    for (const auto& p : prompts)
      f << p << "\n";
  }
  const std::vector<std::pair<std::string, std::string>> decoders = {
      {"beam_search", "--decoder beam_search --set decoder.beam_width=3 --set decoder.num_return=2"},
      {"self_consistency", "--decoder self_consistency --set decoder.samples=3 --temp 0.9"},
      {"speculative greedy",
       "--decoder speculative --set decoder.draft='\"" + model.string() + "\"' --temp 0"},
      {"speculative sampling", "--decoder speculative --set decoder.drafter='\"ngram\"' --temp 0.8"},
      // a draft model's trees with sampling: the target's draws do not depend on the drafts (timed k)
      {"speculative draft-model trees, sampling",
       "--decoder speculative --set decoder.draft='\"" + model.string() + "\"' --temp 0.8"},
      {"speculative wide n-gram trees", "--decoder speculative --set decoder.drafter='\"ngram\"' "
                                        "--set decoder.width=8 --set decoder.adaptive=false --temp 0"},
      {"speculative own first 2 layers", "--decoder speculative --set decoder.draft_layers=2 --temp 0"},
      {"speculative typical acceptance, sampling", "--decoder speculative --set decoder.drafter='\"ngram\"' "
                                                   "--set decoder.acceptance='\"typical\"' --temp 0.8"},
  };
  for (const auto& [label, args] : decoders) {
    SCOPED_TRACE(label);
    // on the reference backend: its floats do not depend on the batch (the cpu backend's kernels sum in
    // other orders for other batch shapes, which moves beam scores in the 7th digit)
    const std::string common =
        " -m " + model.string() + " -n 20 --seed 5 --set backend.name='\"reference\"' " + args;
    const auto batch =
        loom_cli("run --prompts " + (d / "prompts.txt").string() + " --parallel 4 --json" + common);
    ASSERT_EQ(batch.code, 0) << batch.err;
    std::istringstream lines(batch.out);
    std::string line;
    for (const auto& p : prompts) {
      ASSERT_TRUE(static_cast<bool>(std::getline(lines, line)));
      const auto in_batch = nlohmann::json::parse(line);
      const auto alone = run_json("-p '" + p + "'" + common);
      EXPECT_EQ(in_batch["tokens"], alone["tokens"]) << p;
      EXPECT_EQ(in_batch["text"], alone["text"]) << p;
      if (alone.contains("hypotheses")) {
        EXPECT_EQ(in_batch["hypotheses"], alone["hypotheses"]) << p;
      }
      if (alone.contains("votes")) {
        EXPECT_EQ(in_batch["votes"], alone["votes"]) << p;
      }
    }
  }
}

} // namespace
