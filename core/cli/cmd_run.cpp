// `loom run`: one prompt through a pipeline, streamed; --json prints one object at the end.
#include "cli.hpp"
#include "loom/chat/chat.hpp"
#include "loom/error.hpp"
#include "loom/pipeline/pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace loom::cli {

namespace {

constexpr const char* k_run_usage =
    "usage: loom run (-c PIPELINE.toml | -m MODEL.gguf) (-p TEXT | -f FILE | --prompts FILE [--parallel N] "
    "|\n"
    "                --messages FILE.json [--template NAME|FILE])\n"
    "                [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--ignore-eos]\n"
    "                [--decoder NAME] [--plugin-path DIR]... [--set section.key=value]... [--json]\n"
    "Generates text and streams it (the prompt is echoed first unless --no-echo). -n counts new tokens.\n"
    "--messages: OpenAI-style messages rendered by the model's chat template (or --template), the reply\n"
    "streamed until the template's end-of-turn token; --json adds the rendered \"prompt\".\n"
    "Sampling flags edit the pipeline's [[sampler]] chain (default chain: top_k 40, top_p 0.95, min_p 0.05,\n"
    "temperature 0.8, as llama.cpp); --temp 0 is greedy.";

// Sets key of the sampler `name` in the chain, adding the sampler if absent (before temperature).
void set_sampler_param(std::vector<SamplerSpec>& chain, const std::string& name, const std::string& key,
                       ParamValue v) {
  for (auto& s : chain)
    if (s.name == name) {
      for (auto& [k, val] : s.params)
        if (k == key) {
          val = std::move(v);
          return;
        }
      s.params.emplace_back(key, std::move(v));
      return;
    }
  SamplerSpec s;
  s.name = name;
  s.params.emplace_back(key, std::move(v));
  auto it = std::find_if(chain.begin(), chain.end(), [](const SamplerSpec& x) {
    return x.name == "temperature" || x.name == "greedy" || x.name == "dist";
  });
  chain.insert(it, std::move(s));
}

nlohmann::json to_json(const GenerationResult& r) {
  nlohmann::json j;
  j["prompt_tokens"] = r.prompt_tokens;
  j["tokens"] = r.tokens;
  j["text"] = r.text;
  nlohmann::json lp = nlohmann::json::array();
  for (float x : r.logprobs)
    lp.push_back(std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr));
  j["logprobs"] = lp;
  j["stop_reason"] = std::string(stop_reason_name(r.stop_reason));
  if (!r.stop_string.empty()) j["stop_string"] = r.stop_string;
  if (r.n_best.size() > 1) {
    nlohmann::json nb = nlohmann::json::array();
    for (const auto& h : r.n_best)
      nb.push_back({{"tokens", h.tokens},
                    {"text", h.text},
                    {"score", h.score},
                    {"stop_reason", std::string(stop_reason_name(h.stop_reason))}});
    j["hypotheses"] = nb; // best first; tokens/text above are the best one's
  }
  for (const auto& [k, v] : r.outputs) // decoder fields, validated by the host
    j[k] = nlohmann::json::parse(v, nullptr, false);
  if (!r.message.empty()) j["message"] = r.message;
  j["seed"] = r.seed;
  j["metrics"] = {{"ttft_ms", r.metrics.ttft_ms},
                  {"tpot_ms", r.metrics.tpot_ms},
                  {"prefill_tok_s", r.metrics.prefill_tok_s},
                  {"decode_tok_s", r.metrics.decode_tok_s},
                  {"total_ms", r.metrics.total_ms},
                  {"n_prompt", r.metrics.n_prompt},
                  {"n_generated", r.metrics.n_generated},
                  {"forward_ms", r.metrics.forward_ms},
                  {"prefill_ms", r.metrics.prefill_ms},
                  {"kv_reserved_peak_bytes", r.metrics.kv_reserved_peak_bytes},
                  {"kv_used_peak_bytes", r.metrics.kv_used_peak_bytes},
                  {"tokens_evaluated", r.metrics.tokens_evaluated},
                  {"queue_ms", r.metrics.queue_ms},
                  {"itl_p50_ms", r.metrics.itl_p50_ms},
                  {"itl_p90_ms", r.metrics.itl_p90_ms},
                  {"itl_max_ms", r.metrics.itl_max_ms},
                  {"e2e_ms", r.metrics.total_ms},
                  {"preemptions", r.metrics.preemptions},
                  {"cached_prompt_tokens", r.metrics.cached_prompt_tokens}};
  if (r.metrics.draft_tokens_evaluated > 0)
    j["metrics"]["draft_tokens_evaluated"] = r.metrics.draft_tokens_evaluated;
  if (r.metrics.draft_kv_copied > 0) j["metrics"]["draft_kv_copied"] = r.metrics.draft_kv_copied;
  if (r.metrics.verifier_tokens_evaluated > 0)
    j["metrics"]["verifier_tokens_evaluated"] = r.metrics.verifier_tokens_evaluated;
  if (r.metrics.draft_forward_ms > 0) {
    j["metrics"]["draft_forward_ms"] = r.metrics.draft_forward_ms;
    j["metrics"]["draft_prefill_ms"] = r.metrics.draft_prefill_ms;
  }
  for (const auto& [k, v] : r.metrics.decoder) // a decoder's own (speculative: draft_tokens, …)
    if (!j["metrics"].contains(k)) j["metrics"][k] = v;
  return j;
}

} // namespace

void announce_backend(const Pipeline& p) {
  if (!p.backend_note().empty()) std::cerr << "loom: " << p.backend_note() << "\n";
  if (stderr_is_tty()) {
    const std::string d(p.backend().describe());
    std::cerr << "loom: backend " << p.backend_name() << (d.empty() ? "" : ": " + d) << "\n";
  }
}

nlohmann::json backend_json(const Pipeline& p) {
  return {{"name", p.backend_name()}, {"description", std::string(p.backend().describe())}};
}

PipelineConfig run_config_from_args(const po::variables_map& vm) {
  std::vector<ConfigOverride> overrides;
  if (vm.count("decoder")) // first, so that --set decoder.KEY=V applies to this decoder
    overrides.push_back({"decoder.name", nlohmann::json(vm["decoder"].as<std::string>()).dump()});
  PipelineConfig cfg = config_from_args(vm, std::move(overrides));
  if (vm.count("ctx-size")) {
    const int n = vm["ctx-size"].as<int>();
    if (n <= 0) throw UsageError("--ctx-size must be > 0, got " + std::to_string(n));
    cfg.model.n_ctx = n;
  }
  if (vm.count("n-predict")) {
    const int n = vm["n-predict"].as<int>();
    if (n < -1)
      throw UsageError("-n must be ≥ -1 (-1 = until the context is full), got " + std::to_string(n));
    cfg.stop.max_tokens = n;
  }
  if (vm.count("seed")) cfg.run.seed = parse_seed(vm["seed"].as<std::string>(), "--seed");
  if (vm.count("ignore-eos")) cfg.stop.eos = false;
  if (vm.count("special")) cfg.run.parse_special = true;
  if (vm.count("no-echo")) cfg.run.echo = false;
  if (vm.count("plugin-path"))
    for (const auto& d : vm["plugin-path"].as<std::vector<std::string>>())
      cfg.plugins.paths.push_back(d);

  if (vm.count("temp") || vm.count("top-k") || vm.count("top-p") || vm.count("min-p")) {
    std::vector<SamplerSpec> chain = cfg.samplers.empty() ? default_chain_specs() : cfg.samplers;
    if (vm.count("temp")) {
      const double t = vm["temp"].as<double>();
      if (!(t >= 0)) throw UsageError("--temp must be ≥ 0 (0 = greedy), got " + std::to_string(t));
      set_sampler_param(chain, "temperature", "value", t);
    }
    if (vm.count("top-k")) {
      const long k = vm["top-k"].as<long>();
      if (k < 0) throw UsageError("--top-k must be ≥ 0 (0 = off), got " + std::to_string(k));
      set_sampler_param(chain, "top_k", "k", static_cast<int64_t>(k));
    }
    if (vm.count("top-p")) {
      const double p = vm["top-p"].as<double>();
      if (!(p > 0 && p <= 1)) throw UsageError("--top-p must be in (0, 1], got " + std::to_string(p));
      set_sampler_param(chain, "top_p", "p", p);
    }
    if (vm.count("min-p")) {
      const double p = vm["min-p"].as<double>();
      if (!(p >= 0 && p <= 1)) throw UsageError("--min-p must be in [0, 1], got " + std::to_string(p));
      set_sampler_param(chain, "min_p", "p", p);
    }
    for (const auto& s : chain)
      (void)create_sampler(s); // validate
    cfg.samplers = chain;
  }
  return cfg;
}

namespace {

// The prompt's source: exactly one of -p, -f, --prompts and --messages; --template only with --messages.
void check_prompt_source(const po::variables_map& vm) {
  if (!vm.count("config") && !vm.count("model"))
    throw UsageError("give a pipeline (-c FILE.toml) or a model (-m FILE.gguf)");
  const int n_sources =
      static_cast<int>(vm.count("prompt") + vm.count("file") + vm.count("prompts") + vm.count("messages"));
  if (n_sources > 1) throw UsageError("give the prompt with one of -p, -f, --prompts or --messages");
  if (n_sources == 0)
    throw UsageError("give a prompt with -p TEXT (or -f FILE, --prompts FILE, --messages FILE.json)");
  if (vm.count("template") && !vm.count("messages")) throw UsageError("--template goes with --messages");
  if (vm["parallel"].as<int>() < 1) throw UsageError("--parallel must be ≥ 1");
}

// --task: a JSON object (or @FILE holding one), compacted; "" when not given.
std::string task_of(const po::variables_map& vm) {
  if (!vm.count("task")) return "";
  const std::string t = vm["task"].as<std::string>();
  const std::string text = !t.empty() && t[0] == '@' ? read_input_file(t.substr(1), "--task") : t;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("--task: not JSON (" + std::string(e.what()) +
                     "); expected an object such as "
                     "{\"tests\": [\"assert f(2) == 4\"]}");
  }
  if (!j.is_object()) throw UsageError("--task: expected a JSON object, found " + std::string(j.type_name()));
  return j.dump();
}

// --prompts FILE: every line a request, --parallel at once; each printed in input order.
int run_prompts_file(const po::variables_map& vm, const PipelineConfig& cfg, const std::string& task) {
  std::istringstream f(read_input_file(vm["prompts"].as<std::string>(), "--prompts"));
  std::vector<GenerationRequest> reqs;
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    GenerationRequest r;
    r.prompt = line;
    r.task = task;
    reqs.push_back(std::move(r));
  }
  auto pipeline = Pipeline::create(cfg);
  announce_backend(*pipeline);
  const auto results = pipeline->generate_all(reqs, static_cast<size_t>(vm["parallel"].as<int>()));
  int rc = k_exit_ok;
  for (size_t i = 0; i < results.size(); ++i) {
    if (vm.count("json")) {
      nlohmann::json j = to_json(results[i]);
      j["backend"] = backend_json(*pipeline);
      j["metrics"]["load_ms"] = pipeline->load_ms(); // the pipeline's, once for all prompts
      std::cout << j.dump() << "\n";
    } else {
      std::cout << reqs[i].prompt << results[i].text << "\n";
    }
    if (!results[i].message.empty()) {
      std::cerr << "loom: prompt " << i + 1 << ": " << results[i].message << "\n";
      rc = k_exit_error;
    }
  }
  return rc;
}

// The end of one prompt's run: the JSON object, or the text's last line (and on a terminal the numbers).
void print_run_result(const po::variables_map& vm, const Pipeline& pipeline, const GenerationResult& r,
                      const std::string& prompt, size_t streamed) {
  if (vm.count("json")) {
    nlohmann::json j = to_json(r);
    if (vm.count("messages")) j["prompt"] = prompt;
    j["backend"] = backend_json(pipeline);
    j["metrics"]["load_ms"] = pipeline.load_ms(); // weights to the backend (repacks, uploads), KV pool
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
  // A decoder that streams nothing (best-of-n, beam search) has its answer only at the end.
  if (streamed == 0 && !r.text.empty()) std::fwrite(r.text.data(), 1, r.text.size(), stdout);
  std::cout << "\n";
  std::cout.flush();
  if (stderr_is_tty()) {
    std::fprintf(
        stderr,
        "[%d prompt + %d new tokens, stop: %s | TTFT %.1f ms, prefill %.1f tok/s, decode %.1f tok/s]\n",
        r.metrics.n_prompt, r.metrics.n_generated, std::string(stop_reason_name(r.stop_reason)).c_str(),
        r.metrics.ttft_ms, r.metrics.prefill_tok_s, r.metrics.decode_tok_s);
  }
}

// One prompt (-p, -f or --messages), streamed to stdout as it comes (unless --json).
int run_one(const po::variables_map& vm, const PipelineConfig& cfg, const std::string& task) {
  std::string prompt;
  chat::RenderInput chat_in;
  if (vm.count("prompt")) {
    prompt = vm["prompt"].as<std::string>();
  } else if (vm.count("file")) {
    prompt = read_input_file(vm["file"].as<std::string>(), "-f");
  } else {
    read_chat_messages(vm["messages"].as<std::string>(), chat_in);
  }

  auto pipeline = Pipeline::create(cfg);
  announce_backend(*pipeline);
  const bool json = vm.count("json") != 0;
  const bool chat = vm.count("messages") != 0;
  GenerationRequest req;
  req.prompt = prompt;
  req.task = task;
  if (chat) { // the reply to the conversation, under the model's chat template
    const chat::Template t = chat::load_template(vm.count("template") ? vm["template"].as<std::string>() : "",
                                                 &pipeline->model().file());
    chat::ChatPrompt cp =
        chat::chat_prompt(t, chat_in, pipeline->tokenizer(), pipeline->config().run.parse_special);
    prompt = std::move(cp.text);
    req.prompt_tokens = std::move(cp.tokens);
  }
  if (!json && cfg.run.echo && !chat) {
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    std::fflush(stdout);
  }
  StreamCallback cb;
  size_t streamed = 0;
  if (!json)
    cb = [&streamed](std::string_view s) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
      streamed += s.size();
    };
  const GenerationResult r = pipeline->generate(req, cb);
  print_run_result(vm, *pipeline, r, prompt, streamed);
  if (!r.message.empty()) { // the request failed (after some tokens, perhaps): say why, exit 1
    std::cerr << "loom: " << r.message << "\n";
    return k_exit_error;
  }
  return k_exit_ok;
}

} // namespace

int cmd_run(const std::vector<std::string>& args) {
  po::options_description desc("loom run options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("config,c", po::value<std::string>(), "pipeline TOML file")
    ("model,m", po::value<std::string>(), "model file (GGUF); overrides [model] path")
    ("prompt,p", po::value<std::string>(), "prompt text")
    ("file,f", po::value<std::string>(), "read the prompt from a file")
    ("n-predict,n", po::value<int>(), "number of new tokens (-1 = until the context is full)")
    ("temp", po::value<double>(), "temperature (0 = greedy)")
    ("top-k", po::value<long>(), "top-k (0 = off)")
    ("top-p", po::value<double>(), "top-p in (0, 1]")
    ("min-p", po::value<double>(), "min-p in [0, 1]")
    ("seed", po::value<std::string>(), "RNG seed 0..2^63-1 (default: random, reported with --json)")
    ("ignore-eos", "do not stop at end-of-generation tokens")
    ("ctx-size", po::value<int>(), "context window (tokens); overrides [model] n_ctx")
    ("set", po::value<std::vector<std::string>>()->composing(), "override a pipeline key: section.key=value")
    ("no-echo", "do not print the prompt before the generated text")
    ("special", "parse special-token text (e.g. <s>) in the prompt, and in --messages content ([run] parse_special)")
    ("decoder", po::value<std::string>(), "decoder: sample (built in) or a plugin's; its keys via --set decoder.KEY=V")
    ("plugin-path", po::value<std::vector<std::string>>()->composing(), "a plugin directory (repeatable)")
    ("prompts", po::value<std::string>(), "run every line of FILE as a request (see --parallel)")
    ("messages", po::value<std::string>(), "chat: a JSON file of messages ([{\"role\": …, \"content\": …}] or {\"messages\": …, \"tools\": …})")
    ("template", po::value<std::string>(), "with --messages: a built-in chat template or a Jinja file (default: the model's)")
    ("parallel", po::value<int>()->default_value(1), "with --prompts: requests in flight at once")
    ("task", po::value<std::string>(), "the task the [verifier] reads with each candidate: a JSON object (e.g. {\"tests\": [...]}), or @FILE")
    ("json", "print one JSON object (prompt_tokens, tokens, text, logprobs, stop_reason, metrics); with\n"
             "--prompts one object per line, in input order");
  // clang-format on
  po::variables_map vm;
  if (!parse_args(args, desc, vm, k_run_usage)) return k_exit_ok;
  check_prompt_source(vm);
  const PipelineConfig cfg = run_config_from_args(vm);
  const std::string task = task_of(vm);
  if (vm.count("prompts")) return run_prompts_file(vm, cfg, task);
  return run_one(vm, cfg, task);
}

} // namespace loom::cli
