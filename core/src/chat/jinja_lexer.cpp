// Jinja segments and tokens: the segmenter (whitespace control, trim_blocks, lstrip_blocks) and tokenizer.
#include "chat/jinja_lexer.hpp"

#include "chat/jinja_value.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <utility>

namespace loom::chat::jinja {

int count_lines(std::string_view s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

namespace {

// A string literal's body (between the quotes) with Python's escapes decoded.
std::string decode_string(std::string_view body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 >= body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    const auto hex = [&](size_t n) {
      uint32_t v = 0;
      for (size_t k = 1; k <= n; ++k) {
        if (i + k >= body.size()) err(line, "truncated escape in a string");
        const char h = body[i + k];
        const int d = h >= '0' && h <= '9'   ? h - '0'
                      : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                             : -1;
        if (d < 0) err(line, "bad escape in a string");
        v = v * 16 + static_cast<uint32_t>(d);
      }
      i += n;
      return v;
    };
    switch (c) {
    case 'n':
      out += '\n';
      break;
    case 't':
      out += '\t';
      break;
    case 'r':
      out += '\r';
      break;
    case '\\':
      out += '\\';
      break;
    case '\'':
      out += '\'';
      break;
    case '"':
      out += '"';
      break;
    case 'a':
      out += '\a';
      break;
    case 'b':
      out += '\b';
      break;
    case 'f':
      out += '\f';
      break;
    case 'v':
      out += '\v';
      break;
    case '0':
      out += '\0';
      break;
    case '\n': // a line continuation
      break;
    case 'x':
      append_utf8(out, hex(2));
      break;
    case 'u':
      append_utf8(out, hex(4));
      break;
    case 'U':
      append_utf8(out, hex(8));
      break;
    default: // unknown escapes keep their backslash, as in Python
      out += '\\';
      out += c;
    }
  }
  return out;
}

// The tokens of one tag's content.
std::vector<Tok> tokenize(std::string_view s, int line) {
  std::vector<Tok> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '\n') {
      ++line;
      ++i;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') {
      ++i;
      continue;
    }
    Tok t;
    t.line = line;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = i;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_'))
        ++e;
      t.t = Tk::name;
      t.s = std::string(s.substr(i, e - i));
      i = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = i;
      bool fl = false;
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_'))
        ++e;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
        fl = true;
        ++e;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e])))
          ++e;
      }
      if (e < s.size() && (s[e] == 'e' || s[e] == 'E')) {
        size_t x = e + 1;
        if (x < s.size() && (s[x] == '+' || s[x] == '-')) ++x;
        if (x < s.size() && std::isdigit(static_cast<unsigned char>(s[x]))) {
          fl = true;
          e = x;
          while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e])))
            ++e;
        }
      }
      std::string num;
      for (size_t k = i; k < e; ++k)
        if (s[k] != '_') num += s[k];
      if (fl) {
        t.t = Tk::floating;
        t.f = std::strtod(num.c_str(), nullptr);
      } else {
        t.t = Tk::integer;
        const auto r = std::from_chars(num.data(), num.data() + num.size(), t.i);
        if (r.ec != std::errc()) err(line, "integer literal out of range: " + num);
      }
      i = e;
    } else if (c == '\'' || c == '"') {
      size_t e = i + 1;
      while (e < s.size() && s[e] != c) {
        if (s[e] == '\\') ++e;
        ++e;
      }
      if (e >= s.size()) err(line, "unterminated string literal");
      t.t = Tk::string;
      t.s = decode_string(s.substr(i + 1, e - i - 1), line);
      line += count_lines(s.substr(i, e - i));
      i = e + 1;
    } else {
      static const char* two[] = {"==", "!=", "<=", ">=", "//", "**"};
      t.t = Tk::op;
      for (const char* op : two)
        if (s.substr(i, 2) == op) t.s = op;
      if (t.s.empty()) {
        if (std::strchr("()[]{}.,:|~+-*/%=<>", c) == nullptr)
          err(line, std::string("unexpected character '") + c + "'");
        t.s = std::string(1, c);
      }
      i += t.s.size();
    }
    out.push_back(std::move(t));
  }
  Tok e;
  e.line = line;
  out.push_back(e);
  return out;
}

// Where the tag starting at `from` (after its opener) ends: the index of `close` ("}}" or "%}") outside
// string literals and brackets (`{{ {'a': {}} }}` ends at the last "}}").
size_t find_close(std::string_view src, size_t from, std::string_view close, int line) {
  int depth = 0;
  for (size_t i = from; i < src.size(); ++i) {
    const char c = src[i];
    if (depth == 0 && src.substr(i, close.size()) == close) return i;
    if (depth == 0 && c == '-' && src.substr(i + 1, close.size()) == close) return i + 1;
    if (c == '(' || c == '[' || c == '{') {
      ++depth;
      continue;
    }
    if ((c == ')' || c == ']' || c == '}') && depth > 0) {
      --depth;
      continue;
    }
    if (c == '\'' || c == '"') {
      size_t e = i + 1;
      while (e < src.size() && src[e] != c) {
        if (src[e] == '\\') ++e;
        ++e;
      }
      if (e >= src.size()) err(line, "unterminated string literal");
      i = e;
      continue;
    }
  }
  err(line, "unclosed tag: expected '" + std::string(close) + "'");
}

} // namespace

// The template cut into text, output and block segments, with jinja2's whitespace rules applied:
// '-' strips all whitespace on its side; trim_blocks drops the newline right after a block or comment
// tag; lstrip_blocks drops the spaces and tabs before a block or comment tag that begins its line (the
// text holds a newline before it, or the template or a line consumed by the previous tag began there).
std::vector<Seg> segment(std::string_view src) {
  std::vector<Seg> segs;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true; // what came before `pos` ended a line (or nothing came)
  while (pos < src.size()) {
    size_t open = pos;
    while (true) {
      open = src.find('{', open);
      if (open == std::string_view::npos || open + 1 >= src.size()) {
        open = std::string_view::npos;
        break;
      }
      const char n = src[open + 1];
      if (n == '{' || n == '%' || n == '#') break;
      ++open;
    }
    std::string text(src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    const int text_line = line;
    line += count_lines(text);
    if (open == std::string_view::npos) {
      if (!text.empty()) segs.push_back({SegKind::text, std::move(text), {}, text_line});
      break;
    }
    const char kind = src[open + 1];
    size_t body = open + 2;
    const char sign = body < src.size() ? src[body] : '\0';
    if (sign == '-' || sign == '+') ++body;
    if (sign == '-') {
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
        text.pop_back();
    } else if (sign != '+' && kind != '{') { // lstrip_blocks
      const size_t nl = text.find_last_of('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      if ((from > 0 || line_starting) && text.find_first_not_of(" \t\r\v\f", from) == std::string::npos)
        text.erase(from);
    }
    if (!text.empty()) segs.push_back({SegKind::text, std::move(text), {}, text_line});
    const int tag_line = line;
    size_t close = 0;
    if (kind == '#') {
      close = src.find("#}", body);
      if (close == std::string_view::npos) err(tag_line, "unclosed comment: expected '#}'");
    } else {
      close = find_close(src, body, kind == '{' ? "}}" : "%}", tag_line);
    }
    std::string_view inner = src.substr(body, close - body);
    char end_sign = '\0';
    if (!inner.empty() && (inner.back() == '-' || (inner.back() == '+' && kind != '{'))) {
      end_sign = inner.back();
      inner.remove_suffix(1);
    }
    size_t after = close + 2;
    line += count_lines(src.substr(open, after - open));
    if (kind == '{')
      segs.push_back({SegKind::output, {}, tokenize(inner, tag_line), tag_line});
    else if (kind == '%')
      segs.push_back({SegKind::block, {}, tokenize(inner, tag_line), tag_line});
    line_starting = false;
    if (end_sign == '-') { // all whitespace after the tag
      size_t e = after;
      while (e < src.size() && std::isspace(static_cast<unsigned char>(src[e])))
        ++e;
      line += count_lines(src.substr(after, e - after));
      line_starting = e > after && src[e - 1] == '\n';
      after = e;
    } else if (end_sign != '+' && kind != '{' && after < src.size() && src[after] == '\n') { // trim_blocks
      ++after;
      ++line;
      line_starting = true;
    }
    pos = after;
  }
  return segs;
}

} // namespace loom::chat::jinja
