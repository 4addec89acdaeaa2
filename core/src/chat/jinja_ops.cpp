// Jinja operations on values: arithmetic as Python computes it, ordering, iteration, membership, length.
#include "chat/jinja_ast.hpp"
#include "chat/jinja_builtins.hpp"
#include "chat/jinja_value.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace loom::chat::jinja {

// ---- operations ----

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

Value make_func(std::string name, std::function<Value(Ctx&, Args&, int)> fn) {
  auto f = std::make_shared<Func>();
  f->name = std::move(name);
  f->call = std::move(fn);
  return Value::func(std::move(f));
}

} // namespace loom::chat::jinja
