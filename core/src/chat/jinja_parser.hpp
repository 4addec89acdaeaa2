#pragma once
// The Jinja parser: a template's segments to the AST, by recursive descent with jinja2's precedence.

#include "chat/jinja_ast.hpp"
#include "chat/jinja_lexer.hpp"

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::chat::jinja {

struct CallArgs;

class Parser {
public:
  Parser(std::vector<Seg> segs, int last_line) : segs_(std::move(segs)), last_line_(last_line) {}

  Body parse_template();

private:
  std::vector<Seg> segs_;
  int last_line_ = 1; // the template's last line
  size_t si_ = 0;     // current segment
  const std::vector<Tok>* toks_ = nullptr;
  size_t ti_ = 0; // current token in the tag
  int depth_ = 0;

  // ---- tag token helpers ----
  const Tok& peek(size_t ahead = 0) const;
  const Tok& next();
  bool is_op(std::string_view op, size_t ahead = 0) const;
  bool is_name(std::string_view n, size_t ahead = 0) const;
  static std::string describe(const Tok& t);
  void expect_op(std::string_view op);
  std::string expect_name();
  void expect_end();

  // ---- statements ----
  Body parse_body(const std::vector<std::string_view>& ends);
  std::string take_end(std::string_view opened, int open_line);
  void finish_tag();
  StmtP parse_statement(const std::string& kw);
  StmtP parse_if(int line);
  std::vector<std::string> parse_targets();
  StmtP parse_for(int line);
  StmtP parse_set(int line);
  StmtP parse_macro(int line);

  // ---- expressions ----
  struct Depth;
  template <class T> std::unique_ptr<T> node(int line);
  ExprP parse_tuple_or_expr();
  ExprP parse_expr(bool with_condexpr = true);
  ExprP parse_or();
  ExprP parse_and();
  ExprP parse_not();
  ExprP parse_compare();
  ExprP binary(ExprP a, const std::string& op, ExprP b, int line);
  ExprP parse_math1();
  ExprP parse_concat();
  ExprP parse_math2();
  ExprP parse_pow();
  ExprP parse_unary(bool with_filters = true);
  ExprP parse_primary();
  CallArgs parse_call_args(); // after '('
  ExprP parse_postfix(ExprP e);
  ExprP parse_filters(ExprP e);
};

} // namespace loom::chat::jinja
