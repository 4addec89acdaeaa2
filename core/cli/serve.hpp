// `loom serve`: an OpenAI-compatible HTTP server on the batching engine (serve_http.cpp: the HTTP side,
// serve_request.cpp: the bounded request parser, serve_ask.cpp: a request's body → what it asks of the
// engine, serve_openai.cpp: the endpoints and their responses, serve_service.cpp: the step loop and the A/B
// splits, serve_metrics.cpp: the Prometheus metrics).
//
// One engine step loop per model (Service: a thread that steps while there is work). The HTTP side is
// asynchronous on a fixed pool of I/O threads: a connection holds no thread while it is read, written or
// idle, and every read and write has a deadline, so a client that stops sending or stops reading loses
// its connection. A request that runs on the engine is handled on a worker thread of its own, which only
// waits for its engine request and hands the reply (or each event of a stream) to its connection; a
// client that goes away — closed, timed out, not reading — cancels it, and its KV is freed in the next
// step.
#pragma once

#include "loom/chat/chat.hpp"
#include "loom/chat/tool_calls.hpp"
#include "loom/pipeline/pipeline.hpp"
#include "serve_request.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace loom::cli::serve {

struct ServeOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;
  std::string api_key;                     // empty: no authentication
  size_t max_body = size_t{8} << 20;       // request body bytes
  size_t max_header = size_t{16} << 10;    // request header bytes
  size_t max_connections = 256;            // served at once; more get 503
  size_t max_queue = 512;                  // requests waiting in the engine; more get 503
  int64_t max_n_tokens = int64_t{1} << 20; // n × max_tokens of one request
  std::chrono::seconds header_timeout{10}; // a client must send its request's header within this
  std::chrono::seconds body_timeout{40};   // ... and its body within this
  std::chrono::seconds idle_timeout{60};   // keep-alive: the next request within this
  std::chrono::seconds write_timeout{30};  // a reply, or one event of a stream, must be taken within this
  std::chrono::seconds drain_timeout{30};  // SIGTERM: requests in flight may finish within this
  int http_threads = 2;                    // the I/O threads
  std::string model_name;                  // the `model` this server answers to
  std::string chat_template;               // a built-in template or a Jinja file; empty: the model's
};

// What a waiting HTTP thread learns of its engine request.
struct Job {
  std::mutex mu;
  std::condition_variable cv;
  std::string text; // streamed text not yet taken
  bool done = false;
  GenerationResult result;
  RequestId id = 0;
};

// Latency histograms and counters in Prometheus' text format, under vLLM's names and `loom:`.
class Metrics {
public:
  void finished(const GenerationResult& r, bool ok);
  void http_error() noexcept { ++http_errors_; }
  struct Histogram {
    std::vector<double> bounds;
    std::vector<uint64_t> counts; // per bound, then +Inf
    double sum = 0;
    uint64_t n = 0;
    void add(double v);
  };
  struct Values {
    uint64_t prompt_tokens = 0, generation_tokens = 0, success = 0, failed = 0, cancelled = 0,
             http_errors = 0;
    Histogram ttft{
        {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}, {}, 0, 0};
    Histogram tpot{{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5}, {}, 0, 0};
    Histogram e2e{{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60}, {}, 0, 0};
    Histogram queue{{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60}, {}, 0, 0};
    Histogram prefill{
        {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}, {}, 0, 0};
  };
  Values values() const;

private:
  mutable std::mutex mu_;
  Values v_;
  std::atomic<uint64_t> http_errors_{0};
};

// One model's engine and its step loop.
class Service {
public:
  // Loads the pipeline on the service's own thread, the one that then steps its engine: the backend's
  // load-time parallel work (repacking) and its forwards share one OpenMP team. (A second team, the main
  // thread's, doubles the threads libgomp manages past the cores, and it then stops spinning between
  // regions: every op of a decode step waited for a woken thread, 5× slower on 2 cores.) Load errors are
  // rethrown here.
  Service(const PipelineConfig& cfg, ServeOptions o);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  Pipeline& pipeline() noexcept { return *p_; }
  const ServeOptions& options() const noexcept { return o_; }
  const chat::Template* chat_template() const noexcept { return tmpl_ ? &*tmpl_ : nullptr; }
  // How the chat template writes tool calls (what replies are parsed for when a request gives tools).
  tools::Format tool_format() const noexcept { return tool_format_; }
  Metrics& metrics() noexcept { return metrics_; }

  // Submits a request; its text and result reach `job` (on the stepping thread). Throws loom::Error for a
  // request the engine refuses.
  RequestId submit(EngineRequest req, const std::shared_ptr<Job>& job);
  void cancel(RequestId id) { p_->engine().cancel(id); }
  size_t in_flight() const noexcept { return in_flight_.load(); }
  // Gauges as of the last step.
  struct Snapshot {
    size_t running = 0, waiting = 0, preemptions = 0;
    double kv_usage = 0;
  };
  Snapshot snapshot() const;
  // Stops taking requests' steps once none is left (drain), then ends the loop.
  void stop();

private:
  void loop();
  void choose_chat_template();
  std::unique_ptr<Pipeline> p_;
  ServeOptions o_;
  std::optional<chat::Template> tmpl_;
  tools::Format tool_format_ = tools::Format::none;
  Metrics metrics_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> in_flight_{0};
  mutable std::mutex snap_mu_;
  Snapshot snap_;
};

// An A/B split ([serve] ab): requests for its name go to one of its variants (served pipelines) by weight;
// a request that names its `user` always to the same one. Counts what it chose (loom:ab_requests_total).
class Split {
public:
  Split(std::string name, std::vector<std::pair<Service*, double>> variants);
  const std::string& name() const noexcept { return name_; }
  Service& pick(const std::string& user); // thread-safe
  struct Variant {
    Service* service;
    double weight; // normalized: the weights sum to 1
    uint64_t chosen;
  };
  std::vector<Variant> variants() const;

private:
  std::string name_;
  mutable std::mutex mu_;
  std::vector<Variant> v_;
  std::mt19937_64 rng_;
};

// The pipelines a server serves, each under its model name (the first is the default), and its splits.
class Services {
public:
  void add_split(std::unique_ptr<Split> s) { splits_.push_back(std::move(s)); }
  Split* find_split(const std::string& name) noexcept {
    for (auto& s : splits_)
      if (s->name() == name) return s.get();
    return nullptr;
  }
  const std::vector<std::unique_ptr<Split>>& splits() const noexcept { return splits_; }
  void add(std::unique_ptr<Service> s) { all_.push_back(std::move(s)); }
  Service* find(const std::string& name) noexcept {
    for (auto& s : all_)
      if (s->options().model_name == name) return s.get();
    return nullptr;
  }
  Service& first() noexcept { return *all_.front(); }
  const std::vector<std::unique_ptr<Service>>& all() const noexcept { return all_; }
  size_t in_flight() const noexcept {
    size_t n = 0;
    for (const auto& s : all_)
      n += s->in_flight();
    return n;
  }
  void stop() {
    for (auto& s : all_)
      s->stop();
  }

private:
  std::vector<std::unique_ptr<Service>> all_;
  std::vector<std::unique_ptr<Split>> splits_;
};

// Prometheus text of every service's metrics, each sample labelled with its model name.
std::string render_metrics(const Services& ss);

// An HTTP response: status, JSON or text body, content type.
struct Reply {
  unsigned status = 200;
  std::string body;
  std::string content_type = "application/json";
};

// OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
Reply error_reply(unsigned status, const std::string& message,
                  const std::string& type = "invalid_request_error", const std::string& param = "");

// A streaming writer: writes one SSE event (`data: ...\n\n`); false when the client is gone.
using EventSink = std::function<bool(const std::string& data)>;
// Whether the client closed its side (polled while a request runs).
using ClientGone = std::function<bool()>;

// The endpoints. `stream` is non-null when the handler may stream (it then returns nullopt after writing
// every event itself).
std::optional<Reply> handle(Services& ss, const std::string& method, const std::string& target,
                            const std::string& body, const EventSink* stream, const ClientGone& gone,
                            bool& wants_stream);

// Runs the HTTP server until SIGINT / SIGTERM, then drains: stops accepting, closes idle connections,
// lets the requests in flight finish for at most drain_timeout, then closes every connection (their
// requests are cancelled) and returns 0.
int run_server(Services& ss);

} // namespace loom::cli::serve
