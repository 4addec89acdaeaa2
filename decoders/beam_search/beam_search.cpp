// decoders/beam_search — beam search with Hugging Face `generate` semantics (deterministic, diverse
// groups, or beam-sample), a decoder plugin built against the SDK alone.
//
//   [decoder]
//   name = "beam_search"
//   beam_width = 4          # live beams (≥ 1), over all groups
//   length_penalty = 1.0    # a finished hypothesis scores sum(log p) / len^length_penalty
//   early_stopping = false  # true | false | "never" (HF: when the search may stop, see is_done)
//   num_return = 1          # hypotheses reported, best first (1 ≤ num_return ≤ beam_width)
//   groups = 1              # diverse beam search: beam_width / groups beams per group (HF num_beam_groups)
//   diversity_penalty = 0.0 # subtracted from a token's log-prob once per earlier group that chose it
//                           # this step (HF's Hamming diversity)
//   sample = false          # beam-sample: candidates drawn through the request's sampler chain
//
// Each step every live beam proposes its 2·W best next tokens under the model's log-softmax; the
// candidates are ranked by the beam's log-prob sum plus the token's, and the best ones become the
// next beams (a fork of their parent plus the token). A candidate whose token ends the sequence
// (EOS, a stop string, the token budget — the request's stop rules, per hypothesis) becomes a
// finished hypothesis when it ranks among the first W, as in HF's BeamSearchScorer; at most W are
// kept. Beams share nothing mutable: each is its own sequence, forked from its parent.
//
// With groups > 1 each group is such a search over W / groups beams, the groups taking turns within
// a step, and a group's token log-probs are lowered by diversity_penalty for each earlier group
// that picked the token in this step (Vijayakumar et al. 2016, as HF's group beam search; the
// penalised log-probs are what the beams accumulate). Hypotheses of all groups are ranked together.
//
// With sample = true (HF's beam-sample) a beam's next-token distribution is the request's sampler
// chain's (its temperature, top-k/p … with the beam's own sampler state); 2·W candidates are drawn
// without replacement with weights exp(beam sum + log p_chain), then ranked by that sum.
#include "loom/sdk/plugin.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace {

using loom::Session;

class BeamSearch final : public loom::Decoder {
public:
  explicit BeamSearch(const loom::sdk::Config& cfg) {
    const int64_t w = cfg.get_i64("beam_width", 4);
    if (w < 1 || w > 1024)
      throw loom::sdk::Error("beam_search: beam_width must be an integer in [1, 1024], got " +
                             std::to_string(w));
    width_ = static_cast<size_t>(w);
    alpha_ = cfg.get_f64("length_penalty", 1.0);
    if (!std::isfinite(alpha_))
      throw loom::sdk::Error("beam_search: length_penalty must be a finite number, got " +
                             std::to_string(alpha_));
    const int32_t es = cfg.type("early_stopping"); // true / false, or the string "never"
    if (es == LOOM_CONFIG_STRING) {
      const std::string v = cfg.get_str("early_stopping", "");
      if (v != "never")
        throw loom::sdk::Error("beam_search: early_stopping must be true, false or \"never\", got \"" + v +
                               "\"");
      early_ = Early::never;
    } else if (es == LOOM_CONFIG_BOOL || es == LOOM_CONFIG_NONE) {
      early_ = cfg.get_bool("early_stopping", false) ? Early::yes : Early::no;
    } else {
      throw loom::sdk::Error(
          "beam_search: early_stopping must be true, false or \"never\", got a number or a list");
    }
    const int64_t n = cfg.get_i64("num_return", 1);
    if (n < 1 || static_cast<size_t>(n) > width_)
      throw loom::sdk::Error("beam_search: num_return must be an integer in [1, beam_width = " +
                             std::to_string(width_) + "], got " + std::to_string(n));
    num_return_ = static_cast<size_t>(n);
    const int64_t g = cfg.get_i64("groups", 1);
    if (g < 1 || static_cast<size_t>(g) > width_ || width_ % static_cast<size_t>(g) != 0)
      throw loom::sdk::Error("beam_search: groups must divide beam_width = " + std::to_string(width_) +
                             " (an integer in [1, beam_width]), got " + std::to_string(g));
    n_groups_ = static_cast<size_t>(g);
    diversity_ = cfg.get_f64("diversity_penalty", 0.0);
    if (!std::isfinite(diversity_) || diversity_ < 0)
      throw loom::sdk::Error("beam_search: diversity_penalty must be a finite number ≥ 0, got " +
                             std::to_string(diversity_));
    if (diversity_ > 0 && n_groups_ == 1)
      throw loom::sdk::Error("beam_search: diversity_penalty applies between groups; set groups ≥ 2 "
                             "(beam_width / groups beams each)");
    sample_ = cfg.get_bool("sample", false);
  }

  void start(Session& s) override {
    max_new_ = s.max_new_tokens();
    s.set_stream(-1); // the answer is known only at the end
    groups_.assign(n_groups_, Group{});
    for (Group& g : groups_)
      g.beams.assign(1, Beam{0, 0.0}); // every group starts from the prompt
  }

  void plan(Session& s) override {
    std::vector<loom_seq> seen;
    for (const Group& g : groups_)
      for (const Beam& b : g.beams)
        if (std::find(seen.begin(), seen.end(), b.seq) == seen.end() && s.finished(b.seq) == LOOM_STOP_NONE) {
          seen.push_back(b.seq);
          s.plan(b.seq);
        }
  }

  void update(Session& s) override {
    for (const Group& g : groups_)
      for (const Beam& b : g.beams)
        if (s.logits(b.seq).empty()) return; // not evaluated yet (all beams are planned together)
    const size_t V = static_cast<size_t>(s.n_vocab());
    std::vector<size_t> chosen(diversity_ > 0 ? V : 0); // tokens the earlier groups took this step
    std::vector<loom_seq> old;
    for (Group& g : groups_) {
      for (const Beam& b : g.beams)
        old.push_back(b.seq);
      if (g.finished || g.beams.empty()) continue;
      step_group(s, g, chosen);
    }
    std::sort(old.begin(), old.end());
    old.erase(std::unique(old.begin(), old.end()), old.end());
    for (loom_seq q : old) // the old beams: each group's children are forks, so all may go
      s.free(q);
  }

  bool done(const Session&) const override {
    for (const Group& g : groups_)
      if (!g.finished) return false;
    return true;
  }

  void results(Session& s) override {
    std::vector<Hyp> all;
    for (const Group& g : groups_)
      all.insert(all.end(), g.done.begin(), g.done.end());
    std::stable_sort(all.begin(), all.end(), [](const Hyp& a, const Hyp& b) { return a.score > b.score; });
    for (size_t i = 0; i < all.size() && i < num_return_; ++i)
      s.add_result(all[i].seq, all[i].score);
  }

private:
  enum class Early { yes, no, never };
  struct Beam {
    loom_seq seq;
    double sum; // log-prob sum of its generated tokens (penalised, with groups; the chain's, sampling)
  };
  struct Hyp {
    loom_seq seq;
    double score;
  };
  struct Cand {
    double sum;
    size_t beam;
    loom_token token;
  };
  struct Group {
    std::vector<Beam> beams;
    std::vector<Hyp> done; // at most W / groups, best first
    bool finished = false;
  };

  size_t group_width() const { return width_ / n_groups_; }

  // One group's step: candidates, then the group's next beams and finished hypotheses.
  void step_group(Session& s, Group& g, std::vector<size_t>& chosen) {
    const size_t W = group_width(), V = static_cast<size_t>(s.n_vocab());
    const size_t per_beam = std::min(2 * W, V);
    std::vector<Cand> cands;
    std::vector<double> lp(V);
    std::vector<float> probs(sample_ ? V : 0);
    std::vector<loom_token> idx(V);
    std::vector<Cand> pool; // sampling: every (beam, token) with mass
    for (size_t i = 0; i < g.beams.size(); ++i) {
      // 1. The beam's next-token log-probs: the model's log-softmax, or the sampler chain's.
      if (sample_) {
        s.request().probs(g.beams[i].seq, probs);
        for (size_t t = 0; t < V; ++t)
          lp[t] = probs[t] > 0 ? std::log(static_cast<double>(probs[t]))
                               : -std::numeric_limits<double>::infinity();
      } else {
        const auto logits = s.logits(g.beams[i].seq);
        double mx = -std::numeric_limits<double>::infinity();
        for (float l : logits)
          mx = std::max(mx, static_cast<double>(l));
        double z = 0;
        for (float l : logits)
          z += std::exp(static_cast<double>(l) - mx);
        const double lse = mx + std::log(z);
        for (size_t t = 0; t < V; ++t)
          lp[t] = static_cast<double>(logits[t]) - lse;
      }
      if (!chosen.empty())
        for (size_t t = 0; t < V; ++t)
          lp[t] -= diversity_ * static_cast<double>(chosen[t]);
      if (sample_) {
        for (size_t t = 0; t < V; ++t)
          if (std::isfinite(lp[t])) pool.push_back({g.beams[i].sum + lp[t], i, static_cast<loom_token>(t)});
        continue;
      }
      // 2. Deterministic: its 2W best tokens (ties: lower id), scored by the beam's sum plus the token's.
      for (size_t t = 0; t < V; ++t)
        idx[t] = static_cast<loom_token>(t);
      std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(per_beam), idx.end(),
                        [&](loom_token a, loom_token b) {
                          const double la = lp[static_cast<size_t>(a)], lb = lp[static_cast<size_t>(b)];
                          return la > lb || (la == lb && a < b);
                        });
      for (size_t k = 0; k < per_beam; ++k) {
        const double l = lp[static_cast<size_t>(idx[k])];
        if (std::isfinite(l)) cands.push_back({g.beams[i].sum + l, i, idx[k]});
      }
    }
    if (sample_) { // 2W draws without replacement, weights exp(sum), from the request's RNG
      double mx = -std::numeric_limits<double>::infinity();
      for (const Cand& c : pool)
        mx = std::max(mx, c.sum);
      std::vector<double> w(pool.size());
      for (size_t i = 0; i < pool.size(); ++i)
        w[i] = std::exp(pool[i].sum - mx);
      for (size_t d = 0; d < 2 * W && d < pool.size(); ++d) {
        double total = 0;
        for (double x : w)
          total += x;
        if (!(total > 0)) break;
        const double target = s.request().uniform() * total;
        double cum = 0;
        size_t pick = pool.size();
        for (size_t i = 0; i < pool.size(); ++i) {
          if (w[i] <= 0) continue;
          pick = i;
          cum += w[i];
          if (cum > target) break;
        }
        cands.push_back(pool[pick]);
        w[pick] = 0;
      }
    }
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.sum > b.sum; });

    // 3. The next beams, in rank order. A candidate that ends its sequence by EOS, a stop string or a
    // stop token becomes a hypothesis when it ranks among the first W (HF's process()); one that
    // reaches the token budget takes a beam's place and becomes a hypothesis (HF's finalize()).
    const size_t cur_len = s.n_generated(g.beams.front().seq); // before this step's token
    std::vector<Beam> next;
    size_t taken = 0;
    for (size_t rank = 0; rank < cands.size() && taken < W; ++rank) {
      const Cand& c = cands[rank];
      const loom_seq child = s.fork(g.beams[c.beam].seq);
      if (child < 0) continue; // no free KV sequence: a narrower beam this step
      const int32_t why = s.append(child, c.token);
      if (why == LOOM_STOP_NONE) {
        next.push_back(Beam{child, c.sum});
        ++taken;
        if (!chosen.empty()) ++chosen[static_cast<size_t>(c.token)]; // HF counts the groups' new beams
      } else if (why == LOOM_STOP_MAX_TOKENS || why == LOOM_STOP_MAX_CONTEXT || why == LOOM_STOP_TIMEOUT) {
        add_done(s, g, child, c.sum);
        ++taken;
        if (!chosen.empty()) ++chosen[static_cast<size_t>(c.token)]; // a beam to HF until finalize()
      } else if (rank < W) {
        add_done(s, g, child, c.sum);
      } else {
        s.free(child);
      }
    }
    g.beams = std::move(next);
    if (is_done(g, cur_len)) {
      g.finished = true; // HF: a finished group adds no live beam; its beams are released with the old
      for (const Beam& b : g.beams)
        s.free(b.seq);
      g.beams.clear();
    }
  }

  double score_of(double sum, size_t len) const {
    return sum / std::pow(static_cast<double>(std::max<size_t>(1, len)), alpha_);
  }

  // Keeps the group's W best finished hypotheses, best first; a pushed-out one's sequence is freed.
  void add_done(Session& s, Group& g, loom_seq seq, double sum) {
    const Hyp h{seq, score_of(sum, s.n_generated(seq))};
    auto at = std::upper_bound(g.done.begin(), g.done.end(), h,
                               [](const Hyp& a, const Hyp& b) { return a.score > b.score; });
    g.done.insert(at, h);
    if (g.done.size() > group_width()) {
      s.free(g.done.back().seq);
      g.done.pop_back();
    }
  }

  // HF's BeamHypotheses.is_done, with HF's lengths: `cur_len` is the generated length before this
  // step's token; "never" bounds by the longest a beam may become (the token budget).
  bool is_done(const Group& g, size_t cur_len) const {
    if (g.beams.empty()) return true;
    if (g.done.size() < group_width()) return false;
    if (early_ == Early::yes) return true;
    double best = -std::numeric_limits<double>::infinity();
    for (const Beam& b : g.beams)
      best = std::max(best, b.sum);
    size_t len = cur_len;
    if (early_ == Early::never && alpha_ > 0 && max_new_ > 0) len = static_cast<size_t>(max_new_);
    return g.done.back().score >= best / std::pow(static_cast<double>(len), alpha_);
  }

  size_t width_ = 4;
  double alpha_ = 1.0;
  Early early_ = Early::no;
  size_t num_return_ = 1;
  size_t n_groups_ = 1;
  double diversity_ = 0.0;
  bool sample_ = false;
  int32_t max_new_ = -1;
  std::vector<Group> groups_;
};

} // namespace

LOOM_PLUGIN_DEFINE("beam_search", "1.0.0", LOOM_DECODER("beam_search", BeamSearch));
