// The prompts file of an A/B experiment (loom/eval/ab_experiment.hpp): plain text, one prompt a line, or
// JSONL, one task a line — raw text or a conversation — with its expected answer; and --chat.
#include "loom/error.hpp"
#include "loom/eval/ab_experiment.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

namespace loom::ab {

namespace {

// Bad input in the file: the CLI reports it as a usage error (the message names the file and line).
[[noreturn]] void bad_input(const std::string& message) {
  throw Error(Errc::invalid_argument, "", message);
}

// A `messages` line's conversation (and its `tools`), checked as every command checks messages.
chat::RenderInput conversation(const nlohmann::ordered_json& j, const std::string& where) {
  chat::RenderInput in;
  if (const auto problem = chat::messages_problem(j["messages"])) bad_input(where + ": " + *problem);
  in.messages = j["messages"];
  if (j.contains("tools")) {
    if (!j["tools"].is_array()) bad_input(where + ": \"tools\" must be an array of {type, function}");
    in.tools = j["tools"];
  }
  return in;
}

// The expected answer of a task line ("expected", or a task set's "answer"): a string or a number.
std::optional<std::string> expected_of(const nlohmann::ordered_json& j, const std::string& where) {
  if (j.contains("answer") && j.contains("expected"))
    bad_input(where + ": give \"expected\" or \"answer\" (the same thing), not both");
  const auto it = j.contains("answer") ? j.find("answer") : j.find("expected");
  if (it == j.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number_integer()) return it->dump();
  if (!it->is_number()) bad_input(where + ": \"expected\" must be a string or a number");
  const double x = it->get<double>(); // 3.0 → "3", as a text's last number would read
  return x == std::floor(x) && std::fabs(x) < 1e15 ? std::to_string(static_cast<int64_t>(x)) : it->dump();
}

// One JSONL line: raw text (`prompt`) or a conversation (`messages`, `tools`), the expected answer, the id.
Prompt jsonl_prompt(const std::string& line, const std::string& where, size_t index) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(line);
  } catch (const std::exception&) {
    bad_input(where + ": not a JSON object (JSONL: one {\"prompt\": …} or {\"messages\": …} a line, as the "
                      "first line is)");
  }
  if (!j.is_object() || j.contains("prompt") == j.contains("messages") ||
      (j.contains("prompt") && !j["prompt"].is_string()))
    bad_input(where + ": expected an object with a string \"prompt\" or OpenAI-style \"messages\" (one of "
                      "them; optional \"expected\", \"id\")");
  for (const auto& [k, v] : j.items())
    if (k != "prompt" && k != "messages" && k != "tools" && k != "expected" && k != "answer" && k != "id" &&
        k != "tests")
      bad_input(where + ": unknown key \"" + k +
                "\" (expected prompt or messages and tools, expected or answer, id, tests)");
  Prompt p;
  if (j.contains("messages")) {
    p.chat = conversation(j, where);
    p.prompt = chat::last_user_text(p.chat->messages);
  } else {
    if (j.contains("tools")) bad_input(where + ": \"tools\" goes with \"messages\"");
    p.prompt = j["prompt"].get<std::string>();
  }
  p.expected = expected_of(j, where);
  p.id = std::to_string(index + 1);
  if (j.contains("id")) p.id = j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump();
  p.task = j.dump();
  return p;
}

} // namespace

std::vector<Prompt> parse_prompts(const std::string& text, const std::string& path) {
  std::istringstream in(text);
  std::string line;
  std::vector<Prompt> out;
  bool jsonl = false, decided = false;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lineno == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3); // a UTF-8 byte-order mark
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (!decided) {
      jsonl = line[line.find_first_not_of(" \t")] == '{';
      decided = true;
    }
    if (jsonl)
      out.push_back(jsonl_prompt(line, path + ":" + std::to_string(lineno), out.size()));
    else
      out.push_back({std::to_string(out.size() + 1), line, std::nullopt, {}, std::nullopt});
  }
  if (out.empty()) bad_input(path + ": no prompts (expected one prompt a line, or JSONL)");
  return out;
}

void apply_chat(std::vector<Prompt>& prompts, bool raw_too, const std::optional<std::string>& system) {
  for (Prompt& p : prompts) {
    if (!p.chat) {
      if (!raw_too) continue;
      p.chat = chat::RenderInput{};
      p.chat->messages.push_back({{"role", "user"}, {"content", p.prompt}});
    }
    auto& m = p.chat->messages;
    const bool has_system =
        std::any_of(m.begin(), m.end(), [](const auto& x) { return x["role"] == "system"; });
    if (system && !has_system)
      m.insert(m.begin(), nlohmann::ordered_json{{"role", "system"}, {"content", *system}});
  }
}

} // namespace loom::ab
