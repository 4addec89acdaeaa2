// decoders/beam_search — deterministic beam search (Hugging Face `generate` semantics), a decoder
// plugin built against the SDK alone.
//
//   [decoder]
//   name = "beam_search"
//   beam_width = 4          # live beams (≥ 1)
//   length_penalty = 1.0    # a finished hypothesis scores sum(log p) / len^length_penalty
//   early_stopping = false  # true | false | "never" (HF: when the search may stop, see is_done)
//   num_return = 1          # hypotheses reported, best first (1 ≤ num_return ≤ beam_width)
//
// Each step every live beam proposes its 2·W best next tokens under the model's log-softmax; the
// candidates are ranked by the beam's log-prob sum plus the token's, and the best ones become the
// next beams (a fork of their parent plus the token). A candidate whose token ends the sequence
// (EOS, a stop string, the token budget — the request's stop rules, per hypothesis) becomes a
// finished hypothesis when it ranks among the first W, as in HF's BeamSearchScorer; at most W are
// kept. Beams share nothing mutable: each is its own sequence, forked from its parent.
#include "loom/sdk/plugin.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace {

using loom::sdk::Session;

class BeamSearch final : public loom::sdk::Decoder {
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
  }

  void start(Session& s) override {
    max_new_ = s.max_new_tokens();
    s.set_stream(-1); // the answer is known only at the end
    beams_.assign(1, Beam{0, 0.0});
    done_.clear();
    finished_ = false;
  }

  void plan(Session& s) override {
    for (const Beam& b : beams_)
      if (s.finished(b.seq) == LOOM_STOP_NONE) s.plan(b.seq);
  }

  void update(Session& s) override {
    if (finished_ || beams_.empty()) return;
    for (const Beam& b : beams_)
      if (s.logits(b.seq).empty()) return; // not evaluated yet (all beams are planned together)
    // 1. Candidates: each beam's 2W best tokens, scored by the beam's sum plus the token's log-prob.
    struct Cand {
      double sum;
      size_t beam;
      loom_token token;
    };
    std::vector<Cand> cands;
    const size_t per_beam = std::min(2 * width_, static_cast<size_t>(s.n_vocab()));
    std::vector<loom_token> idx(static_cast<size_t>(s.n_vocab()));
    for (size_t i = 0; i < beams_.size(); ++i) {
      const auto logits = s.logits(beams_[i].seq);
      double mx = -std::numeric_limits<double>::infinity();
      for (float l : logits)
        mx = std::max(mx, static_cast<double>(l));
      double z = 0;
      for (float l : logits)
        z += std::exp(static_cast<double>(l) - mx);
      const double lse = mx + std::log(z);
      for (size_t t = 0; t < idx.size(); ++t)
        idx[t] = static_cast<loom_token>(t);
      std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(per_beam), idx.end(),
                        [&](loom_token a, loom_token b) {
                          const float la = logits[static_cast<size_t>(a)],
                                      lb = logits[static_cast<size_t>(b)];
                          return la > lb || (la == lb && a < b);
                        });
      for (size_t k = 0; k < per_beam; ++k) {
        const double lp = static_cast<double>(logits[static_cast<size_t>(idx[k])]) - lse;
        if (std::isfinite(lp)) cands.push_back({beams_[i].sum + lp, i, idx[k]});
      }
    }
    std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.sum > b.sum; });

    // 2. The next beams, in rank order. A candidate that ends its sequence by EOS, a stop string or a
    // stop token becomes a hypothesis when it ranks among the first W (HF's process()); one that
    // reaches the token budget takes a beam's place and becomes a hypothesis (HF's finalize()).
    const size_t cur_len = s.n_generated(beams_.front().seq); // before this step's token
    std::vector<Beam> next;
    size_t taken = 0;
    for (size_t rank = 0; rank < cands.size() && taken < width_; ++rank) {
      const Cand& c = cands[rank];
      const loom_seq child = s.fork(beams_[c.beam].seq);
      if (child < 0) continue; // no free KV sequence: a narrower beam this step
      const int32_t why = s.append(child, c.token);
      if (why == LOOM_STOP_NONE) {
        next.push_back(Beam{child, c.sum});
        ++taken;
      } else if (why == LOOM_STOP_MAX_TOKENS || why == LOOM_STOP_MAX_CONTEXT || why == LOOM_STOP_TIMEOUT) {
        add_done(s, child, c.sum);
        ++taken;
      } else if (rank < width_) {
        add_done(s, child, c.sum);
      } else {
        s.free(child);
      }
    }
    for (const Beam& b : beams_)
      s.free(b.seq);
    beams_ = std::move(next);
    if (is_done(cur_len)) finish(s);
  }

  bool done(const Session&) const override { return finished_; }

  void results(Session& s) override {
    for (size_t i = 0; i < done_.size() && i < num_return_; ++i)
      s.add_result(done_[i].seq, done_[i].score);
  }

private:
  enum class Early { yes, no, never };
  struct Beam {
    loom_seq seq;
    double sum; // log-prob sum of its generated tokens
  };
  struct Hyp {
    loom_seq seq;
    double score;
  };

  double score_of(double sum, size_t len) const {
    return sum / std::pow(static_cast<double>(std::max<size_t>(1, len)), alpha_);
  }

  // Keeps the W best finished hypotheses, best first; a pushed-out one's sequence is freed.
  void add_done(Session& s, loom_seq seq, double sum) {
    const Hyp h{seq, score_of(sum, s.n_generated(seq))};
    auto at = std::upper_bound(done_.begin(), done_.end(), h,
                               [](const Hyp& a, const Hyp& b) { return a.score > b.score; });
    done_.insert(at, h);
    if (done_.size() > width_) {
      s.free(done_.back().seq);
      done_.pop_back();
    }
  }

  // HF's BeamHypotheses.is_done, with HF's lengths: `cur_len` is the generated length before this
  // step's token; "never" bounds by the longest a beam may become (the token budget).
  bool is_done(size_t cur_len) const {
    if (beams_.empty()) return true;
    if (done_.size() < width_) return false;
    if (early_ == Early::yes) return true;
    double best = -std::numeric_limits<double>::infinity();
    for (const Beam& b : beams_)
      best = std::max(best, b.sum);
    size_t len = cur_len;
    if (early_ == Early::never && alpha_ > 0 && max_new_ > 0) len = static_cast<size_t>(max_new_);
    return done_.back().score >= best / std::pow(static_cast<double>(len), alpha_);
  }

  // Ends the search (HF: a finished batch adds no live beam); the live beams are released.
  void finish(Session& s) {
    finished_ = true;
    for (const Beam& b : beams_)
      s.free(b.seq);
    beams_.clear();
  }

  size_t width_ = 4;
  double alpha_ = 1.0;
  Early early_ = Early::no;
  size_t num_return_ = 1;
  int32_t max_new_ = -1;
  std::vector<Beam> beams_;
  std::vector<Hyp> done_;
  bool finished_ = false;
};

} // namespace

LOOM_PLUGIN_DEFINE("beam_search", "1.0.0", LOOM_DECODER("beam_search", BeamSearch));
