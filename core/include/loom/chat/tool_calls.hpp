// loom/chat/tool_calls.hpp — tool calls in a model's reply, in the formats of the families Loom runs:
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

// While a reply streams: how much of `text` (the reply so far) is content for certain — it cannot be part
// of a tool call — and whether a call has begun. Text that could be the start of a call's marker
// (`<tool_c`…) is held back until the next piece tells; a Llama 3 reply that opens with `{` is held whole.
struct Streamable {
  size_t content = 0;      // text[0, content) may be streamed as content
  bool call_began = false; // a marker (or Llama 3's leading `{`) was seen: the rest waits for the end
};
Streamable streamable(Format f, std::string_view text);

} // namespace loom::tools
