// loom/model/graph.hpp — the node list a model builds once per batch shape and a backend executes:
// defined header-only in the SDK (loom/sdk/graph.hpp); the host adds graph identities.
#pragma once

#include "loom/sdk/graph.hpp"

#include <cstdint>

namespace loom {

// A process-unique graph id (Graph::id), never 0.
uint64_t new_graph_id() noexcept;

} // namespace loom
