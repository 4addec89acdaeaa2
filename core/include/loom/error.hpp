// loom/error.hpp — the one exception type of the host side (loom::Error, LOOM_ASSERT: defined in
// the SDK's loom/sdk/error.hpp, shared with backend plugins) and the host's message helpers.
#pragma once

#include "loom/sdk/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

std::string_view errc_name(Errc c) noexcept;

// Text as a one-line message may carry it: control characters and bytes that are not valid UTF-8
// escaped (\\n, \\r, \\t, \\\\, \\xNN); valid UTF-8 kept.
std::string one_line(std::string_view s);
// A user-supplied value as messages echo it: in single quotes, on one line (control characters and
// invalid UTF-8 escaped as \n, \xNN …), cut after `max` bytes with "...".
std::string user_value(std::string_view value, size_t max = 160);

// A byte count as messages and reports show it: "12.3 MiB" (one decimal).
std::string mib(uint64_t bytes);

} // namespace loom
