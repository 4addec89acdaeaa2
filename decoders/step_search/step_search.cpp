// decoders/step_search — search over reasoning *steps* guided by a verifier (Snell et al. 2024,
// "Scaling LLM Test-Time Compute Optimally": beam search and lookahead over a process reward). A
// decoder plugin built against the SDK alone.
//
//   [decoder]
//   name = "step_search"
//   mode = "beam"            # "beam" | "best_first" | "lookahead"
//   beam_width = 4           # beam / lookahead: partial solutions kept after each step (1..64)
//   expansions = 4           # candidate steps sampled from each expanded partial solution (1..64)
//   expand = "sample"        # "sample": each candidate step drawn with the request's sampler chain
//                            # (identical siblings merged); "first_token": the `expansions` most likely
//                            # first tokens, each step then continued by the sampler chain
//   step_delimiter = "\n"    # a step ends at the first delimiter after some non-blank text …
//   max_step_tokens = 64     # … or after this many tokens (1..4096)
//   max_steps = 32           # a partial solution of this many steps is finished as it is (1..1024)
//   max_expansions = 16      # best_first: partial solutions expanded at most (1..4096)
//   queue_size = 16          # best_first: open partial solutions held at most (the worst are freed)
//   lookahead = 1            # lookahead: a candidate is scored by rolling it `lookahead` steps further
//                            # greedily and verifying the roll-out (1..16)
//   aggregate = "best"       # "best" | "majority" | "weighted" (votes weighted by verifier score)
//   answer_regex = "last_number" # majority / weighted: one capture group, or "last_number"
//
// Every partial solution is its own sequence; the candidates of one step are forks of their parent,
// so they share its KV blocks on the paged store and are sampled in one batched forward each step.
// A candidate is scored by the pipeline's [verifier] on the generated text of its whole path (the
// request's prompt passed along); a verifier that fails or returns no number in [0, 1] fails that
// candidate only. Pruned and failed candidates are freed at once. Ranking: score, then mean log-prob,
// then creation order. A sequence that ends by the request's stop rules (EOS, a stop string, the
// token budget) is a finished solution.
//
//   beam: each round expands every kept partial solution; the `beam_width` best unfinished
//     candidates are kept, finished ones become answers; ends when none is kept.
//   best_first: a priority queue of scored partial solutions (finished ones too); each round pops the
//     best: a finished one is an answer, an unfinished one is expanded. Ends with beam_width answers,
//     an empty queue, or after max_expansions expansions (the finished solutions still queued then
//     become answers, best first).
//   lookahead: beam, with each unfinished candidate scored on its greedy roll-out.
//
// `--json` adds `answer`, `votes` and `search` {mode, rounds, expansions, nodes: [{id, parent, depth,
// text, tokens, score, mean_logprob, state, stop_reason?, error?}]}, state one of expanded, kept,
// pruned, duplicate, failed, answer, finished (an answer not among the results: best_first leftovers
// never happen, beam keeps every finished candidate as an answer), open (still queued at the end).
// `tokens`/`text` are the best answer with the winning answer.
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

std::string json_string(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x80) {
      size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
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
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

const char* stop_name(int32_t r) {
  switch (r) {
  case LOOM_STOP_EOS:
    return "eos";
  case LOOM_STOP_STOP_TOKEN:
    return "stop_token";
  case LOOM_STOP_STOP_STRING:
    return "stop_string";
  case LOOM_STOP_MAX_TOKENS:
    return "max_tokens";
  case LOOM_STOP_MAX_CONTEXT:
    return "max_context";
  case LOOM_STOP_TIMEOUT:
    return "timeout";
  case LOOM_STOP_CANCELLED:
    return "cancelled";
  case LOOM_STOP_CUSTOM:
    return "custom";
  default:
    return "error";
  }
}

int64_t int_key(const loom::sdk::Config& cfg, const char* key, int64_t def, int64_t lo, int64_t hi) {
  const int64_t v = cfg.get_i64(key, def);
  if (v < lo || v > hi)
    throw loom::sdk::Error("step_search: " + std::string(key) + " must be an integer in [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(v));
  return v;
}

class StepSearch final : public loom::Decoder {
public:
  explicit StepSearch(const loom::sdk::Config& cfg) {
    const std::string mode = cfg.get_str("mode", "beam");
    if (mode == "beam")
      mode_ = Mode::beam;
    else if (mode == "best_first")
      mode_ = Mode::best_first;
    else if (mode == "lookahead")
      mode_ = Mode::lookahead;
    else
      throw loom::sdk::Error("step_search: mode must be \"beam\", \"best_first\" or \"lookahead\", got \"" +
                             mode + "\"");
    mode_name_ = mode;
    width_ = static_cast<size_t>(int_key(cfg, "beam_width", 4, 1, 64));
    expansions_ = static_cast<size_t>(int_key(cfg, "expansions", 4, 1, 64));
    const std::string ex = cfg.get_str("expand", "sample");
    if (ex != "sample" && ex != "first_token")
      throw loom::sdk::Error("step_search: expand must be \"sample\" or \"first_token\", got \"" + ex + "\"");
    first_token_ = ex == "first_token";
    delim_ = cfg.get_str("step_delimiter", "\n");
    if (delim_.empty())
      throw loom::sdk::Error(
          "step_search: step_delimiter must not be empty (steps may end at max_step_tokens "
          "alone: set a delimiter the model never writes)");
    max_step_tokens_ = static_cast<size_t>(int_key(cfg, "max_step_tokens", 64, 1, 4096));
    max_steps_ = static_cast<size_t>(int_key(cfg, "max_steps", 32, 1, 1024));
    max_expansions_ = static_cast<size_t>(int_key(cfg, "max_expansions", 16, 1, 4096));
    queue_size_ = static_cast<size_t>(int_key(cfg, "queue_size", 16, 1, 4096));
    lookahead_ = static_cast<size_t>(int_key(cfg, "lookahead", 1, 1, 16));
    const std::string ag = cfg.get_str("aggregate", "best");
    if (ag != "best" && ag != "majority" && ag != "weighted")
      throw loom::sdk::Error("step_search: aggregate must be \"best\", \"majority\" or \"weighted\", got \"" +
                             ag + "\"");
    aggregate_ = ag;
    const std::string rx = cfg.get_str("answer_regex", "last_number");
    try {
      regex_ = std::regex(rx == "last_number" ? std::string("(-?[0-9][0-9,]*(?:\\.[0-9]+)?)") : rx,
                          std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw loom::sdk::Error("step_search: answer_regex does not compile (" + std::string(e.what()) +
                             "); expected an ECMAScript regex with one capture group, or \"last_number\"");
    }
    if (regex_.mark_count() != 1)
      throw loom::sdk::Error(
          "step_search: answer_regex must have exactly one capture group (the answer), it has " +
          std::to_string(regex_.mark_count()));
    last_number_ = rx == "last_number";
    if (mode_ != Mode::best_first && (cfg.has("max_expansions") || cfg.has("queue_size")))
      throw loom::sdk::Error("step_search: max_expansions and queue_size apply to mode = \"best_first\"");
    if (mode_ != Mode::lookahead && cfg.has("lookahead"))
      throw loom::sdk::Error("step_search: lookahead applies to mode = \"lookahead\"");
  }

  void start(Session& s) override {
    if (!s.verification().available())
      throw loom::sdk::Error("step_search: needs a verifier to score steps; add a [verifier] section "
                             "(e.g. name = \"arith_check\")");
    s.set_stream(-1); // the answer is known only at the end
    n_prompt_ = s.n_prompt();
    nodes_.clear();
    nodes_.push_back(Node{});
    nodes_[0].seq = 0;
    nodes_[0].state = State::kept;
    frontier_ = {0};
    phase_ = Phase::expand;
  }

  void plan(Session& s) override {
    advance(s);
    if (phase_ == Phase::expand) {
      for (int id : frontier_)
        if (s.logits(nodes_[static_cast<size_t>(id)].seq).empty())
          s.plan(nodes_[static_cast<size_t>(id)].seq);
      return;
    }
    for (const Gen& g : gens_)
      if (!g.complete && s.finished(g.seq) == LOOM_STOP_NONE) s.plan(g.seq);
  }

  void update(Session& s) override {
    if (phase_ == Phase::generate || phase_ == Phase::rollout)
      for (Gen& g : gens_) {
        if (g.complete) continue;
        if (const int32_t why = s.finished(g.seq); why != LOOM_STOP_NONE) { // ended by the host
          g.complete = true;
          if (!g.rollout) {
            Node& n = nodes_[static_cast<size_t>(g.node)];
            n.text = s.request().detokenize(g.step);
            n.n_tokens = g.step.size();
            n.stop = why;
          }
          continue;
        }
        if (s.logits(g.seq).empty()) continue;
        const loom_token t = g.rollout ? argmax(s.logits(g.seq)) : s.sample(g.seq);
        extend(s, g, t);
      }
    advance(s);
  }

  bool done(const Session&) const override { return phase_ == Phase::done; }

  void results(Session& s) override {
    if (answers_.empty()) {
      std::string why = "every candidate step failed verification";
      for (const Node& n : nodes_)
        if (!n.error.empty()) {
          why += " (the first: " + n.error + ")";
          break;
        }
      throw loom::sdk::Error("step_search: no solution: " + why);
    }
    // Answers best first; the aggregate picks the winning answer; the winner's solutions lead.
    std::vector<int> order = answers_;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return better(a, b); });
    struct Tally {
      int count = 0;
      double weight = 0;
      int best = -1; // its best solution
    };
    std::map<std::string, Tally> tally;
    for (int id : order) {
      if (!nodes_[id].answer) continue;
      Tally& t = tally[*nodes_[id].answer];
      ++t.count;
      t.weight += aggregate_ == "weighted" ? std::max(0.0, nodes_[id].score) : 1.0;
      if (t.best < 0) t.best = id;
    }
    std::vector<std::pair<std::string, Tally>> ranked(tally.begin(), tally.end());
    std::stable_sort(ranked.begin(), ranked.end(), [&](const auto& a, const auto& b) {
      if (aggregate_ != "best" && a.second.weight != b.second.weight)
        return a.second.weight > b.second.weight;
      return better(a.second.best, b.second.best); // "best", and ties: the better best solution
    });
    std::optional<std::string> winner;
    if (aggregate_ == "best") {
      if (!order.empty()) winner = nodes_[order.front()].answer;
    } else if (!ranked.empty()) {
      winner = ranked.front().first;
    }
    std::stable_partition(order.begin(), order.end(),
                          [&](int id) { return winner && nodes_[id].answer == winner; });
    for (int id : order)
      s.add_result(nodes_[id].seq, nodes_[id].score);
    s.request().set_output("answer", winner ? json_string(*winner) : "null");
    std::string votes = "[";
    for (size_t i = 0; i < ranked.size(); ++i)
      votes += (i ? "," : "") + std::string("{\"answer\":") + json_string(ranked[i].first) +
               ",\"count\":" + std::to_string(ranked[i].second.count) +
               ",\"weight\":" + json_number(ranked[i].second.weight) + "}";
    s.request().set_output("votes", votes + "]");
    std::string tree = "{\"mode\":" + json_string(mode_name_) + ",\"rounds\":" + std::to_string(rounds_) +
                       ",\"expansions\":" + std::to_string(n_expanded_) + ",\"nodes\":[";
    for (size_t i = 1; i < nodes_.size(); ++i) {
      const Node& n = nodes_[i];
      tree +=
          (i > 1 ? "," : "") + std::string("{\"id\":") + std::to_string(i) +
          ",\"parent\":" + std::to_string(n.parent) + ",\"depth\":" + std::to_string(n.depth) +
          ",\"text\":" + json_string(n.text) + ",\"tokens\":" + std::to_string(n.n_tokens) +
          ",\"score\":" + json_number(n.score) + ",\"mean_logprob\":" + json_number(mean_lp(n)) +
          ",\"state\":\"" + state_name(n.state) + "\"" +
          (n.stop != LOOM_STOP_NONE ? std::string(",\"stop_reason\":\"") + stop_name(n.stop) + "\"" : "") +
          (n.error.empty() ? "" : ",\"error\":" + json_string(n.error)) + "}";
    }
    s.request().set_output("search", tree + "]}");
    s.request().set_metric("search_nodes", static_cast<double>(nodes_.size() - 1));
    s.request().set_metric("search_expansions", static_cast<double>(n_expanded_));
    s.request().set_metric("search_rounds", static_cast<double>(rounds_));
    s.request().set_metric("verifier_calls", static_cast<double>(verifier_calls_));
    s.request().set_metric("verifier_batches", static_cast<double>(verifier_batches_));
  }

private:
  enum class Mode { beam, best_first, lookahead };
  enum class Phase { expand, generate, rollout, done };
  enum class State { generating, scored, expanded, kept, pruned, duplicate, failed, answer, open };
  static const char* state_name(State s) {
    switch (s) {
    case State::generating:
      return "generating";
    case State::scored:
      return "scored";
    case State::expanded:
      return "expanded";
    case State::kept:
      return "kept";
    case State::pruned:
      return "pruned";
    case State::duplicate:
      return "duplicate";
    case State::failed:
      return "failed";
    case State::answer:
      return "answer";
    case State::open:
      return "open";
    }
    return "?";
  }
  struct Node {
    int parent = -1;
    size_t depth = 0;
    loom_seq seq = -1; // the sequence ending at this node; -1 once freed
    std::string text;  // this step's text
    size_t n_tokens = 0;
    double score = std::numeric_limits<double>::quiet_NaN();
    double logprob = 0; // the path's generated log-prob sum
    size_t n_gen = 0;   // the path's generated tokens
    int32_t stop = LOOM_STOP_NONE;
    State state = State::generating;
    std::string error;
    std::optional<std::string> answer;
  };
  struct Gen { // a step being generated (or a roll-out of one)
    int node;
    loom_seq seq;
    bool rollout = false;
    size_t steps_left = 0; // roll-outs: steps still to go
    std::vector<loom_token> step;
    bool complete = false;
  };

  static loom_token argmax(std::span<const float> l) {
    size_t best = 0;
    for (size_t i = 1; i < l.size(); ++i)
      if (l[i] > l[best]) best = i;
    return static_cast<loom_token>(best);
  }
  double mean_lp(const Node& n) const { return n.n_gen ? n.logprob / static_cast<double>(n.n_gen) : 0.0; }
  // Ranking: score (a failed one last), mean log-prob, creation order.
  bool better(int a, int b) const {
    const Node &x = nodes_[static_cast<size_t>(a)], &y = nodes_[static_cast<size_t>(b)];
    const double sx = std::isfinite(x.score) ? x.score : -1, sy = std::isfinite(y.score) ? y.score : -1;
    if (sx != sy) return sx > sy;
    if (mean_lp(x) != mean_lp(y)) return mean_lp(x) > mean_lp(y);
    return a < b;
  }

  void release(Session& s, Node& n) {
    if (n.seq >= 0) s.free(n.seq);
    n.seq = -1;
  }

  // Moves the search on as far as it can without a forward: expands a frontier whose logits are all
  // there, and closes a round whose steps (and roll-outs) are all complete.
  void advance(Session& s) {
    for (;;) {
      if (phase_ == Phase::expand) {
        for (size_t i = 0; i < frontier_.size();) { // one the host ended (its context is full): an answer
          Node& n = nodes_[static_cast<size_t>(frontier_[i])];
          if (const int32_t why = s.finished(n.seq); why != LOOM_STOP_NONE && frontier_[i] != 0) {
            n.stop = why;
            make_answer(s, n);
            frontier_.erase(frontier_.begin() + static_cast<std::ptrdiff_t>(i));
          } else {
            ++i;
          }
        }
        if (frontier_.empty()) {
          phase_ = Phase::done;
          return;
        }
        for (int id : frontier_)
          if (s.logits(nodes_[static_cast<size_t>(id)].seq).empty()) return;
        expand(s);
      } else if (phase_ == Phase::generate || phase_ == Phase::rollout) {
        if (!std::all_of(gens_.begin(), gens_.end(), [](const Gen& g) { return g.complete; })) return;
        if (phase_ == Phase::generate && mode_ == Mode::lookahead && start_rollouts(s)) continue;
        select(s);
      } else {
        return;
      }
    }
  }

  // The frontier's candidate steps: forks of each frontier node, their first tokens appended.
  void expand(Session& s) {
    ++rounds_;
    gens_.clear();
    for (int id : frontier_) {
      const loom_seq parent_seq = nodes_[static_cast<size_t>(id)].seq;
      const size_t parent_depth = nodes_[static_cast<size_t>(id)].depth;
      const double parent_lp = nodes_[static_cast<size_t>(id)].logprob;
      const size_t parent_gen = nodes_[static_cast<size_t>(id)].n_gen;
      ++n_expanded_;
      std::vector<loom_token> firsts;
      if (first_token_) { // the `expansions` most likely first tokens (ties: lower id)
        const auto l = s.logits(parent_seq);
        std::vector<loom_token> idx;
        for (size_t t = 0; t < l.size(); ++t)
          if (std::isfinite(l[t])) idx.push_back(static_cast<loom_token>(t));
        const size_t k = std::min(expansions_, idx.size());
        std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                          [&](loom_token a, loom_token b) {
                            const float la = l[static_cast<size_t>(a)], lb = l[static_cast<size_t>(b)];
                            return la > lb || (la == lb && a < b);
                          });
        firsts.assign(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k));
      }
      const size_t n_children = first_token_ ? firsts.size() : expansions_;
      for (size_t c = 0; c < n_children; ++c) {
        const loom_seq q = s.fork(parent_seq);
        if (q < 0) {
          ++fork_failures_;
          break; // no free KV sequence: fewer candidates
        }
        Node child;
        child.parent = id;
        child.depth = parent_depth + 1;
        child.logprob = parent_lp;
        child.n_gen = parent_gen;
        child.seq = q;
        nodes_.push_back(child);
        gens_.push_back(Gen{static_cast<int>(nodes_.size() - 1), q, false, 0, {}, false});
        Gen& g = gens_.back();
        extend(s, g, first_token_ ? firsts[c] : s.sample(q));
      }
      nodes_[static_cast<size_t>(id)].state = State::expanded;
      release(s, nodes_[static_cast<size_t>(id)]); // the children hold its blocks
    }
    frontier_.clear();
    phase_ = Phase::generate;
  }

  // Appends t to a step; completes it at the delimiter (after some non-blank text), at max_step_tokens
  // or when the sequence ends.
  void extend(Session& s, Gen& g, loom_token t) {
    const float lp = s.logprob(g.seq, t);
    const int32_t why = s.append(g.seq, t);
    g.step.push_back(t);
    Node& n = nodes_[static_cast<size_t>(g.node)];
    if (!g.rollout) {
      n.logprob += static_cast<double>(lp);
      ++n.n_gen;
    }
    const std::string text = s.request().detokenize(g.step);
    const size_t first = text.find_first_not_of(" \t\r\n"); // the delimiter counts after non-blank text
    const bool at_delim = first != std::string::npos && text.find(delim_, first) != std::string::npos;
    const bool step_end = at_delim || g.step.size() >= max_step_tokens_;
    if (why != LOOM_STOP_NONE || step_end) {
      if (g.rollout) {
        if (why == LOOM_STOP_NONE && --g.steps_left > 0) {
          g.step.clear(); // the next step of the roll-out
          return;
        }
        g.complete = true;
        return;
      }
      n.text = text;
      n.n_tokens = g.step.size();
      n.stop = why;
      g.complete = true;
    }
  }

  // Lookahead: every unfinished candidate of this round is rolled forward greedily; false when there
  // is nothing to roll (then select() scores the candidates themselves).
  bool start_rollouts(Session& s) {
    std::vector<Gen> rolls;
    for (const Gen& g : gens_) {
      const Node& n = nodes_[static_cast<size_t>(g.node)];
      if (n.stop != LOOM_STOP_NONE || n.seq < 0) continue;
      const loom_seq q = s.fork(n.seq);
      if (q < 0) {
        ++fork_failures_;
        continue; // scored on itself
      }
      rolls.push_back(Gen{g.node, q, true, lookahead_, {}, false});
    }
    if (rolls.empty()) return false;
    generated_ = std::move(gens_);
    gens_ = std::move(rolls);
    phase_ = Phase::rollout;
    return true;
  }

  // The generated text of a sequence (after the prompt).
  std::string path_text(Session& s, loom_seq q) const {
    const auto toks = s.tokens(q);
    return s.request().detokenize(toks.subspan(std::min(n_prompt_, toks.size())));
  }

  // Scores candidates (node, the sequence whose text it is judged on) in one verifier call: a judge
  // model runs them in one batched forward. A candidate the verifier fails on, or gives no score in
  // [0, 1], fails alone.
  void score(Session& s, const std::vector<std::pair<int, loom_seq>>& which) {
    if (which.empty()) return;
    std::vector<std::string> texts;
    texts.reserve(which.size());
    for (const auto& w : which)
      texts.push_back(path_text(s, w.second));
    verifier_calls_ += which.size();
    ++verifier_batches_;
    const auto verdicts = s.verification().score_many(texts);
    for (size_t i = 0; i < which.size(); ++i) {
      Node& n = nodes_[static_cast<size_t>(which[i].first)];
      const double v = verdicts[i].score;
      if (!verdicts[i].ok()) {
        n.state = State::failed;
        n.error = verdicts[i].error;
      } else if (!(v >= 0 && v <= 1)) {
        n.state = State::failed;
        n.error = "the verifier returned " + std::to_string(v);
      } else {
        n.score = v;
        n.state = State::scored;
      }
    }
  }

  std::optional<std::string> extract(const std::string& text) const {
    std::optional<std::string> found;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), regex_); it != std::sregex_iterator();
         ++it) {
      found = (*it)[1].str();
      if (!last_number_) break;
    }
    if (found && last_number_) found->erase(std::remove(found->begin(), found->end(), ','), found->end());
    return found;
  }

  void make_answer(Session& s, Node& n) {
    n.state = State::answer;
    n.answer = extract(path_text(s, n.seq));
    answers_.push_back(static_cast<int>(&n - nodes_.data()));
  }

  // The round's candidates are complete: score, merge duplicates, keep the best, free the rest.
  void select(Session& s) {
    if (phase_ == Phase::rollout) { // score each candidate on its roll-out, then drop the roll-outs
      std::vector<std::pair<int, loom_seq>> which;
      for (const Gen& r : gens_)
        which.emplace_back(r.node, r.seq);
      score(s, which);
      for (const Gen& r : gens_)
        s.free(r.seq);
      gens_ = std::move(generated_);
    }
    std::vector<int> cands;
    for (const Gen& g : gens_)
      cands.push_back(g.node);
    gens_.clear();
    // Identical siblings (the same parent, the same step, the same end) are one candidate.
    for (size_t i = 0; i < cands.size(); ++i) {
      Node& n = nodes_[static_cast<size_t>(cands[i])];
      for (size_t j = 0; j < i; ++j) {
        const Node& m = nodes_[static_cast<size_t>(cands[j])];
        if (m.state != State::duplicate && m.parent == n.parent && m.text == n.text && m.stop == n.stop &&
            m.n_tokens == n.n_tokens) {
          n.state = State::duplicate;
          release(s, n);
          break;
        }
      }
    }
    std::vector<std::pair<int, loom_seq>> unscored; // not scored on a roll-out
    for (int id : cands)
      if (nodes_[static_cast<size_t>(id)].state == State::generating)
        unscored.emplace_back(id, nodes_[static_cast<size_t>(id)].seq);
    score(s, unscored);
    for (int id : cands) {
      Node& n = nodes_[static_cast<size_t>(id)];
      if (n.state == State::duplicate) continue;
      if (n.state == State::failed) {
        release(s, n);
        continue;
      }
      if (n.stop == LOOM_STOP_NONE && n.depth >= max_steps_) { // the step budget: finished as it is
        s.finish(n.seq, LOOM_STOP_CUSTOM, n.logprob);
        n.stop = LOOM_STOP_CUSTOM;
        n.error = "max_steps";
      }
    }
    std::vector<int> live;
    for (int id : cands)
      if (nodes_[static_cast<size_t>(id)].state == State::scored) live.push_back(id);
    std::stable_sort(live.begin(), live.end(), [&](int a, int b) { return better(a, b); });
    if (mode_ == Mode::best_first) {
      for (int id : live)
        queue_.push_back(id);
      std::stable_sort(queue_.begin(), queue_.end(), [&](int a, int b) { return better(a, b); });
      while (queue_.size() > queue_size_) { // the worst open solutions go
        Node& w = nodes_[static_cast<size_t>(queue_.back())];
        w.state = State::pruned;
        release(s, w);
        queue_.pop_back();
      }
      for (int id : queue_)
        nodes_[static_cast<size_t>(id)].state = State::open;
      // Pop: finished solutions become answers until an unfinished one is to be expanded.
      while (!queue_.empty() && answers_.size() < width_) {
        Node& top = nodes_[static_cast<size_t>(queue_.front())];
        if (top.stop == LOOM_STOP_NONE) {
          if (n_expanded_ >= max_expansions_) break;
          top.state = State::kept;
          frontier_ = {queue_.front()};
          queue_.erase(queue_.begin());
          phase_ = Phase::expand;
          return;
        }
        make_answer(s, top);
        queue_.erase(queue_.begin());
      }
      // The search is over: the finished solutions still queued are answers too (best first); the
      // open ones are freed — unless nothing finished, then the best open one is the answer.
      for (int id : queue_)
        if (nodes_[static_cast<size_t>(id)].stop != LOOM_STOP_NONE)
          make_answer(s, nodes_[static_cast<size_t>(id)]);
      if (answers_.empty() && !queue_.empty()) make_answer(s, nodes_[static_cast<size_t>(queue_.front())]);
      for (int id : queue_) {
        Node& n = nodes_[static_cast<size_t>(id)];
        if (n.state != State::answer) release(s, n);
      }
      queue_.clear();
      phase_ = Phase::done;
      return;
    }
    // beam / lookahead: finished candidates are answers; the best unfinished ones are kept.
    size_t kept = 0;
    std::vector<int> pruned;
    for (int id : live) {
      Node& n = nodes_[static_cast<size_t>(id)];
      if (n.stop != LOOM_STOP_NONE) {
        make_answer(s, n);
      } else if (kept < width_) {
        n.state = State::kept;
        frontier_.push_back(id);
        ++kept;
      } else {
        pruned.push_back(id);
      }
    }
    if (frontier_.empty() && answers_.empty() && !pruned.empty()) { // nothing finished, nothing left:
      make_answer(s, nodes_[static_cast<size_t>(pruned.front())]);  // the best candidate is the answer
      pruned.erase(pruned.begin());
    }
    for (int id : pruned) {
      nodes_[static_cast<size_t>(id)].state = State::pruned;
      release(s, nodes_[static_cast<size_t>(id)]);
    }
    phase_ = frontier_.empty() ? Phase::done : Phase::expand;
  }

  Mode mode_ = Mode::beam;
  std::string mode_name_ = "beam";
  size_t width_ = 4, expansions_ = 4, max_step_tokens_ = 64, max_steps_ = 32, max_expansions_ = 16,
         queue_size_ = 16, lookahead_ = 1;
  bool first_token_ = false;
  std::string delim_ = "\n";
  std::string aggregate_ = "best";
  std::regex regex_;
  bool last_number_ = true;

  size_t n_prompt_ = 0;
  std::vector<Node> nodes_;
  std::vector<int> frontier_, queue_, answers_;
  std::vector<Gen> gens_, generated_;
  Phase phase_ = Phase::expand;
  size_t rounds_ = 0, n_expanded_ = 0, verifier_calls_ = 0, verifier_batches_ = 0, fork_failures_ = 0;
};

} // namespace

LOOM_PLUGIN_DEFINE("step_search", "1.0.0", LOOM_DECODER("step_search", StepSearch));
