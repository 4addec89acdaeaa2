// `loom template render` and a model file: errors name the template's line or the flag, a model without a
// chat template says so, and -m gives a named template the model's BOS/EOS text. (The renderer against
// jinja2 and `loom template` without a model: tests/unit/test_chat_template.cpp.)
#include "test_util.hpp"

#include <filesystem>
#include <gtest/gtest.h>
#include <string>

namespace {

using loom::test::write_temp;

const std::string k_dir = std::string(LOOM_SOURCE_DIR) + "/tests/data/chat/";

TEST(TemplateCli, ErrorsNameTheLineOrTheFlag) {
  LOOM_REQUIRE_BIN();
  const std::string msgs = write_temp(
      "tpl", "m2.json", R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}])");
  const auto raised = loom::test::run_loom(
      "template render -t " + k_dir + "templates/google-gemma-2-2b-it.jinja --messages " + msgs, false);
  EXPECT_EQ(raised.code, 1);
  EXPECT_EQ(raised.err, "loom: error: chat: " + k_dir +
                            "templates/google-gemma-2-2b-it.jinja line 1: System role not supported\n");
  const std::string broken =
      write_temp("tpl", "broken.jinja", "line one\n{% for m in messages %}\n{{ m.role }}\n");
  const auto syntax = loom::test::run_loom("template render -t " + broken + " --messages " + msgs, false);
  EXPECT_EQ(syntax.code, 1);
  EXPECT_NE(syntax.err.find(broken + " line 4: expected 'else' or 'endfor' before the end of the template"),
            std::string::npos)
      << syntax.err;
  const auto usage = loom::test::run_loom("template render --messages " + msgs, false);
  EXPECT_EQ(usage.code, 2);
  EXPECT_NE(usage.err.find("give --template NAME|FILE or -m MODEL"), std::string::npos) << usage.err;
  const auto unknown = loom::test::run_loom("template render -t nosuch --messages " + msgs, false);
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.err.find("neither a built-in template (chatml, llama2"), std::string::npos)
      << unknown.err;
  const std::string not_json = write_temp("tpl", "bad.json", "[{\"role\": ");
  const auto bad = loom::test::run_loom("template render -t chatml --messages " + not_json, false);
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("not JSON"), std::string::npos) << bad.err;
  const std::string no_role = write_temp("tpl", "norole.json", R"([{"content": "x"}])");
  const auto nr = loom::test::run_loom("template render -t chatml --messages " + no_role, false);
  EXPECT_EQ(nr.code, 1);
  EXPECT_NE(nr.err.find("message 0 is not an object with a string \"role\""), std::string::npos) << nr.err;
  const auto date =
      loom::test::run_loom("template render -t chatml --now 2026-02-30 --messages " + msgs, false);
  EXPECT_EQ(date.code, 2);
  EXPECT_NE(date.err.find("--now: no such day"), std::string::npos) << date.err;
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const auto none =
      loom::test::run_loom("template render -m " + model.string() + " --messages " + msgs, false);
  EXPECT_EQ(none.code, 1);
  EXPECT_NE(none.err.find("has no tokenizer.chat_template; name a template with --template (chatml, llama2"),
            std::string::npos)
      << none.err;
  // With --template, -m still gives the model's BOS/EOS text.
  const auto bos =
      loom::test::run_loom("template render -m " + model.string() + " -t llama2 --messages " + msgs, false);
  ASSERT_EQ(bos.code, 0) << bos.err;
  EXPECT_EQ(bos.out, "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nHi [/INST]");
}

} // namespace
