#pragma once
// Jinja values (Value, Dict, Args, Func), TemplateError, str()/repr(), tojson and UTF-8 helpers.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::chat::jinja {

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
[[noreturn]] void err(int line, std::string msg);

const char* type_name(const Value& v);
[[noreturn]] void undefined_error(const Value& v, int line);
bool truthy(const Value& v);

// ---- UTF-8 (the tree's one decoder: tokenizer/utf8.hpp; an ill-formed byte is a character of its own) ----

// The code points of s as byte offsets (one past the last included).
std::vector<size_t> cp_offsets(std::string_view s);
size_t cp_count(std::string_view s);
// The code point at byte `at` (an ill-formed byte: its own value).
uint32_t decode_cp(std::string_view s, size_t at);
void append_utf8(std::string& out, uint32_t cp);
// Python's str.isspace() for a code point.
bool py_space(uint32_t c);

// ---- printing: Python's str() and repr() ----

std::string to_str(const Value& v);
std::string repr(const Value& v);

// ---- tojson: transformers' json.dumps(x, ensure_ascii=False, indent=…) ----

void json_dump(const Value& v, std::string& out, int indent, int level, int line, int depth);

bool equal(const Value& a, const Value& b);

} // namespace loom::chat::jinja
