// decoders/beam_search through `loom run`: width 1 is greedy; with a width as large as the
// vocabulary, two-token search is exhaustive, so its n-best must be the exact top pairs by log-prob
// (computed here with the reference backend over every first token); bad keys are one-line errors.
#include "fixtures/scripted_model.hpp"
#include "loom/model/model.hpp"
#include "loom/model/reference_backend.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "loom/sample/logprobs.hpp"
#include "loom/sample/sampler.hpp"
#include "loom/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <gtest/gtest.h>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace {

using namespace loom;

test::CliResult loom_run(const std::string& args) {
  return test::run_loom("run " + args + " --plugin-path " LOOM_BUILD_BIN_DIR, false, 120);
}

TEST(BeamSearch, WidthOneIsGreedy) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string base = "-m " + model.string() + " -p 'Once upon a time' -n 24 --ignore-eos --json";
  const auto greedy = loom_run(base + " --temp 0");
  const auto beam = loom_run(base + " --decoder beam_search --set decoder.beam_width=1");
  ASSERT_EQ(greedy.code, 0) << greedy.err;
  ASSERT_EQ(beam.code, 0) << beam.err;
  const auto g = nlohmann::json::parse(greedy.out), b = nlohmann::json::parse(beam.out);
  EXPECT_EQ(g["tokens"], b["tokens"]);
  EXPECT_EQ(g["text"], b["text"]);
}

TEST(BeamSearch, TwoTokensAtFullWidthAreExhaustive) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  // Exhaustive: log p(t1 | prompt) + log p(t2 | prompt, t1) for every pair.
  auto m = Model::load(model.string());
  auto tok = Tokenizer::from_gguf(m->file());
  auto be = make_reference_backend();
  const int32_t V = m->config().n_vocab;
  auto kv = make_contiguous_kv_cache(m->kv_shape(16, 2));
  EncodeOptions o;
  o.add_bos = true;
  const std::vector<TokenId> prompt = tok->encode("Once upon a time", o);
  auto forward = [&](const std::vector<TokenId>& toks, SeqId seq) {
    std::vector<Pos> pos(toks.size());
    std::vector<SeqId> seqs(toks.size(), seq);
    for (size_t i = 0; i < toks.size(); ++i)
      pos[i] = static_cast<Pos>(i);
    const std::vector<int32_t> out{static_cast<int32_t>(toks.size()) - 1};
    EXPECT_TRUE(kv->allocate(seq, static_cast<int32_t>(toks.size())));
    std::vector<float> logits(static_cast<size_t>(V));
    m->forward(*be, BatchView{toks, pos, seqs, out}, *kv, logits);
    kv->free(seq);
    return logits;
  };
  const auto l1 = forward(prompt, 0);
  struct Pair {
    double sum;
    TokenId a, b;
  };
  std::vector<Pair> pairs;
  for (TokenId a = 0; a < V; ++a) {
    std::vector<TokenId> p2 = prompt;
    p2.push_back(a);
    const auto l2 = forward(p2, 0);
    const double lp1 = token_logprob(l1, a);
    for (TokenId b = 0; b < V; ++b)
      pairs.push_back({lp1 + static_cast<double>(token_logprob(l2, b)), a, b});
  }
  std::partial_sort(pairs.begin(), pairs.begin() + 4, pairs.end(),
                    [](const Pair& x, const Pair& y) { return x.sum > y.sum; });

  const auto r =
      loom_run("-m " + model.string() + " -p 'Once upon a time' -n 2 --ignore-eos --json --ctx-size 16" +
               " --set kv_cache.max_tokens=" + std::to_string(16 * 3 * V) +
               " --decoder beam_search --set decoder.beam_width=" + std::to_string(V) +
               " --set decoder.num_return=4 --set decoder.length_penalty=0.0");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["hypotheses"].size(), 4u) << r.out;
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE("hypothesis " + std::to_string(i));
    const auto& h = j["hypotheses"][i];
    EXPECT_EQ(h["tokens"], (std::vector<TokenId>{pairs[i].a, pairs[i].b}));
    EXPECT_NEAR(h["score"].get<double>(), pairs[i].sum, 1e-4);
  }
  EXPECT_EQ(j["tokens"], j["hypotheses"][0]["tokens"]);
}

TEST(BeamSearch, BadKeysAreOneLineErrors) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string base = "-m " + model.string() + " -p hi -n 4 --decoder beam_search ";
  for (const auto& [set, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--set decoder.beam_width=0", "beam_width must be an integer in [1, 1024]"},
           {"--set decoder.num_return=9", "num_return must be an integer in [1, beam_width = 4]"},
           {"--set decoder.early_stopping='\"sometimes\"'",
            "early_stopping must be true, false or \"never\""},
           {"--set decoder.early_stopping=3",
            "early_stopping must be true, false or \"never\", got a number"},
           {"--set decoder.widht=3", "widht"}}) {
    SCOPED_TRACE(set);
    const auto r = loom_run(base + set);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  }
}

// On the real model: hypotheses come best first, the top-level answer is the first, and with
// length_penalty 0 a hypothesis's score is exactly the sum of its tokens' log-probs (as reported).
TEST(BeamSearch, ScoresAreTheLogprobSumsBestFirst) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  for (int w : {2, 4, 8}) {
    SCOPED_TRACE("width " + std::to_string(w));
    const auto r =
        loom_run("-m " + model.string() + " -p 'The little dog' -n 16 --json --ignore-eos" +
                 " --decoder beam_search --set decoder.length_penalty=0.0 --set decoder.beam_width=" +
                 std::to_string(w) + " --set decoder.num_return=" + std::to_string(w));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["hypotheses"].size(), static_cast<size_t>(w)) << r.out;
    EXPECT_EQ(j["tokens"], j["hypotheses"][0]["tokens"]);
    double prev = 1e300, top_sum = 0;
    for (const auto& lp : j["logprobs"])
      top_sum += lp.get<double>();
    EXPECT_NEAR(j["hypotheses"][0]["score"].get<double>(), top_sum, 1e-3);
    for (const auto& h : j["hypotheses"]) {
      const double sc = h["score"].get<double>();
      EXPECT_LE(sc, prev + 1e-9) << "best first";
      prev = sc;
      EXPECT_EQ(h["tokens"].size(), 16u);
    }
  }
}

// On the scripted model (three live tokens, EOS among them) every hypothesis of up to four tokens
// can be enumerated: with length_penalty 1 and early_stopping "never", a beam wide enough to hold
// every prefix must return exactly the best five by score — EOS-ended ones of every length included.
TEST(BeamSearch, ExactNBestOnAScriptedModel) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto r = test::run_loom(
      "run -m " + model.string() + " -p hi -n 4 --json --set backend.name=fixture_scripted --plugin-path " +
          LOOM_FIXTURE_DIR + " --plugin-path " LOOM_BUILD_BIN_DIR +
          " --decoder beam_search --set decoder.beam_width=27 --set decoder.num_return=5"
          " --set decoder.length_penalty=1.0 --set 'decoder.early_stopping=\"never\"'",
      false, 60);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const std::vector<int32_t> prompt = j["prompt_tokens"];

  struct Hyp {
    double score;
    std::vector<int32_t> tokens;
  };
  std::vector<Hyp> all;
  // Every sequence over {2, 3, 4} of length 1..4 in which EOS (2) can only be last; shorter than 4
  // only when it ends with EOS (else the budget of 4 ends it).
  std::vector<std::vector<int32_t>> frontier{{}};
  for (int len = 1; len <= 4; ++len) {
    std::vector<std::vector<int32_t>> next;
    for (const auto& pre : frontier)
      for (int32_t t : scripted::k_tokens) {
        auto seq = pre;
        seq.push_back(t);
        if (t == 2 || len == 4) {
          std::vector<int32_t> h = prompt;
          double sum = 0;
          for (int32_t x : seq) {
            sum += scripted::logprob(h, x);
            h.push_back(x);
          }
          all.push_back({sum / static_cast<double>(seq.size()), seq});
        } else {
          next.push_back(seq);
        }
      }
    frontier = std::move(next);
  }
  std::stable_sort(all.begin(), all.end(), [](const Hyp& a, const Hyp& b) { return a.score > b.score; });
  ASSERT_EQ(j["hypotheses"].size(), 5u) << r.out;
  bool eos_ended = false;
  for (size_t i = 0; i < 5; ++i) {
    SCOPED_TRACE("hypothesis " + std::to_string(i));
    const auto& h = j["hypotheses"][i];
    EXPECT_EQ(h["tokens"].get<std::vector<int32_t>>(), all[i].tokens);
    EXPECT_NEAR(h["score"].get<double>(), all[i].score, 1e-5);
    eos_ended = eos_ended || h["stop_reason"] == "eos";
  }
  EXPECT_TRUE(eos_ended) << "the case should rank an EOS-ended hypothesis among the best five";
}

// Hugging Face's beam search (BeamSearchScorer.process / BeamHypotheses.is_done / finalize, lengths
// counted in generated tokens) written out over the scripted model, for the early_stopping modes.
struct RefHyp {
  double score;
  std::vector<int32_t> tokens;
};
std::vector<RefHyp> hf_beam_search(const std::vector<int32_t>& prompt, size_t W, double alpha,
                                   const std::string& early, size_t max_new) {
  struct Beam {
    std::vector<int32_t> gen;
    double sum;
  };
  std::vector<Beam> beams{{{}, 0.0}};
  std::vector<RefHyp> hyps; // best first, at most W
  auto add = [&](const std::vector<int32_t>& gen, double sum) {
    hyps.push_back({sum / std::pow(static_cast<double>(gen.size()), alpha), gen});
    std::stable_sort(hyps.begin(), hyps.end(),
                     [](const RefHyp& a, const RefHyp& b) { return a.score > b.score; });
    if (hyps.size() > W) hyps.pop_back();
  };
  for (size_t cur_len = 0; cur_len < max_new; ++cur_len) {
    struct Cand {
      double sum;
      size_t beam;
      int32_t token;
    };
    std::vector<Cand> cands;
    for (size_t b = 0; b < beams.size(); ++b) {
      std::vector<int32_t> h = prompt;
      h.insert(h.end(), beams[b].gen.begin(), beams[b].gen.end());
      for (int32_t t : scripted::k_tokens)
        cands.push_back({beams[b].sum + scripted::logprob(h, t), b, t});
    }
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
      if (a.sum != b.sum) return a.sum > b.sum;
      return a.beam != b.beam ? a.beam < b.beam : a.token < b.token;
    });
    std::vector<Beam> next;
    for (size_t rank = 0; rank < cands.size() && next.size() < W; ++rank) {
      auto gen = beams[cands[rank].beam].gen;
      gen.push_back(cands[rank].token);
      if (cands[rank].token == 2) { // EOS
        if (rank < W) add(gen, cands[rank].sum);
        continue;
      }
      next.push_back({gen, cands[rank].sum});
    }
    beams = std::move(next);
    if (cur_len + 1 == max_new) { // finalize: the live beams join the hypotheses
      for (const Beam& b : beams)
        add(b.gen, b.sum);
      break;
    }
    // is_done
    if (beams.empty()) break;
    if (hyps.size() < W) continue;
    if (early == "true") break;
    double best = -1e300;
    for (const Beam& b : beams)
      best = std::max(best, b.sum);
    const double len =
        early == "never" && alpha > 0 ? static_cast<double>(max_new) : static_cast<double>(cur_len);
    if (hyps.back().score >= best / std::pow(len, alpha)) break;
  }
  return hyps;
}

// The reported hypotheses equal `want` (tokens, scores within 1e-5); returns them as one string.
std::string expect_hypotheses(const nlohmann::json& j, const std::vector<RefHyp>& want) {
  std::string got;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(j["hypotheses"][i]["tokens"].get<std::vector<int32_t>>(), want[i].tokens) << i;
    EXPECT_NEAR(j["hypotheses"][i]["score"].get<double>(), want[i].score, 1e-5) << i;
    got += j["hypotheses"][i]["tokens"].dump();
  }
  return got;
}

TEST(BeamSearch, EarlyStoppingFollowsHuggingFace) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  std::set<std::string> distinct; // the modes must differ somewhere, or the case tests nothing
  for (size_t w : {2, 3})
    for (double alpha : {1.0, 2.0, -1.0})
      for (std::string early : {"true", "false", "never"}) {
        const std::string tag =
            "w=" + std::to_string(w) + " alpha=" + std::to_string(alpha) + " early=" + early;
        SCOPED_TRACE(tag);
        const std::string e = early == "never" ? "'\"never\"'" : early;
        const auto r =
            test::run_loom("run -m " + model.string() +
                               " -p hi -n 6 --json --set backend.name=fixture_scripted --plugin-path " +
                               LOOM_FIXTURE_DIR + " --plugin-path " LOOM_BUILD_BIN_DIR +
                               " --decoder beam_search --set decoder.beam_width=" + std::to_string(w) +
                               " --set decoder.num_return=" + std::to_string(w) +
                               " --set decoder.length_penalty=" + std::to_string(alpha) +
                               " --set decoder.early_stopping=" + e,
                           false, 60);
        ASSERT_EQ(r.code, 0) << r.err;
        const auto j = nlohmann::json::parse(r.out);
        const auto want = hf_beam_search(j["prompt_tokens"].get<std::vector<int32_t>>(), w, alpha, early, 6);
        ASSERT_EQ(j["hypotheses"].size(), want.size()) << r.out;
        const std::string got = expect_hypotheses(j, want);
        if (w == 2 && alpha == 2.0) distinct.insert(got);
      }
  EXPECT_EQ(distinct.size(), 3u) << "at width 2 and length_penalty 2 the three modes give three answers";
}

// Hugging Face's group (diverse) beam search over the scripted model: G groups of W/G beams take
// turns each step; a group's log-probs are lowered by `penalty` per earlier group's new beam with
// that token (HammingDiversityLogitsProcessor), per-group hypotheses and is_done; all hypotheses are
// ranked together at the end (early_stopping false).
std::vector<RefHyp> hf_group_beam_search(const std::vector<int32_t>& prompt, size_t W, size_t G,
                                         double penalty, double alpha, size_t max_new) {
  struct Beam {
    std::vector<int32_t> gen;
    double sum;
  };
  struct Group {
    std::vector<Beam> beams{{{}, 0.0}};
    std::vector<RefHyp> hyps;
    bool done = false;
  };
  const size_t GW = W / G;
  std::vector<Group> groups(G);
  auto add = [&](Group& g, const std::vector<int32_t>& gen, double sum) {
    g.hyps.push_back({sum / std::pow(static_cast<double>(gen.size()), alpha), gen});
    std::stable_sort(g.hyps.begin(), g.hyps.end(),
                     [](const RefHyp& a, const RefHyp& b) { return a.score > b.score; });
    if (g.hyps.size() > GW) g.hyps.pop_back();
  };
  for (size_t cur_len = 0; cur_len < max_new; ++cur_len) {
    std::map<int32_t, int> chosen;
    for (Group& g : groups) {
      if (g.done) continue;
      struct Cand {
        double sum;
        size_t beam;
        int32_t token;
      };
      std::vector<Cand> cands;
      for (size_t b = 0; b < g.beams.size(); ++b) {
        std::vector<int32_t> h = prompt;
        h.insert(h.end(), g.beams[b].gen.begin(), g.beams[b].gen.end());
        for (int32_t t : scripted::k_tokens)
          cands.push_back({g.beams[b].sum + scripted::logprob(h, t) - penalty * chosen[t], b, t});
      }
      std::stable_sort(cands.begin(), cands.end(), [](const auto& a, const auto& b) {
        if (a.sum != b.sum) return a.sum > b.sum;
        return a.beam != b.beam ? a.beam < b.beam : a.token < b.token;
      });
      std::vector<Beam> next;
      for (size_t rank = 0; rank < cands.size() && next.size() < GW; ++rank) {
        auto gen = g.beams[cands[rank].beam].gen;
        gen.push_back(cands[rank].token);
        if (cands[rank].token == 2) { // EOS
          if (rank < GW) add(g, gen, cands[rank].sum);
          continue;
        }
        next.push_back({gen, cands[rank].sum});
        ++chosen[cands[rank].token];
      }
      g.beams = std::move(next);
      if (cur_len + 1 == max_new) {
        for (const Beam& b : g.beams)
          add(g, b.gen, b.sum);
        g.done = true;
        continue;
      }
      if (g.beams.empty()) {
        g.done = true;
        continue;
      }
      if (g.hyps.size() < GW) continue;
      double best = -1e300;
      for (const Beam& b : g.beams)
        best = std::max(best, b.sum);
      if (g.hyps.back().score >= best / std::pow(static_cast<double>(cur_len), alpha)) g.done = true;
    }
  }
  std::vector<RefHyp> all;
  for (const Group& g : groups)
    all.insert(all.end(), g.hyps.begin(), g.hyps.end());
  std::stable_sort(all.begin(), all.end(),
                   [](const RefHyp& a, const RefHyp& b) { return a.score > b.score; });
  return all;
}

TEST(BeamSearch, DiverseGroupsFollowHuggingFace) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  std::set<std::string> distinct;
  for (double penalty : {0.0, 0.4, 3.0})
    for (size_t groups : {2, 4}) {
      SCOPED_TRACE("penalty " + std::to_string(penalty) + " groups " + std::to_string(groups));
      const auto r = test::run_loom(
          "run -m " + model.string() +
              " -p hi -n 5 --json --set backend.name=fixture_scripted --plugin-path " + LOOM_FIXTURE_DIR +
              " --plugin-path " LOOM_BUILD_BIN_DIR +
              " --decoder beam_search --set decoder.beam_width=4 --set decoder.num_return=4 --set "
              "decoder.groups=" +
              std::to_string(groups) + " --set decoder.diversity_penalty=" + std::to_string(penalty),
          false, 60);
      ASSERT_EQ(r.code, 0) << r.err;
      const auto j = nlohmann::json::parse(r.out);
      auto want =
          hf_group_beam_search(j["prompt_tokens"].get<std::vector<int32_t>>(), 4, groups, penalty, 1.0, 5);
      if (want.size() > 4) want.resize(4);
      ASSERT_EQ(j["hypotheses"].size(), want.size()) << r.out;
      const std::string got = expect_hypotheses(j, want);
      distinct.insert(got);
    }
  EXPECT_GE(distinct.size(), 3u) << "the diversity penalty must change the hypotheses";
}

TEST(BeamSearch, DiversityPenaltySpreadsTheGroupsOnStories260K) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  auto first_tokens = [&](double penalty) {
    const auto r =
        loom_run("-m " + model.string() + " -p 'Once upon a time' -n 8 --ignore-eos --json" +
                 " --decoder beam_search --set decoder.beam_width=4 --set decoder.num_return=4" +
                 " --set decoder.groups=4 --set decoder.diversity_penalty=" + std::to_string(penalty));
    EXPECT_EQ(r.code, 0) << r.err;
    std::set<int32_t> firsts;
    const auto j = nlohmann::json::parse(r.out);
    for (const auto& h : j["hypotheses"])
      firsts.insert(h["tokens"][0].get<int32_t>());
    return firsts.size();
  };
  EXPECT_EQ(first_tokens(0.0), 1u) << "without a penalty the four one-beam groups are the same greedy search";
  EXPECT_EQ(first_tokens(50.0), 4u) << "a large penalty makes every group start differently";
}

TEST(BeamSearch, SampleModeDrawsThroughTheSamplerChain) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string base = "-m " + model.string() +
                           " -p 'Once upon a time' -n 12 --ignore-eos --json --decoder beam_search"
                           " --set decoder.beam_width=3 --set decoder.num_return=3 --set decoder.sample=true";
  // Seeded: the same seed gives the same hypotheses; other seeds give others.
  // A flat chain (temperature 3, no truncation), so that the draws matter.
  const std::string flat = " --temp 3 --top-k 0 --top-p 1 --min-p 0";
  const auto a = loom_run(base + " --seed 1" + flat), b = loom_run(base + " --seed 1" + flat);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["hypotheses"], nlohmann::json::parse(b.out)["hypotheses"]);
  std::set<std::string> texts;
  for (int seed = 1; seed <= 4; ++seed)
    texts.insert(
        nlohmann::json::parse(loom_run(base + " --seed " + std::to_string(seed) + flat).out)["text"]);
  EXPECT_GE(texts.size(), 3u) << "beam-sample draws: seeds must matter";
  // Through the chain: with top_k 1 every beam has a single candidate, so the search is greedy.
  const auto g =
      loom_run("-m " + model.string() + " -p 'Once upon a time' -n 12 --ignore-eos --json --temp 0");
  const auto k1 = loom_run(base + " --seed 3 --top-k 1");
  ASSERT_EQ(k1.code, 0) << k1.err;
  EXPECT_EQ(nlohmann::json::parse(k1.out)["tokens"], nlohmann::json::parse(g.out)["tokens"]);
}

TEST(BeamSearch, BadGroupKeysAreOneLineErrors) {
  LOOM_REQUIRE_BIN();
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const std::string base =
      "-m " + model.string() + " -p hi -n 4 --decoder beam_search --set decoder.beam_width=4";
  for (const auto& [args, expect] : std::vector<std::pair<std::string, std::string>>{
           {" --set decoder.groups=3", "groups must divide beam_width = 4"},
           {" --set decoder.diversity_penalty=-1 --set decoder.groups=2",
            "diversity_penalty must be a finite number ≥ 0"},
           {" --set decoder.diversity_penalty=1", "set groups ≥ 2"}}) {
    const auto r = loom_run(base + args);
    EXPECT_EQ(r.code, 1) << args;
    EXPECT_NE(r.err.find(expect), std::string::npos) << r.err;
  }
}

} // namespace

namespace {

// A finished hypothesis holds no KV: at width 8 with "." ending hypotheses early, the store never holds
// more sequences than the live beams (8) after a step — before, each of up to 8 finished hypotheses kept
// its sequence (16 held) until the request ended.
TEST(BeamSearch, FinishedHypothesesHoldNoKv) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  PipelineConfig cfg;
  cfg.model.path = model.string();
  cfg.model.n_ctx = 128;
  cfg.backend.name = "reference";
  cfg.plugins.paths = {LOOM_BUILD_BIN_DIR};
  cfg.decoder.name = "beam_search";
  cfg.decoder.params = {
      {"beam_width", int64_t{8}}, {"num_return", int64_t{8}}, {"early_stopping", std::string("never")}};
  cfg.stop.strings = {"."};
  auto p = Pipeline::create(cfg);
  GenerationRequest req;
  req.prompt = "Once upon a time";
  req.max_new_tokens = 40;
  p->submit(req);
  const KVCacheStore& kv = p->kv_store();
  int32_t most = 0;
  std::vector<std::pair<RequestId, GenerationResult>> done;
  for (int steps = 0; done.empty() && steps < 200; ++steps) {
    done = p->engine().step();
    most = std::max(most, kv.shape().n_seq_max - kv.free_sequences());
  }
  ASSERT_EQ(done.size(), 1u);
  const GenerationResult& r = done[0].second;
  ASSERT_EQ(r.n_best.size(), 8u);
  size_t early = 0; // hypotheses that ended on "." while others went on
  for (const auto& h : r.n_best)
    early += h.stop_reason == StopReason::stop_string ? 1 : 0;
  EXPECT_GE(early, 2u) << "the test needs hypotheses that finished before the search ended";
  EXPECT_LE(most, 8) << "sequences held after a step: the live beams only";
  EXPECT_EQ(kv.free_sequences(), kv.shape().n_seq_max) << "nothing held after the request";
}

} // namespace
