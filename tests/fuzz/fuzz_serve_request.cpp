// libFuzzer target: `loom serve`'s request path as the server runs it — HTTP bytes through Beast's parser
// with the server's limits, then the bounded body parser and the route's shape checks (and a dump of what
// passed, the recursive walk a handler may do). Input starting with an HTTP method is a whole request;
// anything else is a body for the route its first byte picks.
#include "../../core/cli/serve_request.hpp"

#include <cstdint>
#include <string>

namespace {

using namespace loom::cli::serve;

void check_body(Route r, std::string_view body, const RequestLimits& l) {
  try {
    const json j = parse_body(body, l);
    check_shape(r, j);
    (void)j.dump(-1, ' ', false, json::error_handler_t::replace);
  } catch (const BadRequest& e) {
    if (e.status < 400 || e.status > 599 || e.message.empty()) __builtin_trap();
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  RequestLimits l;
  l.max_body = size_t{1} << 20;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  if (in.rfind("POST ", 0) != 0 && in.rfind("GET ", 0) != 0) {
    if (size == 0) return 0;
    static constexpr Route routes[] = {Route::chat, Route::completions, Route::tokenize, Route::detokenize};
    check_body(routes[data[0] % 4], in.substr(1), l);
    return 0;
  }
  RequestParser p;
  limit(p, l);
  p.eager(true);
  boost::beast::error_code ec;
  size_t used = 0;
  while (!ec && !p.is_done() && used < size) {
    const size_t n = p.put(boost::asio::buffer(data + used, size - used), ec);
    if (n == 0) break;
    used += n;
  }
  if (!ec && !p.is_done()) p.put_eof(ec);
  if (ec || !p.is_done()) return 0;
  const auto& req = p.get();
  const Route r = route_of(std::string_view(req.target().data(), req.target().size()));
  if (is_post(r)) check_body(r, req.body(), l);
  return 0;
}
