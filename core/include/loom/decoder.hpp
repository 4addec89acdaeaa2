// loom/decoder.hpp — search strategies, driven by the engine's step loop.
//
// Each step the engine asks every live request's decoder to plan (which sequences need a forward
// pass), evaluates all planned sequences of all requests in one batch, then lets each decoder
// update (read logits, sample, append, fork, finish). Decoders only plan, so every decoder gets
// continuous batching for free.
#pragma once

#include <memory>
#include <string_view>

namespace loom {

class DecodeSession;

class Decoder {
public:
  virtual ~Decoder() = default;
  virtual std::string_view name() const noexcept = 0;
  virtual void start(DecodeSession& /*s*/) {}
  virtual void plan(DecodeSession& s) = 0;
  virtual void update(DecodeSession& s) = 0;
  virtual bool done(const DecodeSession& s) const = 0;
  virtual void results(DecodeSession& s) = 0; // s.add_result(seq, score), best first
};

// The built-in `sample` decoder: one sequence, each step samples with the request's chain
// (greedy when the chain says temperature 0), streams, stops per the stop rules.
std::unique_ptr<Decoder> make_sample_decoder();

} // namespace loom
