// DecodeSession's draft facet (speculative decoding, loom_draft_api): sequences on the draft model,
// linear drafts and token trees, committing them token by token or node by node. A request whose decoder
// never drafts never calls into this file.
#include "engine/session_state.hpp"
#include "loom/engine/decode_session.hpp"
#include "loom/error.hpp"

#include <algorithm>

namespace loom {

ModelRole DecodeSession::role_of(LocalSeq seq) const {
  return at(seq).e->role;
}

LocalSeq DecodeSession::fork_draft(LocalSeq parent) {
  Seq& p = at(parent);
  if (!ctx_.has_draft())
    fail(Errc::not_found, "decoder",
         "the pipeline has no draft model; name one with [decoder] draft = \"x.gguf\"");
  if (p.e->role != ModelRole::target)
    fail(Errc::invalid_argument, "decoder", "fork_draft: the parent must be a target sequence");
  const SeqId kv = book_.new_kv(ModelRole::draft, -1, false);
  if (kv < 0) return -1; // no free draft KV sequence: recoverable
  FreeKvOnThrow undo{book_, ModelRole::draft, kv};
  auto c = std::make_unique<Seq>(p.stop); // clones the stop criteria: may throw
  SequenceBook::Entry e;
  e.role = ModelRole::draft;
  e.kv = kv;
  e.tokens = p.e->tokens; // committed tokens only; none evaluated on the draft model yet
  e.finished = p.e->finished;
  e.mirror = parent;
  copy_state(p, *c); // clones plugin state: may throw
  undo.armed = false;
  return adopt(std::move(e), std::move(c));
}

size_t DecodeSession::n_draft(LocalSeq seq) const {
  return at(seq).e->draft.size();
}

size_t DecodeSession::set_draft(LocalSeq seq, std::span<const TokenId> tokens) {
  Seq& s = at(seq);
  if (s.finished != StopReason::none)
    fail(Errc::invalid_argument, "decoder", "cannot draft after finished sequence " + std::to_string(seq));
  for (TokenId t : tokens)
    if (t < 0 || t >= n_vocab())
      fail(Errc::invalid_argument, "decoder",
           "draft token " + std::to_string(t) + " is outside the vocabulary");
  book_.drop_draft(*s.e);
  // Positions the context has left (the committed tokens' last one is evaluated at tokens.size() - 1).
  const size_t room =
      static_cast<size_t>(std::max<int64_t>(0, ctx_.n_ctx - static_cast<int64_t>(s.e->tokens.size())));
  const size_t n = std::min(tokens.size(), room);
  s.e->draft.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
  book_.note();
  return n;
}

StopReason DecodeSession::commit(LocalSeq seq, size_t n) {
  Seq& s = at(seq);
  std::vector<TokenId>& draft = s.e->draft;
  if (s.e->is_tree())
    fail(Errc::invalid_argument, "decoder",
         "commit(n) on sequence " + std::to_string(seq) +
             ", whose draft is a tree: commit its nodes one by "
             "one (commit_node)");
  if (n > draft.size())
    fail(Errc::invalid_argument, "decoder",
         "commit of " + std::to_string(n) + " tokens but sequence " + std::to_string(seq) + " has " +
             std::to_string(draft.size()) + " drafted");
  StopReason r = StopReason::none;
  for (size_t i = 0; i < n && r == StopReason::none; ++i) {
    if (s.finished != StopReason::none)
      fail(Errc::invalid_argument, "decoder", "commit to finished sequence " + std::to_string(seq));
    const TokenId t = draft.front();
    draft.erase(draft.begin());
    r = commit_token(s, t);
  }
  return r;
}

int32_t DecodeSession::max_tree_nodes(LocalSeq seq) const {
  return ctx_.models[at(seq).e->role].tree_nodes;
}
int32_t DecodeSession::max_tree_depth(LocalSeq seq) const {
  return ctx_.models[at(seq).e->role].tree_depth;
}

size_t DecodeSession::set_draft_tree(LocalSeq seq, std::span<const TokenId> tokens,
                                     std::span<const int32_t> parents) {
  Seq& s = at(seq);
  SequenceBook::Entry& e = *s.e;
  if (s.finished != StopReason::none)
    fail(Errc::invalid_argument, "decoder", "cannot draft after finished sequence " + std::to_string(seq));
  if (tokens.size() != parents.size())
    fail(Errc::invalid_argument, "decoder",
         "set_draft_tree: " + std::to_string(tokens.size()) + " tokens but " +
             std::to_string(parents.size()) + " parents (one each)");
  if (tokens.size() > static_cast<size_t>(k_max_tree_nodes))
    fail(Errc::invalid_argument, "decoder",
         "set_draft_tree: " + std::to_string(tokens.size()) + " nodes; a tree has at most " +
             std::to_string(k_max_tree_nodes));
  bool chain = true;
  std::vector<int32_t> depth(tokens.size());
  int32_t max_depth = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab())
      fail(Errc::invalid_argument, "decoder",
           "draft token " + std::to_string(tokens[i]) + " is outside the vocabulary");
    const int32_t par = parents[i];
    if (par < -1 || par >= static_cast<int32_t>(i))
      fail(Errc::invalid_argument, "decoder",
           "set_draft_tree: node " + std::to_string(i) + " has parent " + std::to_string(par) +
               "; expected -1 (the last committed token) or an earlier node");
    chain = chain && par == static_cast<int32_t>(i) - 1;
    depth[i] = par < 0 ? 1 : depth[static_cast<size_t>(par)] + 1;
    max_depth = std::max(max_depth, depth[i]);
  }
  const ModelSlot& slot = ctx_.models[e.role];
  if (!chain && slot.tree_nodes == 0)
    fail(Errc::unsupported, "decoder",
         "this backend runs no token-tree rows (attention feature 'tree'): draft a chain (set_draft), or "
         "run the pipeline on a backend that has them (cpu, reference)");
  if (!chain && max_depth > slot.tree_depth)
    fail(Errc::invalid_argument, "decoder",
         "set_draft_tree: a tree " + std::to_string(max_depth) +
             " deep; this model's narrowest attention "
             "window allows " +
             std::to_string(slot.tree_depth));
  book_.drop_draft(e);
  const size_t room =
      static_cast<size_t>(std::max<int64_t>(0, ctx_.n_ctx - static_cast<int64_t>(e.tokens.size())));
  const size_t n = std::min(tokens.size(), room);
  e.draft.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
  e.parent.assign(parents.begin(), parents.begin() + static_cast<std::ptrdiff_t>(n));
  e.tree_chain = chain;
  e.tree_base = static_cast<int32_t>(e.tokens.size());
  e.tree_at = -1;
  e.tree_kv_keep = e.tree_base;
  book_.note();
  return n;
}

StopReason DecodeSession::commit_node(LocalSeq seq, int32_t node) {
  Seq& s = at(seq);
  SequenceBook::Entry& e = *s.e;
  if (s.finished != StopReason::none)
    fail(Errc::invalid_argument, "decoder", "commit to finished sequence " + std::to_string(seq));
  if (!e.is_tree())
    fail(Errc::invalid_argument, "decoder",
         "commit_node on sequence " + std::to_string(seq) + ", which has no draft tree (set_draft_tree)");
  if (node < 0 || node >= static_cast<int32_t>(e.draft.size()))
    fail(Errc::invalid_argument, "decoder",
         "commit_node: node " + std::to_string(node) + " of a tree of " + std::to_string(e.draft.size()));
  if (e.parent[static_cast<size_t>(node)] != e.tree_at)
    fail(Errc::invalid_argument, "decoder",
         "commit_node: node " + std::to_string(node) + " is not a child of the last committed node (" +
             std::to_string(e.tree_at) + ")");
  if (e.tree_at < 0) { // the first commit: the tree's rows as evaluated
    if (e.n_rows < e.draft.size() + 1)
      fail(Errc::invalid_argument, "decoder",
           "commit_node: the tree of sequence " + std::to_string(seq) + " is not evaluated yet (plan it)");
    e.tree_row_off = e.row_off;
    e.tree_n_rows = e.n_rows;
  }
  // The committed node's depth is its slot's when every node before it on the path was at its own
  // (node == depth − 1): then its K/V stay where they are.
  const auto n_before = static_cast<int32_t>(e.tokens.size());
  if (e.tree_kv_keep == n_before && node == n_before - e.tree_base) e.tree_kv_keep = n_before + 1;
  const int32_t from = e.tree_at; // row 0 = the row after the last committed node
  e.row_off = e.tree_row_off + static_cast<size_t>(1 + from);
  e.n_rows = e.tree_n_rows - static_cast<size_t>(1 + from);
  e.tree_at = node;
  const StopReason r = commit_token(s, e.draft[static_cast<size_t>(node)]);
  if (r == StopReason::none) {
    e.row_off = e.tree_row_off + static_cast<size_t>(1 + node);
    e.n_rows = e.tree_n_rows - static_cast<size_t>(1 + node);
  }
  return r;
}

} // namespace loom
