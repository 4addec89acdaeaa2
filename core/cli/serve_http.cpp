// `loom serve`: the HTTP side on Boost.Beast's asynchronous model — an acceptor and a fixed pool of I/O
// threads; each connection a Connection on a strand whose every read and write has a deadline
// (beast::tcp_stream::expires_after), so no client can hold a thread or a slot by sending or reading
// slowly. A request that runs on the engine is handled on a worker thread, which never touches the
// socket: it hands events and the reply to its connection, and learns from a flag that its client is gone.
// SIGINT / SIGTERM: stop accepting, close idle connections, give requests in flight --drain-timeout,
// then close everything.
#include "serve.hpp"

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <csignal>
#include <cstdio>
#include <deque>
#include <list>
#include <sstream>
#include <sys/socket.h>
#include <vector>

namespace loom::cli::serve {

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// Constant-time comparison of the bearer token (a mismatch at the first byte takes as long as at the last).
bool same_key(std::string_view a, std::string_view b) noexcept {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// A reply as the bytes on the wire.
std::shared_ptr<const std::string> wire(unsigned version, bool keep_alive, const Reply& r) {
  http::response<http::string_body> res{static_cast<http::status>(r.status), version};
  res.set(http::field::server, "loom");
  res.set(http::field::content_type, r.content_type);
  res.keep_alive(keep_alive);
  res.body() = r.body;
  res.prepare_payload();
  std::ostringstream os;
  os << res;
  return std::make_shared<const std::string>(std::move(os).str());
}

// The threads requests run on while the engine serves them: a pool that grows to what the traffic needs
// and keeps its threads (a thread per request would leave the allocator a new arena to grow each time).
class Workers {
public:
  ~Workers() {
    for (auto& t : threads_)
      if (t.joinable()) t.detach(); // (stuck past the drain: left to the process's exit)
  }
  void spawn(std::function<void()> fn) {
    std::lock_guard lk(mu_);
    tasks_.push_back(std::move(fn));
    ++running_;
    if (tasks_.size() <= idle_) // an idle thread for each waiting task
      cv_.notify_one();
    else
      threads_.emplace_back([this] { serve(); });
  }
  size_t running() {
    std::lock_guard lk(mu_);
    return running_;
  }
  // Waits until every task ended or `until`, then ends the idle threads (joined) and leaves the rest.
  void join_all(Clock::time_point until) {
    std::unique_lock lk(mu_);
    done_cv_.wait_until(lk, until, [&] { return running_ == 0; });
    stop_ = true;
    cv_.notify_all();
    const bool all = running_ == 0;
    lk.unlock();
    for (auto& t : threads_)
      if (all)
        t.join();
      else
        t.detach();
    threads_.clear();
  }

private:
  void serve() {
    std::unique_lock lk(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
      --idle_;
      if (tasks_.empty()) return; // stopped
      std::function<void()> fn = std::move(tasks_.front());
      tasks_.pop_front();
      lk.unlock();
      fn();
      fn = nullptr; // (what it holds, a connection, goes before the count does)
      lk.lock();
      --running_;
      done_cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  size_t running_ = 0, idle_ = 0;
  bool stop_ = false;
};

class Connection;

// (Declared so that what connections touch in their destructors outlives the io_context, which destroys the
// handlers still queued — and the connections they hold — last.)
struct Server {
  Server(Services& s, const ServeOptions& opts) : ss(s), o(opts) {}
  Services& ss;
  const ServeOptions& o;
  std::atomic<size_t> live{0}; // counted connections: connections being served, lingering closes included
  std::atomic<bool> draining{false};
  std::mutex mu;
  std::list<std::weak_ptr<Connection>> connections;
  Workers workers;
  net::io_context ioc;
  tcp::acceptor acc{net::make_strand(ioc)};
  void accept();
  // SIGTERM: stop accepting, close idle connections, wait drain_timeout for the rest, then close them all.
  void drain();
  void add(const std::shared_ptr<Connection>& s);
  void each(const std::function<void(Connection&)>& f);
};

// One connection: read a request (header, then body, each with its deadline), answer it, and again while
// the client keeps it alive. Everything runs on the connection's strand but the worker's handle().
class Connection : public std::enable_shared_from_this<Connection> {
public:
  Connection(tcp::socket&& s, Server& srv, bool counted)
      : stream_(std::move(s)), ex_(stream_.get_executor()), srv_(srv), counted_(counted) {
    if (counted_) ++srv_.live;
  }
  ~Connection() {
    if (counted_) --srv_.live;
  }
  void start() {
    net::dispatch(ex_, [self = shared_from_this()] {
      if (self->counted_) {
        self->read_request();
        return;
      }
      self->refuse(error_reply(503,
                               "the server is at its connection limit (" +
                                   std::to_string(self->srv_.o.max_connections) + "): retry later",
                               "server_error"));
    });
  }
  // The drain: a connection with no request running is closed now; all of them at the drain's end.
  void drain(bool all) {
    net::post(ex_, [self = shared_from_this(), all] {
      if (all || !self->handling_) self->close();
    });
  }

private:
  void read_request() {
    if (closed_) return;
    if (srv_.draining) return close();
    parser_.emplace();
    RequestLimits l;
    l.max_header = srv_.o.max_header;
    l.max_body = srv_.o.max_body;
    limit(*parser_, l);
    stream_.expires_after(first_ ? srv_.o.header_timeout : srv_.o.idle_timeout);
    http::async_read_header(
        stream_, buf_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    first_ = false;
    if (ec == http::error::body_limit) // a Content-Length over the limit fails with the header
      return refuse(
          error_reply(413, "the request body exceeds " + std::to_string(srv_.o.max_body) + " bytes"));
    if (ec == http::error::header_limit)
      return refuse(
          error_reply(431, "the request's header exceeds " + std::to_string(srv_.o.max_header) + " bytes"));
    if (ec) return close(); // a timeout, the end of the stream, a reset, a malformed request line
    stream_.expires_after(srv_.o.body_timeout);
    http::async_read(stream_, buf_, *parser_,
                     [self = shared_from_this()](beast::error_code ec2, size_t) { self->on_body(ec2); });
  }

  void on_body(beast::error_code ec) {
    if (ec == http::error::body_limit)
      return refuse(
          error_reply(413, "the request body exceeds " + std::to_string(srv_.o.max_body) + " bytes"));
    if (ec == beast::error::timeout || ec == net::error::eof || ec == http::error::end_of_stream ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted)
      return close();
    if (ec) return refuse(error_reply(400, std::string("malformed request: ") + ec.message()));
    stream_.expires_never();
    auto req = parser_->release();
    version_ = req.version();
    keep_alive_ = req.keep_alive() && !srv_.draining;
    const std::string target(req.target());
    if (!srv_.o.api_key.empty() && route_of(target) != Route::health) {
      const std::string_view auth(req[http::field::authorization].data(),
                                  req[http::field::authorization].size());
      const std::string_view prefix = "Bearer ";
      if (!(auth.size() > prefix.size() && auth.substr(0, prefix.size()) == prefix &&
            same_key(auth.substr(prefix.size()), srv_.o.api_key))) {
        handling_ = true;
        return finish(error_reply(401, "a valid API key is required (Authorization: Bearer KEY)",
                                  "authentication_error"));
      }
    }
    handling_ = true;
    const std::string method(req.method_string());
    if (!is_post(route_of(target))) { // /health, /metrics, /v1/models, 404s and 405s: quick, answered here
      bool streams = false;
      return finish(handle(
          srv_.ss, method, target, std::string(), nullptr, [] { return false; }, streams));
    }
    gone_ = std::make_shared<std::atomic<bool>>(false);
    watch();
    srv_.workers.spawn([self = shared_from_this(), gone = gone_, method, target,
                        body = std::move(req.body())]() mutable { self->work(method, target, body, gone); });
  }

  // On the worker: the handler, its events posted to the connection as they come, then its reply.
  void work(const std::string& method, const std::string& target, const std::string& body,
            const std::shared_ptr<std::atomic<bool>>& gone) {
    const EventSink sink = [this, gone](const std::string& data) {
      if (gone->load()) return false;
      net::post(ex_, [self = shared_from_this(), ev = "data: " + data + "\n\n"] { self->event(ev); });
      return true;
    };
    bool streams = false;
    std::optional<Reply> r = handle(
        srv_.ss, method, target, body, &sink, [gone] { return gone->load(); }, streams);
    net::post(ex_, [self = shared_from_this(), r = std::move(r)] { self->finish(r); });
  }

  // While a request runs: the socket readable means the client closed it (or pipelined the next request).
  void watch() {
    watching_ = true;
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      self->watching_ = false;
      if (ec == net::error::operation_aborted) {
        if (self->read_after_watch_) {
          self->read_after_watch_ = false;
          self->read_request();
        }
        return;
      }
      char c;
      const ssize_t n =
          ec ? -1 : ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)))
        self->close(); // closed or broken: the worker sees `gone` and cancels its request
    });
  }

  void event(const std::string& ev) {
    if (closed_) return;
    if (!sse_started_) {
      sse_started_ = true;
      send(std::make_shared<const std::string>(
          std::string("HTTP/1.1 200 OK\r\nServer: loom\r\nContent-Type: text/event-stream\r\n"
                      "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: ") +
          (keep_alive_ ? "keep-alive" : "close") + "\r\n\r\n"));
    }
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", ev.size());
    send(std::make_shared<const std::string>(size + ev + "\r\n"));
  }

  // The request is answered: its reply (nullopt: it streamed, or its client went away).
  void finish(const std::optional<Reply>& r) {
    handled_ = true;
    if (closed_) return;
    if (r && !sse_started_)
      send(wire(version_, keep_alive_ && !srv_.draining, *r));
    else if (sse_started_)
      send(std::make_shared<const std::string>("0\r\n\r\n"));
    else
      return close();
    if (!writing_) next();
  }

  // After a reply: the next request of a kept-alive connection, or the end.
  void next() {
    handling_ = handled_ = sse_started_ = false;
    gone_.reset();
    if (!keep_alive_ || srv_.draining) return close();
    if (watching_) { // the watch holds the socket's read side: cancelled, it starts the next read
      read_after_watch_ = true;
      beast::error_code ec;
      stream_.socket().cancel(ec);
      return;
    }
    read_request();
  }

  void send(std::shared_ptr<const std::string> bytes) {
    out_bytes_ += bytes->size();
    out_.push_back(std::move(bytes));
    if (out_bytes_ > (size_t{64} << 20)) return close(); // a client that does not keep up with its stream
    if (!writing_) write_next();
  }

  void write_next() {
    writing_ = true;
    stream_.expires_after(srv_.o.write_timeout);
    net::async_write(stream_, net::buffer(*out_.front()),
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    if (closed_) return;
    if (ec) return close(); // not taken within write_timeout, or the client is gone
    out_bytes_ -= out_.front()->size();
    out_.pop_front();
    if (!out_.empty()) return write_next();
    stream_.expires_never();
    if (refused_) return linger();
    if (handled_) next();
  }

  // A refusal that leaves the request unread: the reply, our side closed for writing, then what the client
  // still sends read and dropped for at most a second and 1 MiB (so it gets the reply rather than a reset).
  void refuse(const Reply& r) {
    refused_ = true;
    keep_alive_ = false;
    send(wire(11, false, r));
  }
  void linger() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(1));
    junk_.resize(16384);
    stream_.async_read_some(net::buffer(junk_), [self = shared_from_this()](beast::error_code e, size_t n) {
      self->lingered_ += n;
      if (e || n == 0 || self->lingered_ > (size_t{1} << 20)) return self->close();
      self->linger_more();
    });
  }
  void linger_more() {
    stream_.async_read_some(net::buffer(junk_), [self = shared_from_this()](beast::error_code e, size_t n) {
      self->lingered_ += n;
      if (e || n == 0 || self->lingered_ > (size_t{1} << 20)) return self->close();
      self->linger_more();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    if (gone_) gone_->store(true);
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    out_.clear();
  }

  beast::tcp_stream stream_;
  const beast::tcp_stream::executor_type ex_; // the strand: what other threads post to
  Server& srv_;
  const bool counted_;
  beast::flat_buffer buf_;
  std::optional<RequestParser> parser_;
  unsigned version_ = 11;
  bool first_ = true, keep_alive_ = false, closed_ = false, refused_ = false;
  bool handling_ = false, handled_ = false, sse_started_ = false;
  bool watching_ = false, read_after_watch_ = false, writing_ = false;
  std::shared_ptr<std::atomic<bool>> gone_; // set when the client is gone; read by the worker
  std::deque<std::shared_ptr<const std::string>> out_;
  size_t out_bytes_ = 0, lingered_ = 0;
  std::string junk_;
};

void Server::add(const std::shared_ptr<Connection>& s) {
  std::lock_guard lk(mu);
  connections.remove_if([](const std::weak_ptr<Connection>& w) { return w.expired(); });
  connections.push_back(s);
}

void Server::each(const std::function<void(Connection&)>& f) {
  std::vector<std::shared_ptr<Connection>> all;
  {
    std::lock_guard lk(mu);
    for (const auto& w : connections)
      if (auto s = w.lock()) all.push_back(std::move(s));
  }
  for (const auto& s : all)
    f(*s);
}

void Server::drain() {
  draining = true;
  net::post(acc.get_executor(), [this] {
    beast::error_code e;
    acc.close(e);
  });
  each([](Connection& s) { s.drain(false); });
  const auto idle = [&] { return live.load() == 0 && workers.running() == 0; };
  const auto deadline = Clock::now() + o.drain_timeout;
  while (!idle() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!idle()) { // stuck connections cannot extend the drain: closed, their requests cancelled
    std::fprintf(stderr, "loom serve: the drain's time is up: closing %zu connections\n", live.load());
    each([](Connection& s) { s.drain(true); });
  }
  workers.join_all(Clock::now() + std::chrono::seconds(5)); // (cancelled requests end in a step)
}

void Server::accept() {
  acc.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket sock) {
    if (ec == net::error::operation_aborted || !acc.is_open()) return;
    if (!ec) {
      const bool room = live.load() < o.max_connections; // a slot for nobody else: 503 and close
      auto s = std::make_shared<Connection>(std::move(sock), *this, room);
      if (room) add(s);
      s->start();
    }
    accept();
  });
}

} // namespace

int run_server(Services& ss) {
  const ServeOptions& o = ss.first().options();
  Server srv(ss, o);
  beast::error_code ec;
  const auto addr = net::ip::make_address(o.host, ec);
  if (ec)
    throw Error(Errc::invalid_argument, "serve",
                "--host " + o.host + ": not an IP address (" + ec.message() + ")");
  const tcp::endpoint ep(addr, o.port);
  srv.acc.open(ep.protocol(), ec);
  if (!ec) srv.acc.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) srv.acc.bind(ep, ec);
  if (!ec) srv.acc.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw Error(Errc::invalid_argument, "serve",
                "cannot listen on " + o.host + ":" + std::to_string(o.port) + ": " + ec.message() +
                    " (another server there? try --port)");
  std::signal(SIGPIPE, SIG_IGN);
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  net::signal_set signals(srv.ioc, SIGINT, SIGTERM);
  signals.async_wait([&](beast::error_code e, int) {
    if (e) return;
    std::lock_guard lk(mu);
    stop = true;
    cv.notify_all();
  });
  for (const auto& sv : ss.all())
    std::fprintf(stderr, "loom serve: model '%s' = %s\n", sv->options().model_name.c_str(),
                 sv->pipeline().config().source.c_str());
  std::fprintf(stderr, "loom serve: listening on http://%s:%u (Ctrl-C or SIGTERM drains and stops)\n",
               o.host.c_str(), static_cast<unsigned>(srv.acc.local_endpoint().port()));
  srv.accept();
  auto guard = net::make_work_guard(srv.ioc);
  std::vector<std::thread> io;
  for (int i = 0; i < std::max(1, o.http_threads); ++i)
    io.emplace_back([&srv] { srv.ioc.run(); });
  {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return stop; });
  }
  std::fprintf(stderr, "loom serve: draining (%zu connections, %zu requests in flight; at most %lld s)\n",
               srv.live.load(), ss.in_flight(), static_cast<long long>(o.drain_timeout.count()));
  srv.drain();
  guard.reset();
  srv.ioc.stop();
  for (auto& t : io)
    t.join();
  ss.stop();
  std::fprintf(stderr, "loom serve: stopped\n");
  return 0;
}

} // namespace loom::cli::serve
