// decoders/self_consistency — sample N completions of one prompt and answer by majority vote over
// the answers extracted from them (Wang et al., "Self-Consistency Improves Chain of Thought
// Reasoning"). A decoder plugin built against the SDK alone.
//
//   [decoder]
//   name = "self_consistency"
//   samples = 8                  # completions, forked from the evaluated prompt (1..256)
//   answer_regex = "= (\\d+)"    # one capture group: the answer; or "last_number" (the default)
//   weighting = "count"          # "count": one vote each; "logprob": each vote weighs exp(mean log-prob)
//   verifier = "none"            # "weight": a vote also weighs the pipeline's [verifier] score;
//                                # "filter": candidates scoring below verifier_min do not vote
//   verifier_min = 0.5
//
// Every completion is sampled with the request's sampler chain and seeded RNG and ends by the
// request's stop rules. A completion without an answer does not vote. The winner has the largest
// vote weight; ties go to the answer whose candidates have the higher mean log-prob. `--json` adds
// `answer`, `votes` [{answer, count, share}] and `candidates` [{text, answer, mean_logprob}];
// `tokens`/`text` are the best candidate (highest mean log-prob) that gave the winning answer.
#include "loom/sdk/plugin.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

namespace {

using loom::Session;

// JSON string literal of s (UTF-8 passed through; control characters and invalid bytes escaped).
std::string json_string(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x80) {
      size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0; // a well-formed UTF-8 sequence is kept
      bool ok = c >= 0x80 && n > 0 && i + n <= s.size();
      for (size_t k = 1; ok && k < n; ++k)
        ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
      if (ok) {
        out.append(s, i, n);
        i += n - 1;
      } else {
        out += c < 0x20 ? std::string("\\u00") + hex[c >> 4] + hex[c & 15] : std::string("\\ufffd");
      }
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

class SelfConsistency final : public loom::Decoder {
public:
  explicit SelfConsistency(const loom::sdk::Config& cfg) {
    const int64_t n = cfg.get_i64("samples", 8);
    if (n < 1 || n > 256)
      throw loom::sdk::Error("self_consistency: samples must be an integer in [1, 256], got " +
                             std::to_string(n));
    samples_ = static_cast<int>(n);
    const std::string rx = cfg.get_str("answer_regex", "last_number");
    try {
      regex_ = std::regex(rx == "last_number" ? std::string("(-?[0-9]+(?:\\.[0-9]+)?)") : rx,
                          std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw loom::sdk::Error("self_consistency: answer_regex does not compile (" + std::string(e.what()) +
                             "); expected an ECMAScript regex with one capture group, or \"last_number\"");
    }
    if (regex_.mark_count() != 1)
      throw loom::sdk::Error(
          "self_consistency: answer_regex must have exactly one capture group (the answer), it has " +
          std::to_string(regex_.mark_count()));
    last_ = rx == "last_number";
    const std::string w = cfg.get_str("weighting", "count");
    if (w != "count" && w != "logprob")
      throw loom::sdk::Error("self_consistency: weighting must be \"count\" or \"logprob\", got \"" + w +
                             "\"");
    by_logprob_ = w == "logprob";
    verifier_ = cfg.get_str("verifier", "none");
    if (verifier_ != "none" && verifier_ != "weight" && verifier_ != "filter")
      throw loom::sdk::Error("self_consistency: verifier must be \"none\", \"weight\" or \"filter\", got \"" +
                             verifier_ + "\"");
    verifier_min_ = cfg.get_f64("verifier_min", 0.5);
    if (!(verifier_min_ >= 0 && verifier_min_ <= 1))
      throw loom::sdk::Error("self_consistency: verifier_min must be in [0, 1], got " +
                             std::to_string(verifier_min_));
  }

  void start(Session& s) override {
    if (verifier_ != "none" && !s.verification().available())
      throw loom::sdk::Error("self_consistency: verifier = \"" + verifier_ +
                             "\" needs a verifier in the pipeline: add a [verifier] section");
    s.set_stream(-1); // the answer is known only when every sample has finished
    seqs_.assign(1, 0);
    forked_ = false;
  }

  void plan(Session& s) override {
    for (const loom_seq q : seqs_)
      if (s.finished(q) == LOOM_STOP_NONE) s.plan(q);
  }

  void update(Session& s) override {
    if (!forked_) {
      if (s.finished(0) != LOOM_STOP_NONE || s.logits(0).empty()) return; // the prompt is not evaluated yet
      for (int i = 1; i < samples_; ++i) { // the samples share the evaluated prompt (fork)
        const loom_seq q = s.fork(0);
        if (q < 0) break; // no free KV sequence: fewer samples
        seqs_.push_back(q);
      }
      forked_ = true;
    }
    for (const loom_seq q : seqs_)
      if (s.finished(q) == LOOM_STOP_NONE && !s.logits(q).empty()) s.append(q, s.sample(q));
  }

  bool done(const Session& s) const override {
    return forked_ && std::all_of(seqs_.begin(), seqs_.end(),
                                  [&](loom_seq q) { return s.finished(q) != LOOM_STOP_NONE; });
  }

  void results(Session& s) override {
    struct Cand {
      loom_seq seq;
      std::string text;
      std::optional<std::string> answer;
      double mean_lp;
      std::optional<double> verified; // the verifier's score, when one is used
      std::string verify_error;       // why the verifier gave none
    };
    std::vector<Cand> cands;
    const size_t n_prompt = s.n_prompt();
    for (const loom_seq q : seqs_) {
      const auto toks = s.tokens(q);
      const std::string text = s.request().detokenize(toks.subspan(n_prompt));
      const size_t n = std::max<size_t>(1, s.n_generated(q));
      cands.push_back({q, text, extract(text), s.score(q) / static_cast<double>(n), std::nullopt, {}});
    }
    // Every candidate in one verifier call (a judge model batches them); one that fails verification,
    // or gets no score in [0, 1], has no vote.
    if (verifier_ != "none") {
      std::vector<std::string> texts;
      for (const Cand& c : cands)
        texts.push_back(c.text);
      const auto verdicts = s.verification().score_many(texts);
      for (size_t i = 0; i < cands.size(); ++i)
        if (!verdicts[i].ok())
          cands[i].verify_error = verdicts[i].error;
        else if (!(verdicts[i].score >= 0 && verdicts[i].score <= 1))
          cands[i].verify_error = "the verifier returned " + std::to_string(verdicts[i].score);
        else
          cands[i].verified = verdicts[i].score;
    }
    // Votes: weight per answer; ties by the answer's mean log-prob over its candidates.
    struct Tally {
      int count = 0;
      double weight = 0, lp_sum = 0;
    };
    std::map<std::string, Tally> tally;
    int voters = 0;
    for (const Cand& c : cands) {
      if (!c.answer) continue;
      if (verifier_ != "none" && !c.verified) continue;                   // failed verification: no vote
      if (verifier_ == "filter" && *c.verified < verifier_min_) continue; // filtered out: no vote
      Tally& t = tally[*c.answer];
      ++t.count;
      ++voters;
      t.weight += (by_logprob_ ? std::exp(c.mean_lp) : 1.0) * (verifier_ == "weight" ? *c.verified : 1.0);
      t.lp_sum += c.mean_lp;
    }
    std::vector<std::pair<std::string, Tally>> ranked(tally.begin(), tally.end());
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
      if (a.second.weight != b.second.weight) return a.second.weight > b.second.weight;
      return a.second.lp_sum / a.second.count > b.second.lp_sum / b.second.count;
    });
    const std::optional<std::string> winner =
        ranked.empty() ? std::nullopt : std::optional<std::string>(ranked.front().first);

    // Hypotheses: the winner's candidates first, then the rest; each group by mean log-prob.
    std::vector<const Cand*> order;
    for (const Cand& c : cands)
      order.push_back(&c);
    std::stable_sort(order.begin(), order.end(), [&](const Cand* a, const Cand* b) {
      const bool wa = winner && a->answer == winner, wb = winner && b->answer == winner;
      if (wa != wb) return wa;
      return a->mean_lp > b->mean_lp;
    });
    for (const Cand* c : order)
      s.add_result(c->seq, c->mean_lp);

    s.request().set_output("answer", winner ? json_string(*winner) : "null");
    std::string votes = "[";
    for (size_t i = 0; i < ranked.size(); ++i)
      votes += (i ? "," : "") + std::string("{\"answer\":") + json_string(ranked[i].first) +
               ",\"count\":" + std::to_string(ranked[i].second.count) +
               ",\"share\":" + json_number(static_cast<double>(ranked[i].second.count) / voters) + "}";
    s.request().set_output("votes", votes + "]");
    std::string list = "[";
    for (size_t i = 0; i < cands.size(); ++i)
      list += (i ? "," : "") + std::string("{\"text\":") + json_string(cands[i].text) +
              ",\"answer\":" + (cands[i].answer ? json_string(*cands[i].answer) : "null") +
              ",\"mean_logprob\":" + json_number(cands[i].mean_lp) +
              (cands[i].verified ? ",\"verifier_score\":" + json_number(*cands[i].verified) : std::string()) +
              (cands[i].verify_error.empty() ? std::string()
                                             : ",\"verifier_error\":" + json_string(cands[i].verify_error)) +
              "}";
    s.request().set_output("candidates", list + "]");
  }

private:
  // The answer in a completion: the capture group of the first match (the last one for
  // "last_number"); none when the regex does not match.
  std::optional<std::string> extract(const std::string& text) const {
    std::optional<std::string> found;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), regex_); it != std::sregex_iterator();
         ++it) {
      found = (*it)[1].str();
      if (!last_) break;
    }
    return found;
  }

  int samples_ = 8;
  std::regex regex_;
  bool last_ = true;
  bool by_logprob_ = false;
  std::string verifier_ = "none";
  double verifier_min_ = 0.5;
  std::vector<loom_seq> seqs_{0};
  bool forked_ = false;
};

} // namespace

LOOM_PLUGIN_DEFINE("self_consistency", "1.0.0", LOOM_DECODER("self_consistency", SelfConsistency));
