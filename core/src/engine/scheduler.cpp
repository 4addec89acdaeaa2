// Admission, token budget, chunked prefill and preemption (loom/engine/scheduler.hpp).
#include "loom/engine/scheduler.hpp"

#include <algorithm>
#include <optional>

namespace loom {

Scheduler::Decision Scheduler::admission(size_t n_prompt, int64_t needed, size_t n_running) const {
  if (n_prompt >= static_cast<size_t>(n_ctx_))
    return {Admission::never, StopReason::max_context,
            "the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                std::to_string(n_ctx_) +
                " (prompt + at least one new token); shorten the prompt or raise [model] n_ctx"};
  if (kv_.units_for(static_cast<int64_t>(n_prompt) + 1) > kv_.n_units())
    return {Admission::never, StopReason::max_context,
            "the prompt has " + std::to_string(n_prompt) + " tokens but the KV cache holds " +
                std::to_string(kv_.capacity_positions()) +
                " positions in all (prompt + at least one new token); raise [kv_cache] max_tokens"};
  if (n_running >= max_running_) return {Admission::wait, StopReason::none, {}};
  if (kv_.free_sequences() < 1) {
    if (n_running > 0)
      return {Admission::wait, StopReason::none, {}}; // a running request frees its sequences when it ends
    return {Admission::never, StopReason::error,
            "the KV cache has no free sequence although no request is running (" +
                std::to_string(kv_.shape().n_seq_max) + " sequences of " + std::to_string(n_ctx_) +
                " positions); raise [kv_cache] max_tokens"};
  }
  // Room for what it holds at once: a new request's prompt, a preempted one's sequences. With
  // nothing running it starts anyway (what does not fit then ends with max_context).
  // A paged store also keeps a block (per layer group) of headroom per running request, so that what it
  // admits does not preempt the running ones as soon as they grow (a slab holds its sequence's whole
  // context).
  const int64_t headroom = kv_.positions_per_unit() < n_ctx_
                               ? static_cast<int64_t>(n_running) * kv_.units_for(kv_.positions_per_unit())
                               : 0;
  if (n_running > 0 && kv_.free_units() - headroom < needed) return {Admission::wait, StopReason::none, {}};
  return {Admission::admit, StopReason::none, {}};
}

Scheduler::Schedule Scheduler::schedule(std::span<const RequestState> reqs, const KVCacheStore* draft) const {
  Schedule out;
  const size_t n = reqs.size();
  const PerModel<const KVCacheStore*> store{&kv_, draft};
  PerModel<int64_t> free_units{kv_.free_units(), draft ? draft->free_units() : 0};
  std::vector<char> scheduled(n, 0), evicted(n, 0);
  std::vector<PerModel<int64_t>> reserved(n); // units each request's takes reserved
  PerModel<int32_t> budget{max_batch_tokens_, max_batch_tokens_};
  for (size_t i = 0; i < n; ++i)
    evicted[i] = reqs[i].evicted ? 1 : 0;
  const auto newest_victim = [&](size_t i) -> std::optional<size_t> {
    for (size_t j = n; j-- > i + 1;)
      if (!scheduled[j] && !evicted[j]) return j;
    return std::nullopt;
  };
  const auto others_hold_kv = [&](size_t i) {
    for (size_t j = 0; j < n; ++j)
      if (j != i && !evicted[j]) return true;
    return false;
  };
  const auto preempt = [&](size_t j) { // what it holds, and what it reserved this step, become free
    for (ModelRole m : k_model_roles)
      if (store[m]) free_units[m] += store[m]->units_freed_by(reqs[j].kv_held[m]) + reserved[j][m];
    evicted[j] = 1;
    std::erase_if(out.copies, [&](const Schedule::BlockCopy& c) { return c.request == j; });
    out.actions.push_back({Action::Op::preempt, j, -1, ModelRole::target, 0, StopReason::none});
    out.preempted.push_back(j);
  };
  for (int pass = 0; pass < 2; ++pass) // decodes, then prefills
    for (size_t i = 0; i < n; ++i) {
      const RequestState& r = reqs[i];
      if (evicted[i] || r.decoding != (pass == 0)) continue;
      const size_t first_action = out.actions.size();
      bool self_preempted = false;
      PerModel<int32_t> taken;
      for (const SequenceBook::Pending& p : r.pending) {
        const ModelRole m = p.role;
        const int32_t take = std::min(p.remaining, budget[m]);
        if (take <= 0 || !store[m]) continue; // the budget is spent: the rest waits for the next step
        bool took = false;
        for (;;) {
          const int64_t need = store[m]->units_to_grow(p.kv, take);
          if (need >= 0 && need <= free_units[m]) {
            free_units[m] -= need;
            reserved[i][m] += need;
            took = true;
            break;
          }
          if (auto v = newest_victim(i)) {
            preempt(*v);
            continue;
          }
          if (!others_hold_kv(i)) { // alone and still no room: this sequence cannot grow further
            out.actions.push_back({Action::Op::end, i, p.seq, m, 0, StopReason::max_context});
            break;
          }
          if (r.decoding || (out.tokens == PerModel<int32_t>{} && taken == PerModel<int32_t>{})) {
            self_preempted = true; // it gives way to the older requests and is recomputed later
          }
          break; // a prefill waits for the next step
        }
        if (self_preempted) break;
        if (took) {
          budget[m] -= take;
          taken[m] += take;
          out.actions.push_back({Action::Op::take, i, p.seq, m, take, StopReason::none});
          for (const KVCacheStore::GrowCopy& c : store[m]->copies_to_grow(p.kv, take))
            out.copies.push_back({i, p.seq, m, c});
        }
      }
      if (self_preempted) { // its chunks are dropped (their budget and KV come back); victims stay out
        std::vector<Action> kept(out.actions.begin(),
                                 out.actions.begin() + static_cast<std::ptrdiff_t>(first_action));
        for (size_t k = first_action; k < out.actions.size(); ++k)
          if (out.actions[k].request != i || out.actions[k].op != Action::Op::take)
            kept.push_back(out.actions[k]);
        out.actions = std::move(kept);
        std::erase_if(out.copies, [&](const Schedule::BlockCopy& c) { return c.request == i; });
        for (ModelRole m : k_model_roles)
          budget[m] += taken[m];
        preempt(i);
        continue;
      }
      if (taken.target + taken.draft > 0) scheduled[i] = 1;
      for (ModelRole m : k_model_roles)
        out.tokens[m] += taken[m];
    }
  for (ModelRole m : k_model_roles)
    for (size_t i = 0; i < n; ++i)
      out.units[m] += evicted[i] ? 0 : reserved[i][m];
  return out;
}

void Scheduler::Batch::add(size_t request, const SequenceBook::Work& w) {
  if (sessions.empty() || sessions.back() != request) sessions.push_back(request);
  size_t row = static_cast<size_t>(w.first_row);
  for (size_t k = 0; k < w.tokens.size(); ++k) {
    const Pos pos = w.first_pos + static_cast<Pos>(k);
    tokens.push_back(w.tokens[k]);
    positions.push_back(pos);
    seq_ids.push_back(w.kv);
    rope.push_back(w.rope.empty() ? pos : w.rope[k]);
    tree_base.push_back(w.tree_base.empty() ? pos + 1 : w.tree_base[k]);
    tree_mask.push_back(w.tree_mask.empty() ? 0 : w.tree_mask[k]);
    if (!w.tree_base.empty()) has_tree = true;
    if (pos >= w.out_from) {
      out_rows.push_back(static_cast<int32_t>(tokens.size()) - 1);
      outs.push_back({request, w.seq, row++});
    }
  }
}

} // namespace loom
