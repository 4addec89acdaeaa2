// `loom serve`: the HTTP side on Boost.Beast — a listener, and a thread per connection (at most
// max_connections; more get 503) that reads a request with limits on header and body size and on time
// (a slow client cannot hold a slot), checks the API key in constant time, and writes the reply or the
// stream of server-sent events. SIGINT / SIGTERM: stop accepting, let the requests in flight finish,
// return.
#include "serve.hpp"

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <csignal>
#include <cstdio>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

namespace loom::cli::serve {

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) {
  g_stop = true;
}

// Constant-time comparison of the bearer token (a mismatch at the first byte takes as long as at the last).
bool same_key(std::string_view a, std::string_view b) noexcept {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

void set_recv_timeout(int fd, std::chrono::seconds s) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(s.count());
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// Whether the peer closed the connection (or it broke): polled while its request runs.
bool peer_gone(int fd) {
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  if (p.revents & POLLIN) {
    char c;
    const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0; // (bytes waiting: a pipelined request, not a close)
  }
  return false;
}

void write_reply(tcp::socket& sock, unsigned version, bool keep_alive, const Reply& r,
                 beast::error_code& ec) {
  http::response<http::string_body> res{static_cast<http::status>(r.status), version};
  res.set(http::field::server, "loom");
  res.set(http::field::content_type, r.content_type);
  res.keep_alive(keep_alive);
  res.body() = r.body;
  res.prepare_payload();
  http::write(sock, res, ec);
}

// The socket for Beast's reads with a deadline: each read waits in poll() for what is left of it (asio's
// blocking reads retry past SO_RCVTIMEO), so a client that sends nothing, or a byte now and then, cannot
// hold its thread past the deadline.
struct TimedReader {
  tcp::socket& sock;
  std::chrono::steady_clock::time_point deadline;
  using executor_type = tcp::socket::executor_type;
  executor_type get_executor() { return sock.get_executor(); }
  template <class Buffers> size_t read_some(const Buffers& b, beast::error_code& ec) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
            .count();
    pollfd p{sock.native_handle(), POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) {
      ec = net::error::timed_out;
      return 0;
    }
    return sock.read_some(b, ec);
  }
  template <class Buffers> size_t read_some(const Buffers& b) {
    beast::error_code ec;
    const size_t n = read_some(b, ec);
    if (ec) throw beast::system_error(ec);
    return n;
  }
};

// After a refusal that leaves the request unread: our side closed for writing, what the client still sends
// read and dropped for a moment (so that it gets the reply rather than a reset), then the socket closed.
void linger_close(tcp::socket& sock) {
  beast::error_code ec;
  sock.shutdown(tcp::socket::shutdown_send, ec);
  set_recv_timeout(sock.native_handle(), std::chrono::seconds(1));
  char junk[16384];
  for (size_t total = 0; total < (size_t{64} << 20);) {
    const size_t n = sock.read_some(net::buffer(junk), ec);
    if (ec || n == 0) break;
    total += n;
  }
}

void session(tcp::socket sock, Services& ss, std::atomic<size_t>& live) {
  struct Done {
    std::atomic<size_t>& live;
    ~Done() { --live; }
  } done{live};
  const ServeOptions& o = ss.first().options();
  const int fd = sock.native_handle();
  beast::flat_buffer buf;
  bool first = true;
  for (;;) {
    if (!first) { // keep-alive: wait for the next request in slices, so that a drain need not wait for it
      bool ready = false;
      for (auto waited = std::chrono::milliseconds(0); waited < o.idle_timeout && !g_stop;
           waited += std::chrono::milliseconds(200)) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 200) > 0) {
          ready = true;
          break;
        }
      }
      if (!ready) break;
    }
    set_recv_timeout(fd, o.header_timeout);
    first = false;
    http::request_parser<http::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(o.max_header));
    parser.body_limit(o.max_body);
    beast::error_code ec;
    TimedReader rd{sock, std::chrono::steady_clock::now() + o.header_timeout};
    http::read_header(rd, buf, parser, ec);
    if (ec == http::error::end_of_stream || ec == net::error::eof) break;
    if (ec == http::error::body_limit) { // (a Content-Length over the limit fails with the header)
      write_reply(sock, 11, false,
                  error_reply(413, "the request body exceeds " + std::to_string(o.max_body) + " bytes"), ec);
      linger_close(sock);
      return;
    }
    if (ec == http::error::header_limit) {
      write_reply(sock, 11, false,
                  error_reply(431, "the request's header exceeds " + std::to_string(o.max_header) + " bytes"),
                  ec);
      break;
    }
    if (ec) break; // a timeout, a reset, a malformed request line: close
    rd.deadline = std::chrono::steady_clock::now() + o.header_timeout + std::chrono::seconds(30); // the body
    http::read(rd, buf, parser, ec);
    if (ec == http::error::body_limit) {
      write_reply(sock, parser.get().version(), false,
                  error_reply(413, "the request body exceeds " + std::to_string(o.max_body) + " bytes"), ec);
      linger_close(sock);
      return;
    }
    if (ec) {
      write_reply(sock, 11, false, error_reply(400, std::string("malformed request: ") + ec.message()), ec);
      break;
    }
    auto& req = parser.get();
    const bool keep_alive = req.keep_alive() && !g_stop;
    if (!o.api_key.empty() && std::string(req.target()) != "/health") {
      const auto auth = req[http::field::authorization];
      const std::string_view prefix = "Bearer ";
      const bool ok =
          auth.size() > prefix.size() && std::string_view(auth.data(), prefix.size()) == prefix &&
          same_key(std::string_view(auth.data() + prefix.size(), auth.size() - prefix.size()), o.api_key);
      if (!ok) {
        write_reply(sock, req.version(), keep_alive,
                    error_reply(401, "a valid API key is required (Authorization: Bearer KEY)",
                                "authentication_error"),
                    ec);
        if (ec || !keep_alive) break;
        continue;
      }
    }
    // Server-sent events: the header once, then a chunk per event.
    bool started = false;
    bool broken = false;
    const unsigned version = req.version();
    EventSink sink = [&](const std::string& data) {
      beast::error_code wec;
      if (!started) {
        http::response<http::empty_body> res{http::status::ok, version};
        res.set(http::field::server, "loom");
        res.set(http::field::content_type, "text/event-stream");
        res.set(http::field::cache_control, "no-cache");
        res.keep_alive(keep_alive);
        res.chunked(true);
        http::response_serializer<http::empty_body> sr{res};
        http::write_header(sock, sr, wec);
        started = true;
        if (wec) broken = true;
      }
      if (broken) return false;
      const std::string ev = "data: " + data + "\n\n";
      net::write(sock, http::make_chunk(net::buffer(ev)), wec);
      if (wec) broken = true;
      return !broken;
    };
    const ClientGone gone = [fd] { return peer_gone(fd); };
    bool wants_stream = false;
    const std::optional<Reply> reply = handle(ss, std::string(req.method_string()), std::string(req.target()),
                                              req.body(), &sink, gone, wants_stream);
    if (reply) {
      if (started) break; // (cannot happen: a handler that streamed returns nothing)
      write_reply(sock, version, keep_alive, *reply, ec);
      if (ec) break;
    } else {
      if (!started || broken) break; // the client went away before or while it was served
      net::write(sock, http::make_chunk_last(), ec);
      if (ec) break;
    }
    if (!keep_alive) break;
  }
  beast::error_code ec;
  sock.shutdown(tcp::socket::shutdown_send, ec);
}

} // namespace

int run_server(Services& ss) {
  const ServeOptions& o = ss.first().options();
  net::io_context io;
  beast::error_code ec;
  const auto addr = net::ip::make_address(o.host, ec);
  if (ec)
    throw Error(Errc::invalid_argument, "serve",
                "--host " + o.host + ": not an IP address (" + ec.message() + ")");
  tcp::acceptor acc(io);
  const tcp::endpoint ep(addr, o.port);
  acc.open(ep.protocol(), ec);
  if (!ec) acc.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acc.bind(ep, ec);
  if (!ec) acc.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw Error(Errc::invalid_argument, "serve",
                "cannot listen on " + o.host + ":" + std::to_string(o.port) + ": " + ec.message() +
                    " (another server there? try --port)");
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  for (const auto& sv : ss.all())
    std::fprintf(stderr, "loom serve: model '%s' = %s\n", sv->options().model_name.c_str(),
                 sv->pipeline().config().source.c_str());
  std::fprintf(stderr, "loom serve: listening on http://%s:%u (Ctrl-C or SIGTERM drains and stops)\n",
               o.host.c_str(), static_cast<unsigned>(acc.local_endpoint().port()));
  std::atomic<size_t> live{0};
  std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> sessions;
  const auto reap = [&](bool all) { // joins the finished sessions (all: every one, or detaches a stuck one)
    for (auto it = sessions.begin(); it != sessions.end();) {
      if (it->second->load() || all) {
        if (it->second->load())
          it->first.join();
        else
          it->first.detach(); // still busy after the drain's wait: left to the process' exit
        it = sessions.erase(it);
      } else {
        ++it;
      }
    }
  };
  const int afd = acc.native_handle();
  while (!g_stop) {
    pollfd p{afd, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue; // (wakes to see a signal)
    tcp::socket sock(io);
    acc.accept(sock, ec);
    if (ec) continue;
    if (live >= o.max_connections) { // a slot for nobody else: say so and close
      const Reply r = error_reply(503,
                                  "the server is at its connection limit (" +
                                      std::to_string(o.max_connections) + "): retry later",
                                  "server_error");
      beast::error_code wec;
      write_reply(sock, 11, false, r, wec);
      sock.shutdown(tcp::socket::shutdown_send, wec);
      continue;
    }
    ++live;
    // Joined, not detached: a finished session's thread is joined on the next turn, and the drain joins
    // them all before the io_context and the services they use are destroyed.
    auto finished = std::make_shared<std::atomic<bool>>(false);
    sessions.emplace_back(std::thread([s = std::move(sock), &ss, &live, finished]() mutable {
                            session(std::move(s), ss, live);
                            finished->store(true);
                          }),
                          finished);
    reap(false);
  }
  std::fprintf(stderr, "loom serve: draining (%zu connections, %zu requests in flight)\n", live.load(),
               ss.in_flight());
  acc.close(ec);
  // The connections finish their requests (the engine keeps stepping until none is left).
  for (int i = 0; i < 600 && live > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int i = 0; i < 50 && std::any_of(sessions.begin(), sessions.end(),
                                        [](const auto& e) { return !e.second->load(); });
       ++i) // a session past its last request is ending: its thread finishes in a moment
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  reap(true);
  ss.stop();
  std::fprintf(stderr, "loom serve: stopped\n");
  return 0;
}

} // namespace loom::cli::serve
