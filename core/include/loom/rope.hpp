// loom/rope.hpp — rotary position embedding tables: defined header-only in the SDK (loom/sdk/rope.hpp).
#pragma once

#include "loom/sdk/rope.hpp"
