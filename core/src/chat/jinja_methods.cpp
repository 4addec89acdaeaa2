// Jinja string helpers (strip, split, replace, case) and call arguments; the methods of str, dict and
// list values; attribute and item access.
#include "chat/jinja_ast.hpp"
#include "chat/jinja_builtins.hpp"
#include "chat/jinja_value.hpp"
#include "tokenizer/utf8.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::chat::jinja {

// ---- string helpers and call arguments ----

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

namespace {

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

} // namespace loom::chat::jinja
