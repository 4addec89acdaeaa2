// The Jinja subset behind loom/chat.hpp: a segmenter (text and tags, with jinja2's whitespace control,
// trim_blocks and lstrip_blocks), a recursive-descent parser to an AST, and a tree-walking interpreter
// over Python-like values (None, bool, int, float, str, list, dict in insertion order, namespace,
// callables) whose printing, `tojson`, truthiness, undefined and scoping follow jinja2 3.1 as
// transformers configures it.
#include "loom/chat.hpp"
#include "loom/error.hpp"
#include "tokenizer/utf8.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <utility>

namespace loom::chat {

namespace {

// ================================================================================================
// Values
// ================================================================================================

struct Value;
struct Dict;
struct Func;
struct Ctx;
using List = std::vector<Value>;

struct Value {
  enum class K : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, ns, func };
  K k = K::undefined;
  bool b = false; // a bool's value; for a list: a Python tuple (printed "(a, b)")
  int64_t i = 0;
  double f = 0.0;
  std::string s; // a string's text; for undefined, what was looked up (for the error)
  std::shared_ptr<List> l;
  std::shared_ptr<Dict> d; // dict or namespace (a namespace is mutable, shared by reference)
  std::shared_ptr<const Func> fn;

  static Value undef(std::string what) {
    Value v;
    v.s = std::move(what);
    return v;
  }
  static Value none() {
    Value v;
    v.k = K::none;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.k = K::boolean;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.k = K::integer;
    v.i = x;
    return v;
  }
  static Value floating(double x) {
    Value v;
    v.k = K::floating;
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v;
    v.k = K::string;
    v.s = std::move(x);
    return v;
  }
  static Value list(List x) {
    Value v;
    v.k = K::list;
    v.l = std::make_shared<List>(std::move(x));
    return v;
  }
  static Value tuple(List x) {
    Value v = list(std::move(x));
    v.b = true;
    return v;
  }
  static Value dict(Dict x);
  static Value ns(Dict x);
  static Value func(std::shared_ptr<const Func> f) {
    Value v;
    v.k = K::func;
    v.fn = std::move(f);
    return v;
  }
  bool is(K kind) const noexcept { return k == kind; }
  bool number() const noexcept { return k == K::integer || k == K::floating || k == K::boolean; }
  double as_double() const noexcept {
    return k == K::floating ? f : k == K::boolean ? (b ? 1.0 : 0.0) : static_cast<double>(i);
  }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const {
    for (const auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& [k, old] : items)
      if (k == key) {
        old = std::move(v);
        return;
      }
    items.emplace_back(key, std::move(v));
  }
};

Value Value::dict(Dict x) {
  Value v;
  v.k = K::dict;
  v.d = std::make_shared<Dict>(std::move(x));
  return v;
}
Value Value::ns(Dict x) {
  Value v = dict(std::move(x));
  v.k = K::ns;
  return v;
}

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* kwarg(std::string_view name) const {
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

struct Func {
  std::string name;
  std::function<Value(Ctx&, Args&, int line)> call;
};

// An error inside the template: its line and message (turned into loom::Error at the top).
struct TemplateError {
  int line;
  std::string msg;
};
[[noreturn]] void err(int line, std::string msg) {
  throw TemplateError{line, std::move(msg)};
}

const char* type_name(const Value& v) {
  switch (v.k) {
  case Value::K::undefined:
    return "Undefined";
  case Value::K::none:
    return "NoneType";
  case Value::K::boolean:
    return "bool";
  case Value::K::integer:
    return "int";
  case Value::K::floating:
    return "float";
  case Value::K::string:
    return "str";
  case Value::K::list:
    return "list";
  case Value::K::dict:
    return "dict";
  case Value::K::ns:
    return "Namespace";
  case Value::K::func:
    return "function";
  }
  return "?";
}

[[noreturn]] void undefined_error(const Value& v, int line) {
  err(line, (v.s.empty() ? std::string("a value") : v.s) + " is undefined");
}

bool truthy(const Value& v) {
  switch (v.k) {
  case Value::K::undefined:
  case Value::K::none:
    return false;
  case Value::K::boolean:
    return v.b;
  case Value::K::integer:
    return v.i != 0;
  case Value::K::floating:
    return v.f != 0.0;
  case Value::K::string:
    return !v.s.empty();
  case Value::K::list:
    return !v.l->empty();
  case Value::K::dict:
  case Value::K::ns:
    return !v.d->items.empty();
  case Value::K::func:
    return true;
  }
  return false;
}

// ---- UTF-8 (the tree's one decoder: tokenizer/utf8.hpp; an ill-formed byte is a character of its own) ----

// The code points of s as byte offsets (one past the last included).
std::vector<size_t> cp_offsets(std::string_view s) {
  std::vector<size_t> o;
  for (size_t i = 0; i < s.size(); i += tok::utf8_char_len(s.substr(i)))
    o.push_back(i);
  o.push_back(s.size());
  return o;
}
size_t cp_count(std::string_view s) {
  return cp_offsets(s).size() - 1;
}
// The code point at byte `at` (an ill-formed byte: its own value).
uint32_t decode_cp(std::string_view s, size_t at) {
  const size_t n = tok::utf8_valid_len(s.substr(at));
  return n == 0 ? static_cast<unsigned char>(s[at]) : tok::utf8_decode(s.substr(at), n);
}
void append_utf8(std::string& out, uint32_t cp) {
  tok::utf8_append(out, cp);
}
// Python's str.isspace() for a code point.
bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// ---- printing: Python's str() and repr() ----

std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  if (x == 0.0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific); // shortest
  const std::string sci(buf, r.ptr);
  const bool neg = sci[0] == '-';
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t i = neg ? 1 : 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out = neg ? "-" : "";
  if (exp >= -5 + 1 && exp < 16) { // repr's fixed notation: -4 ≤ exponent < 16
    const int decpt = exp + 1;
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  const int ae = std::abs(exp);
  out += std::string("e") + (exp < 0 ? "-" : "+") + (ae < 10 ? "0" : "") + std::to_string(ae);
  return out;
}

std::string py_str_repr(std::string_view s) {
  const bool dq = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == q || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  out += q;
  return out;
}

std::string repr(const Value& v);

std::string to_str(const Value& v) {
  switch (v.k) {
  case Value::K::undefined:
    return "";
  case Value::K::none:
    return "None";
  case Value::K::boolean:
    return v.b ? "True" : "False";
  case Value::K::integer:
    return std::to_string(v.i);
  case Value::K::floating:
    return py_float(v.f);
  case Value::K::string:
    return v.s;
  case Value::K::list:
  case Value::K::dict:
    return repr(v);
  case Value::K::ns:
    return "<Namespace>";
  case Value::K::func:
    return "<function " + v.fn->name + ">";
  }
  return "";
}

std::string repr(const Value& v) {
  switch (v.k) {
  case Value::K::string:
    return py_str_repr(v.s);
  case Value::K::list: {
    std::string out = v.b ? "(" : "[";
    for (size_t i = 0; i < v.l->size(); ++i)
      out += (i ? ", " : "") + repr((*v.l)[i]);
    return out + (v.b ? (v.l->size() == 1 ? ",)" : ")") : "]");
  }
  case Value::K::dict: {
    std::string out = "{";
    for (size_t i = 0; i < v.d->items.size(); ++i)
      out += (i ? ", " : "") + py_str_repr(v.d->items[i].first) + ": " + repr(v.d->items[i].second);
    return out + "}";
  }
  default:
    return to_str(v);
  }
}

// ---- tojson: transformers' json.dumps(x, ensure_ascii=False, indent=…) ----

void json_string(std::string_view s, std::string& out) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    case '\b':
      out += "\\b";
      break;
    case '\f':
      out += "\\f";
      break;
    default:
      if (c < 0x20) {
        static const char* hex = "0123456789abcdef";
        out += "\\u00";
        out += hex[c >> 4];
        out += hex[c & 15];
      } else {
        out += ch;
      }
    }
  }
  out += '"';
}

void json_dump(const Value& v, std::string& out, int indent, int level, int line, int depth) {
  if (depth > 200) err(line, "tojson: nesting deeper than 200");
  const auto newline = [&](int lv) {
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(lv), ' ');
  };
  switch (v.k) {
  case Value::K::none:
    out += "null";
    return;
  case Value::K::boolean:
    out += v.b ? "true" : "false";
    return;
  case Value::K::integer:
    out += std::to_string(v.i);
    return;
  case Value::K::floating:
    out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity") : py_float(v.f);
    return;
  case Value::K::string:
    json_string(v.s, out);
    return;
  case Value::K::list:
    if (v.l->empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < v.l->size(); ++i) {
      if (i) out += indent >= 0 ? "," : ", ";
      if (indent >= 0) newline(level + 1);
      json_dump((*v.l)[i], out, indent, level + 1, line, depth + 1);
    }
    if (indent >= 0) newline(level);
    out += ']';
    return;
  case Value::K::dict:
  case Value::K::ns:
    if (v.d->items.empty()) {
      out += "{}";
      return;
    }
    out += '{';
    for (size_t i = 0; i < v.d->items.size(); ++i) {
      if (i) out += indent >= 0 ? "," : ", ";
      if (indent >= 0) newline(level + 1);
      json_string(v.d->items[i].first, out);
      out += ": ";
      json_dump(v.d->items[i].second, out, indent, level + 1, line, depth + 1);
    }
    if (indent >= 0) newline(level);
    out += '}';
    return;
  case Value::K::undefined:
    err(line, "tojson: Object of type Undefined is not JSON serializable");
  case Value::K::func:
    err(line, "tojson: Object of type function is not JSON serializable");
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.number() && b.number()) {
    if (a.k == Value::K::floating || b.k == Value::K::floating) return a.as_double() == b.as_double();
    return (a.k == Value::K::boolean ? int64_t{a.b} : a.i) == (b.k == Value::K::boolean ? int64_t{b.b} : b.i);
  }
  if (a.k != b.k) return false;
  switch (a.k) {
  case Value::K::undefined:
  case Value::K::none:
    return true;
  case Value::K::string:
    return a.s == b.s;
  case Value::K::list:
    if (a.l->size() != b.l->size()) return false;
    for (size_t i = 0; i < a.l->size(); ++i)
      if (!equal((*a.l)[i], (*b.l)[i])) return false;
    return true;
  case Value::K::dict:
    if (a.d->items.size() != b.d->items.size()) return false;
    for (const auto& [k, v] : a.d->items) {
      const Value* o = b.d->find(k);
      if (!o || !equal(v, *o)) return false;
    }
    return true;
  case Value::K::ns:
    return a.d == b.d;
  case Value::K::func:
    return a.fn == b.fn;
  default:
    return false;
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
  case nlohmann::ordered_json::value_t::null:
    return Value::none();
  case nlohmann::ordered_json::value_t::boolean:
    return Value::boolean(j.get<bool>());
  case nlohmann::ordered_json::value_t::number_integer:
    return Value::integer(j.get<int64_t>());
  case nlohmann::ordered_json::value_t::number_unsigned: {
    const auto u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return Value::floating(static_cast<double>(u));
    return Value::integer(static_cast<int64_t>(u));
  }
  case nlohmann::ordered_json::value_t::number_float:
    return Value::floating(j.get<double>());
  case nlohmann::ordered_json::value_t::string:
    return Value::str(j.get<std::string>());
  case nlohmann::ordered_json::value_t::array: {
    List l;
    l.reserve(j.size());
    for (const auto& e : j)
      l.push_back(from_json(e));
    return Value::list(std::move(l));
  }
  case nlohmann::ordered_json::value_t::object: {
    Dict d;
    for (const auto& [k, v] : j.items())
      d.items.emplace_back(k, from_json(v));
    return Value::dict(std::move(d));
  }
  default:
    return Value::none();
  }
}

// ================================================================================================
// Segments and tokens
// ================================================================================================

enum class Tk { name, string, integer, floating, op, end };
struct Tok {
  Tk t = Tk::end;
  std::string s; // name, decoded string, operator
  int64_t i = 0;
  double f = 0.0;
  int line = 1;
};

enum class SegKind { text, output, block };
struct Seg {
  SegKind kind;
  std::string text;      // text segments
  std::vector<Tok> toks; // output and block segments (ending with Tk::end)
  int line;
};

int count_lines(std::string_view s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

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

// ================================================================================================
// AST
// ================================================================================================

struct Expr {
  int line = 1;
  virtual ~Expr() = default;
  virtual Value eval(Ctx& c) const = 0;
};
using ExprP = std::unique_ptr<Expr>;

struct Stmt {
  int line = 1;
  virtual ~Stmt() = default;
  virtual void exec(Ctx& c) const = 0;
};
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

// ---- the render context ----

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Frame> parent;
  Value* find(std::string_view name) {
    for (Frame* f = this; f; f = f->parent.get())
      for (auto& [k, v] : f->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};

struct Ctx {
  std::string out;
  std::shared_ptr<Frame> frame;
  const Limits* lim = nullptr;
  int64_t steps = 0;
  int depth = 0;
  enum class Flow { normal, brk, cont } flow = Flow::normal;
  std::tm now{};
  std::map<std::string, Value, std::less<>> globals;
  // Every namespace() made: emptied when the render ends, so that a namespace holding itself (or a list
  // that holds it) is freed — the only mutable values, so the only way to a reference cycle.
  std::vector<std::shared_ptr<Dict>> namespaces;

  void step(int line) {
    if (++steps > lim->max_steps)
      err(line,
          "the template ran more than " + std::to_string(lim->max_steps) + " steps (a loop without end?)");
  }
  void emit(std::string_view s, int line) {
    if (out.size() + s.size() > lim->max_output)
      err(line, "the rendered text exceeds " + std::to_string(lim->max_output) + " bytes");
    out += s;
  }
  Value lookup(std::string_view name) {
    if (Value* v = frame->find(name)) return *v;
    if (auto it = globals.find(name); it != globals.end()) return it->second;
    return Value::undef("'" + std::string(name) + "'");
  }
};

struct DepthGuard {
  Ctx& c;
  DepthGuard(Ctx& ctx, int line) : c(ctx) {
    if (++c.depth > c.lim->max_depth)
      err(line, "nesting deeper than " + std::to_string(c.lim->max_depth) + " (unbounded recursion?)");
  }
  ~DepthGuard() { --c.depth; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

void exec_body(const Body& b, Ctx& c) {
  for (const auto& s : b) {
    c.step(s->line);
    s->exec(c);
    if (c.flow != Ctx::Flow::normal) return;
  }
}

// ---- operations ----

// The most items a list built by the template itself may have (range(), list * n): values are ≈ 100 bytes.
constexpr int64_t k_max_items = 1'000'000;

int64_t as_int(const Value& v) {
  return v.is(Value::K::boolean) ? int64_t{v.b} : v.i;
}

// x (op) y on int64, an error on overflow (Python's ints are unbounded; no template needs 2⁶³).
template <class Op> int64_t checked(int64_t x, int64_t y, Op op, int line) {
  int64_t r = 0;
  if (op(x, y, &r)) err(line, "integer overflow");
  return r;
}
constexpr auto k_add = [](int64_t x, int64_t y, int64_t* r) { return __builtin_add_overflow(x, y, r); };
constexpr auto k_sub = [](int64_t x, int64_t y, int64_t* r) { return __builtin_sub_overflow(x, y, r); };
constexpr auto k_mul = [](int64_t x, int64_t y, int64_t* r) { return __builtin_mul_overflow(x, y, r); };

Value add(const Value& a, const Value& b, int line) {
  if (a.is(Value::K::undefined)) undefined_error(a, line);
  if (b.is(Value::K::undefined)) undefined_error(b, line);
  if (a.number() && b.number()) {
    if (a.is(Value::K::floating) || b.is(Value::K::floating))
      return Value::floating(a.as_double() + b.as_double());
    return Value::integer(checked(as_int(a), as_int(b), k_add, line));
  }
  if (a.is(Value::K::string) && b.is(Value::K::string)) return Value::str(a.s + b.s);
  if (a.is(Value::K::list) && b.is(Value::K::list)) {
    List l = *a.l;
    l.insert(l.end(), b.l->begin(), b.l->end());
    return Value::list(std::move(l));
  }
  err(line,
      std::string("unsupported operand types for +: '") + type_name(a) + "' and '" + type_name(b) + "'");
}

Value arith(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "+") return add(a, b, line);
  if (a.is(Value::K::undefined)) undefined_error(a, line);
  if (b.is(Value::K::undefined)) undefined_error(b, line);
  if (op == "*") {
    const auto repeat = [&](const Value& seq, int64_t n) {
      n = std::max<int64_t>(n, 0);
      if (seq.is(Value::K::string)) {
        if (static_cast<double>(seq.s.size()) * static_cast<double>(n) > 16e6)
          err(line, "string repetition longer than 16 MB");
        std::string s;
        for (int64_t k = 0; k < n; ++k)
          s += seq.s;
        return Value::str(std::move(s));
      }
      if (static_cast<double>(seq.l->size()) * static_cast<double>(n) > static_cast<double>(k_max_items))
        err(line, "list repetition of more than " + std::to_string(k_max_items) + " items");
      List l;
      for (int64_t k = 0; k < n; ++k)
        l.insert(l.end(), seq.l->begin(), seq.l->end());
      return Value::list(std::move(l));
    };
    if ((a.is(Value::K::string) || a.is(Value::K::list)) &&
        (b.is(Value::K::integer) || b.is(Value::K::boolean)))
      return repeat(a, as_int(b));
    if ((b.is(Value::K::string) || b.is(Value::K::list)) &&
        (a.is(Value::K::integer) || a.is(Value::K::boolean)))
      return repeat(b, as_int(a));
  }
  if (!a.number() || !b.number())
    err(line, "unsupported operand types for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  const bool fl = a.is(Value::K::floating) || b.is(Value::K::floating);
  if (op == "/") {
    if (b.as_double() == 0.0) err(line, "division by zero");
    return Value::floating(a.as_double() / b.as_double());
  }
  if (op == "**") {
    if (!fl && as_int(b) >= 0) {
      double r = std::pow(a.as_double(), b.as_double());
      if (std::fabs(r) > 9.2e18) err(line, "integer overflow");
      int64_t x = 1;
      for (int64_t k = 0; k < as_int(b); ++k)
        x *= as_int(a);
      return Value::integer(x);
    }
    return Value::floating(std::pow(a.as_double(), b.as_double()));
  }
  if (fl) {
    const double x = a.as_double(), y = b.as_double();
    if (op == "-") return Value::floating(x - y);
    if (op == "*") return Value::floating(x * y);
    if (y == 0.0) err(line, "float division by zero");
    if (op == "//") return Value::floating(std::floor(x / y));
    double m = std::fmod(x, y); // "%": the sign of the divisor, as in Python
    if (m != 0.0 && ((m < 0) != (y < 0))) m += y;
    return Value::floating(m);
  }
  const int64_t x = as_int(a), y = as_int(b);
  if (op == "-") return Value::integer(checked(x, y, k_sub, line));
  if (op == "*") return Value::integer(checked(x, y, k_mul, line));
  if (y == 0) err(line, "integer division or modulo by zero");
  if (op == "//") {
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return Value::integer(q);
  }
  int64_t m = x % y;
  if (m != 0 && ((m < 0) != (y < 0))) m += y;
  return Value::integer(m);
}

int compare(const Value& a, const Value& b, int line) { // <0, 0, >0 for ordering
  if (a.number() && b.number()) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is(Value::K::string) && b.is(Value::K::string)) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.is(Value::K::list) && b.is(Value::K::list)) {
    for (size_t i = 0; i < std::min(a.l->size(), b.l->size()); ++i) {
      if (equal((*a.l)[i], (*b.l)[i])) continue;
      return compare((*a.l)[i], (*b.l)[i], line);
    }
    return a.l->size() < b.l->size() ? -1 : a.l->size() > b.l->size() ? 1 : 0;
  }
  if (a.is(Value::K::undefined)) undefined_error(a, line);
  if (b.is(Value::K::undefined)) undefined_error(b, line);
  err(line, std::string("'<' not supported between instances of '") + type_name(a) + "' and '" +
                type_name(b) + "'");
}

// The items `for` walks: a list's elements, a dict's keys, a string's characters; undefined: none.
List iterate(const Value& v, int line) {
  switch (v.k) {
  case Value::K::undefined:
    return {};
  case Value::K::list:
    return *v.l;
  case Value::K::dict: {
    List l;
    for (const auto& kv : v.d->items)
      l.push_back(Value::str(kv.first));
    return l;
  }
  case Value::K::string: {
    List l;
    const auto o = cp_offsets(v.s);
    for (size_t i = 0; i + 1 < o.size(); ++i)
      l.push_back(Value::str(v.s.substr(o[i], o[i + 1] - o[i])));
    return l;
  }
  default:
    err(line, std::string("'") + type_name(v) + "' object is not iterable");
  }
}

bool contains(const Value& container, const Value& item, int line) {
  switch (container.k) {
  case Value::K::string:
    if (!item.is(Value::K::string))
      err(line, std::string("'in <string>' requires string as left operand, not ") + type_name(item));
    return container.s.find(item.s) != std::string::npos;
  case Value::K::dict:
  case Value::K::ns:
    return item.is(Value::K::string) && container.d->find(item.s) != nullptr;
  case Value::K::list:
    for (const auto& e : *container.l)
      if (equal(e, item)) return true;
    return false;
  case Value::K::undefined:
    return false;
  default:
    err(line, std::string("argument of type '") + type_name(container) + "' is not iterable");
  }
}

int64_t length(const Value& v, int line) {
  switch (v.k) {
  case Value::K::undefined:
    return 0;
  case Value::K::string:
    return static_cast<int64_t>(cp_count(v.s));
  case Value::K::list:
    return static_cast<int64_t>(v.l->size());
  case Value::K::dict:
  case Value::K::ns:
    return static_cast<int64_t>(v.d->items.size());
  default:
    err(line, std::string("object of type '") + type_name(v) + "' has no len()");
  }
}

// Python slice bounds over n items.
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step,
                                   int line) {
  const auto get = [&](const Value& v) -> std::optional<int64_t> {
    if (v.is(Value::K::undefined) || v.is(Value::K::none)) return std::nullopt;
    if (!v.is(Value::K::integer) && !v.is(Value::K::boolean))
      err(line, "slice indices must be integers or None");
    return as_int(v);
  };
  const int64_t st = get(step).value_or(1);
  if (st == 0) err(line, "slice step cannot be zero");
  const auto norm = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v < 0 ? *v + n : *v;
    return st > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t a = norm(get(start), st > 0 ? 0 : n - 1);
  const int64_t b = norm(get(stop), st > 0 ? n : -1);
  std::vector<int64_t> idx;
  if (st > 0)
    for (int64_t i = a; i < b; i += st)
      idx.push_back(i);
  else
    for (int64_t i = a; i > b; i += st)
      idx.push_back(i);
  return idx;
}

Value call_value(Ctx& c, const Value& f, Args& a, int line) {
  if (f.is(Value::K::undefined)) undefined_error(f, line);
  if (!f.is(Value::K::func)) err(line, std::string("'") + type_name(f) + "' object is not callable");
  DepthGuard g(c, line);
  return f.fn->call(c, a, line);
}

Value make_func(std::string name, std::function<Value(Ctx&, Args&, int)> fn) {
  auto f = std::make_shared<Func>();
  f->name = std::move(name);
  f->call = std::move(fn);
  return Value::func(std::move(f));
}

// ---- string helpers ----

std::string strip_chars(std::string_view s, const Value* chars, bool left, bool right) {
  const auto o = cp_offsets(s);
  size_t a = 0, b = o.size() - 1; // code point range [a, b)
  std::vector<uint32_t> set;
  const bool ws = !chars || chars->is(Value::K::none) || chars->is(Value::K::undefined);
  if (!ws)
    for (size_t i = 0; i < chars->s.size(); i += tok::utf8_char_len(std::string_view(chars->s).substr(i)))
      set.push_back(decode_cp(chars->s, i));
  const auto strip = [&](size_t at) {
    const uint32_t cp = decode_cp(s, o[at]);
    return ws ? py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  if (left)
    while (a < b && strip(a))
      ++a;
  if (right)
    while (b > a && strip(b - 1))
      --b;
  return std::string(s.substr(o[a], o[b] - o[a]));
}

List split(std::string_view s, const Value* sep, int64_t maxsplit, int line) {
  List out;
  if (!sep || sep->is(Value::K::none) || sep->is(Value::K::undefined)) { // runs of whitespace
    const auto o = cp_offsets(s);
    size_t i = 0;
    const size_t n = o.size() - 1;
    while (i < n) {
      while (i < n && py_space(decode_cp(s, o[i])))
        ++i;
      if (i >= n) break;
      size_t j = i;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
        size_t e = n;
        while (e > i && py_space(decode_cp(s, o[e - 1])))
          --e;
        out.push_back(Value::str(std::string(s.substr(o[i], o[e] - o[i]))));
        break;
      }
      while (j < n && !py_space(decode_cp(s, o[j])))
        ++j;
      out.push_back(Value::str(std::string(s.substr(o[i], o[j] - o[i]))));
      i = j;
    }
    return out;
  }
  if (!sep->is(Value::K::string)) err(line, "split: the separator must be a string");
  if (sep->s.empty()) err(line, "split: empty separator");
  size_t from = 0;
  while (true) {
    const size_t at = s.find(sep->s, from);
    if (at == std::string_view::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit)) {
      out.push_back(Value::str(std::string(s.substr(from))));
      break;
    }
    out.push_back(Value::str(std::string(s.substr(from, at - from))));
    from = at + sep->s.size();
  }
  return out;
}

std::string replace_all(std::string s, std::string_view from, std::string_view to, int64_t count) {
  if (from.empty()) return s; // (Python inserts `to` between characters; no template does that)
  std::string out;
  size_t pos = 0;
  int64_t n = 0;
  while (true) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos || (count >= 0 && n >= count)) break;
    out.append(s, pos, at - pos);
    out += to;
    pos = at + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

std::string case_map(std::string_view s, int mode) { // 0 lower, 1 upper, 2 title, 3 capitalize (ASCII)
  std::string out(s);
  bool start = true;
  for (size_t i = 0; i < out.size(); ++i) {
    const auto ch = static_cast<unsigned char>(out[i]);
    if (mode == 0)
      out[i] = static_cast<char>(std::tolower(ch));
    else if (mode == 1)
      out[i] = static_cast<char>(std::toupper(ch));
    else if (mode == 2) {
      out[i] = static_cast<char>(start ? std::toupper(ch) : std::tolower(ch));
      start = !std::isalpha(ch);
    } else {
      out[i] = static_cast<char>(i == 0 ? std::toupper(ch) : std::tolower(ch));
    }
  }
  return out;
}

const Value* arg(const Args& a, size_t i, std::string_view kw) {
  if (i < a.pos.size()) return &a.pos[i];
  return a.kwarg(kw);
}

int64_t int_arg(const Args& a, size_t i, std::string_view kw, int64_t def, int line) {
  const Value* v = arg(a, i, kw);
  if (!v || v->is(Value::K::none)) return def;
  if (!v->is(Value::K::integer) && !v->is(Value::K::boolean))
    err(line, std::string(kw) + ": expected an integer");
  return as_int(*v);
}

// A method of a str, list or dict value (`s.strip()`, `d.items()`), bound to it; nullopt: no such method.
std::optional<Value> method(const Value& obj, const std::string& name, int line) {
  static const std::set<std::string, std::less<>> unsafe = {
      "append",  "extend", "insert",  "pop", "remove",  "clear",     "update",   "setdefault",
      "popitem", "sort",   "reverse", "add", "discard", "__class__", "__dict__", "mro"};
  if (!obj.is(Value::K::string) && !obj.is(Value::K::list) && !obj.is(Value::K::dict)) return std::nullopt;
  if (unsafe.count(name) || (!name.empty() && name[0] == '_')) {
    if (obj.is(Value::K::dict) && obj.d->find(name)) return std::nullopt; // a key of that name
    return make_func(name, [name, t = std::string(type_name(obj))](Ctx&, Args&, int l) -> Value {
      err(l, "access to attribute '" + name + "' of '" + t +
                 "' object is unsafe (templates may not modify "
                 "values; use namespace())");
    });
  }
  (void)line;
  if (obj.is(Value::K::string)) {
    const std::string s = obj.s;
    static const std::set<std::string, std::less<>> names = {
        "strip",    "lstrip",     "rstrip",  "split",   "rsplit",     "replace", "startswith",
        "endswith", "upper",      "lower",   "title",   "capitalize", "find",    "count",
        "join",     "splitlines", "isdigit", "isalpha", "isspace",    "format"};
    if (!names.count(name)) return std::nullopt;
    return make_func("str." + name, [s, name](Ctx& c, Args& a, int l) -> Value {
      if (name == "strip" || name == "lstrip" || name == "rstrip")
        return Value::str(strip_chars(s, arg(a, 0, "chars"), name != "rstrip", name != "lstrip"));
      if (name == "split" || name == "rsplit") {
        if (name == "rsplit" && int_arg(a, 1, "maxsplit", -1, l) >= 0)
          err(l, "rsplit with maxsplit is not supported");
        return Value::list(split(s, arg(a, 0, "sep"), int_arg(a, 1, "maxsplit", -1, l), l));
      }
      if (name == "splitlines") {
        List out;
        size_t from = 0;
        while (from < s.size()) {
          size_t e = s.find('\n', from);
          if (e == std::string::npos) e = s.size();
          std::string part = s.substr(from, e - from);
          if (!part.empty() && part.back() == '\r') part.pop_back();
          out.push_back(Value::str(part));
          from = e + 1;
        }
        return Value::list(std::move(out));
      }
      if (name == "replace") {
        const Value* from = arg(a, 0, "old");
        const Value* to = arg(a, 1, "new");
        if (!from || !to || !from->is(Value::K::string) || !to->is(Value::K::string))
          err(l, "replace: expected two strings");
        return Value::str(replace_all(s, from->s, to->s, int_arg(a, 2, "count", -1, l)));
      }
      if (name == "startswith" || name == "endswith") {
        const Value* p = arg(a, 0, "prefix");
        if (!p) err(l, name + ": expected an argument");
        const auto test = [&](const std::string& x) {
          return name == "startswith"
                     ? s.rfind(x, 0) == 0
                     : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
        };
        if (p->is(Value::K::string)) return Value::boolean(test(p->s));
        if (p->is(Value::K::list)) {
          for (const auto& e : *p->l)
            if (e.is(Value::K::string) && test(e.s)) return Value::boolean(true);
          return Value::boolean(false);
        }
        err(l, name + ": expected a string");
      }
      if (name == "upper") return Value::str(case_map(s, 1));
      if (name == "lower") return Value::str(case_map(s, 0));
      if (name == "title") return Value::str(case_map(s, 2));
      if (name == "capitalize") return Value::str(case_map(s, 3));
      if (name == "isdigit" || name == "isalpha" || name == "isspace") {
        if (s.empty()) return Value::boolean(false);
        for (const char ch : s) {
          const auto u = static_cast<unsigned char>(ch);
          if (name == "isdigit" ? !std::isdigit(u) : name == "isalpha" ? !std::isalpha(u) : !std::isspace(u))
            return Value::boolean(false);
        }
        return Value::boolean(true);
      }
      const Value* x = arg(a, 0, "sub");
      if (name == "join") {
        if (!x) err(l, "join: expected an iterable");
        std::string out;
        const List items = iterate(*x, l);
        for (size_t i = 0; i < items.size(); ++i) {
          if (!items[i].is(Value::K::string))
            err(l, std::string("sequence item ") + std::to_string(i) + ": expected str instance, " +
                       type_name(items[i]) + " found");
          out += (i ? s : "") + items[i].s;
        }
        return Value::str(std::move(out));
      }
      if (name == "format") err(l, "str.format is not supported");
      if (!x || !x->is(Value::K::string)) err(l, name + ": expected a string");
      if (name == "count") {
        if (x->s.empty()) return Value::integer(static_cast<int64_t>(cp_count(s)) + 1);
        int64_t n = 0;
        for (size_t p = s.find(x->s); p != std::string::npos; p = s.find(x->s, p + x->s.size()))
          ++n;
        return Value::integer(n);
      }
      const size_t at = s.find(x->s); // find: a code point index
      (void)c;
      return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(cp_count(s.substr(0, at))));
    });
  }
  if (obj.is(Value::K::dict)) {
    if (name != "items" && name != "keys" && name != "values" && name != "get") return std::nullopt;
    const auto d = obj.d;
    return make_func("dict." + name, [d, name](Ctx&, Args& a, int l) -> Value {
      if (name == "get") {
        const Value* k = arg(a, 0, "key");
        if (!k) err(l, "get: expected a key");
        const Value* v = k->is(Value::K::string) ? d->find(k->s) : nullptr;
        if (v) return *v;
        const Value* def = arg(a, 1, "default");
        return def ? *def : Value::none();
      }
      List out;
      for (const auto& [k, v] : d->items)
        out.push_back(name == "items"  ? Value::tuple({Value::str(k), v})
                      : name == "keys" ? Value::str(k)
                                       : v);
      return Value::list(std::move(out));
    });
  }
  if (name == "index" || name == "count") {
    const auto l = obj.l;
    return make_func("list." + name, [l, name](Ctx&, Args& a, int ln) -> Value {
      const Value* x = arg(a, 0, "value");
      if (!x) err(ln, name + ": expected a value");
      int64_t n = 0;
      for (size_t i = 0; i < l->size(); ++i)
        if (equal((*l)[i], *x)) {
          if (name == "index") return Value::integer(static_cast<int64_t>(i));
          ++n;
        }
      if (name == "index") err(ln, "list.index(x): x not in list");
      return Value::integer(n);
    });
  }
  return std::nullopt;
}

// `obj.name` as jinja2's getattr: a method, else a key (a namespace's attribute); missing: undefined.
Value get_attr(const Value& obj, const std::string& name, int line) {
  if (obj.is(Value::K::undefined)) undefined_error(obj, line);
  if (auto m = method(obj, name, line)) return *m;
  if (obj.is(Value::K::dict) || obj.is(Value::K::ns)) {
    if (const Value* v = obj.d->find(name)) return *v;
    return Value::undef("'" + std::string(type_name(obj)) + " object' has no attribute '" + name + "'");
  }
  return Value::undef("'" + std::string(type_name(obj)) + " object' has no attribute '" + name + "'");
}

// `obj[key]` as jinja2's getitem: an element, a key, else an attribute; missing: undefined.
Value get_item(const Value& obj, const Value& key, int line) {
  if (obj.is(Value::K::undefined)) undefined_error(obj, line);
  if ((obj.is(Value::K::list) || obj.is(Value::K::string)) &&
      (key.is(Value::K::integer) || key.is(Value::K::boolean))) {
    int64_t i = as_int(key);
    if (obj.is(Value::K::list)) {
      const auto n = static_cast<int64_t>(obj.l->size());
      if (i < 0) i += n;
      if (i < 0 || i >= n)
        return Value::undef("list index " + std::to_string(as_int(key)) + " (out of range)");
      return (*obj.l)[static_cast<size_t>(i)];
    }
    const auto o = cp_offsets(obj.s);
    const auto n = static_cast<int64_t>(o.size()) - 1;
    if (i < 0) i += n;
    if (i < 0 || i >= n)
      return Value::undef("string index " + std::to_string(as_int(key)) + " (out of range)");
    return Value::str(
        obj.s.substr(o[static_cast<size_t>(i)], o[static_cast<size_t>(i) + 1] - o[static_cast<size_t>(i)]));
  }
  if ((obj.is(Value::K::dict) || obj.is(Value::K::ns)) && key.is(Value::K::string)) {
    if (const Value* v = obj.d->find(key.s)) return *v;
  }
  if (key.is(Value::K::string)) return get_attr(obj, key.s, line);
  return Value::undef("'" + std::string(type_name(obj)) + " object' has no item " + repr(key));
}

// ---- tests (`x is name`) ----

bool run_test(Ctx& c, const std::string& name, const Value& v, Args& a, int line) {
  const Value* x = arg(a, 0, "value");
  const auto need = [&]() -> const Value& {
    if (!x) err(line, "test '" + name + "' needs an argument");
    return *x;
  };
  if (name == "defined") return !v.is(Value::K::undefined);
  if (name == "undefined") return v.is(Value::K::undefined);
  if (name == "none") return v.is(Value::K::none);
  if (name == "string") return v.is(Value::K::string);
  if (name == "mapping") return v.is(Value::K::dict);
  if (name == "iterable")
    return v.is(Value::K::string) || v.is(Value::K::list) || v.is(Value::K::dict) ||
           v.is(Value::K::undefined);
  if (name == "sequence") return v.is(Value::K::string) || v.is(Value::K::list) || v.is(Value::K::dict);
  if (name == "number") return v.is(Value::K::integer) || v.is(Value::K::floating);
  if (name == "integer") return v.is(Value::K::integer);
  if (name == "float") return v.is(Value::K::floating);
  if (name == "boolean") return v.is(Value::K::boolean);
  if (name == "true") return v.is(Value::K::boolean) && v.b;
  if (name == "false") return v.is(Value::K::boolean) && !v.b;
  if (name == "callable") return v.is(Value::K::func);
  if (name == "lower") return v.is(Value::K::string) && case_map(v.s, 0) == v.s;
  if (name == "upper") return v.is(Value::K::string) && case_map(v.s, 1) == v.s;
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (!v.is(Value::K::integer)) err(line, "test '" + name + "' needs an integer");
    if (name == "divisibleby") {
      const Value& d = need();
      if (!d.is(Value::K::integer) || d.i == 0) err(line, "divisibleby: expected a non-zero integer");
      return v.i % d.i == 0;
    }
    return (v.i % 2 == 0) == (name == "even");
  }
  if (name == "equalto" || name == "eq" || name == "==") return equal(v, need());
  if (name == "ne" || name == "!=") return !equal(v, need());
  if (name == "sameas") return equal(v, need()) && v.k == need().k;
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, need(), line) < 0;
  if (name == "le" || name == "<=") return compare(v, need(), line) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, need(), line) > 0;
  if (name == "ge" || name == ">=") return compare(v, need(), line) >= 0;
  if (name == "in") return contains(need(), v, line);
  (void)c;
  err(line, "no test named '" + name + "'");
}

Value apply_filter(Ctx& c, const std::string& name, const Value& v, Args& a, int line);

// selectattr / rejectattr / select / reject: the items passing (or failing) a test on an attribute.
Value select_items(Ctx& c, const Value& v, Args& a, bool attr, bool keep, int line) {
  Args test_args;
  std::string attr_name, test = "truthy";
  size_t i = 0;
  if (attr) {
    if (a.pos.empty() || !a.pos[0].is(Value::K::string)) err(line, "selectattr: expected an attribute name");
    attr_name = a.pos[0].s;
    i = 1;
  }
  if (i < a.pos.size()) {
    if (!a.pos[i].is(Value::K::string)) err(line, "select: the test must be named by a string");
    test = a.pos[i].s;
    test_args.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(i) + 1, a.pos.end());
  }
  List out;
  for (const Value& item : iterate(v, line)) {
    Value x = item;
    if (attr) x = get_item(item, Value::str(attr_name), line);
    const bool pass = test == "truthy" ? truthy(x) : run_test(c, test, x, test_args, line);
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value apply_filter(Ctx& c, const std::string& name, const Value& v, Args& a, int line) {
  const auto str_of = [&](const Value& x) { return to_str(x); };
  if (name == "tojson") {
    int indent = -1;
    if (const Value* ind = arg(a, 0, "indent"); ind && !ind->is(Value::K::none)) {
      if (!ind->is(Value::K::integer)) err(line, "tojson: indent must be an integer");
      indent = static_cast<int>(std::clamp<int64_t>(ind->i, 0, 64));
    }
    std::string out;
    json_dump(v, out, indent, 0, line, 0);
    return Value::str(std::move(out));
  }
  if (name == "length" || name == "count") return Value::integer(length(v, line));
  if (name == "string") return Value::str(str_of(v));
  if (name == "trim") return Value::str(strip_chars(str_of(v), arg(a, 0, "chars"), true, true));
  if (name == "lower") return Value::str(case_map(str_of(v), 0));
  if (name == "upper") return Value::str(case_map(str_of(v), 1));
  if (name == "title") return Value::str(case_map(str_of(v), 2));
  if (name == "capitalize") return Value::str(case_map(str_of(v), 3));
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name == "safe") return v;
    std::string out; // HTML escaping (no template autoescapes; `|e` is explicit)
    for (const char ch : str_of(v)) {
      switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += ch;
      }
    }
    return Value::str(std::move(out));
  }
  if (name == "default" || name == "d") {
    const Value* def = arg(a, 0, "default_value");
    const Value* boolean = arg(a, 1, "boolean");
    const bool use = v.is(Value::K::undefined) || (boolean && truthy(*boolean) && !truthy(v));
    return use ? (def ? *def : Value::str("")) : v;
  }
  if (name == "items") {
    if (v.is(Value::K::undefined)) return Value::list({});
    if (!v.is(Value::K::dict)) err(line, "items: expected a mapping");
    List out;
    for (const auto& [k, x] : v.d->items)
      out.push_back(Value::tuple({Value::str(k), x}));
    return Value::list(std::move(out));
  }
  if (name == "dictsort") {
    if (!v.is(Value::K::dict)) err(line, "dictsort: expected a mapping");
    auto items = v.d->items;
    std::stable_sort(items.begin(), items.end(), [](const auto& x, const auto& y) {
      return case_map(x.first, 0) < case_map(y.first, 0);
    });
    List out;
    for (const auto& [k, x] : items)
      out.push_back(Value::tuple({Value::str(k), x}));
    return Value::list(std::move(out));
  }
  if (name == "list") return Value::list(iterate(v, line));
  if (name == "join") {
    const Value* sep = arg(a, 0, "d");
    const Value* attribute = arg(a, 1, "attribute");
    std::string out;
    const List items = iterate(v, line);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i && sep) out += str_of(*sep);
      out += str_of(attribute ? get_item(items[i], *attribute, line) : items[i]);
    }
    return Value::str(std::move(out));
  }
  if (name == "first" || name == "last") {
    const List items = iterate(v, line);
    if (items.empty()) return Value::undef("'" + name + "' of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is(Value::K::string)) {
      const auto o = cp_offsets(v.s);
      std::string out;
      for (size_t i = o.size() - 1; i > 0; --i)
        out += v.s.substr(o[i - 1], o[i] - o[i - 1]);
      return Value::str(std::move(out));
    }
    List items = iterate(v, line);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "sort") {
    List items = iterate(v, line);
    const bool rev = [&] {
      const Value* r = arg(a, 0, "reverse");
      return r && truthy(*r);
    }();
    const Value* attribute = arg(a, 2, "attribute");
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const Value kx = attribute ? get_item(x, *attribute, line) : x;
      const Value ky = attribute ? get_item(y, *attribute, line) : y;
      return rev ? compare(ky, kx, line) < 0 : compare(kx, ky, line) < 0;
    });
    return Value::list(std::move(items));
  }
  if (name == "unique") {
    List out;
    for (const Value& x : iterate(v, line))
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
    return Value::list(std::move(out));
  }
  if (name == "map") {
    List out;
    const Value* attribute = a.kwarg("attribute");
    if (!attribute && (a.pos.empty() || !a.pos[0].is(Value::K::string)))
      err(line, "map: expected a filter name or attribute=");
    for (const Value& x : iterate(v, line)) {
      if (attribute) {
        Value r = get_item(x, *attribute, line);
        if (r.is(Value::K::undefined))
          if (const Value* def = a.kwarg("default")) r = *def;
        out.push_back(r);
      } else {
        Args rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        out.push_back(apply_filter(c, a.pos[0].s, x, rest, line));
      }
    }
    return Value::list(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr")
    return select_items(c, v, a, true, name == "selectattr", line);
  if (name == "select" || name == "reject") return select_items(c, v, a, false, name == "select", line);
  if (name == "indent") { // jinja2's do_indent: lines after the first; blank lines only with blank=true
    const int64_t width = int_arg(a, 0, "width", 4, line);
    const Value* first = arg(a, 1, "first");
    const Value* blank = arg(a, 2, "blank");
    const std::string pad(static_cast<size_t>(std::clamp<int64_t>(width, 0, 256)), ' ');
    const std::string s = str_of(v) + "\n";
    std::vector<std::string> lines;
    for (size_t from = 0; from < s.size();) {
      size_t e = s.find('\n', from);
      std::string ln = s.substr(from, e - from);
      if (!ln.empty() && ln.back() == '\r') ln.pop_back();
      lines.push_back(std::move(ln));
      from = e + 1;
    }
    std::string out = lines.empty() ? std::string() : lines[0];
    for (size_t i = 1; i < lines.size(); ++i)
      out += "\n" + ((blank && truthy(*blank)) || !lines[i].empty() ? pad + lines[i] : lines[i]);
    if (first && truthy(*first)) out = pad + out;
    return Value::str(std::move(out));
  }
  if (name == "replace") {
    const Value* from = arg(a, 0, "old");
    const Value* to = arg(a, 1, "new");
    if (!from || !to) err(line, "replace: expected two arguments");
    return Value::str(replace_all(str_of(v), str_of(*from), str_of(*to), int_arg(a, 2, "count", -1, line)));
  }
  if (name == "abs") {
    if (v.is(Value::K::integer)) return Value::integer(v.i < 0 ? -v.i : v.i);
    if (v.is(Value::K::floating)) return Value::floating(std::fabs(v.f));
    err(line, "abs: expected a number");
  }
  if (name == "int") {
    if (v.is(Value::K::integer) || v.is(Value::K::boolean)) return Value::integer(as_int(v));
    if (v.is(Value::K::floating)) return Value::integer(static_cast<int64_t>(v.f));
    if (v.is(Value::K::string)) {
      int64_t x = 0;
      const std::string s = strip_chars(v.s, nullptr, true, true);
      const auto r = std::from_chars(s.data(), s.data() + s.size(), x);
      if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return Value::integer(x);
    }
    const Value* def = arg(a, 0, "default");
    return def ? *def : Value::integer(0);
  }
  if (name == "float") {
    if (v.number()) return Value::floating(v.as_double());
    if (v.is(Value::K::string)) {
      char* end = nullptr;
      const double x = std::strtod(v.s.c_str(), &end);
      if (end && *end == '\0' && !v.s.empty()) return Value::floating(x);
    }
    const Value* def = arg(a, 0, "default");
    return def ? *def : Value::floating(0.0);
  }
  if (name == "round") {
    const int64_t prec = int_arg(a, 0, "precision", 0, line);
    if (!v.number()) err(line, "round: expected a number");
    const double m = std::pow(10.0, static_cast<double>(prec));
    return Value::floating(std::nearbyint(v.as_double() * m) / m);
  }
  if (name == "sum" || name == "min" || name == "max") {
    const List items = iterate(v, line);
    if (name == "sum") {
      Value acc = Value::integer(0);
      for (const auto& x : items)
        acc = add(acc, x, line);
      return acc;
    }
    if (items.empty()) return Value::undef("'" + name + "' of an empty sequence");
    Value best = items.front();
    for (const auto& x : items)
      if (name == "min" ? compare(x, best, line) < 0 : compare(x, best, line) > 0) best = x;
    return best;
  }
  if (name == "wordcount")
    return Value::integer(static_cast<int64_t>(split(str_of(v), nullptr, -1, line).size()));
  if (name == "batch" || name == "slice" || name == "groupby" || name == "format" || name == "truncate" ||
      name == "urlencode" || name == "xmlattr" || name == "filesizeformat" || name == "pprint" ||
      name == "striptags" || name == "urlize" || name == "wordwrap" || name == "random" || name == "attr")
    err(line, "the filter '" + name + "' is not supported by this Jinja subset");
  err(line, "no filter named '" + name + "'");
}

// ---- expressions ----

struct Literal final : Expr {
  Value v;
  Value eval(Ctx&) const override { return v; }
};

struct Name final : Expr {
  std::string name;
  Value eval(Ctx& c) const override { return c.lookup(name); }
};

struct ListExpr final : Expr {
  std::vector<ExprP> items;
  bool tuple = false;
  Value eval(Ctx& c) const override {
    List l;
    for (const auto& e : items)
      l.push_back(e->eval(c));
    return tuple ? Value::tuple(std::move(l)) : Value::list(std::move(l));
  }
};

struct DictExpr final : Expr {
  std::vector<std::pair<ExprP, ExprP>> items;
  Value eval(Ctx& c) const override {
    Dict d;
    for (const auto& [k, v] : items) {
      const Value key = k->eval(c);
      d.set(key.is(Value::K::string) ? key.s : to_str(key), v->eval(c));
    }
    return Value::dict(std::move(d));
  }
};

struct AttrExpr final : Expr {
  ExprP obj;
  std::string name;
  Value eval(Ctx& c) const override { return get_attr(obj->eval(c), name, line); }
};

struct ItemExpr final : Expr {
  ExprP obj, key;
  Value eval(Ctx& c) const override {
    const Value o = obj->eval(c);
    return get_item(o, key->eval(c), line);
  }
};

struct SliceExpr final : Expr {
  ExprP obj, start, stop, step; // any may be null
  Value eval(Ctx& c) const override {
    const Value o = obj->eval(c);
    const auto ev = [&](const ExprP& e) { return e ? e->eval(c) : Value::none(); };
    const Value a = ev(start), b = ev(stop), s = ev(step);
    if (o.is(Value::K::undefined)) undefined_error(o, line);
    if (o.is(Value::K::list)) {
      List out;
      for (const int64_t i : slice_indices(static_cast<int64_t>(o.l->size()), a, b, s, line))
        out.push_back((*o.l)[static_cast<size_t>(i)]);
      return Value::list(std::move(out));
    }
    if (o.is(Value::K::string)) {
      const auto off = cp_offsets(o.s);
      std::string out;
      for (const int64_t i : slice_indices(static_cast<int64_t>(off.size()) - 1, a, b, s, line))
        out += o.s.substr(off[static_cast<size_t>(i)],
                          off[static_cast<size_t>(i) + 1] - off[static_cast<size_t>(i)]);
      return Value::str(std::move(out));
    }
    err(line, std::string("'") + type_name(o) + "' object is not subscriptable");
  }
};

struct CallArgs {
  std::vector<ExprP> pos;
  std::vector<std::pair<std::string, ExprP>> kw;
  Args eval(Ctx& c) const {
    Args a;
    for (const auto& e : pos)
      a.pos.push_back(e->eval(c));
    for (const auto& [k, e] : kw)
      a.kw.emplace_back(k, e->eval(c));
    return a;
  }
};

struct CallExpr final : Expr {
  ExprP fn;
  CallArgs args;
  Value eval(Ctx& c) const override {
    const Value f = fn->eval(c);
    Args a = args.eval(c);
    return call_value(c, f, a, line);
  }
};

struct FilterExpr final : Expr {
  ExprP value;
  std::string name;
  CallArgs args;
  Value eval(Ctx& c) const override {
    const Value v = value->eval(c);
    Args a = args.eval(c);
    DepthGuard g(c, line);
    return apply_filter(c, name, v, a, line);
  }
};

struct TestExpr final : Expr {
  ExprP value;
  std::string name;
  CallArgs args;
  bool negate = false;
  Value eval(Ctx& c) const override {
    const Value v = value->eval(c);
    Args a = args.eval(c);
    return Value::boolean(run_test(c, name, v, a, line) != negate);
  }
};

struct UnaryExpr final : Expr {
  std::string op; // "not", "-", "+"
  ExprP e;
  Value eval(Ctx& c) const override {
    const Value v = e->eval(c);
    if (op == "not") return Value::boolean(!truthy(v));
    if (v.is(Value::K::undefined)) undefined_error(v, line);
    if (op == "-") {
      if (v.is(Value::K::integer) || v.is(Value::K::boolean)) {
        if (as_int(v) == INT64_MIN) err(line, "integer overflow");
        return Value::integer(-as_int(v));
      }
      if (v.is(Value::K::floating)) return Value::floating(-v.f);
    } else if (v.number()) {
      return v;
    }
    err(line, std::string("bad operand type for unary ") + op + ": '" + type_name(v) + "'");
  }
};

struct BinExpr final : Expr {
  std::string op; // + - * / // % ** ~ and or
  ExprP a, b;
  Value eval(Ctx& c) const override {
    if (op == "and") {
      Value x = a->eval(c);
      return truthy(x) ? b->eval(c) : x;
    }
    if (op == "or") {
      Value x = a->eval(c);
      return truthy(x) ? x : b->eval(c);
    }
    const Value x = a->eval(c), y = b->eval(c);
    if (op == "~") return Value::str(to_str(x) + to_str(y));
    return arith(op, x, y, line);
  }
};

struct CompareExpr final : Expr {
  ExprP first;
  std::vector<std::pair<std::string, ExprP>> rest; // == != < <= > >= in notin
  Value eval(Ctx& c) const override {
    Value left = first->eval(c);
    for (const auto& [op, e] : rest) {
      const Value right = e->eval(c);
      bool r = false;
      if (op == "==")
        r = equal(left, right);
      else if (op == "!=")
        r = !equal(left, right);
      else if (op == "in")
        r = contains(right, left, line);
      else if (op == "notin")
        r = !contains(right, left, line);
      else {
        const int k = compare(left, right, line);
        r = op == "<" ? k < 0 : op == "<=" ? k <= 0 : op == ">" ? k > 0 : k >= 0;
      }
      if (!r) return Value::boolean(false);
      left = right;
    }
    return Value::boolean(true);
  }
};

struct CondExpr final : Expr {
  ExprP then, cond, otherwise; // otherwise may be null (undefined)
  Value eval(Ctx& c) const override {
    if (truthy(cond->eval(c))) return then->eval(c);
    return otherwise ? otherwise->eval(c) : Value::undef("the else branch of an inline if");
  }
};

// ---- statements ----

struct TextStmt final : Stmt {
  std::string text;
  void exec(Ctx& c) const override { c.emit(text, line); }
};

struct OutputStmt final : Stmt {
  ExprP e;
  void exec(Ctx& c) const override { c.emit(to_str(e->eval(c)), line); }
};

struct IfStmt final : Stmt {
  std::vector<std::pair<ExprP, Body>> branches; // a null condition: else
  void exec(Ctx& c) const override {
    for (const auto& [cond, body] : branches)
      if (!cond || truthy(cond->eval(c))) {
        exec_body(body, c);
        return;
      }
  }
};

// Binds `targets` (one name, or several unpacking a sequence) in the current frame.
void bind_targets(Ctx& c, const std::vector<std::string>& targets, const Value& v, int line) {
  if (targets.size() == 1) {
    c.frame->set(targets[0], v);
    return;
  }
  const List items = iterate(v, line);
  if (items.size() != targets.size())
    err(line,
        "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()));
  for (size_t i = 0; i < targets.size(); ++i)
    c.frame->set(targets[i], items[i]);
}

struct ForStmt final : Stmt {
  std::vector<std::string> targets;
  ExprP iter, filter; // filter may be null
  Body body, else_body;
  void exec(Ctx& c) const override {
    const List all = iterate(iter->eval(c), line);
    const auto outer = c.frame;
    List items;
    if (filter) {
      for (const Value& v : all) {
        c.frame = std::make_shared<Frame>();
        c.frame->parent = outer;
        bind_targets(c, targets, v, line);
        const bool keep = truthy(filter->eval(c));
        c.frame = outer;
        if (keep) items.push_back(v);
      }
    } else {
      items = all;
    }
    const auto n = static_cast<int64_t>(items.size());
    try {
      for (int64_t i = 0; i < n; ++i) {
        c.step(line);
        c.frame = std::make_shared<Frame>();
        c.frame->parent = outer;
        Dict loop;
        loop.set("index", Value::integer(i + 1));
        loop.set("index0", Value::integer(i));
        loop.set("revindex", Value::integer(n - i));
        loop.set("revindex0", Value::integer(n - i - 1));
        loop.set("first", Value::boolean(i == 0));
        loop.set("last", Value::boolean(i == n - 1));
        loop.set("length", Value::integer(n));
        loop.set("depth", Value::integer(1));
        loop.set("depth0", Value::integer(0));
        if (i > 0) loop.set("previtem", items[static_cast<size_t>(i - 1)]);
        if (i + 1 < n) loop.set("nextitem", items[static_cast<size_t>(i + 1)]);
        loop.set("cycle", make_func("loop.cycle", [i](Ctx&, Args& a, int l) -> Value {
                   if (a.pos.empty()) err(l, "loop.cycle: expected at least one value");
                   return a.pos[static_cast<size_t>(i) % a.pos.size()];
                 }));
        c.frame->set("loop", Value::dict(std::move(loop)));
        bind_targets(c, targets, items[static_cast<size_t>(i)], line);
        exec_body(body, c);
        c.frame = outer;
        if (c.flow == Ctx::Flow::brk) {
          c.flow = Ctx::Flow::normal;
          break;
        }
        c.flow = Ctx::Flow::normal;
      }
    } catch (...) {
      c.frame = outer;
      throw;
    }
    if (n == 0) exec_body(else_body, c);
  }
};

struct SetStmt final : Stmt {
  std::vector<std::string> targets; // or one namespace attribute:
  std::string ns, attr;
  ExprP value;
  Body block; // {% set x %}…{% endset %}
  bool is_block = false;
  void exec(Ctx& c) const override {
    Value v;
    if (is_block) {
      std::string saved;
      std::swap(saved, c.out);
      exec_body(block, c);
      std::swap(saved, c.out);
      v = Value::str(std::move(saved));
    } else {
      v = value->eval(c);
    }
    if (!ns.empty()) {
      const Value target = c.lookup(ns);
      if (!target.is(Value::K::ns))
        err(line, "cannot assign attribute on non-namespace object '" + ns + "' (" + type_name(target) + ")");
      target.d->set(attr, std::move(v));
      return;
    }
    bind_targets(c, targets, v, line);
  }
};

struct LoopCtlStmt final : Stmt {
  bool brk = true;
  void exec(Ctx& c) const override { c.flow = brk ? Ctx::Flow::brk : Ctx::Flow::cont; }
};

struct BlockStmt final : Stmt { // {% generation %}: its body, unchanged
  Body body;
  void exec(Ctx& c) const override { exec_body(body, c); }
};

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprP> defaults; // per param, null: required
  Body body;
};

struct MacroStmt final : Stmt {
  std::shared_ptr<MacroDef> def;
  void exec(Ctx& c) const override {
    const auto d = def;
    // The defining frame, weakly: the macro is stored in it, and a strong reference would be a cycle.
    const std::weak_ptr<Frame> defined_in = c.frame;
    c.frame->set(d->name, make_func(d->name, [d, defined_in](Ctx& cc, Args& a, int call_line) -> Value {
                   if (a.pos.size() > d->params.size())
                     err(call_line, "macro '" + d->name + "' takes not more than " +
                                        std::to_string(d->params.size()) + " argument(s)");
                   const auto saved_frame = cc.frame;
                   auto f = std::make_shared<Frame>();
                   f->parent = defined_in.lock();
                   if (!f->parent) { // called after its frame ended (kept in a namespace): the top frame
                     f->parent = cc.frame;
                     while (f->parent->parent)
                       f->parent = f->parent->parent;
                   }
                   std::string saved_out;
                   std::swap(saved_out, cc.out);
                   const auto restore = [&] {
                     cc.frame = saved_frame;
                     std::swap(saved_out, cc.out);
                     cc.flow = Ctx::Flow::normal;
                   };
                   try {
                     cc.frame = f;
                     for (size_t i = 0; i < d->params.size(); ++i) {
                       const Value* v = i < a.pos.size() ? &a.pos[i] : a.kwarg(d->params[i]);
                       if (v)
                         f->set(d->params[i], *v);
                       else if (d->defaults[i])
                         f->set(d->params[i], d->defaults[i]->eval(cc));
                       else
                         f->set(d->params[i], Value::undef("'" + d->params[i] + "'"));
                     }
                     for (const auto& [k, v] : a.kw)
                       if (std::find(d->params.begin(), d->params.end(), k) == d->params.end())
                         err(call_line, "macro '" + d->name + "' takes no keyword argument '" + k + "'");
                     exec_body(d->body, cc);
                   } catch (...) {
                     restore();
                     throw;
                   }
                   std::string result = std::move(cc.out);
                   restore();
                   return Value::str(std::move(result));
                 }));
  }
};

// ================================================================================================
// Parser
// ================================================================================================

class Parser {
public:
  Parser(std::vector<Seg> segs, int last_line) : segs_(std::move(segs)), last_line_(last_line) {}

  Body parse_template() {
    Body b = parse_body({});
    if (si_ < segs_.size()) {
      const Seg& s = segs_[si_];
      err(s.line, "unexpected '" + s.toks[0].s + "' (no block is open)");
    }
    return b;
  }

private:
  std::vector<Seg> segs_;
  int last_line_ = 1; // the template's last line
  size_t si_ = 0;     // current segment
  const std::vector<Tok>* toks_ = nullptr;
  size_t ti_ = 0; // current token in the tag
  int depth_ = 0;

  // ---- tag token helpers ----
  const Tok& peek(size_t ahead = 0) const {
    const size_t i = std::min(ti_ + ahead, toks_->size() - 1);
    return (*toks_)[i];
  }
  const Tok& next() {
    const Tok& t = peek();
    if (ti_ < toks_->size() - 1) ++ti_;
    return t;
  }
  bool is_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).t == Tk::op && peek(ahead).s == op;
  }
  bool is_name(std::string_view n, size_t ahead = 0) const {
    return peek(ahead).t == Tk::name && peek(ahead).s == n;
  }
  static std::string describe(const Tok& t) {
    switch (t.t) {
    case Tk::end:
      return "the end of the tag";
    case Tk::string:
      return "a string";
    case Tk::integer:
    case Tk::floating:
      return "a number";
    default:
      return "'" + t.s + "'";
    }
  }
  void expect_op(std::string_view op) {
    if (!is_op(op)) err(peek().line, "expected '" + std::string(op) + "', found " + describe(peek()));
    next();
  }
  std::string expect_name() {
    if (peek().t != Tk::name) err(peek().line, "expected a name, found " + describe(peek()));
    return next().s;
  }
  void expect_end() {
    if (peek().t != Tk::end) err(peek().line, "expected the end of the tag, found " + describe(peek()));
  }

  // ---- statements ----

  // Statements until a block tag whose keyword is in `ends` (left unconsumed) or the template's end.
  Body parse_body(const std::vector<std::string_view>& ends) {
    Body body;
    while (si_ < segs_.size()) {
      const Seg& s = segs_[si_];
      if (s.kind == SegKind::text) {
        auto t = std::make_unique<TextStmt>();
        t->line = s.line;
        t->text = s.text;
        body.push_back(std::move(t));
        ++si_;
        continue;
      }
      toks_ = &s.toks;
      ti_ = 0;
      if (s.kind == SegKind::output) {
        auto o = std::make_unique<OutputStmt>();
        o->line = s.line;
        if (peek().t == Tk::end) err(s.line, "empty expression '{{ }}'");
        o->e = parse_expr();
        expect_end();
        body.push_back(std::move(o));
        ++si_;
        continue;
      }
      if (peek().t != Tk::name) err(s.line, "expected a statement keyword, found " + describe(peek()));
      const std::string kw = peek().s;
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) return body;
      if (kw.rfind("end", 0) == 0 || kw == "elif" || kw == "else") {
        std::string want;
        for (const auto e : ends)
          want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
        err(s.line, "unexpected '" + kw + "'" +
                        (ends.empty() ? std::string(" (no block is open)") : "; expected " + want));
      }
      body.push_back(parse_statement(kw));
    }
    if (!ends.empty()) {
      std::string want;
      for (const auto e : ends)
        want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
      err(last_line_, "expected " + want + " before the end of the template");
    }
    return body;
  }

  // The keyword of the block tag at the current segment (after parse_body stopped there); consumes it.
  std::string take_end(std::string_view opened, int open_line) {
    if (si_ >= segs_.size()) err(open_line, "the '" + std::string(opened) + "' block is never closed");
    toks_ = &segs_[si_].toks;
    ti_ = 0;
    return next().s;
  }
  void finish_tag() {
    expect_end();
    ++si_;
  }

  StmtP parse_statement(const std::string& kw) {
    const int line = segs_[si_].line;
    next(); // the keyword
    if (kw == "if") return parse_if(line);
    if (kw == "for") return parse_for(line);
    if (kw == "set") return parse_set(line);
    if (kw == "macro") return parse_macro(line);
    if (kw == "break" || kw == "continue") {
      auto s = std::make_unique<LoopCtlStmt>();
      s->line = line;
      s->brk = kw == "break";
      finish_tag();
      return s;
    }
    if (kw == "generation") {
      auto s = std::make_unique<BlockStmt>();
      s->line = line;
      finish_tag();
      s->body = parse_body({"endgeneration"});
      take_end("generation", line);
      finish_tag();
      return s;
    }
    if (kw == "raw" || kw == "include" || kw == "extends" || kw == "import" || kw == "from" ||
        kw == "block" || kw == "call" || kw == "filter" || kw == "with" || kw == "autoescape")
      err(line, "the '" + kw + "' tag is not supported by this Jinja subset");
    err(line, "unknown tag '" + kw + "'");
  }

  StmtP parse_if(int line) {
    auto s = std::make_unique<IfStmt>();
    s->line = line;
    ExprP cond = parse_expr();
    finish_tag();
    while (true) {
      Body b = parse_body({"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(b));
      const std::string end = take_end("if", line);
      if (end == "endif") {
        finish_tag();
        return s;
      }
      if (end == "elif") {
        cond = parse_expr();
        finish_tag();
        continue;
      }
      finish_tag(); // else
      Body eb = parse_body({"endif"});
      s->branches.emplace_back(nullptr, std::move(eb));
      take_end("if", line);
      finish_tag();
      return s;
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> t{expect_name()};
    while (is_op(",")) {
      next();
      t.push_back(expect_name());
    }
    return t;
  }

  StmtP parse_for(int line) {
    auto s = std::make_unique<ForStmt>();
    s->line = line;
    s->targets = parse_targets();
    if (!is_name("in")) err(peek().line, "expected 'in' in the for tag, found " + describe(peek()));
    next();
    s->iter = parse_expr(false); // no inline if: `for x in xs if cond` filters
    if (is_name("if")) {
      next();
      s->filter = parse_expr(false);
    }
    if (is_name("recursive")) err(peek().line, "recursive loops are not supported by this Jinja subset");
    finish_tag();
    s->body = parse_body({"else", "endfor"});
    if (take_end("for", line) == "else") {
      finish_tag();
      s->else_body = parse_body({"endfor"});
      take_end("for", line);
    }
    finish_tag();
    return s;
  }

  StmtP parse_set(int line) {
    auto s = std::make_unique<SetStmt>();
    s->line = line;
    const std::string first = expect_name();
    if (is_op(".")) {
      next();
      s->ns = first;
      s->attr = expect_name();
    } else {
      s->targets = {first};
      while (is_op(",")) {
        next();
        s->targets.push_back(expect_name());
      }
    }
    if (peek().t == Tk::end) { // a block set
      if (!s->ns.empty() || s->targets.size() != 1) err(line, "a block set assigns one name");
      s->is_block = true;
      finish_tag();
      s->block = parse_body({"endset"});
      take_end("set", line);
      finish_tag();
      return s;
    }
    expect_op("=");
    s->value = parse_tuple_or_expr();
    finish_tag();
    return s;
  }

  StmtP parse_macro(int line) {
    auto def = std::make_shared<MacroDef>();
    def->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      def->params.push_back(expect_name());
      if (is_op("=")) {
        next();
        def->defaults.push_back(parse_expr());
      } else {
        def->defaults.push_back(nullptr);
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
    finish_tag();
    def->body = parse_body({"endmacro"});
    take_end("macro", line);
    finish_tag();
    auto s = std::make_unique<MacroStmt>();
    s->line = line;
    s->def = std::move(def);
    return s;
  }

  // ---- expressions ----

  struct Depth {
    Parser& p;
    Depth(Parser& parser, int line) : p(parser) {
      if (++p.depth_ > 150) err(line, "expression nested too deeply");
    }
    ~Depth() { --p.depth_; }
    Depth(const Depth&) = delete;
    Depth& operator=(const Depth&) = delete;
  };

  template <class T> std::unique_ptr<T> node(int line) {
    auto n = std::make_unique<T>();
    n->line = line;
    return n;
  }

  // `a, b` (a tuple, as a list) or one expression.
  ExprP parse_tuple_or_expr() {
    ExprP e = parse_expr();
    if (!is_op(",")) return e;
    auto l = node<ListExpr>(e->line);
    l->tuple = true;
    l->items.push_back(std::move(e));
    while (is_op(",")) {
      next();
      if (peek().t == Tk::end) break;
      l->items.push_back(parse_expr());
    }
    return l;
  }

  ExprP parse_expr(bool with_condexpr = true) {
    Depth d(*this, peek().line);
    ExprP e = parse_or();
    if (with_condexpr && is_name("if")) {
      const int line = next().line;
      auto c = node<CondExpr>(line);
      c->then = std::move(e);
      c->cond = parse_or();
      if (is_name("else")) {
        next();
        c->otherwise = parse_expr();
      }
      return c;
    }
    return e;
  }

  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      auto b = node<BinExpr>(next().line);
      b->op = "or";
      b->a = std::move(e);
      b->b = parse_and();
      e = std::move(b);
    }
    return e;
  }

  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      auto b = node<BinExpr>(next().line);
      b->op = "and";
      b->a = std::move(e);
      b->b = parse_not();
      e = std::move(b);
    }
    return e;
  }

  ExprP parse_not() {
    if (is_name("not")) {
      Depth d(*this, peek().line);
      auto u = node<UnaryExpr>(next().line);
      u->op = "not";
      u->e = parse_not();
      return u;
    }
    return parse_compare();
  }

  ExprP parse_compare() {
    ExprP e = parse_math1();
    std::unique_ptr<CompareExpr> cmp;
    while (true) {
      std::string op;
      if (peek().t == Tk::op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" ||
                                 peek().s == "<=" || peek().s == ">" || peek().s == ">="))
        op = next().s;
      else if (is_name("in"))
        op = (next(), "in");
      else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "notin";
      } else
        break;
      if (!cmp) {
        cmp = node<CompareExpr>(e->line);
        cmp->first = std::move(e);
      }
      cmp->rest.emplace_back(op, parse_math1());
    }
    if (cmp) return cmp;
    return e;
  }

  ExprP binary(ExprP a, const std::string& op, ExprP b, int line) {
    auto n = node<BinExpr>(line);
    n->op = op;
    n->a = std::move(a);
    n->b = std::move(b);
    return n;
  }

  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Tok& t = next();
      const std::string op = t.s;
      e = binary(std::move(e), op, parse_concat(), t.line);
    }
    return e;
  }

  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (is_op("~")) {
      const int line = next().line;
      e = binary(std::move(e), "~", parse_math2(), line);
    }
    return e;
  }

  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Tok& t = next();
      const std::string op = t.s;
      e = binary(std::move(e), op, parse_pow(), t.line);
    }
    return e;
  }

  ExprP parse_pow() {
    ExprP e = parse_unary();
    while (is_op("**")) {
      const int line = next().line;
      e = binary(std::move(e), "**", parse_unary(), line);
    }
    return e;
  }

  // jinja2's order: `-x|f` is (-x)|f, the sign applying to the operand before its filters.
  ExprP parse_unary(bool with_filters = true) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      Depth d(*this, peek().line);
      const Tok& t = next();
      auto u = node<UnaryExpr>(t.line);
      u->op = t.s;
      u->e = parse_unary(false);
      e = std::move(u);
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filters ? parse_filters(std::move(e)) : std::move(e);
  }

  ExprP parse_primary() {
    const Tok t = peek();
    switch (t.t) {
    case Tk::string: {
      next();
      auto l = node<Literal>(t.line);
      std::string s = t.s;
      while (peek().t == Tk::string) // adjacent literals concatenate
        s += next().s;
      l->v = Value::str(std::move(s));
      return l;
    }
    case Tk::integer: {
      next();
      auto l = node<Literal>(t.line);
      l->v = Value::integer(t.i);
      return l;
    }
    case Tk::floating: {
      next();
      auto l = node<Literal>(t.line);
      l->v = Value::floating(t.f);
      return l;
    }
    case Tk::name: {
      next();
      auto l = node<Literal>(t.line);
      if (t.s == "true" || t.s == "True") {
        l->v = Value::boolean(true);
      } else if (t.s == "false" || t.s == "False") {
        l->v = Value::boolean(false);
      } else if (t.s == "none" || t.s == "None") {
        l->v = Value::none();
      } else {
        auto n = node<Name>(t.line);
        n->name = t.s;
        return n;
      }
      return l;
    }
    case Tk::op:
      if (t.s == "(") {
        next();
        ExprP e = parse_tuple_or_expr();
        expect_op(")");
        return e;
      }
      if (t.s == "[") {
        next();
        auto l = node<ListExpr>(t.line);
        while (!is_op("]")) {
          l->items.push_back(parse_expr());
          if (!is_op(",")) break;
          next();
        }
        expect_op("]");
        return l;
      }
      if (t.s == "{") {
        next();
        auto d = node<DictExpr>(t.line);
        while (!is_op("}")) {
          ExprP k = parse_expr();
          expect_op(":");
          d->items.emplace_back(std::move(k), parse_expr());
          if (!is_op(",")) break;
          next();
        }
        expect_op("}");
        return d;
      }
      break;
    default:
      break;
    }
    err(t.line, "expected an expression, found " + describe(t));
  }

  CallArgs parse_call_args() { // after '('
    CallArgs a;
    while (!is_op(")")) {
      if (peek().t == Tk::name && is_op("=", 1)) {
        std::string k = next().s;
        next();
        a.kw.emplace_back(std::move(k), parse_expr());
      } else {
        if (!a.kw.empty()) err(peek().line, "a positional argument follows keyword arguments");
        a.pos.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
    return a;
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        auto a = node<AttrExpr>(line);
        a->obj = std::move(e);
        if (peek().t == Tk::integer) { // x.0 as x[0]
          auto it = node<ItemExpr>(line);
          auto lit = node<Literal>(line);
          lit->v = Value::integer(next().i);
          it->obj = std::move(a->obj);
          it->key = std::move(lit);
          e = std::move(it);
          continue;
        }
        a->name = expect_name();
        e = std::move(a);
      } else if (is_op("[")) {
        const int line = next().line;
        ExprP start, stop, step;
        bool slice = false;
        if (!is_op(":")) start = parse_expr();
        if (is_op(":")) {
          slice = true;
          next();
          if (!is_op("]") && !is_op(":")) stop = parse_expr();
          if (is_op(":")) {
            next();
            if (!is_op("]")) step = parse_expr();
          }
        }
        expect_op("]");
        if (slice) {
          auto s = node<SliceExpr>(line);
          s->obj = std::move(e);
          s->start = std::move(start);
          s->stop = std::move(stop);
          s->step = std::move(step);
          e = std::move(s);
        } else {
          auto it = node<ItemExpr>(line);
          it->obj = std::move(e);
          it->key = std::move(start);
          e = std::move(it);
        }
      } else if (is_op("(")) {
        const int line = next().line;
        auto c = node<CallExpr>(line);
        c->fn = std::move(e);
        c->args = parse_call_args();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  // Filters `|f(args)` and tests `is [not] t(args)`, left to right, binding tighter than arithmetic.
  ExprP parse_filters(ExprP e) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        auto f = node<FilterExpr>(line);
        f->value = std::move(e);
        f->name = expect_name();
        while (is_op(".")) { // dotted filter names
          next();
          f->name += "." + expect_name();
        }
        if (is_op("(")) {
          next();
          f->args = parse_call_args();
        }
        e = parse_postfix(std::move(f));
      } else if (is_name("is")) {
        const int line = next().line;
        auto t = node<TestExpr>(line);
        t->value = std::move(e);
        if (is_name("not")) {
          next();
          t->negate = true;
        }
        if (peek().t == Tk::op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" ||
                                   peek().s == ">" || peek().s == "<=" || peek().s == ">="))
          t->name = next().s;
        else
          t->name = expect_name();
        if (is_op("(")) {
          next();
          t->args = parse_call_args();
        } else if (peek().t == Tk::string || peek().t == Tk::integer || peek().t == Tk::floating ||
                   (peek().t == Tk::name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is"))) {
          t->args.pos.push_back(parse_postfix(parse_primary())); // `x is divisibleby 3`
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
};

std::string strftime_at(const std::tm& t, const std::string& fmt, int line) {
  if (fmt.size() > 256) err(line, "strftime_now: format longer than 256 characters");
  std::string out(512, '\0');
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored                                                                               \
    "-Wformat-nonliteral" // the template's format: strftime writes at most out.size()
  const size_t n = std::strftime(out.data(), out.size(), fmt.c_str(), &t);
#pragma GCC diagnostic pop
  if (n == 0 && !fmt.empty()) return "";
  out.resize(n);
  return out;
}

// transformers' message normalization: keys with null values dropped, except a null `content`, which stays
// none as jinja2 sees json.loads' None (DeepSeek-style tool-call turns test `message['content'] is none`);
// a reasoning field aliased to
// both `thinking` (first) and `reasoning_content` (last), as {"thinking": r, **m, "reasoning_content": r}.
nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return messages;
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& m : messages) {
    if (!m.is_object()) {
      out.push_back(m);
      continue;
    }
    nlohmann::ordered_json kept = nlohmann::ordered_json::object();
    for (const auto& [k, v] : m.items())
      if (!v.is_null() || k == "content") kept[k] = v;
    const nlohmann::ordered_json* reasoning = nullptr;
    for (const char* k : {"reasoning_content", "thinking", "reasoning"})
      if (kept.contains(k)) {
        reasoning = &kept[k];
        break;
      }
    if (!reasoning) {
      out.push_back(std::move(kept));
      continue;
    }
    nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
    aliased["thinking"] = *reasoning;
    for (const auto& [k, v] : kept.items())
      aliased[k] = v;
    aliased["reasoning_content"] = *reasoning;
    out.push_back(std::move(aliased));
  }
  return out;
}

} // namespace

// ================================================================================================
// Template
// ================================================================================================

struct Template::Impl {
  std::string name;
  Body body;
};

Template::Template(std::string_view source, std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
  try {
    Parser p(segment(source), 1 + count_lines(source));
    impl_->body = p.parse_template();
  } catch (const TemplateError& e) {
    fail(Errc::parse_error, "chat", impl_->name + " line " + std::to_string(e.line) + ": " + e.msg);
  }
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

const std::string& Template::name() const noexcept {
  return impl_->name;
}

std::string Template::render(const RenderInput& in, const Limits& limits) const {
  Ctx c;
  c.lim = &limits;
  c.frame = std::make_shared<Frame>();
  if (in.now) {
    c.now = *in.now;
  } else {
    const std::time_t t = std::time(nullptr);
    localtime_r(&t, &c.now);
  }
  c.globals.emplace("raise_exception", make_func("raise_exception", [](Ctx&, Args& a, int line) -> Value {
                      err(line, a.pos.empty() ? std::string("raise_exception() called") : to_str(a.pos[0]));
                    }));
  c.globals.emplace("strftime_now", make_func("strftime_now", [](Ctx& cc, Args& a, int line) -> Value {
                      const Value* f = arg(a, 0, "format");
                      if (!f || !f->is(Value::K::string)) err(line, "strftime_now: expected a format string");
                      return Value::str(strftime_at(cc.now, f->s, line));
                    }));
  c.globals.emplace("namespace", make_func("namespace", [](Ctx& cc, Args& a, int line) -> Value {
                      Dict d;
                      for (const auto& p : a.pos) {
                        if (!p.is(Value::K::dict)) err(line, "namespace: expected a mapping or name=value");
                        for (const auto& [k, v] : p.d->items)
                          d.set(k, v);
                      }
                      for (const auto& [k, v] : a.kw)
                        d.set(k, v);
                      Value ns = Value::ns(std::move(d));
                      cc.namespaces.push_back(ns.d);
                      return ns;
                    }));
  c.globals.emplace("dict", make_func("dict", [](Ctx&, Args& a, int line) -> Value {
                      Dict d;
                      for (const auto& p : a.pos) {
                        if (!p.is(Value::K::dict)) err(line, "dict: expected a mapping or name=value");
                        d = *p.d;
                      }
                      for (const auto& [k, v] : a.kw)
                        d.set(k, v);
                      return Value::dict(std::move(d));
                    }));
  c.globals.emplace("range", make_func("range", [](Ctx& cc, Args& a, int line) -> Value {
                      int64_t lo = 0, hi = 0, st = 1;
                      if (a.pos.size() == 1) {
                        hi = int_arg(a, 0, "stop", 0, line);
                      } else if (a.pos.size() >= 2) {
                        lo = int_arg(a, 0, "start", 0, line);
                        hi = int_arg(a, 1, "stop", 0, line);
                        st = int_arg(a, 2, "step", 1, line);
                      } else {
                        err(line, "range: expected 1 to 3 integers");
                      }
                      if (st == 0) err(line, "range() arg 3 must not be zero");
                      const double count = std::ceil((static_cast<double>(hi) - static_cast<double>(lo)) /
                                                     static_cast<double>(st));
                      if (count > static_cast<double>(k_max_items))
                        err(line, "range() of more than " + std::to_string(k_max_items) + " items");
                      List l;
                      for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
                        cc.step(line);
                        l.push_back(Value::integer(i));
                      }
                      return Value::list(std::move(l));
                    }));
  Frame& root = *c.frame;
  root.set("messages", from_json(normalize_messages(in.messages)));
  root.set("tools", from_json(in.tools));
  root.set("documents", Value::none());
  root.set("add_generation_prompt", Value::boolean(in.add_generation_prompt));
  if (in.bos_token) root.set("bos_token", Value::str(*in.bos_token));
  if (in.eos_token) root.set("eos_token", Value::str(*in.eos_token));
  if (in.extra.is_object())
    for (const auto& [k, v] : in.extra.items())
      root.set(k, from_json(v));
  struct BreakCycles {
    Ctx& c;
    ~BreakCycles() {
      for (const auto& d : c.namespaces)
        d->items.clear();
    }
  } break_cycles{c};
  try {
    exec_body(impl_->body, c);
  } catch (const TemplateError& e) {
    fail(Errc::invalid_argument, "chat", impl_->name + " line " + std::to_string(e.line) + ": " + e.msg);
  }
  return std::move(c.out);
}

} // namespace loom::chat
