#pragma once
// The Jinja AST's expression and statement nodes (built by the parser, evaluated in jinja_eval.cpp).

#include "chat/jinja_ast.hpp"
#include "chat/jinja_value.hpp"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace loom::chat::jinja {

// ---- expressions ----

struct Literal final : Expr {
  Value v;
  Value eval(Ctx&) const override;
};

struct Name final : Expr {
  std::string name;
  Value eval(Ctx& c) const override;
};

struct ListExpr final : Expr {
  std::vector<ExprP> items;
  bool tuple = false;
  Value eval(Ctx& c) const override;
};

struct DictExpr final : Expr {
  std::vector<std::pair<ExprP, ExprP>> items;
  Value eval(Ctx& c) const override;
};

struct AttrExpr final : Expr {
  ExprP obj;
  std::string name;
  Value eval(Ctx& c) const override;
};

struct ItemExpr final : Expr {
  ExprP obj, key;
  Value eval(Ctx& c) const override;
};

struct SliceExpr final : Expr {
  ExprP obj, start, stop, step; // any may be null
  Value eval(Ctx& c) const override;
};

struct CallArgs {
  std::vector<ExprP> pos;
  std::vector<std::pair<std::string, ExprP>> kw;
  Args eval(Ctx& c) const;
};

struct CallExpr final : Expr {
  ExprP fn;
  CallArgs args;
  Value eval(Ctx& c) const override;
};

struct FilterExpr final : Expr {
  ExprP value;
  std::string name;
  CallArgs args;
  Value eval(Ctx& c) const override;
};

struct TestExpr final : Expr {
  ExprP value;
  std::string name;
  CallArgs args;
  bool negate = false;
  Value eval(Ctx& c) const override;
};

struct UnaryExpr final : Expr {
  std::string op; // "not", "-", "+"
  ExprP e;
  Value eval(Ctx& c) const override;
};

struct BinExpr final : Expr {
  std::string op; // + - * / // % ** ~ and or
  ExprP a, b;
  Value eval(Ctx& c) const override;
};

struct CompareExpr final : Expr {
  ExprP first;
  std::vector<std::pair<std::string, ExprP>> rest; // == != < <= > >= in notin
  Value eval(Ctx& c) const override;
};

struct CondExpr final : Expr {
  ExprP then, cond, otherwise; // otherwise may be null (undefined)
  Value eval(Ctx& c) const override;
};

// ---- statements ----

struct TextStmt final : Stmt {
  std::string text;
  void exec(Ctx& c) const override;
};

struct OutputStmt final : Stmt {
  ExprP e;
  void exec(Ctx& c) const override;
};

struct IfStmt final : Stmt {
  std::vector<std::pair<ExprP, Body>> branches; // a null condition: else
  void exec(Ctx& c) const override;
};

struct ForStmt final : Stmt {
  std::vector<std::string> targets;
  ExprP iter, filter; // filter may be null
  Body body, else_body;
  void exec(Ctx& c) const override;
};

struct SetStmt final : Stmt {
  std::vector<std::string> targets; // or one namespace attribute:
  std::string ns, attr;
  ExprP value;
  Body block; // {% set x %}…{% endset %}
  bool is_block = false;
  void exec(Ctx& c) const override;
};

struct LoopCtlStmt final : Stmt {
  bool brk = true;
  void exec(Ctx& c) const override;
};

struct BlockStmt final : Stmt { // {% generation %}: its body, unchanged
  Body body;
  void exec(Ctx& c) const override;
};

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprP> defaults; // per param, null: required
  Body body;
};

struct MacroStmt final : Stmt {
  std::shared_ptr<MacroDef> def;
  void exec(Ctx& c) const override;
};

} // namespace loom::chat::jinja
