// `loom serve`: an OpenAI-compatible HTTP server for one pipeline (serve.hpp).
#include "cli.hpp"
#include "loom/error.hpp"
#include "loom/pipeline/pipeline_config.hpp"
#include "serve.hpp"

#include <cstdio>
#include <filesystem>

namespace loom::cli {

namespace {

// The -c files read: the pipelines to serve (each with the file it came from, "" for the command line's)
// and the A/B splits ([serve] ab): a name and the pipelines it sends requests to; they load no model.
struct ServedConfigs {
  std::vector<PipelineConfig> cfgs;
  std::vector<std::string> files;
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, double>>>> splits;
};

// The command line's model, context, plugin paths and --parallel, over a pipeline file's.
void apply_pipeline_flags(const po::variables_map& vm, PipelineConfig& cfg) {
  if (vm.count("model")) cfg.model.path = vm["model"].as<std::string>();
  if (vm.count("ctx-size")) {
    const int n = vm["ctx-size"].as<int>();
    if (n <= 0) throw UsageError("--ctx-size must be > 0, got " + std::to_string(n));
    cfg.model.n_ctx = n;
  }
  if (vm.count("plugin-path"))
    for (const auto& d : vm["plugin-path"].as<std::vector<std::string>>())
      cfg.plugins.paths.push_back(d);
  if (vm.count("parallel")) {
    const int n = vm["parallel"].as<int>();
    if (n < 1) throw UsageError("--parallel must be ≥ 1, got " + std::to_string(n));
    cfg.scheduler.max_sequences = n;
  }
}

// Each pipeline's config: its file with the --set overrides, then the command line's model and context.
ServedConfigs served_configs(const po::variables_map& vm) {
  // Serving's default store: paged, with its prefix cache (a repeated system prompt or conversation is
  // evaluated once, as in vLLM and llama-server) — where the file says nothing else.
  std::vector<ConfigOverride> overrides{{"kv_cache.store", "\"paged\"", true}};
  if (vm.count("set"))
    for (const auto& x : vm["set"].as<std::vector<std::string>>())
      overrides.push_back(parse_override(x));
  std::vector<std::string> files;
  if (vm.count("config")) files = vm["config"].as<std::vector<std::string>>();
  if (files.empty()) files.push_back("");
  ServedConfigs sc;
  for (const auto& f : files) {
    PipelineConfig cfg;
    if (!f.empty()) {
      cfg = load_pipeline(f, overrides);
    } else {
      cfg.source = "<command line>";
      cfg.kv_cache.store = "paged";
      cfg = apply_overrides(cfg, overrides);
    }
    if (!cfg.serve.ab.empty()) {
      if (!cfg.model.path.empty())
        throw UsageError(f +
                         ": [serve] ab makes this file an A/B split between other pipelines (-c files); it "
                         "loads no model of its own: remove [model] path");
      sc.splits.emplace_back(
          cfg.serve.name.empty() ? std::filesystem::path(f).stem().string() : cfg.serve.name, cfg.serve.ab);
      continue;
    }
    sc.files.push_back(f);
    apply_pipeline_flags(vm, cfg);
    sc.cfgs.push_back(std::move(cfg));
  }
  if (sc.cfgs.empty())
    throw UsageError("every -c file is an A/B split ([serve] ab): give the pipelines they split between");
  if (vm.count("name") && sc.cfgs.size() > 1)
    throw UsageError("--name names the one pipeline; with several -c, each is served under its file's stem");
  return sc;
}

// The server's address, key, limits and timeouts, checked.
serve::ServeOptions server_options(const po::variables_map& vm) {
  serve::ServeOptions o;
  o.host = vm["host"].as<std::string>();
  const int port = vm["port"].as<int>();
  if (port < 0 || port > 65535) throw UsageError("--port must be 0..65535, got " + std::to_string(port));
  o.port = static_cast<uint16_t>(port);
  if (vm.count("api-key"))
    o.api_key = vm["api-key"].as<std::string>();
  else if (const char* k = std::getenv("LOOM_API_KEY"))
    o.api_key = k;
  const auto positive = [&](const char* name) {
    const long v = vm[name].as<long>();
    if (v < 1) throw UsageError(std::string("--") + name + " must be ≥ 1, got " + std::to_string(v));
    return static_cast<size_t>(v);
  };
  o.max_body = positive("max-body");
  o.max_connections = positive("max-connections");
  o.max_queue = positive("max-queue");
  const auto seconds = [&](const char* name, int lo) {
    const int v = vm[name].as<int>();
    if (v < lo)
      throw UsageError(std::string("--") + name + " must be ≥ " + std::to_string(lo) + " second" +
                       (lo == 1 ? "" : "s") + ", got " + std::to_string(v));
    return std::chrono::seconds(v);
  };
  o.header_timeout = seconds("timeout", 1);
  o.body_timeout = o.header_timeout + std::chrono::seconds(30);
  o.idle_timeout = seconds("idle-timeout", 1);
  o.write_timeout = seconds("write-timeout", 1);
  o.drain_timeout = seconds("drain-timeout", 0);
  const int threads = vm["http-threads"].as<int>();
  if (threads < 1 || threads > 64)
    throw UsageError("--http-threads must be in 1..64, got " + std::to_string(threads));
  o.http_threads = threads;
  if (vm.count("template")) o.chat_template = vm["template"].as<std::string>();
  return o;
}

// One Service per pipeline, under --name, its [serve] name, its file's stem or its model's.
void add_services(const po::variables_map& vm, const ServedConfigs& sc, const serve::ServeOptions& o,
                  serve::Services& services) {
  for (size_t i = 0; i < sc.cfgs.size(); ++i) {
    serve::ServeOptions oi = o;
    oi.model_name = vm.count("name")                 ? vm["name"].as<std::string>()
                    : !sc.cfgs[i].serve.name.empty() ? sc.cfgs[i].serve.name
                    : !sc.files[i].empty()           ? std::filesystem::path(sc.files[i]).stem().string()
                                           : std::filesystem::path(sc.cfgs[i].model.path).stem().string();
    if (services.find(oi.model_name))
      throw UsageError("two pipelines would be served as '" + oi.model_name +
                       "': give the files distinct names");
    auto service = std::make_unique<serve::Service>(sc.cfgs[i], oi);
    announce_backend(service->pipeline());
    services.add(std::move(service));
  }
}

// The A/B splits, each over services served here.
void add_splits(const ServedConfigs& sc, serve::Services& services) {
  for (const auto& [name, ab] : sc.splits) {
    if (services.find(name) || services.find_split(name))
      throw UsageError("the A/B split '" + name +
                       "' has the name of another pipeline or split: give it its own");
    std::vector<std::pair<serve::Service*, double>> variants;
    for (const auto& [v, w] : ab) {
      serve::Service* s = services.find(v);
      if (!s) {
        std::string names;
        for (const auto& x : services.all())
          names += (names.empty() ? "'" : ", '") + x->options().model_name + "'";
        throw UsageError("the A/B split '" + name + "' names '" + v +
                         "', which is not served here (served: " + names + ")");
      }
      variants.emplace_back(s, w);
    }
    services.add_split(std::make_unique<serve::Split>(name, std::move(variants)));
    std::fprintf(stderr, "loom serve: A/B split '%s' over %zu pipelines\n", name.c_str(), ab.size());
  }
}

} // namespace

int cmd_serve(const std::vector<std::string>& args) {
  po::options_description desc("loom serve options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("config,c", po::value<std::vector<std::string>>()->composing(), "pipeline TOML file (repeatable: each served under its file's stem)")
    ("model,m", po::value<std::string>(), "model file (GGUF); overrides [model] path")
    ("host", po::value<std::string>()->default_value("127.0.0.1"), "address to listen on (0.0.0.0: every interface)")
    ("port", po::value<int>()->default_value(8080), "port (0: any free port, printed at start)")
    ("api-key", po::value<std::string>(), "require `Authorization: Bearer KEY` (also $LOOM_API_KEY)")
    ("name", po::value<std::string>(), "the model name clients use (default: the file's stem)")
    ("template", po::value<std::string>(), "chat template: a built-in one or a Jinja file (default: the model's)")
    ("parallel", po::value<int>(), "requests in the running batch at most ([scheduler] max_sequences)")
    ("max-body", po::value<long>()->default_value(8L << 20), "request body bytes at most")
    ("max-connections", po::value<long>()->default_value(256), "connections served at once (more: 503)")
    ("max-queue", po::value<long>()->default_value(512), "requests waiting at most (more: 503)")
    ("timeout", po::value<int>()->default_value(10), "seconds a client has to send its request's header (its body: 30 more)")
    ("idle-timeout", po::value<int>()->default_value(60), "seconds a kept-alive connection may wait for its next request")
    ("write-timeout", po::value<int>()->default_value(30), "seconds a client has to take a reply or a stream's event (then it is dropped and its request cancelled)")
    ("drain-timeout", po::value<int>()->default_value(30), "SIGTERM: seconds requests in flight may finish before every connection is closed")
    ("http-threads", po::value<int>()->default_value(2), "I/O threads")
    ("ctx-size", po::value<int>(), "context window (tokens); overrides [model] n_ctx")
    ("set", po::value<std::vector<std::string>>()->composing(), "override a pipeline key: section.key=value")
    ("plugin-path", po::value<std::vector<std::string>>()->composing(), "a plugin directory (repeatable)");
  // clang-format on
  po::variables_map vm;
  if (!parse_args(
          args, desc, vm,
          "usage: loom serve (-c PIPELINE.toml | -m MODEL.gguf) [--host 127.0.0.1] [--port 8080]\n"
          "                  [--api-key KEY] [--name NAME] [--parallel N]\n"
          "An OpenAI-compatible server on the batching engine: POST /v1/chat/completions, "
          "/v1/completions\n(streamed with \"stream\": true), /tokenize, /detokenize; GET /v1/models, "
          "/health, /metrics\n(Prometheus, vLLM's names). Binds localhost unless told otherwise; "
          "SIGTERM drains."))
    return k_exit_ok;
  if (!vm.count("config") && !vm.count("model"))
    throw UsageError("give a pipeline (-c FILE.toml, repeatable) or a model (-m FILE.gguf)");
  const ServedConfigs sc = served_configs(vm);
  const serve::ServeOptions o = server_options(vm);
  serve::Services services;
  add_services(vm, sc, o, services);
  add_splits(sc, services);
  return serve::run_server(services);
}

} // namespace loom::cli
