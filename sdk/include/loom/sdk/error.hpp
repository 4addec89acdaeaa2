// loom/sdk/error.hpp — loom::Error, the exception of Loom's C++ code (host and the header-only
// executor code of the SDK), and LOOM_ASSERT. Header-only: backend plugins compile it in.
//
// Setup errors (config, model file, plugin) are loom::Error: what was expected, what was found, and
// a hint. Expected runtime outcomes (a stop, a full KV cache) are values, never errors. Inside a
// plugin an exception never crosses the ABI: the SDK's trampolines turn it into a loom_status.
#pragma once

#include <cstdio>
#include <cstdlib>
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

[[noreturn]] inline void fail(Errc code, std::string component, const std::string& message) {
  throw Error(code, std::move(component), message);
}

// Programmer-error check: always on, aborts with file:line. Never used for input validation.
[[noreturn]] inline void assert_fail(const char* expr, const char* file, int line, const char* msg) noexcept {
  std::fprintf(stderr, "loom: internal assertion failed: %s (%s) at %s:%d\n", expr, msg ? msg : "", file,
               line);
  std::abort();
}

} // namespace loom

#define LOOM_ASSERT(cond, msg)                                                                               \
  do {                                                                                                       \
    if (!(cond)) ::loom::assert_fail(#cond, __FILE__, __LINE__, (msg));                                      \
  } while (0)
