// The prompts file of an A/B experiment (loom/eval/ab_experiment.hpp): plain text, one prompt a line, or
// JSONL, one task a line with its expected answer.
#include "loom/error.hpp"
#include "loom/eval/ab_experiment.hpp"

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

namespace loom::ab {

namespace {

// Bad input in the file: the CLI reports it as a usage error (the message names the file and line).
[[noreturn]] void bad_input(const std::string& message) {
  throw Error(Errc::invalid_argument, "", message);
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
    const std::string where = path + ":" + std::to_string(lineno);
    if (!jsonl) {
      out.push_back({std::to_string(out.size() + 1), line, std::nullopt, {}});
      continue;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      bad_input(where + ": not a JSON object (JSONL: one {\"prompt\": …} a line, as the first line is)");
    }
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      bad_input(where + ": expected an object with a string \"prompt\" (and optional \"expected\", \"id\")");
    Prompt p;
    p.prompt = j["prompt"].get<std::string>();
    p.task = j.dump();
    p.id = std::to_string(out.size() + 1);
    if (j.contains("id")) p.id = j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump();
    if (j.contains("answer") && j.contains("expected"))
      bad_input(where + ": give \"expected\" or \"answer\" (the same thing), not both");
    if (j.contains("answer")) j["expected"] = j["answer"]; // a task set's answer
    if (j.contains("expected")) {
      if (j["expected"].is_string())
        p.expected = j["expected"].get<std::string>();
      else if (j["expected"].is_number_integer())
        p.expected = j["expected"].dump();
      else if (j["expected"].is_number()) { // 3.0 → "3", as a text's last number would read
        const double x = j["expected"].get<double>();
        p.expected = x == std::floor(x) && std::fabs(x) < 1e15 ? std::to_string(static_cast<int64_t>(x))
                                                               : j["expected"].dump();
      } else
        bad_input(where + ": \"expected\" must be a string or a number");
    }
    for (const auto& [k, v] : j.items())
      if (k != "prompt" && k != "expected" && k != "answer" && k != "id" && k != "tests")
        bad_input(where + ": unknown key \"" + k + "\" (expected prompt, expected or answer, id, tests)");
    out.push_back(std::move(p));
  }
  if (out.empty()) bad_input(path + ": no prompts (expected one prompt a line, or JSONL)");
  return out;
}

} // namespace loom::ab
