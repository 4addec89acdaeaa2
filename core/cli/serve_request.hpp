// `loom serve`: a request as it arrives — the one parser every endpoint's body goes through (bounded in
// nesting and size before anything recursive copies, dumps or renders it), the route a target names,
// the shape checks of each route's body, and the 4xx error a client gets for what it got wrong.
// Pipeline-free, so the request fuzzer (tests/fuzz/fuzz_serve_request.cpp) runs it as the server does.
#pragma once

#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace loom::cli::serve {

using json = nlohmann::ordered_json; // key order kept: a JSON schema's properties, the replies' fields

// A request the client got wrong: a 4xx (503 when the server is full) with OpenAI's error body naming the
// field.
struct BadRequest {
  std::string message, param;
  unsigned status = 400;
  std::string type = "invalid_request_error";
};
[[noreturn]] void bad(const std::string& param, const std::string& message, unsigned status = 400);

// What a request may be: header and body bytes, and its body's JSON nesting and number of values.
struct RequestLimits {
  size_t max_header = size_t{16} << 10;
  size_t max_body = size_t{8} << 20;
  int max_depth = 64;
  size_t max_values = size_t{1} << 20;
};

// The parser a connection reads a request with: Beast's, with the header and body limits.
using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;
void limit(RequestParser& p, const RequestLimits& l);

// The body as JSON: parsed iteratively with the nesting and value count checked while it is read, so a
// body nested 100 000 deep is a 400, never a stack overflow later. Throws BadRequest.
json parse_body(std::string_view body, const RequestLimits& l);

enum class Route { health, models, metrics, completions, chat, tokenize, detokenize, none };
Route route_of(std::string_view target); // the path without its query
bool is_post(Route r) noexcept;          // the routes that take a JSON body

// The shapes every handler of `r` relies on: an object; `model` a string; `messages` an array of objects
// with a string role and string / null / array-of-parts content; `tools` an array of objects;
// `response_format` an object; `prompt` / `tokens` of their types. Throws BadRequest naming the field.
void check_shape(Route r, const json& body);

} // namespace loom::cli::serve
