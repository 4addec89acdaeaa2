// tokenizer/utf8.hpp — UTF-8 helpers shared by the tokenizers (private header).
//
// Well-formedness follows Unicode §3.9 Table 3-7 (no overlongs, no surrogates, nothing above
// U+10FFFF). Invalid input is never rejected: callers treat each invalid byte on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::tok {

inline constexpr std::string_view k_replacement = "\xEF\xBF\xBD"; // U+FFFD

// Length of the well-formed UTF-8 sequence at the start of `s`: 1..4, or 0 when the bytes there
// are not a complete well-formed sequence (invalid lead byte, bad continuation, or truncated).
inline size_t utf8_valid_len(std::string_view s) noexcept {
  if (s.empty()) return 0;
  const auto b0 = static_cast<uint8_t>(s[0]);
  if (b0 < 0x80) return 1;
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF; // allowed range of the second byte
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
    return 0;
  }
  if (s.size() < need) return 0;
  const auto b1 = static_cast<uint8_t>(s[1]);
  if (b1 < lo || b1 > hi) return 0;
  for (size_t k = 2; k < need; ++k) {
    const auto b = static_cast<uint8_t>(s[k]);
    if (b < 0x80 || b > 0xBF) return 0;
  }
  return need;
}

// Length of one "character" for splitting: the well-formed sequence at the front, or 1 byte.
inline size_t utf8_char_len(std::string_view s) noexcept {
  const size_t n = utf8_valid_len(s);
  return n == 0 ? 1 : n;
}

// Code point of the well-formed sequence of length n (from utf8_valid_len) at the front of `s`.
inline uint32_t utf8_decode(std::string_view s, size_t n) noexcept {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[k])); };
  switch (n) {
  case 1:
    return b(0);
  case 2:
    return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
  case 3:
    return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  case 4:
    return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  default:
    return 0xFFFD;
  }
}

inline void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Moves the complete characters at the front of `pending` to `out`. Bytes that can never become
// part of a well-formed character are replaced by U+FFFD (one per maximal ill-formed subpart).
// A tail that is a valid but incomplete prefix stays in `pending`, unless `flush` is set, in
// which case it becomes one U+FFFD.
void utf8_drain(std::string& pending, std::string& out, bool flush);

} // namespace loom::tok
