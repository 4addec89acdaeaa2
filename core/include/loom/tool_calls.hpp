// loom/tool_calls.hpp — tool calls in a model's reply, in the formats of the families Loom runs:
// Hermes / Qwen (`<tool_call>{"name": …, "arguments": {…}}</tool_call>`), Llama 3.x (a JSON object
// `{"name": …, "parameters": {…}}`, after `<|python_tag|>` or alone), Mistral (`[TOOL_CALLS][{…}, …]`).
// What `loom serve` turns into OpenAI's `tool_calls`; arguments are always a JSON object's text, never
// dropped or null ("{}" when the model gave none).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace loom::tools {

enum class Format { none, hermes, llama3, mistral };

struct ToolCall {
  std::string name;
  std::string arguments; // JSON text of an object
};
struct Parsed {
  std::string content; // the reply without its tool calls (trimmed)
  std::vector<ToolCall> calls;
};

// The format a chat template writes tools in, from its source (or a built-in template's name).
Format format_of_template(std::string_view source);
// The tool calls of a whole reply; a reply with none (or one that does not parse) is all content.
Parsed parse(Format f, std::string_view text);

} // namespace loom::tools
