// Admission, token budget, chunked prefill and preemption (loom/scheduler.hpp).
#include "loom/scheduler.hpp"

#include <algorithm>

namespace loom {

Scheduler::Decision Scheduler::admission(size_t n_prompt, int64_t needed, size_t n_running) const {
  if (n_prompt >= static_cast<size_t>(n_ctx_))
    return {Admission::never, StopReason::max_context,
            "the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                std::to_string(n_ctx_) +
                " (prompt + at least one new token); shorten the prompt or raise [model] n_ctx"};
  if (static_cast<int64_t>(n_prompt) + 1 > kv_.capacity_positions())
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
  // A paged store also keeps a block of headroom per running request, so that what it admits does not
  // preempt the running ones as soon as they grow (a slab holds its sequence's whole context).
  const int64_t headroom =
      kv_.positions_per_unit() < n_ctx_ ? static_cast<int64_t>(n_running) * kv_.positions_per_unit() : 0;
  if (n_running > 0 && kv_.free_positions() - headroom < needed)
    return {Admission::wait, StopReason::none, {}};
  return {Admission::admit, StopReason::none, {}};
}

Scheduler::Step Scheduler::build(std::span<const Candidate> cands) const {
  Step out;
  const size_t n = cands.size();
  std::vector<char> scheduled(n, 0), evicted(n, 0);
  int32_t budget[2] = {max_batch_tokens_, max_batch_tokens_};
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
  const auto evict = [&](size_t j) {
    cands[j].session->evict();
    evicted[j] = 1;
    out.preempted.push_back(j);
  };
  for (int pass = 0; pass < 2; ++pass) // decodes, then prefills
    for (size_t i = 0; i < n; ++i) {
      const Candidate& c = cands[i];
      if (evicted[i] || c.decoding != (pass == 0) || c.session->evicted()) continue;
      std::vector<DecodeSession::Work> works;
      bool self_preempted = false;
      for (const DecodeSession::Pending& p : c.session->pending()) {
        const int m = p.model == 0 ? 0 : 1;
        const int32_t take = std::min(p.remaining, budget[m]);
        if (take <= 0) continue; // the budget is spent: the rest waits for the next step
        std::optional<DecodeSession::Work> w;
        while (!(w = c.session->take_chunk(p.seq, take))) {
          if (auto v = newest_victim(i)) {
            evict(*v);
            continue;
          }
          if (!others_hold_kv(i)) { // alone and still no room: this sequence cannot grow further
            c.session->end_pending(p.seq, StopReason::max_context);
            break;
          }
          if (c.decoding || (out.batches[0].empty() && out.batches[1].empty() && works.empty())) {
            evict(i); // it gives way to the older requests and is recomputed later
            self_preempted = true;
          }
          break; // a prefill waits for the next step
        }
        if (self_preempted) break;
        if (w) {
          budget[m] -= take;
          works.push_back(std::move(*w));
        }
      }
      if (self_preempted) {
        for (const DecodeSession::Work& w : works) // its chunks are dropped: their budget comes back
          budget[w.model == 0 ? 0 : 1] += static_cast<int32_t>(w.tokens.size());
        continue;
      }
      if (!works.empty()) scheduled[i] = 1;
      for (const DecodeSession::Work& w : works) {
        Batch& b = out.batches[w.model == 0 ? 0 : 1];
        if (b.sessions.empty() || b.sessions.back() != i) b.sessions.push_back(i);
        size_t row = static_cast<size_t>(w.first_row);
        for (size_t k = 0; k < w.tokens.size(); ++k) {
          const Pos pos = w.first_pos + static_cast<Pos>(k);
          b.tokens.push_back(w.tokens[k]);
          b.positions.push_back(pos);
          b.seq_ids.push_back(w.kv);
          if (pos >= w.out_from) {
            b.out_rows.push_back(static_cast<int32_t>(b.tokens.size()) - 1);
            b.outs.push_back({i, w.seq, row++});
          }
        }
      }
    }
  return out;
}

} // namespace loom
