// libFuzzer target: chat templates (parse + render) — a model's template is untrusted input. The input
// is the template; it renders for a fixed conversation with tools, under small bounds so that every
// run ends fast. Any loom::Error is fine; a crash, a hang or another exception is a finding.
#include "loom/chat/chat.hpp"
#include "loom/error.hpp"

#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Héllo \"there\"\n"},
    {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": {"a": 1, "b": [true, null, 2.5]}}}]},
    {"role": "tool", "content": "42", "name": "f"},
    {"role": "assistant", "content": "ok", "reasoning_content": "because"}])");
  static const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  loom::chat::RenderInput in;
  in.messages = messages;
  in.tools = tools;
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.now = std::tm{};
  loom::chat::Limits lim;
  lim.max_steps = 20000;
  lim.max_output = 1 << 16;
  lim.max_depth = 64;
  try {
    const loom::chat::Template t(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    (void)t.render(in, lim);
  } catch (const loom::Error&) {
  }
  return 0;
}
