// loom/sdk/types.hpp — common vocabulary of the host and the backends.
#pragma once

#include <cstdint>

namespace loom {

using TokenId = int32_t; // index into the vocabulary
using SeqId = int32_t;   // one sequence (a request has one or more: beams, samples)
using Pos = int32_t;     // position in a sequence, 0-based

} // namespace loom
