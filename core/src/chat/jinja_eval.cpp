// Jinja evaluation: the expression nodes' eval() and the statement nodes' exec(), and exec_body().
#include "chat/jinja_ast.hpp"
#include "chat/jinja_builtins.hpp"
#include "chat/jinja_nodes.hpp"
#include "chat/jinja_value.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::chat::jinja {

void exec_body(const Body& b, Ctx& c) {
  for (const auto& s : b) {
    c.step(s->line);
    s->exec(c);
    if (c.flow != Ctx::Flow::normal) return;
  }
}

namespace {

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

} // namespace

// ---- expressions ----

Value Literal::eval(Ctx&) const {
  return v;
}

Value Name::eval(Ctx& c) const {
  return c.lookup(name);
}

Value ListExpr::eval(Ctx& c) const {
  List l;
  for (const auto& e : items)
    l.push_back(e->eval(c));
  return tuple ? Value::tuple(std::move(l)) : Value::list(std::move(l));
}

Value DictExpr::eval(Ctx& c) const {
  Dict d;
  for (const auto& [k, v] : items) {
    const Value key = k->eval(c);
    d.set(key.is(Value::K::string) ? key.s : to_str(key), v->eval(c));
  }
  return Value::dict(std::move(d));
}

Value AttrExpr::eval(Ctx& c) const {
  return get_attr(obj->eval(c), name, line);
}

Value ItemExpr::eval(Ctx& c) const {
  const Value o = obj->eval(c);
  return get_item(o, key->eval(c), line);
}

Value SliceExpr::eval(Ctx& c) const {
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

Args CallArgs::eval(Ctx& c) const {
  Args a;
  for (const auto& e : pos)
    a.pos.push_back(e->eval(c));
  for (const auto& [k, e] : kw)
    a.kw.emplace_back(k, e->eval(c));
  return a;
}

Value CallExpr::eval(Ctx& c) const {
  const Value f = fn->eval(c);
  Args a = args.eval(c);
  return call_value(c, f, a, line);
}

Value FilterExpr::eval(Ctx& c) const {
  const Value v = value->eval(c);
  Args a = args.eval(c);
  DepthGuard g(c, line);
  return apply_filter(c, name, v, a, line);
}

Value TestExpr::eval(Ctx& c) const {
  const Value v = value->eval(c);
  Args a = args.eval(c);
  return Value::boolean(run_test(c, name, v, a, line) != negate);
}

Value UnaryExpr::eval(Ctx& c) const {
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

Value BinExpr::eval(Ctx& c) const {
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

Value CompareExpr::eval(Ctx& c) const {
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

Value CondExpr::eval(Ctx& c) const {
  if (truthy(cond->eval(c))) return then->eval(c);
  return otherwise ? otherwise->eval(c) : Value::undef("the else branch of an inline if");
}

// ---- statements ----

void TextStmt::exec(Ctx& c) const {
  c.emit(text, line);
}

void OutputStmt::exec(Ctx& c) const {
  c.emit(to_str(e->eval(c)), line);
}

void IfStmt::exec(Ctx& c) const {
  for (const auto& [cond, body] : branches)
    if (!cond || truthy(cond->eval(c))) {
      exec_body(body, c);
      return;
    }
}

namespace {

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

} // namespace

void ForStmt::exec(Ctx& c) const {
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

void SetStmt::exec(Ctx& c) const {
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

void LoopCtlStmt::exec(Ctx& c) const {
  c.flow = brk ? Ctx::Flow::brk : Ctx::Flow::cont;
}

void BlockStmt::exec(Ctx& c) const {
  exec_body(body, c);
}

void MacroStmt::exec(Ctx& c) const {
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

} // namespace loom::chat::jinja
