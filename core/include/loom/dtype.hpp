// loom/dtype.hpp — element types of tensors and conversions: defined header-only in the SDK
// (loom/sdk/dtype.hpp), so the host and every backend plugin share one implementation.
#pragma once

#include "loom/sdk/dtype.hpp"
