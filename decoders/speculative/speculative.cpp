// decoders/speculative — speculative decoding with exact speculative sampling, a decoder plugin built
// against the SDK alone.
//
//   [decoder]
//   name = "speculative"
//   draft = "draft.gguf"   # read by the host: a draft model with the target's vocabulary
//   draft_layers = N       # … or (host) the target's own first N layers as the draft model
//   drafter = "auto"       # "model" (the draft above) | "ngram" (prompt lookup) | "auto" (model if any)
//   k = 4                  # draft tokens per round
//   adaptive = true        # n-gram: the tree (depth ≤ k_max, width) that maximises expected tokens per
//                          # unit of measured cost; draft model with trees: the k in 0..k_max that
//                          # maximises the speed-up formula with measured α, c, v (0: no drafts, probes);
//                          # without trees: k ±1 on rejections / full acceptances. false: k, width as given
//   k_min = 1              # adaptive bounds
//   k_max = 16
//   ngram_min = 1          # n-gram drafter: suffix lengths tried, longest first
//   ngram_max = 3
//   tree = "auto"          # "auto" (trees where the backend runs them) | true | false: linear drafts
//   width = 4              # tree branches: n-gram matches with different continuations; for a draft
//                          # model, the alternatives kept beside its pick at each step (width − 1)
//   max_nodes = 32         # a tree's most nodes (≤ the backend's limit, 64)
//   acceptance = "exact"   # "exact" (speculative sampling, below) | "typical": NOT EXACT — Medusa's
//                          # typical acceptance: a draft token is kept when p(d) ≥ min(typical_threshold,
//                          # typical_alpha · exp(−H(p))), else a token is drawn from p and the round ends;
//                          # greedy output is unchanged, sampled output no longer follows p exactly
//   typical_threshold = 0.09, typical_alpha = 0.3
//
// Token trees: the n-gram drafter collects up to `width` continuations (the latest matches of the
// longest suffix first) into a trie; the draft model adds, at each of its steps, its next-likeliest
// tokens as leaves beside the one it continues with. The target evaluates every node in one forward
// (tree attention: a node sees the committed tokens and its ancestors). Verification walks down the
// tree: at each node the target's token is drawn from p (the sampler chain at that node, its state
// after the path) and the walk follows the child holding that token, committing it; when no child
// holds it, the drawn token is appended and the round ends. Every token is thus drawn from p exactly,
// whatever the tree (exact for sampling, the target's own output for greedy); with trees off, a draft
// model's draft keeps the rejection scheme below, which accepts more often when drafts are sampled.
// (With trees on, every draft goes as a tree, a chain included: choosing the scheme after seeing the
// drafts would bias them.)
//
// A round: the drafter proposes d1..dk (a draft model samples them one forward at a time from its q,
// taken after the request's sampler chain; the n-gram drafter copies what followed the latest earlier
// occurrence of the context's last n tokens, q one-hot). The target evaluates all k + 1 positions in
// one forward (the drafts are uncommitted tokens: seq_set_draft), and for i = 1..k, with p the
// target's distribution after the sampler chain (seq_probs, in the chain's state after d1..d(i-1)):
// di is accepted with probability min(1, p(di) / q(di)) and committed through the stop rules; on the
// first rejection a token is drawn from norm(max(0, p − q)) and appended (the rest of the draft is
// dropped, K/V rolled back); after k acceptances a bonus token is drawn from p. Every token is thus
// distributed exactly as the sampler chain alone would draw it (Leviathan et al. 2023; Chen et al.
// 2023); with a greedy chain p is one-hot and the output equals the target's own greedy output.
// The draft model's sequence is brought back to the committed tokens by truncate + append.
#include "loom/sdk/plugin.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using loom::Session;
using loom::sdk::Error;

// The index drawn from the weights w (not necessarily normalised) with u in [0, 1); never a zero weight.
size_t draw(std::span<const float> w, double u) {
  double total = 0;
  for (float x : w)
    total += static_cast<double>(std::max(x, 0.0f));
  const double target = u * total;
  double cum = 0;
  size_t last = w.size();
  for (size_t i = 0; i < w.size(); ++i) {
    if (!(w[i] > 0.0f)) continue;
    last = i;
    cum += static_cast<double>(w[i]);
    if (cum > target) return i;
  }
  return last; // rounding left the total just under the target
}

class Speculative final : public loom::Decoder {
public:
  explicit Speculative(const loom::sdk::Config& cfg) {
    const std::string d = cfg.get_str("drafter", "auto");
    if (d == "auto")
      drafter_ = Drafter::auto_;
    else if (d == "model")
      drafter_ = Drafter::model;
    else if (d == "ngram")
      drafter_ = Drafter::ngram;
    else
      throw Error("speculative: drafter must be \"model\", \"ngram\" or \"auto\", got \"" + d + "\"");
    const auto bounded = [&](const char* key, int64_t def, int64_t lo, int64_t hi) {
      const int64_t v = cfg.get_i64(key, def);
      if (v < lo || v > hi)
        throw Error("speculative: " + std::string(key) + " must be an integer in [" + std::to_string(lo) +
                    ", " + std::to_string(hi) + "], got " + std::to_string(v));
      return static_cast<size_t>(v);
    };
    k_ = bounded("k", 4, 1, 64);
    adaptive_ = cfg.get_bool("adaptive", true);
    k_min_ = bounded("k_min", 1, 1, 64);
    k_max_ = bounded("k_max", static_cast<int64_t>(std::max<size_t>(16, k_)), 1, 64);
    if (k_min_ > k_ || k_ > k_max_)
      throw Error("speculative: expected k_min ≤ k ≤ k_max, got k_min = " + std::to_string(k_min_) +
                  ", k = " + std::to_string(k_) + ", k_max = " + std::to_string(k_max_));
    ngram_min_ = bounded("ngram_min", 1, 1, 32);
    ngram_max_ = bounded("ngram_max", 3, 1, 32);
    if (ngram_min_ > ngram_max_)
      throw Error("speculative: expected ngram_min ≤ ngram_max, got " + std::to_string(ngram_min_) + " > " +
                  std::to_string(ngram_max_));
    if (cfg.has("tree") && cfg.type("tree") == LOOM_CONFIG_BOOL)
      tree_ = cfg.get_bool("tree", true) ? Tree::on : Tree::off;
    else if (const std::string t = cfg.get_str("tree", "auto"); t == "auto")
      tree_ = Tree::auto_;
    else
      throw Error("speculative: tree must be true, false or \"auto\", got \"" + t + "\"");
    width_ = bounded("width", 4, 1, 16);
    max_nodes_ = bounded("max_nodes", 32, 1, 64);
    if (const std::string a = cfg.get_str("acceptance", "exact"); a == "typical")
      typical_ = true;
    else if (a != "exact")
      throw Error("speculative: acceptance must be \"exact\" or \"typical\" (Medusa's, not exact), got \"" +
                  a + "\"");
    const auto unit = [&](const char* key, double def) {
      const double v = cfg.get_f64(key, def);
      if (!(v > 0 && v <= 1))
        throw Error("speculative: " + std::string(key) + " must be in (0, 1], got " + std::to_string(v));
      return v;
    };
    typical_threshold_ = unit("typical_threshold", 0.09);
    typical_alpha_ = unit("typical_alpha", 0.3);
    if (!typical_ && (cfg.has("typical_threshold") || cfg.has("typical_alpha")))
      throw Error("speculative: typical_threshold and typical_alpha apply to acceptance = \"typical\" only");
  }

  void start(Session& s) override {

    V_ = static_cast<size_t>(s.n_vocab());
    p_.assign(V_, 0.0f);
    r_.assign(V_, 0.0f);
    k_cur_ = k_;
    if (drafter_ == Drafter::auto_) drafter_ = s.draft().has_model() ? Drafter::model : Drafter::ngram;
    if (drafter_ == Drafter::model) {
      // the draft's own stream, seeded from the request's (one draw: n-gram drafting takes none)
      draft_rng_.seed(static_cast<uint64_t>(s.request().uniform() * 18446744073709551615.0));
      if (!s.draft().has_model())
        throw Error(
            "speculative: drafter = \"model\" needs a draft model: add draft = \"x.gguf\" to [decoder] "
            "(or use drafter = \"ngram\")");
      draft_seq_ = s.draft().fork(0);
      if (draft_seq_ < 0) { // the draft model's KV cache is full: decode without drafts
        loom::sdk::log(LOOM_LOG_WARN, "speculative: no free sequence in the draft model's KV cache; this "
                                      "request decodes without drafts");
        drafter_ = Drafter::none;
      }
    }
    // Trees: where the target's backend runs them (auto), or asked for (then an error if it cannot).
    const int32_t nodes = s.draft().max_tree_nodes(0);
    if (tree_ == Tree::on && nodes == 0)
      throw Error("speculative: tree = true, but the target's backend runs no token-tree rows; set tree = "
                  "false (or \"auto\") or use the cpu or reference backend");
    use_tree_ = tree_ != Tree::off && nodes > 0 && width_ > 1;
    if (!use_tree_) width_ = 1;
    node_budget_ = std::min<size_t>(max_nodes_, static_cast<size_t>(std::max(nodes, 1)));
    depth_cap_ = use_tree_ ? static_cast<size_t>(std::max(s.draft().max_tree_depth(0), 1)) : size_t{64};
    phase_ = Phase::verify; // the first target pass is the prompt's, with no drafts
  }

  void plan(Session& s) override {
    if (s.finished(0) != LOOM_STOP_NONE) return;
    if (phase_ == Phase::verify) {
      s.plan(0); // the first: the prompt's, alone — the draft reads it at its first step (a draft of the
                 // target's own layers then takes its K/V from the target instead of evaluating it)
    } else {
      s.plan(draft_seq_);
    }
  }

  void update(Session& s) override {
    if (s.finished(0) != LOOM_STOP_NONE) return;
    if (phase_ == Phase::draft) {
      draft_step(s);
      return;
    }
    if (s.draft().logits_at(0, s.draft().size(0)).empty()) return; // not evaluated yet
    if (prefilled_) { // the forward's wall time (with the engine's step), for the cost model
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_submit_).count();
      cost_.add(static_cast<double>(s.draft().size(0) + 1), ms);
      nodes_sum_ += static_cast<double>(s.draft().size(0));
      if (s.draft().size(0) > 0) { // a verification: its time, for v
        verify_ms_ += ms;
        ++verifies_;
      }
    }
    prefilled_ = true;
    ++target_forwards_;
    if (in_tree_)
      verify_tree(s);
    else
      verify(s);
    if (s.finished(0) != LOOM_STOP_NONE) return;
    next_round(s);
    // the target's next forward starts now (after a draft model's steps: submit_drafts sets it then)
    if (phase_ == Phase::verify) t_submit_ = std::chrono::steady_clock::now();
  }

  bool done(const Session& s) const override { return s.finished(0) != LOOM_STOP_NONE; }

  void results(Session& s) override {
    s.request().set_metric("draft_tokens", static_cast<double>(draft_tokens_));
    s.request().set_metric("accepted_tokens", static_cast<double>(accepted_));
    s.request().set_metric("acceptance_rate",
                           draft_tokens_ ? static_cast<double>(accepted_) / static_cast<double>(draft_tokens_)
                                         : 0.0);
    // Rounds that ended on a rejected draft: accepted / (accepted + rejections) estimates the
    // per-position acceptance probability α of the speed-up formula (acceptance_rate also counts
    // the drafts after a rejection, which were never tested).
    s.request().set_metric("rejections", static_cast<double>(rejections_));
    s.request().set_metric("mean_accepted_len",
                           rounds_ ? static_cast<double>(accepted_) / static_cast<double>(rounds_) : 0.0);
    s.request().set_metric("draft_rounds", static_cast<double>(rounds_));
    s.request().set_metric("tree_rounds", static_cast<double>(tree_rounds_));
    // Accepted tree nodes off the first branch (whose K/V slot was not their position): evaluated again.
    s.request().set_metric("off_chain_tokens", static_cast<double>(off_chain_tokens_));
    s.request().set_metric("target_forwards", static_cast<double>(target_forwards_));
    s.request().set_metric("draft_forwards", static_cast<double>(draft_forwards_));
    s.request().set_metric("tokens_per_target_forward",
                           target_forwards_
                               ? static_cast<double>(s.n_generated(0)) / static_cast<double>(target_forwards_)
                               : 0.0);
    s.request().set_metric("k", static_cast<double>(k_cur_));
    s.request().set_metric("exact", typical_ ? 0.0 : 1.0); // acceptance = "typical" is not exact
    // The drafts' size as chosen: nodes per verification, and the measured marginal cost of a row.
    s.request().set_metric("mean_draft_nodes", target_forwards_ > 1
                                                   ? nodes_sum_ / static_cast<double>(target_forwards_ - 1)
                                                   : 0.0);
    s.request().set_metric("row_cost", cost_.beta());
    // v: a verification forward's mean wall time over a one-row forward's (the fit's), as measured here
    const double t1 = cost_.t1();
    s.request().set_metric("verify_cost",
                           verifies_ > 0 && t1 > 0 ? verify_ms_ / static_cast<double>(verifies_) / t1 : 0.0);
    s.add_result(0, s.score(0));
  }

private:
  enum class Drafter { auto_, model, ngram, none };
  enum class Phase { draft, verify };
  enum class Tree { auto_, on, off };

  // One draft-model step: q after the chain (the draft sequence's own chain state), a token drawn
  // from it, appended to the draft sequence. After k (or when the draft sequence stops) the drafts go
  // to the target. With trees, the step's next-likeliest tokens become leaves beside the one drawn.
  void draft_step(Session& s) {
    if (s.logits(draft_seq_).empty()) return;
    ++draft_forwards_;
    { // a draft forward's wall time (with the engine's step), for choosing k — not a probe's first,
      // which also catches up the tokens the skipped rounds left unevaluated on the draft model
      const auto now = std::chrono::steady_clock::now();
      const double ms = std::chrono::duration<double, std::milli>(now - t_draft_).count();
      if (!catch_up_) draft_ms_ = draft_ms_ < 0 ? ms : 0.9 * draft_ms_ + 0.1 * ms;
      catch_up_ = false;
      t_draft_ = now;
    }
    const size_t i = drafts_.size();
    if (q_.size() <= i) q_.emplace_back(V_); // kept across rounds: no allocation per draft token
    s.request().probs(draft_seq_, q_[i]);
    // The draft's own stream (seeded from the request's at start): how many drafts a round takes — with
    // adaptive trees, chosen from measured times — then never shifts the target's draws, so a tree
    // round consumes the request's RNG exactly as decoding alone (one draw per token): --seed reproduces.
    const auto d = static_cast<loom_token>(draw(q_[i], draft_u_(draft_rng_)));
    if (use_tree_) add_alternatives(s.logits(draft_seq_), d);
    reach_ *= static_cast<double>(q_[i][static_cast<size_t>(d)]); // the chain's own confidence so far
    drafts_.push_back(d);
    const int32_t reason = s.append(draft_seq_, d);
    if (reason != LOOM_STOP_NONE || drafts_.size() >= std::min(k_cur_, depth_cap_)) submit_drafts(s);
  }

  // Leaves beside the draft's pick at its step i (before drafts_[i] is pushed): the tokens the draft
  // model's logits rank next (not its sampler chain's q, one-hot under greedy), up to width − 1 of them.
  void add_alternatives(std::span<const float> q, loom_token picked) {
    const size_t want = width_ - 1;
    best_.clear();
    // Adaptive: a leaf only at an uncertain step — its share of the draft's softmax, times the chance the
    // chain reaches it, above a row's measured marginal cost (β, with a margin for the round's gain).
    double zmax = -std::numeric_limits<double>::infinity(), z = 0;
    if (adaptive_) {
      for (size_t t = 0; t < V_ && t < q.size(); ++t)
        zmax = std::max(zmax, static_cast<double>(q[t]));
      for (size_t t = 0; t < V_ && t < q.size(); ++t)
        z += std::exp(static_cast<double>(q[t]) - zmax);
    }
    for (size_t t = 0; t < V_ && t < q.size(); ++t) {
      if (static_cast<loom_token>(t) == picked || !(q[t] > -std::numeric_limits<float>::infinity())) continue;
      if (best_.size() < want || q[t] > q[static_cast<size_t>(best_.back())]) {
        if (best_.size() == want) best_.pop_back();
        best_.push_back(static_cast<loom_token>(t));
        std::sort(best_.begin(), best_.end(), [&](loom_token a, loom_token b) {
          return q[static_cast<size_t>(a)] > q[static_cast<size_t>(b)];
        });
      }
    }
    for (loom_token t : best_) {
      if (adaptive_ &&
          reach_ * std::exp(static_cast<double>(q[static_cast<size_t>(t)]) - zmax) / z < 1.5 * plan_beta())
        continue;
      alts_.push_back({drafts_.size(), t});
    }
  }

  // With trees on, every draft goes as a tree (a chain when no alternative was kept) and is verified by
  // drawing from p: choosing the rejection scheme after seeing the drafts (no leaves kept → linear) would
  // bias the drafts that scheme sees, and it is exact only for drafts distributed as q.
  void submit_drafts(Session& s) {
    t_submit_ = std::chrono::steady_clock::now();
    if (use_tree_) { // the chain, then each step's alternatives as leaves
      tree_tok_.assign(drafts_.begin(), drafts_.end());
      tree_par_.clear();
      for (size_t i = 0; i < drafts_.size(); ++i)
        tree_par_.push_back(static_cast<int32_t>(i) - 1);
      for (const auto& [step, t] : alts_) {
        if (tree_tok_.size() >= node_budget_) break;
        tree_tok_.push_back(t);
        tree_par_.push_back(static_cast<int32_t>(step) - 1);
      }
      alts_.clear();
      submit_tree(s);
      return;
    }
    alts_.clear();
    const size_t kept = s.draft().set(0, drafts_);
    drafts_.resize(kept);
    in_tree_ = false;
    phase_ = Phase::verify;
  }

  void submit_tree(Session& s) {
    const size_t kept = s.draft().set_tree(0, tree_tok_, tree_par_);
    tree_tok_.resize(kept);
    tree_par_.resize(kept);
    children_.assign(kept + 1, {}); // children_[i + 1]: node i's; children_[0]: the root's
    for (size_t i = 0; i < kept; ++i)
      children_[static_cast<size_t>(tree_par_[i] + 1)].push_back(static_cast<int32_t>(i));
    in_tree_ = true;
    phase_ = Phase::verify;
  }

  // Accept / reject the drafts against the target's rows, then one more token (correction or bonus).
  void verify(Session& s) {
    const size_t m = drafts_.size();
    size_t a = 0;
    bool rejected = false;
    for (; a < m; ++a) {
      s.request().probs(0, p_);
      const loom_token d = drafts_[a];
      const auto di = static_cast<size_t>(d);
      if (typical_) { // not exact: keep a plausible draft, else draw from p and end the round
        if (static_cast<double>(p_[di]) >= typical_cut()) {
          if (s.draft().commit(0, 1) != LOOM_STOP_NONE) {
            ++a;
            record(m, a, false);
            return;
          }
          continue;
        }
        s.append(0, static_cast<loom_token>(draw(p_, s.request().uniform())));
        rejected = true;
        break;
      }
      const double qd = drafter_ == Drafter::model ? static_cast<double>(q_[a][di]) : 1.0;
      const double pd = static_cast<double>(p_[di]);
      const double u = s.request().uniform();
      if (u < std::min(1.0, pd / qd)) {
        if (s.draft().commit(0, 1) != LOOM_STOP_NONE) {
          ++a;
          record(m, a, false);
          return;
        }
        continue;
      }
      // Rejected: draw from norm(max(0, p − q)).
      double mass = 0;
      if (drafter_ == Drafter::model) {
        for (size_t i = 0; i < V_; ++i)
          mass += static_cast<double>(r_[i] = std::max(0.0f, p_[i] - q_[a][i]));
      } else {
        r_ = p_;
        r_[di] = 0.0f;
        for (float x : r_)
          mass += static_cast<double>(x);
      }
      const std::vector<float>& from = mass > 0 ? r_ : p_; // mass 0 only by rounding
      s.append(0, static_cast<loom_token>(draw(from, s.request().uniform())));
      rejected = true;
      break;
    }
    if (!rejected) { // every draft accepted: the bonus token from the row after the last one
      s.request().probs(0, p_);
      s.append(0, static_cast<loom_token>(draw(p_, s.request().uniform())));
    }
    record(m, a, rejected);
  }

  // Walks down the evaluated tree: at each node the target's token drawn from p there; the child that
  // holds it is committed, else the token is appended and the round ends.
  void verify_tree(Session& s) {
    const size_t m = tree_tok_.size();
    off_chain_ = false;
    int32_t at = -1;
    size_t a = 0;
    bool rejected = false;
    const auto& roots = children_[0];
    const int h = hot_; // the regime these counts belong to (the one the tree was chosen in)
    for (size_t r = 0; r < roots.size(); ++r)
      offered_[h][std::min(r, offered_[h].size() - 1)] += 1;
    for (;;) {
      s.request().probs(0, p_);
      int32_t next = -1;
      const auto& kids = children_[static_cast<size_t>(at + 1)];
      loom_token x = -1;
      if (typical_) { // not exact: the likeliest child that passes the typical test, without a draw
        const double cut = typical_cut();
        float best = -1;
        size_t best_r = 0;
        for (size_t r = 0; r < kids.size(); ++r) {
          const auto t = static_cast<size_t>(tree_tok_[static_cast<size_t>(kids[r])]);
          if (p_[t] > best && static_cast<double>(p_[t]) >= cut) {
            best = p_[t];
            best_r = r;
            next = kids[r];
            x = static_cast<loom_token>(t);
          }
        }
        if (next >= 0 && at < 0) taken_[h][std::min(best_r, taken_[h].size() - 1)] += 1;
        if (next < 0) x = static_cast<loom_token>(draw(p_, s.request().uniform()));
      } else {
        x = static_cast<loom_token>(draw(p_, s.request().uniform()));
        for (size_t r = 0; r < kids.size(); ++r)
          if (tree_tok_[static_cast<size_t>(kids[r])] == x) {
            next = kids[r];
            if (at < 0) taken_[h][std::min(r, taken_[h].size() - 1)] += 1;
            break;
          }
      }
      if (at >= 0 && !kids.empty()) { // a continuation tested
        cont_tested_[h] += 1;
        if (next >= 0) cont_acc_[h] += 1;
      }
      if (next < 0) {
        rejected = !children_[static_cast<size_t>(at + 1)].empty();
        s.append(0, x);
        break;
      }
      ++a;
      if (next != static_cast<int32_t>(a) - 1) off_chain_ = true; // not at its depth's slot
      if (off_chain_) ++off_chain_tokens_; // its K/V are evaluated again with the next forward
      if (s.draft().commit_node(0, next) != LOOM_STOP_NONE) break;
      at = next;
    }
    ++tree_rounds_;
    hot_ = m > 0 && !rejected && !off_chain_ ? 1 : 0; // a leaf of the first branch reached
    // Per tested depth, as the linear scheme counts: the drafts of the path, α from its rejections.
    record(m, a, rejected);
  }

  // Medusa's typical acceptance (not exact): a token t passes when p(t) ≥ min(threshold, alpha ·
  // exp(−H(p))), p the sampler chain's distribution at this position (one-hot for greedy: only its
  // token passes).
  double typical_cut() const {
    double h = 0;
    for (float x : p_)
      if (x > 0.0f) h -= static_cast<double>(x) * std::log(static_cast<double>(x));
    return std::min(typical_threshold_, typical_alpha_ * std::exp(-h));
  }

  void record(size_t m, size_t a, bool rejected) {
    if (m == 0) return;
    draft_tokens_ += m;
    accepted_ += a;
    ++rounds_;
    if (rejected) ++rejections_;
    adapt(a, rejected);
  }

  // Draft model, adaptive: α from this request's counts (prior 0.7, worth two positions), c = a draft
  // forward's measured time over a one-row target forward's, v(T) = 1 + β (T − 1) fitted: the k in
  // 0 .. k_max that maximises (1 − α^(k+1)) / ((1 − α)(k c + v(k + 1))) — 0 (decode without drafts; a
  // probe round of k_min, every 8th round and rarer while probes find no gain, keeps α and c measured) when
  // no k beats decoding alone.
  void adapt(size_t a, bool rejected) {
    if (!adaptive_) return;
    m_acc_ += static_cast<double>(a);
    m_tested_ += static_cast<double>(a) + (rejected ? 1.0 : 0.0);
    const double t1 = cost_.t1();
    // The ±1 rule where k must not depend on timing: the rejection scheme (no trees) draws from the
    // request's RNG once per tested draft, so a timed k would make sampled output vary between runs.
    // So does typical acceptance, whose draws depend on which drafts were offered.
    if (drafter_ != Drafter::model || !use_tree_ || typical_ || draft_ms_ < 0 || t1 <= 0) {
      if (rejected)
        k_cur_ = std::max(k_cur_ > 1 ? k_cur_ - 1 : 1, k_min_);
      else if (a >= k_cur_) // a full round of k (not a shorter draft that a stop or lookup cut)
        k_cur_ = std::min(k_cur_ + 1, k_max_);
      return;
    }
    const double alpha = std::min((m_acc_ + 2 * 0.7) / (m_tested_ + 2), 0.999);
    const double c = draft_ms_ / t1, beta = cost_.beta();
    size_t best = 0;
    double best_rate = 1.0; // decoding alone
    for (size_t k = k_min_; k <= k_max_; ++k) {
      const double gain = (1 - std::pow(alpha, static_cast<double>(k + 1))) / (1 - alpha);
      const double rate = gain / (static_cast<double>(k) * c + 1 + beta * static_cast<double>(k));
      if (rate > best_rate) {
        best_rate = rate;
        best = k;
      }
    }
    k_cur_ = best;
  }

  void next_round(Session& s) {
    drafts_.clear();
    alts_.clear();
    in_tree_ = false;
    if (drafter_ == Drafter::model) {
      // The draft sequence holds the old committed tokens + its drafts: back to the accepted ones,
      // then the target's last token (no re-prefill: only that token and at most one draft are new).
      const auto toks = s.tokens(0);
      s.truncate(draft_seq_, toks.size() - 1);
      if (s.append(draft_seq_, toks.back()) != LOOM_STOP_NONE) {
        drafter_ = Drafter::none; // the draft stopped where the target did not (a timeout): go on without
        s.free(draft_seq_);
        draft_seq_ = -1;
        phase_ = Phase::verify;
        return;
      }
      if (k_cur_ == 0 && ++skipped_ < probe_every_) { // drafting does not pay now: a plain step
        phase_ = Phase::verify;
        return;
      }
      if (k_cur_ == 0) { // the probe round; probes grow rarer while they find no gain (8, 16, … 128)
        k_cur_ = k_min_;
        catch_up_ = skipped_ > 1;
        probe_every_ = std::min<size_t>(probe_every_ * 2, 128);
        skipped_ = 0;
        probing_ = true;
      } else if (!probing_) {
        probe_every_ = 8;
      }
      probing_ = false;
      reach_ = 1;
      t_draft_ = std::chrono::steady_clock::now();
      phase_ = Phase::draft;
      return;
    }
    if (drafter_ == Drafter::ngram) {
      if (use_tree_ || adaptive_) { // (trees off: width 1, a chain)
        lookup_tree(s.tokens(0));
        if (tree_tok_.size() > 0) {
          submit_tree(s);
          return;
        }
      } else {
        lookup(s.tokens(0));
        if (!drafts_.empty()) submit_drafts(s);
      }
    }
    phase_ = Phase::verify;
  }

  // Prompt lookup: the tokens that followed the latest earlier occurrence of the last n tokens
  // (n = ngram_max .. ngram_min), at most k of them.
  void lookup(std::span<const loom_token> t) {
    const size_t len = t.size();
    for (size_t n = std::min(ngram_max_, len > 0 ? len - 1 : 0); n >= ngram_min_ && n > 0; --n) {
      const std::span<const loom_token> suffix = t.subspan(len - n);
      for (size_t j = len - n; j-- > 0;) { // start of an earlier occurrence, latest first
        if (!std::equal(suffix.begin(), suffix.end(), t.begin() + static_cast<std::ptrdiff_t>(j))) continue;
        const size_t from = j + n, to = std::min(len, from + k_cur_);
        drafts_.assign(t.begin() + static_cast<std::ptrdiff_t>(from),
                       t.begin() + static_cast<std::ptrdiff_t>(to));
        return;
      }
    }
  }

  // The same lookup keeping up to `width` continuations (longest suffix first, latest occurrence first)
  // in a trie of at most node_budget nodes; the first continuation is the chain of nodes 0, 1, ….
  void lookup_tree(std::span<const loom_token> t) {
    tree_tok_.clear();
    tree_par_.clear();
    tree_p_.clear();
    // The counts fade (×0.9 a round, ≈ the last ten rounds): a reply that starts free and then copies is
    // seen as copying, and estimates that ruled drafting out drift back to the prior and are tried again
    // (without this, five early rejections stopped all drafting for the rest of a 256-token reply).
    for (int h = 0; h < 2; ++h) {
      for (size_t r = 0; r < offered_[h].size(); ++r) {
        offered_[h][r] *= 0.9;
        taken_[h][r] *= 0.9;
      }
      cont_tested_[h] *= 0.9;
      cont_acc_[h] *= 0.9;
    }
    const size_t len = t.size();
    // adaptive: candidates as deep as k_max, the cost model picks; else k deep
    const size_t depth = std::min(adaptive_ ? k_max_ : k_cur_, depth_cap_);
    size_t branches = 0;
    for (size_t n = std::min(ngram_max_, len > 0 ? len - 1 : 0); n >= ngram_min_ && n > 0; --n) {
      const std::span<const loom_token> suffix = t.subspan(len - n);
      for (size_t j = len - n; j-- > 0 && branches < width_;) {
        if (!std::equal(suffix.begin(), suffix.end(), t.begin() + static_cast<std::ptrdiff_t>(j))) continue;
        const size_t from = j + n, to = std::min(len, from + depth);
        if (from >= to) continue;
        int32_t cur = -1;
        bool added = false;
        for (size_t p = from; p < to; ++p) {
          int32_t found = -1;
          for (size_t i = 0; i < tree_tok_.size(); ++i)
            if (tree_par_[i] == cur && tree_tok_[i] == t[p]) {
              found = static_cast<int32_t>(i);
              break;
            }
          if (found < 0) {
            if (tree_tok_.size() >= node_budget_) break;
            tree_tok_.push_back(t[p]);
            tree_par_.push_back(cur);
            // the chance it is reached: its branch's first token taken, then each one after it
            tree_p_.push_back(rank_p(branches) * std::pow(cont_p(), static_cast<double>(p - from)));
            found = static_cast<int32_t>(tree_tok_.size()) - 1;
            added = true;
          }
          cur = found;
        }
        if (added) ++branches;
      }
      if (branches >= width_ || tree_tok_.size() >= node_budget_) break;
    }
    if (adaptive_) select_by_cost();
  }

  // ---- adaptive drafts: expected tokens per unit of cost ----
  // A node's chance of being accepted (tree_p_) comes from running counts: a branch of rank r (the r-th
  // continuation found) has its first token taken with P_r, each later token with α_c (priors below). A
  // verification of T rows costs v(T) = 1 + β (T − 1) one-row forwards, β fitted to this request's
  // measured forward times (prior 0.25). Nodes are taken in order of their chance (a node after its
  // parent: the chance only falls along a branch) while 1 + Σ chances over v(1 + nodes) grows — the
  // tree (depth and width) that maximises the expected tokens per unit of cost.
  // The counts are kept apart by regime: after a round that took its whole first branch (copying a
  // passage, say, acceptance runs long) and after one that did not.
  // Priors (worth two rounds; replies are often a few dozen tokens): after a round that took its whole
  // first branch the text is likely being copied — first token 0.9, each next 0.95; else 0.5 and 0.75;
  // a lower-ranked branch's first token 0.1.
  double rank_p(size_t r) const {
    r = std::min<size_t>(r, taken_[0].size() - 1);
    const double prior = r > 0 ? 0.1 : hot_ ? 0.9 : 0.5;
    return (taken_[hot_][r] + 2 * prior) / (offered_[hot_][r] + 2);
  }
  double cont_p() const { return (cont_acc_[hot_] + 2 * (hot_ ? 0.95 : 0.75)) / (cont_tested_[hot_] + 2); }

  void select_by_cost() {
    const size_t n = tree_tok_.size();
    if (n == 0) return;
    order_.resize(n);
    for (size_t i = 0; i < n; ++i)
      order_[i] = static_cast<int32_t>(i);
    std::stable_sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
      return tree_p_[static_cast<size_t>(a)] > tree_p_[static_cast<size_t>(b)];
    });
    const double beta = plan_beta();
    double gain = 1, best = 1.0 / 1.0;
    size_t keep = 0;
    for (size_t i = 0; i < n; ++i) {
      gain += tree_p_[static_cast<size_t>(order_[i])];
      const double rate = gain / (1 + beta * static_cast<double>(i + 1));
      if (rate > best) {
        best = rate;
        keep = i + 1;
      }
    }
    std::vector<char>& in = in_;
    in.assign(n, 0);
    for (size_t i = 0; i < keep; ++i)
      in[static_cast<size_t>(order_[i])] = 1;
    // the kept nodes in their order (parents first, the first branch's chain at the front), renumbered
    std::vector<int32_t>& id = renum_;
    id.assign(n, -1);
    size_t m = 0;
    for (size_t i = 0; i < n; ++i) {
      const int32_t par = tree_par_[i];
      if (!in[i] || (par >= 0 && id[static_cast<size_t>(par)] < 0)) continue;
      id[i] = static_cast<int32_t>(m);
      tree_tok_[m] = tree_tok_[i];
      tree_par_[m] = par < 0 ? -1 : id[static_cast<size_t>(par)];
      tree_p_[m] = tree_p_[i];
      ++m;
    }
    tree_tok_.resize(m);
    tree_par_.resize(m);
    tree_p_.resize(m);
  }

  // A verification row's marginal cost in one-row forwards before any is measured (F16 on the Zen 4 of
  // docs/benchmarks.md: 0.2–0.3).
  static constexpr double kBetaPrior = 0.25;
  // The β that shapes drafts: measured — but fixed at the prior under typical acceptance, whose output
  // depends on which drafts were offered: drafts chosen from wall-clock times would make a seeded run
  // differ between runs and between a batch and alone.
  double plan_beta() const { return typical_ ? kBetaPrior : cost_.beta(); }

  // Wall-clock cost of a target forward of `rows` rows, fitted as a + b·rows with exponential forgetting
  // (≈ the last 50 rounds); beta() = b / (a + b), a row's marginal cost in one-row forwards.
  struct CostFit {
    double w = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    void add(double x, double y) {
      constexpr double keep = 0.98;
      w = w * keep + 1;
      sx = sx * keep + x;
      sy = sy * keep + y;
      sxx = sxx * keep + x * x;
      sxy = sxy * keep + x * y;
    }
    // The wall time of a one-row forward: the fit's a + b, or (rows not yet varied) the mean time over
    // 1 + β (mean rows − 1); < 0 before any round.
    double t1() const {
      if (w <= 0) return -1;
      const double mx = sx / w, my = sy / w;
      return my / (1 + beta() * std::max(mx - 1, 0.0));
    }
    double beta() const {
      constexpr double prior = kBetaPrior;
      if (w < 3) return prior;
      const double mx = sx / w, var = sxx / w - mx * mx;
      if (var < 0.25) return prior; // the rows did not vary enough yet
      const double b = (sxy / w - mx * (sy / w)) / var, a = sy / w - b * mx;
      if (!(a + b > 0)) return prior;
      return std::clamp(b / (a + b), 0.0, 1.0);
    }
  };

  Drafter drafter_ = Drafter::auto_;
  Tree tree_ = Tree::auto_;
  size_t k_ = 4, k_min_ = 1, k_max_ = 16, k_cur_ = 4;
  bool adaptive_ = false;
  size_t ngram_min_ = 1, ngram_max_ = 3;
  size_t width_ = 4, max_nodes_ = 32, node_budget_ = 32, depth_cap_ = 64;
  bool use_tree_ = false, in_tree_ = false;
  size_t V_ = 0;
  loom_seq draft_seq_ = -1;
  Phase phase_ = Phase::verify;
  bool prefilled_ = false;
  std::vector<loom_token> drafts_;
  std::vector<std::vector<float>> q_; // q_[i]: the draft distribution drafts_[i] was drawn from (this round)
  std::vector<float> p_, r_;
  std::vector<std::pair<size_t, loom_token>> alts_; // (draft step, token): leaves beside the model's picks
  std::vector<loom_token> best_;
  std::vector<loom_token> tree_tok_; // the tree being verified: node tokens and parents
  std::vector<int32_t> tree_par_;
  std::vector<std::vector<int32_t>> children_;
  std::vector<double> tree_p_; // each node's estimated chance of acceptance (adaptive)
  std::vector<int32_t> order_, renum_;
  std::vector<char> in_;
  // per regime (hot_: the last round took its whole first branch) and branch rank: rounds offered, first
  // token taken; continuations tested / accepted
  std::array<std::array<double, 16>, 2> offered_{}, taken_{};
  std::array<double, 2> cont_tested_{}, cont_acc_{};
  int hot_ = 0;
  CostFit cost_;
  std::mt19937_64 draft_rng_;
  std::uniform_real_distribution<double> draft_u_{0.0, 1.0};
  double draft_ms_ = -1; // a draft forward's wall time (moving average)
  std::chrono::steady_clock::time_point t_draft_{};
  double m_acc_ = 0, m_tested_ = 0; // the draft model's drafts accepted / tested
  double reach_ = 1;                // the draft chain's confidence so far this round
  size_t skipped_ = 0;              // rounds without drafts (k = 0) since the last probe
  size_t probe_every_ = 4;          // skipped rounds before a probe: 4, then 8, 16, … 128
  bool typical_ = false;            // acceptance = "typical" (Medusa's; not exact)
  double typical_threshold_ = 0.09, typical_alpha_ = 0.3;
  bool probing_ = false, catch_up_ = true; // the first draft step also reads the prompt
  std::chrono::steady_clock::time_point t_submit_{};
  double nodes_sum_ = 0, verify_ms_ = 0;
  size_t verifies_ = 0;
  size_t draft_tokens_ = 0, accepted_ = 0, rounds_ = 0, rejections_ = 0, target_forwards_ = 0,
         draft_forwards_ = 0, tree_rounds_ = 0, off_chain_tokens_ = 0;
  bool off_chain_ = false;
};

} // namespace

LOOM_PLUGIN_DEFINE("speculative", "1.0.0", LOOM_DECODER("speculative", Speculative));
