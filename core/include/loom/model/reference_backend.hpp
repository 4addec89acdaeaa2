// loom/model/reference_backend.hpp — the backend every other is tested against. loom::Backend, one
// device that executes model graphs, is defined in the SDK (loom/sdk/executor.hpp): backend plugins
// implement the very interface the host uses.
#pragma once

#include "loom/sdk/executor.hpp"

#include <memory>

namespace loom {

// Plain, obviously-correct F32 C++ (loom/sdk/reference.hpp): the ground truth of every test and
// the fallback for any op.
std::unique_ptr<Backend> make_reference_backend();

} // namespace loom
