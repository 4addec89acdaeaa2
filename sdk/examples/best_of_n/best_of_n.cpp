// best_of_n.cpp — an out-of-tree Loom decoder plugin, built only against the installed SDK.
//
// Decoder "best_of_n": samples `n` independent completions of the prompt and reports all of them,
// best first by mean log-probability (sum of the generated tokens' log-probs / their count).
//
//   start()    no streaming: which completion wins is only known at the end.
//   plan()     first the prompt (sequence 0); afterwards every live sequence.
//   update()   once the prompt's logits exist, fork n-1 children from sequence 0 (a fork shares the
//              parent's tokens, KV cache, logits and sampler state), then sample and append one
//              token on every live sequence. Appending runs the stop rules, which finish sequences.
//   done()     when every sequence is finished.
//   results()  all sequences, sorted by mean log-prob, best first.
#include "loom/sdk/plugin.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace {

using loom::Session;

class BestOfN final : public loom::Decoder {
public:
  explicit BestOfN(const loom::sdk::Config& cfg) {
    const int64_t n = cfg.get_i64("n", 4);
    if (n < 1 || n > 64)
      throw loom::sdk::Error("best_of_n: `n` must be an integer in [1, 64], got " + std::to_string(n));
    n_ = static_cast<int>(n);
  }

  void start(Session& s) override {
    s.set_stream(-1);
    seqs_.assign(1, 0); // sequence 0 holds the prompt
    forked_ = false;
  }

  void plan(Session& s) override {
    for (const loom_seq seq : seqs_)
      if (s.finished(seq) == LOOM_STOP_NONE) s.plan(seq);
  }

  void update(Session& s) override {
    if (!forked_) {
      if (s.finished(0) != LOOM_STOP_NONE || s.logits(0).empty()) return; // the prompt is not evaluated yet
      for (int i = 1; i < n_; ++i) {
        const loom_seq child = s.fork(0);
        if (child < 0) break; // the KV cache has no free sequence: best of fewer
        seqs_.push_back(child);
      }
      forked_ = true;
    }
    for (const loom_seq seq : seqs_) {
      if (s.finished(seq) != LOOM_STOP_NONE || s.logits(seq).empty()) continue;
      s.append(seq, s.sample(seq));
    }
  }

  bool done(const Session& s) const override {
    return std::all_of(seqs_.begin(), seqs_.end(),
                       [&](loom_seq seq) { return s.finished(seq) != LOOM_STOP_NONE; });
  }

  void results(Session& s) override {
    std::vector<std::pair<double, loom_seq>> ranked;
    ranked.reserve(seqs_.size());
    for (const loom_seq seq : seqs_) {
      const size_t n_gen = std::max<size_t>(1, s.n_generated(seq));
      const double mean = s.score(seq) / static_cast<double>(n_gen);
      ranked.emplace_back(std::isnan(mean) ? -std::numeric_limits<double>::infinity() : mean, seq);
    }
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [mean_logprob, seq] : ranked)
      s.add_result(seq, mean_logprob);
  }

private:
  int n_ = 4;
  std::vector<loom_seq> seqs_{0};
  bool forked_ = false;
};

} // namespace

LOOM_PLUGIN_DEFINE("best_of_n", "1.0.0", LOOM_DECODER("best_of_n", BestOfN));
