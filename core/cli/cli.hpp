// core/cli/cli.hpp — shared pieces of the `loom` subcommands. The CLI is the only place that
// parses argv; everything it does is available through the library.
#pragma once

#include "loom/pipeline/pipeline.hpp"
#include "loom/pipeline/pipeline_config.hpp"

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::chat {
struct RenderInput;
} // namespace loom::chat

namespace loom::cli {

namespace po = boost::program_options;

// Exit codes: 0 ok, 1 error, 2 usage.
constexpr int k_exit_ok = 0;
constexpr int k_exit_error = 1;
constexpr int k_exit_usage = 2;

// Thrown for command-line misuse (exit 2).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses args against `desc` (+ positional), prints help and returns false when --help was given.
bool parse_args(const std::vector<std::string>& args, const po::options_description& desc,
                po::variables_map& vm, const std::string& usage,
                const po::positional_options_description* pos = nullptr);

// The pipeline of a command: -c FILE (or the defaults), then `overrides` and every --set in order,
// then -m MODEL as the model path.
PipelineConfig config_from_args(const po::variables_map& vm, std::vector<ConfigOverride> overrides = {});

// The whole of a text input file (-f, --prompts, --file): a directory or an unreadable path is a
// loom::Error naming the flag and the path ("-" is not special; FIFOs such as /dev/stdin work).
std::string read_input_file(const std::string& path, const std::string& flag);
// A seed as --seed gives it: the rule of [run] seed (an integer 0 .. 2^63-1), else UsageError.
uint64_t parse_seed(const std::string& text, const std::string& flag);
// The pipeline `loom run`'s flags describe (-c/-m, --decoder, --set, -n, --temp/--top-k/--top-p/--min-p,
// --seed, --ignore-eos, --ctx-size, --plugin-path, …); absent flags leave the file's values.
PipelineConfig run_config_from_args(const po::variables_map& vm);
int cmd_explain(const std::vector<std::string>& args);
int cmd_ab(const std::vector<std::string>& args);

// OpenAI-style chat input (--messages FILE.json): an array of {"role": …, "content": …} objects, or an
// object with "messages" (and maybe "tools"), into in.messages / in.tools; loom::Error says what is wrong.
void read_chat_messages(const std::string& path, chat::RenderInput& in);

bool stdout_is_tty();
bool stderr_is_tty();
// After Pipeline::create: the one line saying why "auto" fell back to the reference backend (always,
// on stderr), and on a terminal the backend in use with its description (its routes).
void announce_backend(const Pipeline& p);
// {"name": ..., "description": ...} of the pipeline's backend (--json).
nlohmann::json backend_json(const Pipeline& p);

int cmd_run(const std::vector<std::string>& args);
int cmd_tokenize(const std::vector<std::string>& args);
int cmd_inspect(const std::vector<std::string>& args);
int cmd_config(const std::vector<std::string>& args);
int cmd_plugins(const std::vector<std::string>& args);
int cmd_synth(const std::vector<std::string>& args);
int cmd_quantize(const std::vector<std::string>& args);
int cmd_bench(const std::vector<std::string>& args);
int cmd_template(const std::vector<std::string>& args);
int cmd_chat(const std::vector<std::string>& args);
int cmd_serve(const std::vector<std::string>& args);
int cmd_verify(const std::vector<std::string>& args);

} // namespace loom::cli
