// Jinja tests (`x is name`), filters (`v|name`) and the global functions.
#include "chat/jinja_ast.hpp"
#include "chat/jinja_builtins.hpp"
#include "chat/jinja_value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace loom::chat::jinja {

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
    acc = arith("+", acc, x, line);
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
