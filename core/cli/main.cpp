// `loom` — the command-line entry point: dispatches to a subcommand and maps errors to exit codes.
#include "cli.hpp"
#include "loom/error.hpp"

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace loom::cli {

PipelineConfig config_from_args(const po::variables_map& vm, std::vector<ConfigOverride> overrides) {
  if (vm.count("set"))
    for (const auto& s : vm["set"].as<std::vector<std::string>>())
      overrides.push_back(parse_override(s));
  PipelineConfig cfg;
  if (vm.count("config")) {
    cfg = load_pipeline(vm["config"].as<std::string>(), overrides);
  } else {
    cfg.source = "<command line>";
    cfg = apply_overrides(cfg, overrides);
  }
  if (vm.count("model")) cfg.model.path = vm["model"].as<std::string>();
  return cfg;
}

std::string read_input_file(const std::string& path, const std::string& flag) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    fail(Errc::invalid_argument, "cli",
         flag + " " + user_value(path) + " is a directory; expected a text file");
  std::ifstream f(path, std::ios::binary);
  if (!f)
    fail(Errc::not_found, "cli",
         flag + ": cannot read " + user_value(path) + ": " + std::strerror(errno) +
             " (expected a text file)");
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail(Errc::invalid_argument, "cli", flag + ": reading " + user_value(path) + " failed");
  return ss.str();
}

uint64_t parse_seed(const std::string& text, const std::string& flag) {
  int64_t v = -1;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end || v < 0)
    throw UsageError(flag + ": expected an integer in 0.." + std::to_string(INT64_MAX) +
                     " (as [run] seed), found " + user_value(text));
  return static_cast<uint64_t>(v);
}

bool stdout_is_tty() {
  return isatty(STDOUT_FILENO) != 0;
}
bool stderr_is_tty() {
  return isatty(STDERR_FILENO) != 0;
}

bool parse_args(const std::vector<std::string>& args, const po::options_description& desc,
                po::variables_map& vm, const std::string& usage,
                const po::positional_options_description* pos) {
  try {
    auto parser = po::command_line_parser(args).options(desc);
    if (pos) parser.positional(*pos);
    po::store(parser.run(), vm);
    if (vm.count("help")) {
      std::cout << usage << "\n\n" << desc << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(std::string(e.what()) + "\n" + usage);
  }
  return true;
}

} // namespace loom::cli

namespace {

constexpr const char* k_usage = R"(loom — an inference engine for decoder-only language models

usage: loom <command> [options]

commands:
  run        generate text from a prompt (streams; --json for tokens, logprobs, stop reason, metrics)
  tokenize   print the token ids of a text
  inspect    describe a model file: architecture, parameters, tensor types, memory
  config     show the resolved pipeline of a TOML file (config show -c P.toml)
  plugins    list the plugins found: name, kind, version, ABI, path, sha256, score
  bench      prefill/decode throughput, TTFT, TPOT, peak RSS (median and spread over repetitions)
  synth      write a random-weight model of a named shape (loads in llama.cpp too)
  quantize   copy a model with its weight matrices in another type (f16, bf16, q8_0, q4_0)
  explain    the sampler chain step by step: candidates and probabilities after each stage
  ab         A/B comparison of pipelines on the same prompts and seeds: speed and quality, with CIs
  chat       a conversation in the terminal under the model's chat template (/reset, /save, Ctrl-C)
  serve      an OpenAI-compatible HTTP server (chat / completions, streaming, /metrics)
  template   render a chat template for a list of messages: exactly what the model is fed
  verify     score given candidates with a verifier plugin, without a model (accuracy, ROC AUC)

Run 'loom <command> --help' for the options of a command.
Example: loom run -m models/stories260K.gguf -p "Once upon a time" -n 60 --temp 0)";

} // namespace

int main(int argc, char** argv) {
  using namespace loom::cli;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << k_usage << "\n";
    return k_exit_usage;
  }
  const std::string cmd = args.front();
  std::vector<std::string> rest(args.begin() + 1, args.end());
  try {
    if (cmd == "-h" || cmd == "--help" || cmd == "help") {
      std::cout << k_usage << "\n";
      return k_exit_ok;
    }
    if (cmd == "--version" || cmd == "version") {
      std::cout << "loom 0.1.0\n";
      return k_exit_ok;
    }
    if (cmd == "run") return cmd_run(rest);
    if (cmd == "tokenize") return cmd_tokenize(rest);
    if (cmd == "inspect") return cmd_inspect(rest);
    if (cmd == "config") return cmd_config(rest);
    if (cmd == "plugins") return cmd_plugins(rest);
    if (cmd == "synth") return cmd_synth(rest);
    if (cmd == "quantize") return cmd_quantize(rest);
    if (cmd == "explain") return cmd_explain(rest);
    if (cmd == "ab") return cmd_ab(rest);
    if (cmd == "bench") return cmd_bench(rest);
    if (cmd == "template") return cmd_template(rest);
    if (cmd == "chat") return cmd_chat(rest);
    if (cmd == "serve") return cmd_serve(rest);
    if (cmd == "verify") return cmd_verify(rest);
    std::cerr << "loom: unknown command '" << cmd << "'\n" << k_usage << "\n";
    return k_exit_usage;
  } catch (const UsageError& e) {
    std::cerr << "loom " << cmd << ": " << e.what() << "\n";
    return k_exit_usage;
  } catch (const loom::Error& e) {
    std::cerr << "loom: error: " << e.what() << "\n";
    return k_exit_error;
  } catch (const std::bad_alloc&) {
    std::cerr << "loom: error: out of memory\n";
    return k_exit_error;
  } catch (const std::exception& e) {
    std::cerr << "loom: error: " << e.what() << "\n";
    return k_exit_error;
  }
}
