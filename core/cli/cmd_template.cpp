// `loom template`: what a model is fed — a chat template rendered for a list of messages, exactly
// (no newline added), and the built-in templates.
#include "cli.hpp"
#include "loom/chat/chat.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <iostream>
#include <optional>

namespace loom::cli {

namespace {

std::tm parse_date(const std::string& s) {
  std::tm t{};
  int y = 0, m = 0, d = 0;
  char tail = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2d%c", &y, &m, &d, &tail) != 3 || y < 1900 || m < 1 || m > 12 ||
      d < 1 || d > 31)
    throw UsageError("--now: expected a date YYYY-MM-DD, found '" + s + "'");
  t.tm_year = y - 1900;
  t.tm_mon = m - 1;
  t.tm_mday = d;
  t.tm_hour = 12;
  std::tm copy = t;
  if (timegm(&copy) == static_cast<time_t>(-1) || copy.tm_mday != d)
    throw UsageError("--now: no such day: '" + s + "'");
  t = copy; // weekday and day of the year filled in
  t.tm_hour = 0;
  return t;
}

} // namespace

int cmd_template(const std::vector<std::string>& args) {
  po::options_description desc("loom template options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("template,t", po::value<std::string>(), "a built-in template (chatml, llama2, llama3, mistral, gemma, phi3) or a Jinja file")
    ("model,m", po::value<std::string>(), "the model whose tokenizer.chat_template (and BOS/EOS text) to use")
    ("messages", po::value<std::string>(), "JSON file: [{\"role\": …, \"content\": …}, …] or {\"messages\": […], \"tools\": […]}")
    ("tools", po::value<std::string>(), "JSON file: the tools (function schemas) the template may list")
    ("bos", po::value<std::string>(), "bos_token text (default: the model's, else undefined)")
    ("eos", po::value<std::string>(), "eos_token text (default: the model's, else undefined)")
    ("no-generation-prompt", "add_generation_prompt = false (default true: end with the assistant's header)")
    ("now", po::value<std::string>(), "the date strftime_now() sees, YYYY-MM-DD (default: today)")
    ("var", po::value<std::vector<std::string>>()->composing(), "NAME=JSON: one more template variable, e.g. enable_thinking=false (repeatable)");
  // clang-format on
  po::positional_options_description pos;
  pos.add("action", 1);
  desc.add_options()("action", po::value<std::string>(), "render | list");
  po::variables_map vm;
  if (!parse_args(
          args, desc, vm,
          "usage: loom template render (--template NAME|FILE | -m MODEL) --messages M.json [--tools T.json]\n"
          "                            [--bos TEXT] [--eos TEXT] [--no-generation-prompt] [--now "
          "YYYY-MM-DD]\n"
          "                            [--var NAME=JSON]...\n"
          "       loom template list\n"
          "Prints exactly the prompt a chat template renders for the messages (no newline added) — what\n"
          "the model is fed. A template error exits 1 with the template's line and message.",
          &pos))
    return k_exit_ok;
  const std::string action = vm.count("action") ? vm["action"].as<std::string>() : "";
  if (action == "list") {
    for (const auto name : chat::builtin_template_names())
      std::cout << name << "\n";
    return k_exit_ok;
  }
  if (action != "render") throw UsageError("expected 'render' or 'list', found '" + action + "'");
  if (!vm.count("template") && !vm.count("model")) throw UsageError("give --template NAME|FILE or -m MODEL");
  if (!vm.count("messages")) throw UsageError("give --messages FILE.json");

  chat::RenderInput in;
  read_chat_messages(vm["messages"].as<std::string>(), in);
  if (vm.count("tools")) {
    const std::string path = vm["tools"].as<std::string>();
    try {
      in.tools = nlohmann::ordered_json::parse(read_input_file(path, "--tools"));
    } catch (const nlohmann::json::exception& e) {
      fail(Errc::parse_error, "template", "--tools " + path + ": not JSON (" + e.what() + ")");
    }
    if (!in.tools.is_array())
      fail(Errc::invalid_argument, "template", "--tools " + path + ": expected a JSON array of tool schemas");
  }
  std::optional<GgufFile> model;
  if (vm.count("model")) {
    model = GgufFile::open(vm["model"].as<std::string>());
    const auto tok = Tokenizer::from_gguf(*model);
    if (tok->bos() >= 0) in.bos_token = tok->piece(tok->bos());
    if (tok->eos() >= 0) in.eos_token = tok->piece(tok->eos());
  }
  const chat::Template t = chat::load_template(vm.count("template") ? vm["template"].as<std::string>() : "",
                                               model ? &*model : nullptr);
  if (vm.count("bos")) in.bos_token = vm["bos"].as<std::string>();
  if (vm.count("eos")) in.eos_token = vm["eos"].as<std::string>();
  in.add_generation_prompt = vm.count("no-generation-prompt") == 0;
  if (vm.count("now")) in.now = parse_date(vm["now"].as<std::string>());
  if (vm.count("var"))
    for (const std::string& kv : vm["var"].as<std::vector<std::string>>()) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0)
        throw UsageError("--var: expected NAME=JSON, found '" + kv + "'");
      try {
        in.extra[kv.substr(0, eq)] = nlohmann::ordered_json::parse(kv.substr(eq + 1));
      } catch (const nlohmann::json::exception&) {
        throw UsageError("--var " + kv.substr(0, eq) + ": the value is not JSON (strings need quotes: " +
                         kv.substr(0, eq) + "='\"text\"')");
      }
    }
  std::cout << t.render(in) << std::flush;
  return k_exit_ok;
}

} // namespace loom::cli
