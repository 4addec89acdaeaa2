#include "loom/error.hpp"

#include "tokenizer/utf8.hpp"

#include <algorithm>
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

std::string one_line(std::string_view s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = tok::utf8_valid_len(s.substr(i)); // 0: not a well-formed sequence
    if (n > 1) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c == 0x7f || n == 0) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  return out;
}

std::string user_value(std::string_view value, size_t max) {
  size_t cut = std::min(max, value.size());
  while (cut < value.size() && cut > 0 && (static_cast<unsigned char>(value[cut]) & 0xC0) == 0x80)
    --cut; // not inside a UTF-8 character
  return "'" + one_line(value.substr(0, cut)) + (cut < value.size() ? "...'" : "'");
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

} // namespace loom
