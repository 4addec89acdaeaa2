// Chat templates (loom/chat/chat.hpp) against Python jinja2 3.1 as transformers configures it: 21 real
// model templates × 10 conversations × generation prompt on/off (tests/data/chat/expected.json), and
// 54 small templates that pin the renderer's semantics one at a time (snippets_expected.json) —
// both written by tests/data/chat/make_expected.py, so no Python runs here. Then what jinja2 does
// not decide: error lines, bounds on hostile templates, the built-in templates; `loom template render`.
// (`loom template` with a model file: tests/integration/test_chat_template.cpp.)
#include "loom/chat/chat.hpp"
#include "loom/error.hpp"
#include "test_util.hpp"

#include <chrono>
#include <gtest/gtest.h>
#include <map>

namespace {

using loom::chat::RenderInput;
using loom::chat::Template;
using loom::test::read_file;
using json = nlohmann::ordered_json;

const std::string k_dir = std::string(LOOM_SOURCE_DIR) + "/tests/data/chat/";

json read_json(const std::string& path) {
  return json::parse(read_file(path));
}

std::tm frozen_clock() { // make_expected.py's FIXED_NOW: 2026-07-26 00:00:00, a Sunday
  std::tm t{};
  t.tm_year = 2026 - 1900;
  t.tm_mon = 6;
  t.tm_mday = 26;
  t.tm_wday = 0;
  t.tm_yday = 206;
  return t;
}

// What happened when rendering: the text, or the error message.
struct Outcome {
  std::string text, error;
};

Outcome render(const std::string& source, const RenderInput& in, const std::string& name = "t") {
  Outcome o;
  try {
    o.text = Template(source, name).render(in);
  } catch (const loom::Error& e) {
    o.error = e.what();
  }
  return o;
}

TEST(ChatTemplate, RealTemplatesRenderAsJinja2Does) {
  const json conv = read_json(k_dir + "conversations.json");
  std::map<std::string, json> convs;
  for (const auto& c : conv["conversations"])
    convs[c["name"].get<std::string>()] = c;
  const json cases = read_json(k_dir + "expected.json");
  ASSERT_GE(cases.size(), 400u);
  std::map<std::string, std::string> sources;
  int texts = 0, errors = 0;
  for (const auto& c : cases) {
    const std::string name = c["template"];
    if (!sources.count(name)) sources[name] = read_file(k_dir + "templates/" + name);
    const json& cv = convs.at(c["conversation"].get<std::string>());
    RenderInput in;
    in.messages = cv["messages"];
    if (cv.contains("tools")) in.tools = cv["tools"];
    in.add_generation_prompt = c["add_generation_prompt"];
    if (!c["bos_token"].is_null()) in.bos_token = c["bos_token"].get<std::string>();
    if (!c["eos_token"].is_null()) in.eos_token = c["eos_token"].get<std::string>();
    in.extra = c["kwargs"];
    in.now = frozen_clock();
    SCOPED_TRACE(name + " × " + c["conversation"].get<std::string>() +
                 (c["add_generation_prompt"].get<bool>() ? " + generation prompt" : "") + " " +
                 c["kwargs"].dump());
    const Outcome o = render(sources[name], in, name);
    if (c["error"].is_null()) {
      EXPECT_EQ(o.error, "");
      EXPECT_EQ(o.text, c["output"].get<std::string>());
      ++texts;
    } else { // jinja2 raised (raise_exception, 'str' + None, …): so must we, naming the template's line
      EXPECT_NE(o.error, "") << "jinja2: " << c["error"] << "\nwe rendered: " << o.text;
      EXPECT_NE(o.error.find(name + " line "), std::string::npos) << o.error;
      ++errors;
    }
  }
  std::printf("%zu templates, %d renders equal to jinja2's, %d errors where jinja2 raised\n", sources.size(),
              texts, errors);
  EXPECT_GE(sources.size(), 20u);
}

TEST(ChatTemplate, SnippetsRenderAsJinja2Does) {
  const json cases = read_json(k_dir + "snippets_expected.json");
  ASSERT_GE(cases.size(), 50u);
  RenderInput in;
  in.messages = json::parse(R"([{"role": "user", "content": "hi"}])");
  in.add_generation_prompt = false;
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.now = frozen_clock();
  for (const auto& c : cases) {
    const std::string src = c["template"];
    SCOPED_TRACE(src);
    const Outcome o = render(src, in);
    if (c["error"].is_null()) {
      EXPECT_EQ(o.error, "");
      EXPECT_EQ(o.text, c["output"].get<std::string>());
    } else {
      EXPECT_NE(o.error, "") << "jinja2: " << c["error"] << "\nwe rendered: " << o.text;
    }
  }
}

TEST(ChatTemplate, ErrorsAreOneLineNamingTheTemplateLine) {
  RenderInput in;
  const auto parse_error = [](const std::string& src) {
    try {
      Template t(src, "my.jinja");
    } catch (const loom::Error& e) {
      EXPECT_EQ(e.code(), loom::Errc::parse_error);
      return std::string(e.what());
    }
    return std::string("(parsed)");
  };
  EXPECT_EQ(parse_error("a\nb\n{% for x in %}"),
            "chat: my.jinja line 3: expected an expression, found the end of the tag");
  EXPECT_EQ(parse_error("{% if x %}\n\nno end"),
            "chat: my.jinja line 3: expected 'elif' or 'else' or 'endif' before the end of the template");
  EXPECT_EQ(parse_error("{% for m in messages %}\n{% endif %}"),
            "chat: my.jinja line 2: unexpected 'endif'; expected 'else' or 'endfor'");
  EXPECT_EQ(parse_error("x\n{{ 'open"), "chat: my.jinja line 2: unterminated string literal");
  EXPECT_EQ(parse_error("{% include 'x' %}"),
            "chat: my.jinja line 1: the 'include' tag is not supported by this Jinja subset");
  EXPECT_EQ(parse_error("{{ a | }}"), "chat: my.jinja line 1: expected a name, found the end of the tag");
  try {
    Template("one\ntwo {{ raise_exception('Conversation roles must alternate') }}", "my.jinja").render(in);
    FAIL() << "raise_exception did not raise";
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), loom::Errc::invalid_argument);
    EXPECT_STREQ(e.what(), "chat: my.jinja line 2: Conversation roles must alternate");
  }
  const Outcome plus = render("\n\n{{ 'a' + {} }}", in);
  EXPECT_EQ(plus.error, "chat: t line 3: unsupported operand types for +: 'str' and 'dict'");
  EXPECT_EQ(render("{{ unknown_filter_test | nope }}", in).error, "chat: t line 1: no filter named 'nope'");
  EXPECT_EQ(render("{{ x.y }}", in).error, "chat: t line 1: 'x' is undefined");
  EXPECT_NE(render("{% set l = [] %}{{ l.append(1) }}", in).error.find("unsafe"), std::string::npos);
}

// Untrusted templates cannot run away: loops, recursion and output are bounded, each with its own error,
// and quickly.
TEST(ChatTemplate, HostileTemplatesHitTheirBounds) {
  RenderInput in;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(render("{% for i in range(1000000000) %}{% endfor %}", in).error.find("range() of more than"),
            std::string::npos);
  EXPECT_NE(render("{{ [1, 2] * 600000 }}", in).error.find("list repetition of more than"),
            std::string::npos);
  loom::chat::Limits few;
  few.max_steps = 100000;
  try { // nested loops: the steps of both count
    Template("{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}").render(in, few);
    FAIL() << "the step bound did not hold";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("ran more than 100000 steps"), std::string::npos) << e.what();
  }
  EXPECT_NE(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", in).error.find("nesting deeper"),
            std::string::npos);
  EXPECT_NE(render("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", in).error.find("exceeds"),
            std::string::npos);
  EXPECT_NE(render("{{ 'x' * 100000000000 }}", in).error, "");
  EXPECT_NE(render("{{ 9223372036854775807 + 1 }}", in).error.find("overflow"), std::string::npos);
  EXPECT_NE(render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", in)
                .error.find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(render("{{ " + std::string(5000, '-') + "1 }}", in).error.find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(render("{{ " + std::string(5000, '(') + " }}", in).error.find("unclosed tag"), std::string::npos);
  std::string deep_list = "{{ " + std::string(3000, '[') + std::string(3000, ']') + " }}";
  EXPECT_NE(render(deep_list, in).error, "");
  loom::chat::Limits small;
  small.max_output = 10;
  try {
    Template("{{ 'abcdefghijk' }}").render(in, small);
    FAIL() << "the output bound did not hold";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds 10 bytes"), std::string::npos) << e.what();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 60.0) << "bounded templates should fail fast";
}

// transformers' message normalization: null keys dropped, except a null content, which the template sees as
// none (DeepSeek-style tool-call templates test `message['content'] is none`); a reasoning field under both
// names.
TEST(ChatTemplate, MessagesAreNormalizedAsTransformersDoes) {
  RenderInput in;
  in.messages = json::parse(R"([{"role": "assistant", "content": null, "reasoning": "r", "name": null}])");
  const Outcome o = render("{% for m in messages %}{{ m.content is defined }} {{ m['content'] is none }} "
                           "{{ m.name is defined }} {{ m|tojson }}{% endfor %}",
                           in);
  EXPECT_EQ(o.error, "");
  EXPECT_EQ(
      o.text,
      R"(True True False {"thinking": "r", "role": "assistant", "content": null, "reasoning": "r", "reasoning_content": "r"})");
}

TEST(ChatTemplate, BuiltinTemplatesRenderEachFamilysFormat) {
  RenderInput in;
  in.messages = json::parse(R"([{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": "Hello."},
                                {"role": "user", "content": "Bye"}])");
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  const std::map<std::string, std::string> want = {
      {"chatml",
       "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
       "Hello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"},
      {"llama2", "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]"},
      {"llama3",
       "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
       "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant"
       "<|end_header_id|>\n\n"},
      {"mistral", "<s>[INST] Be brief.\n\nHi [/INST]Hello.</s>[INST] Bye [/INST]"},
      {"gemma",
       "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
       "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"},
      {"phi3", "<|system|>\nBe "
               "brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n<|user|>\nBye<|end|>\n"
               "<|assistant|>\n"},
  };
  ASSERT_EQ(loom::chat::builtin_template_names().size(), want.size());
  for (const auto name : loom::chat::builtin_template_names()) {
    SCOPED_TRACE(std::string(name));
    const auto src = loom::chat::builtin_template(name);
    ASSERT_TRUE(src.has_value());
    const Outcome o = render(std::string(*src), in, std::string(name));
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.text, want.at(std::string(name)));
  }
  EXPECT_FALSE(loom::chat::builtin_template("nope").has_value());
  // Roles out of order are the template's own error.
  RenderInput bad = in;
  bad.messages = json::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  EXPECT_NE(
      render(std::string(*loom::chat::builtin_template("llama2")), bad, "llama2").error.find("alternate"),
      std::string::npos);
}

} // namespace

// ---- `loom template` ---------------------------------------------------------------------------

namespace {

using loom::test::write_temp;

TEST(TemplateCli, RendersExactlyWhatTheTemplateGives) {
  LOOM_REQUIRE_BIN();
  const std::string msgs = write_temp(
      "tpl", "m.json", R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])");
  const auto r = loom::test::run_loom("template render -t chatml --messages " + msgs, false);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(
      r.out,
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const auto no_gp =
      loom::test::run_loom("template render -t chatml --no-generation-prompt --messages " + msgs, false);
  EXPECT_EQ(no_gp.out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  // A real template from a file, with the clock fixed and an extra variable.
  const std::string qwen3 = k_dir + "templates/Qwen-Qwen3-0.6B.jinja";
  const auto think = loom::test::run_loom(
      "template render -t " + qwen3 + " --messages " + msgs + " --var enable_thinking=false", false);
  ASSERT_EQ(think.code, 0) << think.err;
  EXPECT_EQ(think.out.substr(think.out.size() - 41), "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  const std::string l32 = k_dir + "templates/meta-llama-Llama-3.2-3B-Instruct.jinja";
  const auto dated = loom::test::run_loom(
      "template render -t " + l32 + " --messages " + msgs + " --bos B --now 2026-07-04", false);
  ASSERT_EQ(dated.code, 0) << dated.err;
  EXPECT_NE(dated.out.find("Today Date: 04 Jul 2026\n"), std::string::npos) << dated.out;
  EXPECT_EQ(dated.out.rfind("B<|start_header_id|>system<|end_header_id|>", 0), 0u) << dated.out;
  // {"messages": …, "tools": …} in one file, as an OpenAI request has them.
  const std::string req =
      write_temp("tpl", "req.json", R"({"messages": [{"role": "user", "content": "Weather?"}],
                      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]})");
  const auto tools = loom::test::run_loom(
      "template render -t " + k_dir + "templates/Qwen-Qwen2.5-7B-Instruct.jinja --messages " + req, false);
  ASSERT_EQ(tools.code, 0) << tools.err;
  EXPECT_NE(tools.out.find("{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""),
            std::string::npos)
      << tools.out;
  const auto list = loom::test::run_loom("template list", false);
  EXPECT_EQ(list.out, "chatml\nllama2\nllama3\nmistral\ngemma\nphi3\n");
}

} // namespace
