// The Jinja parser's member functions: statements (if, for, set, macro, …) and expressions.
#include "chat/jinja_parser.hpp"

#include "chat/jinja_nodes.hpp"
#include "chat/jinja_value.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::chat::jinja {

Body Parser::parse_template() {
  Body b = parse_body({});
  if (si_ < segs_.size()) {
    const Seg& s = segs_[si_];
    err(s.line, "unexpected '" + s.toks[0].s + "' (no block is open)");
  }
  return b;
}

// ---- tag token helpers ----

const Tok& Parser::peek(size_t ahead) const {
  const size_t i = std::min(ti_ + ahead, toks_->size() - 1);
  return (*toks_)[i];
}

const Tok& Parser::next() {
  const Tok& t = peek();
  if (ti_ < toks_->size() - 1) ++ti_;
  return t;
}

bool Parser::is_op(std::string_view op, size_t ahead) const {
  return peek(ahead).t == Tk::op && peek(ahead).s == op;
}

bool Parser::is_name(std::string_view n, size_t ahead) const {
  return peek(ahead).t == Tk::name && peek(ahead).s == n;
}

std::string Parser::describe(const Tok& t) {
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

void Parser::expect_op(std::string_view op) {
  if (!is_op(op)) err(peek().line, "expected '" + std::string(op) + "', found " + describe(peek()));
  next();
}

std::string Parser::expect_name() {
  if (peek().t != Tk::name) err(peek().line, "expected a name, found " + describe(peek()));
  return next().s;
}

void Parser::expect_end() {
  if (peek().t != Tk::end) err(peek().line, "expected the end of the tag, found " + describe(peek()));
}

// ---- statements ----

// Statements until a block tag whose keyword is in `ends` (left unconsumed) or the template's end.
Body Parser::parse_body(const std::vector<std::string_view>& ends) {
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
std::string Parser::take_end(std::string_view opened, int open_line) {
  if (si_ >= segs_.size()) err(open_line, "the '" + std::string(opened) + "' block is never closed");
  toks_ = &segs_[si_].toks;
  ti_ = 0;
  return next().s;
}

void Parser::finish_tag() {
  expect_end();
  ++si_;
}

StmtP Parser::parse_statement(const std::string& kw) {
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
  if (kw == "raw" || kw == "include" || kw == "extends" || kw == "import" || kw == "from" || kw == "block" ||
      kw == "call" || kw == "filter" || kw == "with" || kw == "autoescape")
    err(line, "the '" + kw + "' tag is not supported by this Jinja subset");
  err(line, "unknown tag '" + kw + "'");
}

StmtP Parser::parse_if(int line) {
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

std::vector<std::string> Parser::parse_targets() {
  std::vector<std::string> t{expect_name()};
  while (is_op(",")) {
    next();
    t.push_back(expect_name());
  }
  return t;
}

StmtP Parser::parse_for(int line) {
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

StmtP Parser::parse_set(int line) {
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

StmtP Parser::parse_macro(int line) {
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

struct Parser::Depth {
  Parser& p;
  Depth(Parser& parser, int line) : p(parser) {
    if (++p.depth_ > 150) err(line, "expression nested too deeply");
  }
  ~Depth() { --p.depth_; }
  Depth(const Depth&) = delete;
  Depth& operator=(const Depth&) = delete;
};

template <class T> std::unique_ptr<T> Parser::node(int line) {
  auto n = std::make_unique<T>();
  n->line = line;
  return n;
}

// `a, b` (a tuple, as a list) or one expression.
ExprP Parser::parse_tuple_or_expr() {
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

ExprP Parser::parse_expr(bool with_condexpr) {
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

ExprP Parser::parse_or() {
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

ExprP Parser::parse_and() {
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

ExprP Parser::parse_not() {
  if (is_name("not")) {
    Depth d(*this, peek().line);
    auto u = node<UnaryExpr>(next().line);
    u->op = "not";
    u->e = parse_not();
    return u;
  }
  return parse_compare();
}

ExprP Parser::parse_compare() {
  ExprP e = parse_math1();
  std::unique_ptr<CompareExpr> cmp;
  while (true) {
    std::string op;
    if (peek().t == Tk::op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == "<=" ||
                               peek().s == ">" || peek().s == ">="))
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

ExprP Parser::binary(ExprP a, const std::string& op, ExprP b, int line) {
  auto n = node<BinExpr>(line);
  n->op = op;
  n->a = std::move(a);
  n->b = std::move(b);
  return n;
}

ExprP Parser::parse_math1() {
  ExprP e = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Tok& t = next();
    const std::string op = t.s;
    e = binary(std::move(e), op, parse_concat(), t.line);
  }
  return e;
}

ExprP Parser::parse_concat() {
  ExprP e = parse_math2();
  while (is_op("~")) {
    const int line = next().line;
    e = binary(std::move(e), "~", parse_math2(), line);
  }
  return e;
}

ExprP Parser::parse_math2() {
  ExprP e = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Tok& t = next();
    const std::string op = t.s;
    e = binary(std::move(e), op, parse_pow(), t.line);
  }
  return e;
}

ExprP Parser::parse_pow() {
  ExprP e = parse_unary();
  while (is_op("**")) {
    const int line = next().line;
    e = binary(std::move(e), "**", parse_unary(), line);
  }
  return e;
}

// jinja2's order: `-x|f` is (-x)|f, the sign applying to the operand before its filters.
ExprP Parser::parse_unary(bool with_filters) {
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

ExprP Parser::parse_primary() {
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

CallArgs Parser::parse_call_args() { // after '('
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

ExprP Parser::parse_postfix(ExprP e) {
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
ExprP Parser::parse_filters(ExprP e) {
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
      if (peek().t == Tk::op && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == ">" ||
                                 peek().s == "<=" || peek().s == ">="))
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

} // namespace loom::chat::jinja
