#pragma once
// The Jinja AST's base nodes (Expr, Stmt, Body) and the render context (Frame, Ctx, DepthGuard).

#include "chat/jinja_value.hpp"
#include "loom/chat/chat.hpp"

#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::chat::jinja {

// ================================================================================================
// AST
// ================================================================================================

struct Expr {
  int line = 1;
  virtual ~Expr() = default;
  virtual Value eval(Ctx& c) const = 0;
};
using ExprP = std::unique_ptr<Expr>;

struct Stmt {
  int line = 1;
  virtual ~Stmt() = default;
  virtual void exec(Ctx& c) const = 0;
};
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

// ---- the render context ----

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Frame> parent;
  Value* find(std::string_view name) {
    for (Frame* f = this; f; f = f->parent.get())
      for (auto& [k, v] : f->vars)
        if (k == name) return &v;
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars)
      if (k == name) {
        old = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  }
};

struct Ctx {
  std::string out;
  std::shared_ptr<Frame> frame;
  const Limits* lim = nullptr;
  int64_t steps = 0;
  int depth = 0;
  enum class Flow { normal, brk, cont } flow = Flow::normal;
  std::tm now{};
  std::map<std::string, Value, std::less<>> globals;
  // Every namespace() made: emptied when the render ends, so that a namespace holding itself (or a list
  // that holds it) is freed — the only mutable values, so the only way to a reference cycle.
  std::vector<std::shared_ptr<Dict>> namespaces;

  void step(int line) {
    if (++steps > lim->max_steps)
      err(line,
          "the template ran more than " + std::to_string(lim->max_steps) + " steps (a loop without end?)");
  }
  void emit(std::string_view s, int line) {
    if (out.size() + s.size() > lim->max_output)
      err(line, "the rendered text exceeds " + std::to_string(lim->max_output) + " bytes");
    out += s;
  }
  Value lookup(std::string_view name) {
    if (Value* v = frame->find(name)) return *v;
    if (auto it = globals.find(name); it != globals.end()) return it->second;
    return Value::undef("'" + std::string(name) + "'");
  }
};

struct DepthGuard {
  Ctx& c;
  DepthGuard(Ctx& ctx, int line) : c(ctx) {
    if (++c.depth > c.lim->max_depth)
      err(line, "nesting deeper than " + std::to_string(c.lim->max_depth) + " (unbounded recursion?)");
  }
  ~DepthGuard() { --c.depth; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

// Runs a body's statements, one step each, until one breaks or continues a loop.
void exec_body(const Body& b, Ctx& c);

} // namespace loom::chat::jinja
