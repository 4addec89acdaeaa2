// decoders/step_search: the search it runs on the scripted fixture model, scored by the fixture_hash
// verifier, equals a search written out here (beam, best-first, lookahead: every node's parent, tokens,
// score and fate); pruned branches free their KV; a failing verifier fails its candidate only; bad
// keys are one-line errors; on stories260K, width 1 × 1 expansion at temperature 0 is greedy.
#include "fixtures/scripted_model.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "loom/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <gtest/gtest.h>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

namespace {

using namespace loom;
namespace fs = std::filesystem;

test::CliResult loom_run(const std::string& args) {
  return test::run_loom(
      "run " + args + " --plugin-path " LOOM_FIXTURE_DIR " --plugin-path " LOOM_BUILD_BIN_DIR, false, 120);
}

// ---- the search, written out --------------------------------------------------------------------

struct RefNode {
  int parent = -1;
  size_t depth = 0;
  std::vector<int32_t> gen; // the path's generated tokens
  size_t step_tokens = 0;
  bool finished = false; // EOS or the token budget
  double score = 0, lp = 0;
  std::string state = "generating";
};

struct RefSearch {
  std::vector<int32_t> prompt;
  const Tokenizer* tok = nullptr;
  size_t width = 2, expansions = 2, max_step = 2, max_new = 8, lookahead = 0, max_expansions = 16,
         queue_size = 16;
  std::vector<RefNode> nodes{RefNode{}};
  std::vector<int> answers;
  size_t n_expanded = 0;

  double mean_lp(const RefNode& n) const {
    return n.gen.empty() ? 0 : n.lp / static_cast<double>(n.gen.size());
  }
  bool better(int a, int b) const {
    const RefNode &x = nodes[static_cast<size_t>(a)], &y = nodes[static_cast<size_t>(b)];
    if (x.score != y.score) return x.score > y.score;
    if (mean_lp(x) != mean_lp(y)) return mean_lp(x) > mean_lp(y);
    return a < b;
  }
  std::vector<int32_t> history(const std::vector<int32_t>& gen) const {
    auto h = prompt;
    h.insert(h.end(), gen.begin(), gen.end());
    return h;
  }
  static int32_t greedy(const std::vector<int32_t>& h) {
    int32_t best = scripted::k_tokens[0];
    for (int32_t t : scripted::k_tokens)
      if (scripted::logit(h, t) > scripted::logit(h, best)) best = t;
    return best;
  }
  // Continues `gen` greedily to the end of a step (max_step tokens, EOS or the budget) after `first`.
  // Returns the step's token count; sets `finished`.
  size_t run_step(std::vector<int32_t>& gen, int32_t first, bool& finished, double* lp) const {
    int32_t t = first;
    size_t n = 0;
    for (;;) {
      if (lp) *lp += scripted::logprob(history(gen), t);
      gen.push_back(t);
      ++n;
      if (t == 2 || gen.size() >= max_new) {
        finished = true;
        return n;
      }
      if (n >= max_step) return n;
      t = greedy(history(gen));
    }
  }
  double score_of(const std::vector<int32_t>& gen) const { return scripted::text_score(tok->decode(gen)); }

  // One round: the frontier's children (top-E first tokens, then greedy), scored.
  std::vector<int> expand(const std::vector<int>& frontier) {
    std::vector<int> kids;
    for (int f : frontier) {
      ++n_expanded;
      nodes[static_cast<size_t>(f)].state = "expanded";
      const auto h = history(nodes[static_cast<size_t>(f)].gen);
      std::vector<int32_t> firsts(std::begin(scripted::k_tokens), std::end(scripted::k_tokens));
      std::stable_sort(firsts.begin(), firsts.end(), [&](int32_t a, int32_t b) {
        const float la = scripted::logit(h, a), lb = scripted::logit(h, b);
        return la > lb || (la == lb && a < b);
      });
      firsts.resize(std::min(expansions, firsts.size()));
      for (int32_t t : firsts) {
        RefNode c;
        c.parent = f;
        c.depth = nodes[static_cast<size_t>(f)].depth + 1;
        c.gen = nodes[static_cast<size_t>(f)].gen;
        c.lp = nodes[static_cast<size_t>(f)].lp;
        c.step_tokens = run_step(c.gen, t, c.finished, &c.lp);
        if (lookahead > 0 && !c.finished) { // greedy roll-out of `lookahead` steps
          auto roll = c.gen;
          bool fin = false;
          for (size_t k = 0; k < lookahead && !fin; ++k)
            run_step(roll, greedy(history(roll)), fin, nullptr);
          c.score = score_of(roll);
        } else {
          c.score = score_of(c.gen);
        }
        c.state = "scored";
        nodes.push_back(c);
        kids.push_back(static_cast<int>(nodes.size() - 1));
      }
    }
    return kids;
  }

  void beam() {
    std::vector<int> frontier{0};
    while (!frontier.empty()) {
      auto kids = expand(frontier);
      std::stable_sort(kids.begin(), kids.end(), [&](int a, int b) { return better(a, b); });
      frontier.clear();
      for (int k : kids) {
        RefNode& n = nodes[static_cast<size_t>(k)];
        if (n.finished) {
          n.state = "answer";
          answers.push_back(k);
        } else if (frontier.size() < width) {
          n.state = "kept";
          frontier.push_back(k);
        } else {
          n.state = "pruned";
        }
      }
    }
  }

  void best_first() {
    std::vector<int> queue, frontier{0};
    for (;;) {
      auto kids = expand(frontier);
      queue.insert(queue.end(), kids.begin(), kids.end());
      std::stable_sort(queue.begin(), queue.end(), [&](int a, int b) { return better(a, b); });
      while (queue.size() > queue_size) {
        nodes[static_cast<size_t>(queue.back())].state = "pruned";
        queue.pop_back();
      }
      for (int q : queue)
        nodes[static_cast<size_t>(q)].state = "open";
      frontier.clear();
      while (!queue.empty() && answers.size() < width) {
        RefNode& top = nodes[static_cast<size_t>(queue.front())];
        if (!top.finished) {
          if (n_expanded >= max_expansions) break;
          top.state = "kept";
          frontier = {queue.front()};
          queue.erase(queue.begin());
          break;
        }
        top.state = "answer";
        answers.push_back(queue.front());
        queue.erase(queue.begin());
      }
      if (!frontier.empty()) continue;
      for (int q : queue)
        if (nodes[static_cast<size_t>(q)].finished) {
          nodes[static_cast<size_t>(q)].state = "answer";
          answers.push_back(q);
        }
      if (answers.empty() && !queue.empty()) {
        nodes[static_cast<size_t>(queue.front())].state = "answer";
        answers.push_back(queue.front());
      }
      return;
    }
  }
};

void expect_search(const nlohmann::json& j, const RefSearch& ref) {
  const auto& nodes = j["search"]["nodes"];
  ASSERT_EQ(nodes.size(), ref.nodes.size() - 1) << j["search"].dump();
  for (size_t i = 1; i < ref.nodes.size(); ++i) {
    SCOPED_TRACE("node " + std::to_string(i));
    const auto& n = nodes[i - 1];
    const RefNode& r = ref.nodes[i];
    EXPECT_EQ(n["id"], i);
    EXPECT_EQ(n["parent"], r.parent);
    EXPECT_EQ(n["depth"], r.depth);
    EXPECT_EQ(n["tokens"], r.step_tokens);
    EXPECT_NEAR(n["score"].get<double>(), r.score, 1e-12);
    EXPECT_NEAR(n["mean_logprob"].get<double>(), ref.mean_lp(r), 1e-5);
    EXPECT_EQ(n["state"], r.state);
  }
  EXPECT_EQ(j["search"]["expansions"], ref.n_expanded);
  // The result: the answers best first (aggregate "best").
  std::vector<int> order = ref.answers;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ref.better(a, b); });
  ASSERT_FALSE(order.empty());
  if (order.size() > 1) { // `hypotheses` lists them all when there are several
    ASSERT_EQ(j["hypotheses"].size(), order.size());
    for (size_t i = 0; i < order.size(); ++i)
      EXPECT_EQ(j["hypotheses"][i]["tokens"].get<std::vector<int32_t>>(),
                ref.nodes[static_cast<size_t>(order[i])].gen)
          << i;
  } else {
    EXPECT_FALSE(j.contains("hypotheses"));
  }
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), ref.nodes[static_cast<size_t>(order.front())].gen);
}

nlohmann::json run_scripted(const fs::path& model, const std::string& keys, size_t max_new,
                            const std::string& prompt = "b") {
  const auto r = loom_run("-m " + model.string() + " -p " + prompt + " -n " + std::to_string(max_new) +
                          " --temp 0 --json --set backend.name=fixture_scripted --decoder step_search"
                          " --set 'decoder.expand=\"first_token\"' --set decoder.max_step_tokens=2"
                          " --set 'verifier.name=\"fixture_hash\"' " +
                          keys);
  EXPECT_EQ(r.code, 0) << r.err;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json::object();
}

TEST(StepSearch, BeamIsTheWrittenOutSearchOnAScriptedModel) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto m = Model::load(model.string());
  auto tok = Tokenizer::from_gguf(m->file());
  size_t pruned = 0, deepest = 0;
  for (const auto& [w, e] : std::vector<std::pair<size_t, size_t>>{{2, 2}, {1, 3}, {3, 3}}) {
    SCOPED_TRACE("width " + std::to_string(w) + ", expansions " + std::to_string(e));
    const auto j = run_scripted(model,
                                "--set decoder.beam_width=" + std::to_string(w) +
                                    " --set decoder.expansions=" + std::to_string(e),
                                12);
    ASSERT_TRUE(j.contains("search"));
    RefSearch ref;
    ref.prompt = j["prompt_tokens"].get<std::vector<int32_t>>();
    ref.tok = tok.get();
    ref.width = w;
    ref.expansions = e;
    ref.max_new = 12;
    ref.beam();
    expect_search(j, ref);
    for (const RefNode& n : ref.nodes)
      pruned += n.state == "pruned" ? 1 : 0;
    deepest = std::max(deepest, ref.nodes.back().depth);
  }
  EXPECT_GT(pruned, 0u) << "the cases should prune";
  EXPECT_GE(deepest, 4u) << "the cases should search several steps deep";
}

TEST(StepSearch, BestFirstIsTheWrittenOutSearchOnAScriptedModel) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto m = Model::load(model.string());
  auto tok = Tokenizer::from_gguf(m->file());
  for (const auto& [maxe, q] : std::vector<std::pair<size_t, size_t>>{{6, 16}, {20, 3}, {2, 16}}) {
    SCOPED_TRACE("max_expansions " + std::to_string(maxe) + ", queue " + std::to_string(q));
    const auto j = run_scripted(model,
                                "--set 'decoder.mode=\"best_first\"' --set decoder.beam_width=2 "
                                "--set decoder.expansions=2 --set decoder.max_expansions=" +
                                    std::to_string(maxe) + " --set decoder.queue_size=" + std::to_string(q),
                                8);
    ASSERT_TRUE(j.contains("search"));
    RefSearch ref;
    ref.prompt = j["prompt_tokens"].get<std::vector<int32_t>>();
    ref.tok = tok.get();
    ref.width = 2;
    ref.expansions = 2;
    ref.max_expansions = maxe;
    ref.queue_size = q;
    ref.best_first();
    expect_search(j, ref);
  }
}

TEST(StepSearch, LookaheadScoresTheGreedyRollOut) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto m = Model::load(model.string());
  auto tok = Tokenizer::from_gguf(m->file());
  for (size_t la : {1, 2}) {
    SCOPED_TRACE("lookahead " + std::to_string(la));
    const auto j = run_scripted(model,
                                "--set 'decoder.mode=\"lookahead\"' --set decoder.beam_width=2 "
                                "--set decoder.expansions=2 --set decoder.lookahead=" +
                                    std::to_string(la),
                                10);
    ASSERT_TRUE(j.contains("search"));
    RefSearch ref;
    ref.prompt = j["prompt_tokens"].get<std::vector<int32_t>>();
    ref.tok = tok.get();
    ref.max_new = 10;
    ref.lookahead = la;
    ref.beam();
    expect_search(j, ref);
  }
}

TEST(StepSearch, AFailingVerifierFailsItsCandidateOnly) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto m = Model::load(model.string());
  auto tok = Tokenizer::from_gguf(m->file());
  const std::string byte4 =
      std::to_string(static_cast<unsigned char>(tok->decode(std::vector<int32_t>{4})[0]));
  for (const char* key : {"fail_on", "nan_on"}) {
    SCOPED_TRACE(key);
    // Token 4's byte fails every candidate with a 4 in it; the others go on.
    const auto j = run_scripted(model,
                                "--set decoder.beam_width=2 --set decoder.expansions=3 --set verifier." +
                                    std::string(key) + "=" + byte4,
                                6);
    ASSERT_TRUE(j.contains("search"));
    size_t failed = 0, other = 0;
    for (const auto& n : j["search"]["nodes"]) {
      const std::string text = n["text"];
      if (n["state"] == "failed") {
        ++failed;
        EXPECT_TRUE(n.contains("error"));
      } else {
        ++other;
      }
    }
    EXPECT_GT(failed, 0u);
    EXPECT_GT(other, 0u);
    for (const auto& h : j["hypotheses"])
      for (int32_t t : h["tokens"].get<std::vector<int32_t>>())
        EXPECT_NE(t, 4) << "an answer passed verification";
  }
}

// self_consistency sends its candidates to the verifier together (verify_many); one the verifier fails
// on loses its vote and says why, the request still answers.
TEST(StepSearch, SelfConsistencyCandidatesFailVerificationAlone) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto r =
      loom_run("-m " + model.string() +
               " -p 'One day, a little' -n 12 --seed 11 --temp 1.0 --json --decoder self_consistency"
               " --set decoder.samples=8 --set 'decoder.verifier=\"weight\"'"
               " --set 'decoder.answer_regex=\"(T[a-z]+)\"'"
               " --set 'verifier.name=\"fixture_hash\"' --set verifier.fail_on=103"); // 'g'
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  size_t failed = 0, scored = 0;
  for (const auto& c : j["candidates"]) {
    const std::string text = c["text"];
    if (text.find('g') != std::string::npos) {
      ++failed;
      EXPECT_TRUE(c.contains("verifier_error")) << c.dump();
      EXPECT_FALSE(c.contains("verifier_score")) << c.dump();
    } else {
      ++scored;
      EXPECT_TRUE(c.contains("verifier_score")) << c.dump();
    }
  }
  EXPECT_GT(failed, 0u);
  EXPECT_GT(scored, 0u);
  size_t votes = 0, want = 0;
  for (const auto& v : j["votes"])
    votes += v["count"].get<size_t>();
  for (const auto& c : j["candidates"])
    if (!c["answer"].is_null() && c.contains("verifier_score")) ++want;
  EXPECT_EQ(votes, want);
}

TEST(StepSearch, PrunedBranchesFreeTheirKv) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.model.n_ctx = 256;
  cfg.backend.name = "reference";
  cfg.kv_cache.store = "paged";
  cfg.plugins.paths = {LOOM_BUILD_BIN_DIR};
  cfg.decoder.name = "step_search";
  cfg.decoder.params = {{"beam_width", int64_t{2}},
                        {"expansions", int64_t{3}},
                        {"max_step_tokens", int64_t{6}},
                        {"step_delimiter", std::string(".")}};
  cfg.verifier.name = "arith_check";
  auto p = Pipeline::create(cfg);
  const KVCacheStore& kv = p->kv_store();
  const int64_t units0 = kv.units_in_use();
  GenerationRequest req;
  req.prompt = "Once upon a time";
  req.max_new_tokens = 30;
  req.seed = 5;
  p->submit(req);
  int32_t most = 0;
  std::vector<std::pair<RequestId, GenerationResult>> done;
  for (int steps = 0; done.empty() && steps < 400; ++steps) {
    done = p->engine().step();
    most = std::max(most, kv.shape().n_seq_max - kv.free_sequences());
  }
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].second.n_best.empty());
  // Held at once: the kept partial solutions' candidates (2 × 3) and the finished answers.
  EXPECT_LE(most, 2 * 3 + 6) << "pruned candidates are freed at once";
  EXPECT_EQ(kv.free_sequences(), kv.shape().n_seq_max) << "nothing held after the request";
  EXPECT_EQ(kv.units_in_use(), units0) << "every block returned";
}

TEST(StepSearch, WidthOneOneExpansionAtTemperatureZeroIsGreedy) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string base = "-m " + model.string() + " -p 'Once upon a time' -n 40 --temp 0 --json";
  const auto g = loom_run(base);
  const auto s =
      loom_run(base + " --decoder step_search --set decoder.beam_width=1 --set decoder.expansions=1"
                      " --set 'decoder.step_delimiter=\".\"' --set 'verifier.name=\"arith_check\"'");
  ASSERT_EQ(g.code, 0) << g.err;
  ASSERT_EQ(s.code, 0) << s.err;
  const auto jg = nlohmann::json::parse(g.out), js = nlohmann::json::parse(s.out);
  EXPECT_EQ(js["tokens"], jg["tokens"]);
  EXPECT_GE(js["search"]["rounds"].get<int>(), 2) << "several steps";
  // With more expansions at temperature 0 the siblings are identical: merged as duplicates.
  const auto d =
      loom_run(base + " --decoder step_search --set decoder.beam_width=1 --set decoder.expansions=3"
                      " --set 'decoder.step_delimiter=\".\"' --set 'verifier.name=\"arith_check\"'");
  ASSERT_EQ(d.code, 0) << d.err;
  const auto jd = nlohmann::json::parse(d.out);
  EXPECT_EQ(jd["tokens"], jg["tokens"]);
  size_t dups = 0;
  for (const auto& n : jd["search"]["nodes"])
    dups += n["state"] == "duplicate" ? 1 : 0;
  EXPECT_GE(dups, 4u);
}

// The mechanism where the correct path is known: on the scripted model, a process verifier that scores
// the prefixes of one 8-token answer (not the greedy one) lets step search walk to it every time — one
// token a step, every token tried, the one prefix kept — while best-of-n with the same verifier and
// more tokens evaluated finds it in almost no seed (the answer's probability is about 3^-8 a sample).
TEST(StepSearch, AProcessVerifierLeadsStepSearchToTheKnownAnswer) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string base = "-m " + model.string() +
                           " -p b -n 8 --json --set backend.name=fixture_scripted --decoder step_search"
                           " --set 'verifier.name=\"fixture_hash\"' ";
  const auto greedy = loom_run("-m " + model.string() +
                               " -p b -n 8 --temp 0 --ignore-eos --json --set backend.name=fixture_scripted");
  ASSERT_EQ(greedy.code, 0) << greedy.err;
  std::string correct; // greedy's 8 tokens as bits, the first flipped, EOS (2) read as 0
  for (int32_t t : nlohmann::json::parse(greedy.out)["tokens"].get<std::vector<int32_t>>())
    correct += t == 4 ? '1' : '0';
  correct[0] = correct[0] == '1' ? '0' : '1';
  const std::string want_set = "--set 'verifier.correct=\"" + correct + "\"' ";
  int found_search = 0, found_bon = 0;
  double tok_search = 0, tok_bon = 0;
  const int seeds = 12;
  for (int seed = 1; seed <= seeds; ++seed) {
    const auto s = loom_run(base + want_set + "--seed " + std::to_string(seed) +
                            " --temp 1 --set decoder.beam_width=1 --set decoder.expansions=3"
                            " --set 'decoder.expand=\"first_token\"' --set decoder.max_step_tokens=1");
    const auto b = loom_run(base + want_set + "--seed " + std::to_string(seed) +
                            " --temp 1 --set decoder.beam_width=1 --set decoder.expansions=8"
                            " --set 'decoder.step_delimiter=\"never\"' --set decoder.max_step_tokens=64");
    ASSERT_EQ(s.code, 0) << s.err;
    ASSERT_EQ(b.code, 0) << b.err;
    const auto js = nlohmann::json::parse(s.out), jb = nlohmann::json::parse(b.out);
    const auto bits = [](const nlohmann::json& j) {
      std::string o;
      for (int32_t t : j["tokens"].get<std::vector<int32_t>>())
        o += t == 4 ? '1' : t == 3 ? '0' : 'E';
      return o;
    };
    found_search += bits(js) == correct ? 1 : 0;
    found_bon += bits(jb) == correct ? 1 : 0;
    tok_search += js["metrics"]["tokens_evaluated"].get<double>();
    tok_bon += jb["metrics"]["tokens_evaluated"].get<double>();
  }
  EXPECT_EQ(found_search, seeds) << "step search reaches the known answer from every seed";
  EXPECT_LE(found_bon, 1) << "best-of-8 almost never samples it";
  EXPECT_LT(tok_search, tok_bon) << "and step search evaluated fewer tokens";
}

// majority / weighted: the answer with the most votes (weighted: the largest sum of verifier scores) over
// every finished solution, each reported under `hypotheses` with its score; ties: the better best solution.
TEST(StepSearch, MajorityAndWeightedVoteOverTheFinishedSolutions) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  for (const char* aggregate : {"majority", "weighted"}) {
    SCOPED_TRACE(aggregate);
    const auto r =
        loom_run("-m " + model.string() +
                 " -p 'Once upon a time' -n 30 --seed 4 --temp 1.0 --json --decoder step_search"
                 " --set decoder.beam_width=3 --set decoder.expansions=3 --set 'decoder.step_delimiter=\".\"'"
                 " --set 'decoder.aggregate=\"" +
                 aggregate +
                 "\"' --set 'decoder.answer_regex=\"([A-Z][a-z]+)\"'"
                 " --set 'verifier.name=\"fixture_hash\"'");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_TRUE(j.contains("hypotheses"));
    std::map<std::string, std::pair<double, int>> tally; // answer → (weight, first hypothesis index)
    const std::regex rx("([A-Z][a-z]+)");
    for (size_t i = 0; i < j["hypotheses"].size(); ++i) {
      const std::string text = j["hypotheses"][i]["text"];
      std::smatch m;
      if (!std::regex_search(text, m, rx)) continue;
      auto [it, fresh] = tally.try_emplace(m[1].str(), 0.0, static_cast<int>(i));
      it->second.first +=
          std::string(aggregate) == "weighted" ? j["hypotheses"][i]["score"].get<double>() : 1.0;
    }
    ASSERT_GE(tally.size(), 2u) << "the case needs competing answers";
    double best = -1;
    for (const auto& [a, wt] : tally)
      best = std::max(best, wt.first);
    ASSERT_TRUE(j["answer"].is_string());
    const std::string winner = j["answer"];
    EXPECT_NEAR(tally.at(winner).first, best, 1e-9) << "the winner has the most votes";
    double sum = 0;
    for (const auto& v : j["votes"])
      sum += v["weight"].get<double>();
    double want_sum = 0;
    for (const auto& [a, wt] : tally)
      want_sum += wt.first;
    EXPECT_NEAR(sum, want_sum, 1e-6);
    // The winner's solutions lead the hypotheses.
    std::smatch m;
    const std::string first = j["hypotheses"][0]["text"];
    ASSERT_TRUE(std::regex_search(first, m, rx));
    EXPECT_EQ(m[1].str(), winner);
  }
}

TEST(StepSearch, BadKeysAreOneLineErrors) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string base = "-m " + model.string() + " -p hi -n 4 --decoder step_search ";
  const std::string v = " --set 'verifier.name=\"arith_check\"'";
  const auto one_line = [&](const std::string& args, const std::string& has) {
    SCOPED_TRACE(args);
    const auto r = loom_run(base + args);
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find(has), std::string::npos) << r.err;
    EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 2) << r.err;
  };
  one_line("", "needs a verifier");
  one_line("--set 'decoder.mode=\"dfs\"'" + v, "mode must be");
  one_line("--set decoder.beam_width=0" + v, "beam_width must be an integer in [1, 64]");
  one_line("--set decoder.expansions=65" + v, "expansions must be");
  one_line("--set 'decoder.expand=\"all\"'" + v, "expand must be");
  one_line("--set 'decoder.step_delimiter=\"\"'" + v, "step_delimiter must not be empty");
  one_line("--set decoder.max_step_tokens=0" + v, "max_step_tokens");
  one_line("--set 'decoder.aggregate=\"mean\"'" + v, "aggregate must be");
  one_line("--set 'decoder.answer_regex=\"(a)(b)\"'" + v, "exactly one capture group");
  one_line("--set decoder.max_expansions=4" + v, "apply to mode");
  one_line("--set decoder.lookahead=2" + v, "lookahead applies");
  one_line("--set decoder.colour=2" + v, "colour");
}

} // namespace
