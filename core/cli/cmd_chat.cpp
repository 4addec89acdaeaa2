// `loom chat`: a conversation in the terminal under the model's chat template — history, the reply
// streamed, /reset, /save FILE, Ctrl-C stops the current answer, Ctrl-D (or /quit) leaves.
#include "cli.hpp"
#include "loom/chat/chat.hpp"
#include "loom/error.hpp"
#include "loom/pipeline/pipeline.hpp"

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

namespace loom::cli {

namespace {

volatile std::sig_atomic_t g_chat_interrupted = 0;
void on_chat_sigint(int) {
  g_chat_interrupted = 1;
}

// SIGINT stops the answer being generated (not the program) while this lives.
class InterruptScope {
public:
  InterruptScope() {
    g_chat_interrupted = 0;
    struct sigaction sa {};
    sa.sa_handler = on_chat_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_);
  }
  ~InterruptScope() { sigaction(SIGINT, &old_, nullptr); }
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

private:
  struct sigaction old_ {};
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

constexpr const char* k_help =
    "commands: /reset (forget the conversation), /save FILE (the messages as JSON), "
    "/quit; Ctrl-C stops an answer, Ctrl-D leaves";

// The reply to `req`, streamed to stdout; Ctrl-C cancels it (*cancelled), the engine ends it at its next
// step.
GenerationResult generate_interruptible(Pipeline& pipeline, const GenerationRequest& req, bool* cancelled) {
  GenerationResult result;
  const InterruptScope interrupts;
  const RequestId id = pipeline.submit(req, [](std::string_view s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  });
  bool done = false;
  while (!done) {
    if (g_chat_interrupted && !*cancelled) {
      pipeline.engine().cancel(id);
      *cancelled = true;
    }
    for (auto& [rid, res] : pipeline.engine().step())
      if (rid == id) {
        result = std::move(res);
        done = true;
      }
  }
  return result;
}

// The conversation: its messages (from `start`, the system message if any) and what answers them.
class ChatSession {
public:
  ChatSession(Pipeline& pipeline, const chat::Template& tmpl, nlohmann::ordered_json start, bool tty)
      : pipeline_(pipeline), tmpl_(tmpl), start_(std::move(start)), messages_(start_), tty_(tty) {}

  // A /command; false for /quit (or /exit).
  bool command(const std::string& line) {
    if (line == "/quit" || line == "/exit") return false;
    if (line == "/reset") {
      messages_ = start_;
      std::puts("(the conversation is cleared)");
    } else if (line.rfind("/save", 0) == 0) {
      save(trim(line.substr(5)));
    } else {
      std::printf("(%s)\n", k_help);
    }
    return true;
  }

  // The user's line, and the reply to the conversation so far. A conversation the template refuses or
  // the context cannot hold is said, and the line dropped.
  void answer(const std::string& line) {
    messages_.push_back({{"role", "user"}, {"content", line}});
    chat::RenderInput in;
    in.messages = messages_;
    chat::ChatPrompt cp;
    try {
      cp = chat::chat_prompt(tmpl_, in, pipeline_.tokenizer(), pipeline_.config().run.parse_special);
    } catch (const loom::Error& e) { // the template refused the conversation (roles, …): say so, go on
      std::printf("(%s)\n", e.what());
      messages_.erase(messages_.end() - 1);
      return;
    }
    if (static_cast<int64_t>(cp.tokens.size()) >= pipeline_.n_ctx()) {
      std::printf("(the conversation is %zu tokens, the context %d: /reset to start over)\n",
                  cp.tokens.size(), pipeline_.n_ctx());
      messages_.erase(messages_.end() - 1);
      return;
    }
    GenerationRequest req;
    req.prompt_tokens = std::move(cp.tokens);
    bool cancelled = false;
    const GenerationResult result = generate_interruptible(pipeline_, req, &cancelled);
    std::fputs("\n", stdout);
    if (cancelled) std::puts("(stopped)");
    if (!result.message.empty()) std::printf("(%s)\n", result.message.c_str());
    if (tty_)
      std::fprintf(stderr, "[%d prompt + %d new tokens, stop: %s | prefill %.1f tok/s, decode %.1f tok/s]\n",
                   result.metrics.n_prompt, result.metrics.n_generated,
                   std::string(stop_reason_name(result.stop_reason)).c_str(), result.metrics.prefill_tok_s,
                   result.metrics.decode_tok_s);
    messages_.push_back({{"role", "assistant"}, {"content", result.text}});
  }

private:
  void save(const std::string& path) const {
    if (path.empty()) {
      std::puts("(usage: /save FILE)");
      return;
    }
    std::ofstream f(path);
    f << messages_.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!f)
      std::printf("(cannot write %s)\n", path.c_str());
    else
      std::printf("(saved %zu messages to %s)\n", messages_.size(), path.c_str());
  }

  Pipeline& pipeline_;
  const chat::Template& tmpl_;
  const nlohmann::ordered_json start_;
  nlohmann::ordered_json messages_;
  const bool tty_;
};

} // namespace

int cmd_chat(const std::vector<std::string>& args) {
  po::options_description desc("loom chat options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("config,c", po::value<std::string>(), "pipeline TOML file")
    ("model,m", po::value<std::string>(), "model file (GGUF); overrides [model] path")
    ("template", po::value<std::string>(), "a built-in chat template or a Jinja file (default: the model's)")
    ("system", po::value<std::string>(), "a system message that opens the conversation (kept by /reset)")
    ("n-predict,n", po::value<int>(), "the most new tokens per answer (default: until the end of the turn)")
    ("temp", po::value<double>(), "temperature (0 = greedy)")
    ("top-k", po::value<long>(), "top-k (0 = off)")
    ("top-p", po::value<double>(), "top-p in (0, 1]")
    ("min-p", po::value<double>(), "min-p in [0, 1]")
    ("seed", po::value<std::string>(), "RNG seed 0..2^63-1")
    ("ctx-size", po::value<int>(), "context window (tokens); overrides [model] n_ctx")
    ("set", po::value<std::vector<std::string>>()->composing(), "override a pipeline key: section.key=value")
    ("plugin-path", po::value<std::vector<std::string>>()->composing(), "a plugin directory (repeatable)");
  // clang-format on
  po::variables_map vm;
  if (!parse_args(
          args, desc, vm,
          "usage: loom chat (-c PIPELINE.toml | -m MODEL.gguf) [--system TEXT] [--template NAME|FILE]\n"
          "                 [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--set k=v]...\n"
          "A conversation in the terminal: each line you type is a user message; the reply streams,\n"
          "rendered and stopped by the model's chat template. /reset, /save FILE, /quit; Ctrl-C stops an\n"
          "answer, Ctrl-D leaves."))
    return k_exit_ok;
  if (!vm.count("config") && !vm.count("model"))
    throw UsageError("give a pipeline (-c FILE.toml) or a model (-m FILE.gguf)");
  PipelineConfig cfg = run_config_from_args(vm);
  if (!vm.count("n-predict")) cfg.stop.max_tokens = -1; // a reply ends with its turn (or the context)
  auto pipeline = Pipeline::create(cfg);
  announce_backend(*pipeline);
  const chat::Template tmpl = chat::load_template(
      vm.count("template") ? vm["template"].as<std::string>() : "", &pipeline->model().file());
  nlohmann::ordered_json start = nlohmann::ordered_json::array();
  if (vm.count("system")) start.push_back({{"role", "system"}, {"content", vm["system"].as<std::string>()}});
  ChatSession session(*pipeline, tmpl, std::move(start), stdout_is_tty());
  std::fprintf(stderr, "loom chat: %s, template %s, context %d tokens\n%s\n", cfg.model.path.c_str(),
               tmpl.name().c_str(), pipeline->n_ctx(), k_help);

  std::string line;
  while (true) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) { // Ctrl-D
      std::fputs("\n", stdout);
      break;
    }
    line = trim(line);
    if (line.empty()) continue;
    if (line[0] == '/') {
      if (!session.command(line)) break;
      continue;
    }
    session.answer(line);
  }
  return k_exit_ok;
}

} // namespace loom::cli
