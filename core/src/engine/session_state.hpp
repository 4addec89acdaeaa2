// DecodeSession's private state, shared by the files that implement it (decode_session.cpp, the core;
// session_draft.cpp, drafts and token trees; session_verifier.cpp, the verifier).
#pragma once

#include "loom/engine/decode_session.hpp"

#include <memory>
#include <string>
#include <vector>

namespace loom {

// A sequence's state once it had prompt + k generated tokens (immutable; shared by forks), so that
// truncate restores exactly what a sequence of that length had — including sampler state that a
// replay of accept() could not rebuild (Mirostat's μ moves in apply()).
struct DecodeSession::Checkpoint {
  std::unique_ptr<Sampler> chain;
  StopTracker stop; // every criterion, built-in and plugin, with its state
  DecodeState detok;
  size_t text_size = 0;
  explicit Checkpoint(const StopTracker& st) : stop(st) {}
};

// The decoder-side state of a sequence; its tokens, K/V and logits rows are the book's entry `e`.
struct DecodeSession::Seq {
  SequenceBook::Entry* e = nullptr; // the book's entry of the same id (std::map nodes do not move)
  std::unique_ptr<Sampler> chain;   // this sequence's sampler state
  StopTracker stop; // its stop criteria (built-in and plugin) and the text held back from streaming
  DecodeState detok;
  std::string text; // released text
  std::vector<float> logprobs;
  std::vector<TokenAlternatives> top; // per generated token, when the request asked for top_logprobs
  double logprob_sum = 0;
  StopReason finished = StopReason::none;
  std::string stop_string;
  double final_score = 0;
  std::vector<std::shared_ptr<const Checkpoint>> history; // [k]: after k generated tokens

  explicit Seq(StopTracker st) : stop(std::move(st)) {}
};

// A KV sequence just allocated for a sequence whose state is still being built: that state is cloned from
// plugins (sampler chain, stop criteria), which may throw — then the KV sequence goes back to the store.
struct FreeKvOnThrow {
  SequenceBook& book;
  ModelRole role;
  SeqId seq;
  bool armed = true;
  FreeKvOnThrow(SequenceBook& b, ModelRole r, SeqId s) : book(b), role(r), seq(s) {}
  FreeKvOnThrow(const FreeKvOnThrow&) = delete;
  FreeKvOnThrow& operator=(const FreeKvOnThrow&) = delete;
  ~FreeKvOnThrow() {
    if (armed) book.free_kv(role, seq);
  }
};

} // namespace loom
