// Jinja operations, string helpers and methods, tests (`x is name`), filters and the global functions.
#include "chat/jinja_ast.hpp"
#include "chat/jinja_builtins.hpp"
#include "chat/jinja_value.hpp"
#include "tokenizer/utf8.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace loom::chat::jinja {

// ---- operations ----

namespace {

// The most items a list built by the template itself may have (range(), list * n): values are ≈ 100 bytes.
constexpr int64_t k_max_items = 1'000'000;

} // namespace

int64_t as_int(const Value& v) {
  return v.is(Value::K::boolean) ? int64_t{v.b} : v.i;
}

namespace {

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

} // namespace

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

namespace {

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

} // namespace

Value make_func(std::string name, std::function<Value(Ctx&, Args&, int)> fn) {
  auto f = std::make_shared<Func>();
  f->name = std::move(name);
  f->call = std::move(fn);
  return Value::func(std::move(f));
}

// ---- string helpers ----

namespace {

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

// ---- methods of str, dict and list values ----

// A str method: the string, the method's name (several share one function), the call's arguments.
using StrMethod = Value (*)(const std::string& s, const std::string& name, Args& a, int line);

Value str_strip(const std::string& s, const std::string& name, Args& a, int) {
  return Value::str(strip_chars(s, arg(a, 0, "chars"), name != "rstrip", name != "lstrip"));
}

Value str_split(const std::string& s, const std::string& name, Args& a, int l) {
  if (name == "rsplit" && int_arg(a, 1, "maxsplit", -1, l) >= 0)
    err(l, "rsplit with maxsplit is not supported");
  return Value::list(split(s, arg(a, 0, "sep"), int_arg(a, 1, "maxsplit", -1, l), l));
}

Value str_splitlines(const std::string& s, const std::string&, Args&, int) {
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

Value str_replace(const std::string& s, const std::string&, Args& a, int l) {
  const Value* from = arg(a, 0, "old");
  const Value* to = arg(a, 1, "new");
  if (!from || !to || !from->is(Value::K::string) || !to->is(Value::K::string))
    err(l, "replace: expected two strings");
  return Value::str(replace_all(s, from->s, to->s, int_arg(a, 2, "count", -1, l)));
}

// startswith / endswith: a string, or any of a list of strings.
Value str_affix(const std::string& s, const std::string& name, Args& a, int l) {
  const Value* p = arg(a, 0, "prefix");
  if (!p) err(l, name + ": expected an argument");
  const auto test = [&](const std::string& x) {
    return name == "startswith" ? s.rfind(x, 0) == 0
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

// isdigit / isalpha / isspace: every character (ASCII) of a non-empty string.
Value str_is_class(const std::string& s, const std::string& name, Args&, int) {
  if (s.empty()) return Value::boolean(false);
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (name == "isdigit" ? !std::isdigit(u) : name == "isalpha" ? !std::isalpha(u) : !std::isspace(u))
      return Value::boolean(false);
  }
  return Value::boolean(true);
}

Value str_join(const std::string& s, const std::string&, Args& a, int l) {
  const Value* x = arg(a, 0, "sub");
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

Value str_format(const std::string&, const std::string&, Args&, int l) {
  err(l, "str.format is not supported");
}

// count / find: the substring argument.
const Value& substring_arg(const std::string& name, Args& a, int l) {
  const Value* x = arg(a, 0, "sub");
  if (!x || !x->is(Value::K::string)) err(l, name + ": expected a string");
  return *x;
}

Value str_count(const std::string& s, const std::string& name, Args& a, int l) {
  const Value& x = substring_arg(name, a, l);
  if (x.s.empty()) return Value::integer(static_cast<int64_t>(cp_count(s)) + 1);
  int64_t n = 0;
  for (size_t p = s.find(x.s); p != std::string::npos; p = s.find(x.s, p + x.s.size()))
    ++n;
  return Value::integer(n);
}

Value str_find(const std::string& s, const std::string& name, Args& a, int l) {
  const Value& x = substring_arg(name, a, l);
  const size_t at = s.find(x.s); // find: a code point index
  return Value::integer(at == std::string::npos ? -1 : static_cast<int64_t>(cp_count(s.substr(0, at))));
}

const std::map<std::string, StrMethod, std::less<>>& str_methods() {
  static const std::map<std::string, StrMethod, std::less<>> methods = {
      {"strip", str_strip},
      {"lstrip", str_strip},
      {"rstrip", str_strip},
      {"split", str_split},
      {"rsplit", str_split},
      {"splitlines", str_splitlines},
      {"replace", str_replace},
      {"startswith", str_affix},
      {"endswith", str_affix},
      {"lower",
       [](const std::string& s, const std::string&, Args&, int) { return Value::str(case_map(s, 0)); }},
      {"upper",
       [](const std::string& s, const std::string&, Args&, int) { return Value::str(case_map(s, 1)); }},
      {"title",
       [](const std::string& s, const std::string&, Args&, int) { return Value::str(case_map(s, 2)); }},
      {"capitalize",
       [](const std::string& s, const std::string&, Args&, int) { return Value::str(case_map(s, 3)); }},
      {"isdigit", str_is_class},
      {"isalpha", str_is_class},
      {"isspace", str_is_class},
      {"join", str_join},
      {"format", str_format},
      {"count", str_count},
      {"find", str_find}};
  return methods;
}

std::optional<Value> str_method(const std::string& s, const std::string& name) {
  const auto& methods = str_methods();
  const auto it = methods.find(name);
  if (it == methods.end()) return std::nullopt;
  return make_func("str." + name,
                   [s, name, fn = it->second](Ctx&, Args& a, int l) -> Value { return fn(s, name, a, l); });
}

std::optional<Value> dict_method(const std::shared_ptr<Dict>& d, const std::string& name) {
  if (name != "items" && name != "keys" && name != "values" && name != "get") return std::nullopt;
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
      out.push_back(name == "items" ? Value::tuple({Value::str(k), v}) : name == "keys" ? Value::str(k) : v);
    return Value::list(std::move(out));
  });
}

std::optional<Value> list_method(const std::shared_ptr<List>& l, const std::string& name) {
  if (name != "index" && name != "count") return std::nullopt;
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
  if (obj.is(Value::K::string)) return str_method(obj.s, name);
  if (obj.is(Value::K::dict)) return dict_method(obj.d, name);
  return list_method(obj.l, name);
}

} // namespace

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

// ---- filters ----

namespace {

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

// A filter: the context, the filter's name (several share one function), the value, the arguments.
using Filter = Value (*)(Ctx& c, const std::string& name, const Value& v, Args& a, int line);

Value filter_tojson(Ctx&, const std::string&, const Value& v, Args& a, int line) {
  int indent = -1;
  if (const Value* ind = arg(a, 0, "indent"); ind && !ind->is(Value::K::none)) {
    if (!ind->is(Value::K::integer)) err(line, "tojson: indent must be an integer");
    indent = static_cast<int>(std::clamp<int64_t>(ind->i, 0, 64));
  }
  std::string out;
  json_dump(v, out, indent, 0, line, 0);
  return Value::str(std::move(out));
}

// HTML escaping (no template autoescapes; `|e` is explicit).
Value filter_escape(Ctx&, const std::string&, const Value& v, Args&, int) {
  std::string out;
  for (const char ch : to_str(v)) {
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

Value filter_default(Ctx&, const std::string&, const Value& v, Args& a, int) {
  const Value* def = arg(a, 0, "default_value");
  const Value* boolean = arg(a, 1, "boolean");
  const bool use = v.is(Value::K::undefined) || (boolean && truthy(*boolean) && !truthy(v));
  return use ? (def ? *def : Value::str("")) : v;
}

Value filter_items(Ctx&, const std::string&, const Value& v, Args&, int line) {
  if (v.is(Value::K::undefined)) return Value::list({});
  if (!v.is(Value::K::dict)) err(line, "items: expected a mapping");
  List out;
  for (const auto& [k, x] : v.d->items)
    out.push_back(Value::tuple({Value::str(k), x}));
  return Value::list(std::move(out));
}

Value filter_dictsort(Ctx&, const std::string&, const Value& v, Args&, int line) {
  if (!v.is(Value::K::dict)) err(line, "dictsort: expected a mapping");
  auto items = v.d->items;
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& x, const auto& y) { return case_map(x.first, 0) < case_map(y.first, 0); });
  List out;
  for (const auto& [k, x] : items)
    out.push_back(Value::tuple({Value::str(k), x}));
  return Value::list(std::move(out));
}

Value filter_join(Ctx&, const std::string&, const Value& v, Args& a, int line) {
  const Value* sep = arg(a, 0, "d");
  const Value* attribute = arg(a, 1, "attribute");
  std::string out;
  const List items = iterate(v, line);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i && sep) out += to_str(*sep);
    out += to_str(attribute ? get_item(items[i], *attribute, line) : items[i]);
  }
  return Value::str(std::move(out));
}

Value filter_first_last(Ctx&, const std::string& name, const Value& v, Args&, int line) {
  const List items = iterate(v, line);
  if (items.empty()) return Value::undef("'" + name + "' of an empty sequence");
  return name == "first" ? items.front() : items.back();
}

Value filter_reverse(Ctx&, const std::string&, const Value& v, Args&, int line) {
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

Value filter_sort(Ctx&, const std::string&, const Value& v, Args& a, int line) {
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

Value filter_unique(Ctx&, const std::string&, const Value& v, Args&, int line) {
  List out;
  for (const Value& x : iterate(v, line))
    if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); })) out.push_back(x);
  return Value::list(std::move(out));
}

// map(attribute=…, default=…) or map('filter', args…).
Value filter_map(Ctx& c, const std::string&, const Value& v, Args& a, int line) {
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

Value filter_select(Ctx& c, const std::string& name, const Value& v, Args& a, int line) {
  const bool attr = name == "selectattr" || name == "rejectattr";
  return select_items(c, v, a, attr, name == "selectattr" || name == "select", line);
}

// jinja2's do_indent: lines after the first; blank lines only with blank=true.
Value filter_indent(Ctx&, const std::string&, const Value& v, Args& a, int line) {
  const int64_t width = int_arg(a, 0, "width", 4, line);
  const Value* first = arg(a, 1, "first");
  const Value* blank = arg(a, 2, "blank");
  const std::string pad(static_cast<size_t>(std::clamp<int64_t>(width, 0, 256)), ' ');
  const std::string s = to_str(v) + "\n";
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

Value filter_replace(Ctx&, const std::string&, const Value& v, Args& a, int line) {
  const Value* from = arg(a, 0, "old");
  const Value* to = arg(a, 1, "new");
  if (!from || !to) err(line, "replace: expected two arguments");
  return Value::str(replace_all(to_str(v), to_str(*from), to_str(*to), int_arg(a, 2, "count", -1, line)));
}

Value filter_abs(Ctx&, const std::string&, const Value& v, Args&, int line) {
  if (v.is(Value::K::integer)) return Value::integer(v.i < 0 ? -v.i : v.i);
  if (v.is(Value::K::floating)) return Value::floating(std::fabs(v.f));
  err(line, "abs: expected a number");
}

Value filter_int(Ctx&, const std::string&, const Value& v, Args& a, int) {
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

Value filter_float(Ctx&, const std::string&, const Value& v, Args& a, int) {
  if (v.number()) return Value::floating(v.as_double());
  if (v.is(Value::K::string)) {
    char* end = nullptr;
    const double x = std::strtod(v.s.c_str(), &end);
    if (end && *end == '\0' && !v.s.empty()) return Value::floating(x);
  }
  const Value* def = arg(a, 0, "default");
  return def ? *def : Value::floating(0.0);
}

Value filter_round(Ctx&, const std::string&, const Value& v, Args& a, int line) {
  const int64_t prec = int_arg(a, 0, "precision", 0, line);
  if (!v.number()) err(line, "round: expected a number");
  const double m = std::pow(10.0, static_cast<double>(prec));
  return Value::floating(std::nearbyint(v.as_double() * m) / m);
}

Value filter_sum(Ctx&, const std::string&, const Value& v, Args&, int line) {
  Value acc = Value::integer(0);
  for (const auto& x : iterate(v, line))
    acc = add(acc, x, line);
  return acc;
}

Value filter_min_max(Ctx&, const std::string& name, const Value& v, Args&, int line) {
  const List items = iterate(v, line);
  if (items.empty()) return Value::undef("'" + name + "' of an empty sequence");
  Value best = items.front();
  for (const auto& x : items)
    if (name == "min" ? compare(x, best, line) < 0 : compare(x, best, line) > 0) best = x;
  return best;
}

Value filter_case(const Value& v, int mode) {
  return Value::str(case_map(to_str(v), mode));
}

const std::map<std::string, Filter, std::less<>>& filters() {
  static const std::map<std::string, Filter, std::less<>> table = {
      {"tojson", filter_tojson},
      {"length",
       [](Ctx&, const std::string&, const Value& v, Args&, int l) { return Value::integer(length(v, l)); }},
      {"count",
       [](Ctx&, const std::string&, const Value& v, Args&, int l) { return Value::integer(length(v, l)); }},
      {"string", [](Ctx&, const std::string&, const Value& v, Args&, int) { return Value::str(to_str(v)); }},
      {"trim", [](Ctx&, const std::string&, const Value& v, Args& a,
                  int) { return Value::str(strip_chars(to_str(v), arg(a, 0, "chars"), true, true)); }},
      {"lower", [](Ctx&, const std::string&, const Value& v, Args&, int) { return filter_case(v, 0); }},
      {"upper", [](Ctx&, const std::string&, const Value& v, Args&, int) { return filter_case(v, 1); }},
      {"title", [](Ctx&, const std::string&, const Value& v, Args&, int) { return filter_case(v, 2); }},
      {"capitalize", [](Ctx&, const std::string&, const Value& v, Args&, int) { return filter_case(v, 3); }},
      {"safe", [](Ctx&, const std::string&, const Value& v, Args&, int) { return v; }},
      {"e", filter_escape},
      {"escape", filter_escape},
      {"forceescape", filter_escape},
      {"default", filter_default},
      {"d", filter_default},
      {"items", filter_items},
      {"dictsort", filter_dictsort},
      {"list",
       [](Ctx&, const std::string&, const Value& v, Args&, int l) { return Value::list(iterate(v, l)); }},
      {"join", filter_join},
      {"first", filter_first_last},
      {"last", filter_first_last},
      {"reverse", filter_reverse},
      {"sort", filter_sort},
      {"unique", filter_unique},
      {"map", filter_map},
      {"selectattr", filter_select},
      {"rejectattr", filter_select},
      {"select", filter_select},
      {"reject", filter_select},
      {"indent", filter_indent},
      {"replace", filter_replace},
      {"abs", filter_abs},
      {"int", filter_int},
      {"float", filter_float},
      {"round", filter_round},
      {"sum", filter_sum},
      {"min", filter_min_max},
      {"max", filter_min_max},
      {"wordcount", [](Ctx&, const std::string&, const Value& v, Args&, int l) {
         return Value::integer(static_cast<int64_t>(split(to_str(v), nullptr, -1, l).size()));
       }}};
  return table;
}

// jinja2's filters this subset leaves out: named in the error, told apart from a misspelt name.
const std::set<std::string, std::less<>> k_unsupported_filters = {
    "batch",          "slice",  "groupby",   "format", "truncate", "urlencode", "xmlattr",
    "filesizeformat", "pprint", "striptags", "urlize", "wordwrap", "random",    "attr"};

} // namespace

Value apply_filter(Ctx& c, const std::string& name, const Value& v, Args& a, int line) {
  const auto& table = filters();
  if (const auto it = table.find(name); it != table.end()) return it->second(c, name, v, a, line);
  if (k_unsupported_filters.count(name))
    err(line, "the filter '" + name + "' is not supported by this Jinja subset");
  err(line, "no filter named '" + name + "'");
}

// ---- global functions ----

namespace {

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

} // namespace

void add_globals(Ctx& c) {
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
}

} // namespace loom::chat::jinja
