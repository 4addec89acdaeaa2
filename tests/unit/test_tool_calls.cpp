// Tool calls in model replies: Hermes / Qwen, Llama 3.x and Mistral formats, arguments never dropped or
// null, text that is not a call kept as content.
#include "loom/chat/tool_calls.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using namespace loom::tools;
using json = nlohmann::json;

TEST(ToolCalls, HermesCallsAndTheTextAroundThem) {
  const auto p =
      parse(Format::hermes, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                            "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\"}"
                            "</tool_call>");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(p.calls[0].arguments), json({{"city", "Paris"}}));
  EXPECT_EQ(p.calls[1].arguments, "{}") << "no arguments: an empty object, never null";
  EXPECT_EQ(p.content, "Let me check.");
  const auto bad = parse(Format::hermes, "<tool_call>not json</tool_call> ok");
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "<tool_call>not json</tool_call> ok");
  const auto quoted =
      parse(Format::hermes, R"(<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>)");
  ASSERT_EQ(quoted.calls.size(), 1u);
  EXPECT_EQ(json::parse(quoted.calls[0].arguments), json({{"x", 1}}));
}

TEST(ToolCalls, Llama3JsonWithParametersOrPythonTag) {
  auto p = parse(Format::llama3, R"({"name": "get_weather", "parameters": {"city": "Oslo"}})");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(json::parse(p.calls[0].arguments), json({{"city", "Oslo"}}));
  p = parse(Format::llama3,
            R"(<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"k": 2}})");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[1].name, "b");
  p = parse(Format::llama3, "The weather is nice.");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "The weather is nice.");
}

TEST(ToolCalls, MistralArray) {
  const auto p =
      parse(Format::mistral,
            R"([TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}])");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "f");
  EXPECT_EQ(p.calls[1].arguments, "{}");
  EXPECT_EQ(parse(Format::mistral, "plain").content, "plain");
}

TEST(ToolCalls, FormatFromTheTemplate) {
  EXPECT_EQ(format_of_template("{% for t in tools %}<tool_call>{% endfor %}"), Format::hermes);
  EXPECT_EQ(format_of_template("[TOOL_CALLS]"), Format::mistral);
  EXPECT_EQ(format_of_template("<|python_tag|>"), Format::llama3);
  EXPECT_EQ(format_of_template("chatml"), Format::hermes);
  EXPECT_EQ(format_of_template("{{ messages }}"), Format::none);
}

TEST(ToolCalls, StreamingHoldsBackOnlyWhatCouldBeACall) {
  // Hermes: content streams; a tail that may open "<tool_call>" waits; the marker stops the stream.
  EXPECT_EQ(streamable(Format::hermes, "Sure, the weather").content, 17u);
  EXPECT_EQ(streamable(Format::hermes, "Sure <tool_c").content, 5u);
  EXPECT_FALSE(streamable(Format::hermes, "Sure <tool_c").call_began);
  EXPECT_EQ(streamable(Format::hermes, "Sure <b>").content, 8u); // '<' then not the marker
  const auto h = streamable(Format::hermes, "Let me look.\n<tool_call>{\"name\"");
  EXPECT_TRUE(h.call_began);
  EXPECT_EQ(h.content, 13u);
  // Mistral: the same with [TOOL_CALLS].
  EXPECT_EQ(streamable(Format::mistral, "ok [TOOL").content, 3u);
  EXPECT_TRUE(streamable(Format::mistral, "[TOOL_CALLS][{").call_began);
  // Llama 3: a reply that opens with '{' is held whole; whitespace alone waits; text streams.
  EXPECT_TRUE(streamable(Format::llama3, "  {\"name\": ").call_began);
  EXPECT_EQ(streamable(Format::llama3, "  {\"name\": ").content, 0u);
  EXPECT_EQ(streamable(Format::llama3, "\n").content, 0u);
  EXPECT_EQ(streamable(Format::llama3, "Paris is").content, 8u);
  EXPECT_EQ(streamable(Format::llama3, "x <|python").content, 2u);
  EXPECT_EQ(streamable(Format::none, "<tool_call>").content, 11u);
  // What streams before a call, plus the parsed calls, is the reply: the content is never lost.
  const std::string reply = "Checking. <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";
  const auto st = streamable(Format::hermes, reply);
  EXPECT_EQ(reply.substr(0, st.content), "Checking. ");
  EXPECT_EQ(parse(Format::hermes, reply).content, "Checking.");
}

} // namespace
