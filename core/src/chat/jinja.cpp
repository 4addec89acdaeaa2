// loom::chat::Template (loom/chat/chat.hpp): parses a template with the Jinja subset of chat/jinja_*, renders
// it.
//
// The Jinja subset behind loom/chat/chat.hpp: a segmenter (text and tags, with jinja2's whitespace control,
// trim_blocks and lstrip_blocks), a recursive-descent parser to an AST, and a tree-walking interpreter
// over Python-like values (None, bool, int, float, str, list, dict in insertion order, namespace,
// callables) whose printing, `tojson`, truthiness, undefined and scoping follow jinja2 3.1 as
// transformers configures it.
#include "chat/jinja_ast.hpp"
#include "chat/jinja_builtins.hpp"
#include "chat/jinja_lexer.hpp"
#include "chat/jinja_parser.hpp"
#include "chat/jinja_value.hpp"
#include "loom/chat/chat.hpp"
#include "loom/error.hpp"

#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>

namespace loom::chat {

using jinja::add_globals;
using jinja::Body;
using jinja::count_lines;
using jinja::Ctx;
using jinja::Dict;
using jinja::exec_body;
using jinja::Frame;
using jinja::List;
using jinja::Parser;
using jinja::segment;
using jinja::TemplateError;
using jinja::Value;

namespace {

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
  case nlohmann::ordered_json::value_t::null:
    return Value::none();
  case nlohmann::ordered_json::value_t::boolean:
    return Value::boolean(j.get<bool>());
  case nlohmann::ordered_json::value_t::number_integer:
    return Value::integer(j.get<int64_t>());
  case nlohmann::ordered_json::value_t::number_unsigned: {
    const auto u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return Value::floating(static_cast<double>(u));
    return Value::integer(static_cast<int64_t>(u));
  }
  case nlohmann::ordered_json::value_t::number_float:
    return Value::floating(j.get<double>());
  case nlohmann::ordered_json::value_t::string:
    return Value::str(j.get<std::string>());
  case nlohmann::ordered_json::value_t::array: {
    List l;
    l.reserve(j.size());
    for (const auto& e : j)
      l.push_back(from_json(e));
    return Value::list(std::move(l));
  }
  case nlohmann::ordered_json::value_t::object: {
    Dict d;
    for (const auto& [k, v] : j.items())
      d.items.emplace_back(k, from_json(v));
    return Value::dict(std::move(d));
  }
  default:
    return Value::none();
  }
}

// transformers' message normalization: keys with null values dropped, except a null `content`, which stays
// none as jinja2 sees json.loads' None (DeepSeek-style tool-call turns test `message['content'] is none`);
// a reasoning field aliased to
// both `thinking` (first) and `reasoning_content` (last), as {"thinking": r, **m, "reasoning_content": r}.
nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return messages;
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& m : messages) {
    if (!m.is_object()) {
      out.push_back(m);
      continue;
    }
    nlohmann::ordered_json kept = nlohmann::ordered_json::object();
    for (const auto& [k, v] : m.items())
      if (!v.is_null() || k == "content") kept[k] = v;
    const nlohmann::ordered_json* reasoning = nullptr;
    for (const char* k : {"reasoning_content", "thinking", "reasoning"})
      if (kept.contains(k)) {
        reasoning = &kept[k];
        break;
      }
    if (!reasoning) {
      out.push_back(std::move(kept));
      continue;
    }
    nlohmann::ordered_json aliased = nlohmann::ordered_json::object();
    aliased["thinking"] = *reasoning;
    for (const auto& [k, v] : kept.items())
      aliased[k] = v;
    aliased["reasoning_content"] = *reasoning;
    out.push_back(std::move(aliased));
  }
  return out;
}

} // namespace

// ================================================================================================
// Template
// ================================================================================================

struct Template::Impl {
  std::string name;
  Body body;
};

Template::Template(std::string_view source, std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->name = std::move(name);
  try {
    Parser p(segment(source), 1 + count_lines(source));
    impl_->body = p.parse_template();
  } catch (const TemplateError& e) {
    fail(Errc::parse_error, "chat", impl_->name + " line " + std::to_string(e.line) + ": " + e.msg);
  }
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

const std::string& Template::name() const noexcept {
  return impl_->name;
}

std::string Template::render(const RenderInput& in, const Limits& limits) const {
  Ctx c;
  c.lim = &limits;
  c.frame = std::make_shared<Frame>();
  if (in.now) {
    c.now = *in.now;
  } else {
    const std::time_t t = std::time(nullptr);
    localtime_r(&t, &c.now);
  }
  add_globals(c);
  Frame& root = *c.frame;
  root.set("messages", from_json(normalize_messages(in.messages)));
  root.set("tools", from_json(in.tools));
  root.set("documents", Value::none());
  root.set("add_generation_prompt", Value::boolean(in.add_generation_prompt));
  if (in.bos_token) root.set("bos_token", Value::str(*in.bos_token));
  if (in.eos_token) root.set("eos_token", Value::str(*in.eos_token));
  if (in.extra.is_object())
    for (const auto& [k, v] : in.extra.items())
      root.set(k, from_json(v));
  struct BreakCycles {
    Ctx& c;
    ~BreakCycles() {
      for (const auto& d : c.namespaces)
        d->items.clear();
    }
  } break_cycles{c};
  try {
    exec_body(impl_->body, c);
  } catch (const TemplateError& e) {
    fail(Errc::invalid_argument, "chat", impl_->name + " line " + std::to_string(e.line) + ": " + e.msg);
  }
  return std::move(c.out);
}

} // namespace loom::chat
