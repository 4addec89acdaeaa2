// loom/engine/sample_decoder.hpp — the built-in `sample` decoder.
//
// Decoders are search strategies driven by the engine's step loop. Each step the engine asks every live
// request's decoder to plan (which sequences need a forward pass), evaluates all planned sequences of all
// requests in one batch, then lets each decoder update (read logits, sample, append, fork, finish). Decoders
// only plan, so every decoder gets continuous batching for free. The interface is the SDK's
// (loom/sdk/decoder.hpp: loom::Decoder over loom::Session, the session table of abi.h): the built-in decoders
// implement it as plugins do, and a request's DecodeSession is what its Session handle reaches
// (DecodeSession::of).
#pragma once

#include "loom/sdk/decoder.hpp"

#include <memory>

namespace loom {

// The built-in `sample` decoder: one sequence, each step samples with the request's chain
// (greedy when the chain says temperature 0), streams, stops per the stop rules.
std::unique_ptr<Decoder> make_sample_decoder();

} // namespace loom
