// loom/types.hpp — common vocabulary (TokenId, SeqId, Pos: defined in the SDK, loom/sdk/types.hpp).
#pragma once

#include "loom/sdk/types.hpp"
