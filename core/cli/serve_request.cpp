// `loom serve`: the bounded request parser and the routes' shape checks (serve_request.hpp).
#include "serve_request.hpp"

#include "loom/chat/chat.hpp"

#include <algorithm>

namespace loom::cli::serve {

void bad(const std::string& param, const std::string& message, unsigned status) {
  throw BadRequest{message, param, status, status == 503 ? "server_error" : "invalid_request_error"};
}

void limit(RequestParser& p, const RequestLimits& l) {
  p.header_limit(static_cast<std::uint32_t>(std::min<size_t>(l.max_header, UINT32_MAX)));
  p.body_limit(l.max_body);
}

json parse_body(std::string_view body, const RequestLimits& l) {
  if (body.size() > l.max_body)
    bad("",
        "the request body is " + std::to_string(body.size()) + " bytes; this server takes at most " +
            std::to_string(l.max_body),
        413);
  size_t values = 0;
  bool too_deep = false, too_many = false;
  // nlohmann's parser is iterative; the callback sees each value with its depth before it is kept.
  const json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json&) {
    if (depth > l.max_depth) too_deep = true;
    if (ev == json::parse_event_t::value || ev == json::parse_event_t::object_start ||
        ev == json::parse_event_t::array_start)
      too_many = too_many || ++values > l.max_values;
    if (too_deep || too_many) throw BadRequest{}; // (stops the parse; the message is made below)
    return true;
  };
  try {
    json j = json::parse(body, cb);
    if (!j.is_object()) bad("", "the body must be a JSON object");
    return j;
  } catch (const BadRequest& e) {
    if (too_deep)
      bad("", "the body nests deeper than " + std::to_string(l.max_depth) + " levels: flatten it");
    if (too_many)
      bad("", "the body holds more than " + std::to_string(l.max_values) + " JSON values: send less");
    throw;
  } catch (const json::exception& e) {
    bad("", std::string("the body is not JSON: ") + e.what());
  }
}

Route route_of(std::string_view target) {
  const std::string_view path = target.substr(0, target.find('?'));
  if (path == "/health") return Route::health;
  if (path == "/v1/models") return Route::models;
  if (path == "/metrics") return Route::metrics;
  if (path == "/v1/completions") return Route::completions;
  if (path == "/v1/chat/completions") return Route::chat;
  if (path == "/tokenize") return Route::tokenize;
  if (path == "/detokenize") return Route::detokenize;
  return Route::none;
}

bool is_post(Route r) noexcept {
  return r == Route::completions || r == Route::chat || r == Route::tokenize || r == Route::detokenize;
}

namespace {

void check_messages(const json& m) {
  if (const auto problem = chat::messages_problem(nlohmann::ordered_json(m))) bad("messages", *problem);
}

} // namespace

void check_shape(Route r, const json& j) {
  if (!j.is_object()) bad("", "the body must be a JSON object");
  if (const auto m = j.find("model"); m != j.end() && !m->is_null() && !m->is_string())
    bad("model", "'model' must be a string");
  const auto has = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  if (r == Route::chat || (r == Route::tokenize && has("messages"))) {
    if (!j.contains("messages")) bad("messages", "'messages' is required");
    check_messages(j["messages"]);
  }
  if (has("tools")) {
    if (!j["tools"].is_array())
      bad("tools", "'tools' must be an array of {type: \"function\", function: {...}}");
    for (const auto& t : j["tools"])
      if (!t.is_object()) bad("tools", "each tool must be {\"type\": \"function\", \"function\": {...}}");
  }
  if (has("response_format") && !j["response_format"].is_object())
    bad("response_format",
        "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}");
  if (r == Route::completions && !j.contains("prompt")) bad("prompt", "'prompt' is required");
  if (r == Route::tokenize && !has("messages") && !(j.contains("prompt") && j["prompt"].is_string()))
    bad("prompt", "'prompt' must be a string (or give 'messages')");
  if (r == Route::detokenize) {
    const auto t = j.find("tokens");
    if (t == j.end() || !t->is_array() ||
        !std::all_of(t->begin(), t->end(), [](const json& e) { return e.is_number_integer(); }))
      bad("tokens", "'tokens' must be an array of token ids");
  }
}

} // namespace loom::cli::serve
