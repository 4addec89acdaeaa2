// loom/sdk/error.hpp — loom::Error, the one exception of Loom's C++ code (the host, the SDK, every plugin),
// its codes and the ABI's status codes both ways, and LOOM_ASSERT. Header-only: plugins compile it in.
//
// Setup errors (config, model file, plugin) are loom::Error: what was expected, what was found, and
// a hint. Expected runtime outcomes (a stop, a full KV cache) are values, never errors. Inside a
// plugin an exception never crosses the ABI: the SDK's trampolines turn it into a loom_status.
#pragma once

#include "loom/sdk/abi.h"

#include <cstdint>
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
  // A plugin's shorthand: the message alone (bad input, its default), or with the code that fits.
  explicit Error(const std::string& message, Errc code = Errc::invalid_argument) : Error(code, "", message) {}
  Errc code() const noexcept { return code_; }
  const std::string& component() const noexcept { return component_; }

private:
  Errc code_;
  std::string component_;
};

// Errc and the ABI's status codes (loom_status_code), one row each; a parse error, and anything not
// listed, is bad input there.
inline constexpr struct {
  Errc errc;
  int32_t status;
} k_status_codes[] = {{Errc::invalid_argument, LOOM_STATUS_INVALID_ARGUMENT},
                      {Errc::not_found, LOOM_STATUS_NOT_FOUND},
                      {Errc::unsupported, LOOM_STATUS_UNSUPPORTED},
                      {Errc::abi_mismatch, LOOM_STATUS_ABI_MISMATCH},
                      {Errc::out_of_memory, LOOM_STATUS_OUT_OF_MEMORY},
                      {Errc::device_error, LOOM_STATUS_DEVICE_ERROR},
                      {Errc::internal, LOOM_STATUS_INTERNAL}};
inline int32_t status_code(Errc c) noexcept {
  for (const auto& r : k_status_codes)
    if (r.errc == c) return r.status;
  return LOOM_STATUS_INVALID_ARGUMENT;
}
inline Errc errc_of(int32_t status) noexcept {
  for (const auto& r : k_status_codes)
    if (r.status == status) return r.errc;
  return Errc::invalid_argument;
}

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
