// Jinja values: Value's constructors, err(), truthiness, UTF-8 helpers, Python's str()/repr(), tojson, ==.
#include "chat/jinja_value.hpp"

#include "tokenizer/utf8.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace loom::chat::jinja {

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

namespace {

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

} // namespace

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

namespace {

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

} // namespace

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

} // namespace loom::chat::jinja
