// loom/backend.hpp — one device that executes model graphs: loom::Backend is defined in the SDK
// (loom/sdk/executor.hpp), so backend plugins implement the very interface the host uses.
#pragma once

#include "loom/graph.hpp"
#include "loom/kv_cache.hpp"
#include "loom/sdk/executor.hpp"

#include <memory>

namespace loom {

// Plain, obviously-correct F32 C++ (loom/sdk/reference.hpp): the ground truth of every test and
// the fallback for any op.
std::unique_ptr<Backend> make_reference_backend();

} // namespace loom
