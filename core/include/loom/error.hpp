// loom/error.hpp — the one exception type of the host side.
//
// Setup errors (config, model file, plugin) are loom::Error: what was expected, what was found, and
// a hint. Expected runtime outcomes (a stop, a full KV cache) are values, never errors.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace loom {

enum class Errc {
  invalid_argument, // bad user input: CLI flag, sampling parameter, prompt
  parse_error,      // malformed file: GGUF, TOML, JSON
  not_found,        // missing file, key, tensor
  unsupported,      // valid but not implemented: tensor type, architecture
  abi_mismatch,     // plugin built for another ABI
  out_of_memory,    // allocation refused
  device_error,     // backend failure
  internal,         // a bug in Loom
};

std::string_view errc_name(Errc c) noexcept;

class Error : public std::runtime_error {
public:
  Error(Errc code, std::string component, const std::string& message)
      : std::runtime_error(component.empty() ? message : component + ": " + message), code_(code),
        component_(std::move(component)) {}
  Errc code() const noexcept { return code_; }
  const std::string& component() const noexcept { return component_; }

private:
  Errc code_;
  std::string component_;
};

[[noreturn]] void fail(Errc code, std::string component, const std::string& message);

// Text as a one-line message may carry it: control characters and bytes that are not valid UTF-8
// escaped (\\n, \\r, \\t, \\\\, \\xNN); valid UTF-8 kept.
std::string one_line(std::string_view s);
// A user-supplied value as messages echo it: in single quotes, on one line (control characters and
// invalid UTF-8 escaped as \n, \xNN …), cut after `max` bytes with "...".
std::string user_value(std::string_view value, size_t max = 160);

// Programmer-error check: always on, aborts with file:line. Never used for input validation.
[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const char* msg) noexcept;

} // namespace loom

#define LOOM_ASSERT(cond, msg)                                                                               \
  do {                                                                                                       \
    if (!(cond)) ::loom::assert_fail(#cond, __FILE__, __LINE__, (msg));                                      \
  } while (0)
