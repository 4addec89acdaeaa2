#include "loom/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace loom {

std::string_view errc_name(Errc c) noexcept {
  switch (c) {
  case Errc::invalid_argument:
    return "invalid_argument";
  case Errc::parse_error:
    return "parse_error";
  case Errc::not_found:
    return "not_found";
  case Errc::unsupported:
    return "unsupported";
  case Errc::abi_mismatch:
    return "abi_mismatch";
  case Errc::out_of_memory:
    return "out_of_memory";
  case Errc::device_error:
    return "device_error";
  case Errc::internal:
    return "internal";
  }
  return "unknown";
}

void fail(Errc code, std::string component, const std::string& message) {
  throw Error(code, std::move(component), message);
}

void assert_fail(const char* expr, const char* file, int line, const char* msg) noexcept {
  std::fprintf(stderr, "loom: internal assertion failed: %s (%s) at %s:%d\n", expr, msg ? msg : "", file,
               line);
  std::abort();
}

} // namespace loom
