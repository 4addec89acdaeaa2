// The bookkeeping half of a request (loom/engine/sequence_book.hpp): its sequences' tokens, K/V and logits
// rows, the work of a step, preemption.
#include "loom/engine/sequence_book.hpp"

#include "loom/error.hpp"

#include <algorithm>
#include <climits>
#include <string>

namespace loom {

SequenceBook::Entry* SequenceBook::find(LocalSeq seq) noexcept {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}
const SequenceBook::Entry* SequenceBook::find(LocalSeq seq) const noexcept {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

SequenceBook::Entry& SequenceBook::at(LocalSeq seq) {
  Entry* e = find(seq);
  if (!e)
    fail(Errc::invalid_argument, "decoder",
         "sequence " + std::to_string(seq) + " does not exist in this request (never forked, or freed)");
  return *e;
}

SeqId SequenceBook::new_kv(ModelRole role, SeqId parent_kv, bool fork) {
  KVCacheStore& store = ctx_.kv(role);
  const SeqId kv = ctx_.kv_seq_to_take();
  const bool ok = fork ? store.fork(parent_kv, kv) : store.allocate(kv, 0);
  if (!ok) return -1;
  ctx_.take_kv_seq(kv);
  return kv;
}

void SequenceBook::free_kv(ModelRole role, SeqId kv) noexcept {
  if (kv < 0) return;
  ctx_.kv(role).free(kv);
  ctx_.free_kv_seqs.push_back(kv);
}

LocalSeq SequenceBook::add(Entry e) {
  const LocalSeq id = next_seq_++;
  seqs_.emplace(id, std::move(e));
  ++events_;
  return id;
}

void SequenceBook::erase(LocalSeq seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  free_kv(it->second.role, it->second.kv);
  seqs_.erase(it);
  planned_.erase(std::remove(planned_.begin(), planned_.end(), seq), planned_.end());
  ++events_;
}

bool SequenceBook::mark_planned(LocalSeq seq) {
  Entry& e = at(seq);
  if (e.planned) return false;
  e.planned = true;
  planned_.push_back(seq);
  return true;
}

void SequenceBook::rewind(Entry& s, size_t n_tokens) {
  s.draft.clear();
  s.parent.clear();
  s.tree_at = -1;
  s.tokens.resize(n_tokens);
  s.finished = false;
  // The logits of the new last token: evaluated again when the sequence is next planned (begin_work
  // drops its K/V then); a decoder that appends first pays only for the new token.
  s.n_rows = 0;
  uncache(s, static_cast<int32_t>(n_tokens));
  // Under a sliding window the next query (at n_tokens − 1) reads the window before it: when the
  // truncate went back past rows already released, they are evaluated again from the first of them.
  if (s.kv >= 0) {
    const KVCacheStore& store = ctx_.kv(s.role);
    if (!store.readable(s.kv, static_cast<Pos>(n_tokens) - 1, s.n_cached))
      uncache(s, store.first_released(s.kv));
  }
  ++events_;
}

void SequenceBook::begin_work() {
  const auto V = static_cast<size_t>(ctx_.n_vocab);
  for (LocalSeq id : planned_) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;
    Entry& q = it->second;
    q.planned = false;
    if (q.finished || q.kv < 0) continue;
    const auto n_committed = static_cast<int32_t>(q.tokens.size());
    const auto n_all = n_committed + static_cast<int32_t>(q.draft.size());
    const size_t rows_wanted = q.draft.size() + 1; // after the committed tokens and after each draft
    if (q.n_rows >= rows_wanted) continue;         // everything this plan asks is current (e.g. a fresh fork)
    // Rows come from positions out_from .. n_all-1: the committed last token's (unless row 0 is
    // current) and every draft token's. Positions already cached produce no rows: evaluate again.
    const int32_t out_from = q.n_rows >= 1 ? n_committed : n_committed - 1;
    uncache(q, out_from);
    if (q.n_rows > 1) q.n_rows = 1;
    LOOM_ASSERT(n_all - q.n_cached > 0, "a plan evaluates at least one token");
    // Rows buffer: row 0 kept (moved to the front), room for every row this plan writes.
    if (q.n_rows == 1 && q.row_off > 0)
      std::copy_n(q.rows.begin() + static_cast<std::ptrdiff_t>(q.row_off * V), V, q.rows.begin());
    q.row_off = 0;
    q.rows.resize(rows_wanted * V);
    q.n_rows = rows_wanted;
    q.pending = true;
    q.target = n_all;
    q.out_from = out_from;
    if (q.role == ModelRole::draft && ctx_.models.draft.target_layers && q.mirror >= 0) copy_from_target(q);
    ++events_;
  }
  planned_.clear();
}

void SequenceBook::copy_from_target(Entry& q) {
  const auto it = seqs_.find(q.mirror);
  if (it == seqs_.end()) return;
  const Entry& t = it->second;
  KVCacheStore& src = ctx_.kv();
  KVCacheStore& dst = ctx_.kv(ModelRole::draft);
  if (t.role != ModelRole::target || t.kv < 0 || t.in_flight || !src.contains(t.kv)) return;
  // Host memory only (both pools): rows are copied one at a time, which on a device's memory would be a
  // blocking transfer each — there evaluating the layers again is cheaper.
  const Buffer* src_buf = src.memory().buffer();
  const Buffer* dst_buf = dst.memory().buffer();
  if (!src_buf || !dst_buf || src_buf->owner() || dst_buf->owner()) return;
  // The target's committed tokens with K/V at their own positions (a tree's nodes lie elsewhere).
  int32_t lim = std::min({q.out_from, t.n_cached, static_cast<int32_t>(t.tokens.size())});
  if (t.is_tree()) lim = std::min(lim, t.tree_base);
  const int32_t from = q.n_cached;
  int32_t end = from;
  while (end < lim && t.tokens[static_cast<size_t>(end)] == q.tokens[static_cast<size_t>(end)])
    ++end;
  if (end <= from || !src.holds(t.kv, from, end)) return;
  if (dst.length(q.kv) != from || !dst.allocate(q.kv, end - from)) return; // no room: evaluated instead
  const int32_t n_layer = dst.shape().n_layer; // the draft's: the target's first layers
  for (int32_t layer = 0; layer < n_layer; ++layer)
    for (int kv = 0; kv < 2; ++kv)
      for (Pos pos = from; pos < end; ++pos)
        dst.write_row(layer, kv, q.kv, pos, src.read_row(layer, kv, t.kv, pos));
  q.n_cached = end;
  kv_copied_ += static_cast<size_t>(end - from);
}

bool SequenceBook::work_pending() const noexcept {
  for (const auto& [id, q] : seqs_)
    if (q.pending) return true;
  return false;
}

std::vector<SequenceBook::Pending> SequenceBook::pending() const {
  std::vector<Pending> out;
  for (const auto& [id, q] : seqs_)
    if (q.pending) out.push_back({id, q.role, q.kv, q.target - q.n_cached});
  return out;
}

std::vector<SeqId> SequenceBook::kv_held(ModelRole role) const {
  std::vector<SeqId> out;
  for (const auto& [id, q] : seqs_)
    if (q.kv >= 0 && q.role == role && ctx_.kv(q.role).contains(q.kv)) out.push_back(q.kv);
  return out;
}

std::optional<SequenceBook::Work> SequenceBook::take_chunk(LocalSeq seq, int32_t n) {
  Entry& q = at(seq);
  LOOM_ASSERT(q.pending && !evicted_ && n > 0, "a chunk of pending work");
  n = std::min(n, q.target - q.n_cached);
  if (!ctx_.kv(q.role).allocate(q.kv, n)) return std::nullopt;
  const auto n_committed = static_cast<int32_t>(q.tokens.size());
  Work w;
  w.seq = seq;
  w.role = q.role;
  w.kv = q.kv;
  w.first_pos = q.n_cached;
  w.out_from = q.out_from;
  w.first_row = std::max(q.n_cached, q.out_from) - (n_committed - 1);
  for (int32_t p = q.n_cached; p < q.n_cached + n; ++p)
    w.tokens.push_back(p < n_committed ? q.tokens[static_cast<size_t>(p)]
                                       : q.draft[static_cast<size_t>(p - n_committed)]);
  if (q.is_tree() && !q.tree_chain && q.n_cached + n > n_committed) { // tree rows: depth, base, ancestors
    LOOM_ASSERT(q.tree_base == n_committed && q.tree_at < 0, "a tree is evaluated before any node commits");
    for (int32_t p = q.n_cached; p < q.n_cached + n; ++p) {
      if (p < n_committed) {
        w.rope.push_back(p);
        w.tree_base.push_back(p + 1);
        w.tree_mask.push_back(0);
        continue;
      }
      int32_t depth = 0;
      uint64_t mask = 0;
      for (int32_t i = p - n_committed; i >= 0; i = q.parent[static_cast<size_t>(i)]) {
        mask |= uint64_t{1} << i;
        ++depth;
      }
      w.rope.push_back(n_committed - 1 + depth);
      w.tree_base.push_back(n_committed);
      w.tree_mask.push_back(mask);
    }
  }
  q.n_cached += n;
  q.in_flight = true;
  q.in_flight_n = n;
  if (q.n_cached == q.target) q.pending = false;
  evaluated_[q.role] += static_cast<size_t>(n);
  ++events_;
  return w;
}

void SequenceBook::chunks_evaluated() {
  for (auto& [id, q] : seqs_) {
    if (q.in_flight && q.kv >= 0) {
      KVCacheStore& store = ctx_.kv(q.role);
      store.register_prefix(q.kv, q.tokens); // findable by content
      // A sliding window: what no later query reads goes back to the store. The next query is at
      // n_cached, or at the last committed token when its row is evaluated again (begin_work).
      store.retire(q.kv, std::min<Pos>(q.n_cached, static_cast<Pos>(q.tokens.size()) - 1));
    }
    q.in_flight = false;
    if (q.finished) drop_kv(q);
  }
}

void SequenceBook::evict() {
  for (auto& [id, q] : seqs_) {
    if (q.kv >= 0) ctx_.kv(q.role).free(q.kv);
    q.n_cached = 0;
    if (q.in_flight) { // its chunk never ran: its rows are still owed, its tokens were not evaluated
      q.pending = true;
      evaluated_[q.role] -= static_cast<size_t>(q.in_flight_n);
    }
    q.in_flight = false;
  }
  evicted_ = true;
  ++events_;
}

bool SequenceBook::restore() {
  if (!evicted_) return true;
  std::vector<Entry*> done;
  for (auto& [id, q] : seqs_) {
    if (q.kv < 0 || q.finished) continue; // a finished sequence holds no K/V
    if (!ctx_.kv(q.role).allocate(q.kv, 0)) {
      for (Entry* d : done)
        ctx_.kv(d->role).free(d->kv);
      return false;
    }
    done.push_back(&q);
  }
  evicted_ = false;
  // What is still cached of each live sequence's positions comes back without evaluation: up to the
  // first position whose logits row is owed (pending), or all its committed tokens.
  for (Entry* e : done) {
    Entry& q = *e;
    if (q.finished) continue;
    const auto n_committed = static_cast<int32_t>(q.tokens.size());
    const int32_t cap = q.pending ? std::min(q.out_from, n_committed) : n_committed;
    q.n_cached = ctx_.kv(q.role).reuse_prefix(q.kv, q.tokens, cap);
    if (q.pending && q.n_cached >= q.target) q.pending = false;
    // The prefix cache may hand back blocks a sliding window had released: release them again.
    if (q.n_cached > 0)
      ctx_.kv(q.role).retire(q.kv, std::min<Pos>(q.n_cached, static_cast<Pos>(q.tokens.size()) - 1));
  }
  return true;
}

int64_t SequenceBook::units_needed() const noexcept {
  int64_t n = 0;
  for (const auto& [id, q] : seqs_)
    if (q.kv >= 0 && q.role == ModelRole::target)
      n += ctx_.kv().units_for(q.pending ? q.target
                                         : (!q.finished ? static_cast<int64_t>(q.tokens.size()) : 0));
  return n;
}

size_t SequenceBook::max_generated() const noexcept {
  size_t n = 0;
  for (const auto& [id, q] : seqs_)
    n = std::max(n, q.tokens.size() - n_prompt_);
  return n;
}

void SequenceBook::set_logits(LocalSeq seq, size_t row, std::span<const float> logits) {
  Entry& s = at(seq);
  const auto V = static_cast<size_t>(ctx_.n_vocab);
  LOOM_ASSERT(logits.size() == V && row < s.n_rows && s.row_off == 0, "a row begin_work() prepared");
  std::copy(logits.begin(), logits.end(), s.rows.begin() + static_cast<std::ptrdiff_t>(row * V));
}

bool SequenceBook::any_generated() const noexcept {
  for (const auto& [id, q] : seqs_)
    if (q.tokens.size() > n_prompt_) return true;
  return false;
}

void SequenceBook::release() {
  for (auto& [id, q] : seqs_)
    if (q.kv >= 0) {
      ctx_.kv(q.role).free(q.kv);
      ctx_.free_kv_seqs.push_back(q.kv);
      q.kv = -1;
    }
}

void SequenceBook::drop_kv(Entry& s) {
  if (s.kv < 0 || s.in_flight) return;
  KVCacheStore& store = ctx_.kv(s.role);
  if (!store.contains(s.kv)) return;
  store.free(s.kv); // the id stays this sequence's until it is freed (allocate() makes it again)
  s.n_cached = 0;
}

void SequenceBook::drop_draft(Entry& s) {
  if (s.draft.empty()) return;
  s.draft.clear();
  s.n_rows = std::min<size_t>(s.n_rows, 1); // row 0 (after the committed tokens) stays valid
  int32_t keep = static_cast<int32_t>(s.tokens.size());
  if (s.is_tree()) { // committed nodes whose K/V are not at their own positions are evaluated again
    if (s.tree_at >= 0) keep = std::min(keep, s.tree_kv_keep);
    s.parent.clear();
    s.tree_at = -1;
    if (keep < static_cast<int32_t>(s.tokens.size())) s.n_rows = std::min<size_t>(s.n_rows, 1);
  }
  uncache(s, keep);
}

void SequenceBook::uncache(Entry& s, int32_t keep) {
  if (s.n_cached > keep) {
    s.n_cached = keep;
    ctx_.kv(s.role).truncate(s.kv, keep);
  }
}

} // namespace loom
