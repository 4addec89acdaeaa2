// Admission and batch building (loom/scheduler.hpp).
#include "loom/scheduler.hpp"

namespace loom {

Scheduler::Decision Scheduler::admission(size_t n_prompt, size_t n_running) const {
  if (n_prompt >= static_cast<size_t>(n_ctx_))
    return {Admission::never, StopReason::max_context,
            "the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                std::to_string(n_ctx_) +
                " (prompt + at least one new token); shorten the prompt or raise [model] n_ctx"};
  if (n_running >= max_running_) return {Admission::wait, StopReason::none, {}};
  if (kv_.free_sequences() < 1) {
    if (n_running > 0)
      return {Admission::wait, StopReason::none, {}}; // a running request frees its sequences when it ends
    return {Admission::never, StopReason::error,
            "the KV cache has no free sequence although no request is running (" +
                std::to_string(kv_.shape().n_seq_max) + " sequences of " + std::to_string(n_ctx_) +
                " positions); raise [kv_cache] max_tokens"};
  }
  return {Admission::admit, StopReason::none, {}};
}

std::array<Scheduler::Batch, 2> Scheduler::build(std::span<DecodeSession* const> sessions) const {
  std::array<Batch, 2> out;
  for (size_t i = 0; i < sessions.size(); ++i)
    for (const DecodeSession::Work& w : sessions[i]->take_work()) {
      Batch& b = out[w.model == 0 ? 0 : 1];
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
  return out;
}

} // namespace loom
