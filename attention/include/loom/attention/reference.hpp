// loom/attention/reference.hpp — the plain C++ attention kernel every backend's kernel is tested
// against: loom::attention::reference_attention, defined header-only in the SDK (loom/sdk/reference.hpp).
#pragma once

#include "loom/sdk/reference.hpp"
