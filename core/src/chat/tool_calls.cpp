// Tool calls in a model's reply (loom/chat/tool_calls.hpp).
#include "loom/chat/tool_calls.hpp"

#include <nlohmann/json.hpp>

namespace loom::tools {

namespace {

using json = nlohmann::json;

std::string trim(std::string_view s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string_view::npos) return {};
  const size_t b = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(a, b - a + 1));
}

// {"name": N, "arguments" | "parameters": {...} | "<json text>"} → a call; false when it is not one.
bool call_of(const json& j, ToolCall& out) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  out.name = j["name"].get<std::string>();
  const json* a = nullptr;
  for (const char* k : {"arguments", "parameters"})
    if (j.contains(k)) {
      a = &j[k];
      break;
    }
  if (!a || a->is_null()) {
    out.arguments = "{}";
  } else if (a->is_string()) { // already JSON text (some models quote it)
    const auto inner = json::parse(a->get<std::string>(), nullptr, false);
    out.arguments = inner.is_object() ? inner.dump() : json{{"value", a->get<std::string>()}}.dump();
  } else {
    out.arguments = a->is_object() ? a->dump() : json{{"value", *a}}.dump();
  }
  return true;
}

Parsed hermes(std::string_view text) {
  Parsed p;
  std::string rest;
  size_t at = 0;
  const std::string_view open = "<tool_call>", close = "</tool_call>";
  while (true) {
    const size_t a = text.find(open, at);
    if (a == std::string_view::npos) {
      rest += text.substr(at);
      break;
    }
    rest += text.substr(at, a - at);
    const size_t b = text.find(close, a + open.size());
    const std::string_view body =
        text.substr(a + open.size(), (b == std::string_view::npos ? text.size() : b) - a - open.size());
    ToolCall c;
    const auto j = json::parse(body, nullptr, false);
    if (!j.is_discarded() && call_of(j, c))
      p.calls.push_back(std::move(c));
    else // not a call after all: keep it as text
      rest += text.substr(a, (b == std::string_view::npos ? text.size() : b + close.size()) - a);
    if (b == std::string_view::npos) break;
    at = b + close.size();
  }
  p.content = trim(rest);
  return p;
}

Parsed llama3(std::string_view text) {
  Parsed p;
  std::string body = trim(text);
  const std::string tag = "<|python_tag|>";
  if (body.rfind(tag, 0) == 0) body = trim(body.substr(tag.size()));
  // one call, or several separated by ';'
  std::vector<std::string> parts;
  const auto whole = json::parse(body, nullptr, false);
  if (!whole.is_discarded()) {
    parts.push_back(body);
  } else {
    size_t s = 0;
    for (size_t i = 0; i <= body.size(); ++i)
      if (i == body.size() || body[i] == ';') {
        parts.push_back(trim(std::string_view(body).substr(s, i - s)));
        s = i + 1;
      }
  }
  for (const auto& part : parts) {
    ToolCall c;
    const auto j = json::parse(part, nullptr, false);
    if (j.is_discarded() || !call_of(j, c)) return Parsed{trim(text), {}};
    p.calls.push_back(std::move(c));
  }
  return p;
}

Parsed mistral(std::string_view text) {
  const std::string_view tag = "[TOOL_CALLS]";
  const size_t a = text.find(tag);
  if (a == std::string_view::npos) return Parsed{trim(text), {}};
  Parsed p;
  const auto j = json::parse(trim(text.substr(a + tag.size())), nullptr, false);
  if (j.is_array()) {
    for (const auto& e : j) {
      ToolCall c;
      if (call_of(e, c)) p.calls.push_back(std::move(c));
    }
  } else if (!j.is_discarded()) {
    ToolCall c;
    if (call_of(j, c)) p.calls.push_back(std::move(c));
  }
  if (p.calls.empty()) return Parsed{trim(text), {}};
  p.content = trim(text.substr(0, a));
  return p;
}

} // namespace

Format format_of_template(std::string_view src) {
  if (src == "chatml" || src.find("<tool_call>") != std::string_view::npos) return Format::hermes;
  if (src == "mistral" || src.find("[TOOL_CALLS]") != std::string_view::npos) return Format::mistral;
  if (src == "llama3" || src.find("<|python_tag|>") != std::string_view::npos ||
      src.find("ipython") != std::string_view::npos)
    return Format::llama3;
  return Format::none;
}

Streamable streamable(Format f, std::string_view text) {
  std::string_view marker;
  switch (f) {
  case Format::none:
    return {text.size(), false};
  case Format::hermes:
    marker = "<tool_call>";
    break;
  case Format::mistral:
    marker = "[TOOL_CALLS]";
    break;
  case Format::llama3: {
    marker = "<|python_tag|>";
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string_view::npos) return {0, false}; // nothing but whitespace yet: it may open a call
    if (text[first] == '{') return {0, true};               // a JSON call alone
    break;
  }
  }
  if (const size_t at = text.find(marker); at != std::string_view::npos) return {at, true};
  // Hold back the longest tail that is a proper prefix of the marker.
  for (size_t n = std::min(marker.size() - 1, text.size()); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return {text.size() - n, false};
  return {text.size(), false};
}

Parsed parse(Format f, std::string_view text) {
  switch (f) {
  case Format::hermes:
    return hermes(text);
  case Format::llama3:
    return llama3(text);
  case Format::mistral:
    return mistral(text);
  case Format::none:
    break;
  }
  return Parsed{trim(text), {}};
}

} // namespace loom::tools
