// tokenizer/utf8.cpp — incremental UTF-8 validation for detokenization.
#include "tokenizer/utf8.hpp"

namespace loom::tok {

namespace {

// Number of bytes at the front of `s` (s[0] >= 0x80) that form the longest prefix of some
// well-formed sequence ("maximal subpart", at least 1), and the sequence length that lead needs
// (0 for a byte that can never start a sequence).
struct Subpart {
  size_t len;
  size_t need;
};

Subpart maximal_subpart(std::string_view s) noexcept {
  const auto b0 = static_cast<uint8_t>(s[0]);
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, 0};
  }
  size_t k = 1;
  for (; k < need && k < s.size(); ++k) {
    const auto b = static_cast<uint8_t>(s[k]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  return {k, need};
}

} // namespace

void utf8_drain(std::string& pending, std::string& out, bool flush) {
  const std::string_view s = pending;
  size_t i = 0;
  while (i < s.size()) {
    const std::string_view rest = s.substr(i);
    if (const size_t n = utf8_valid_len(rest); n > 0) {
      out.append(rest.substr(0, n));
      i += n;
      continue;
    }
    const Subpart p = maximal_subpart(rest);
    // A valid lead whose continuation bytes so far are fine but run into the end: wait for more.
    if (p.need > 0 && p.len == rest.size() && p.len < p.need && !flush) break;
    out.append(k_replacement);
    i += p.len;
  }
  pending.erase(0, i);
}

} // namespace loom::tok
