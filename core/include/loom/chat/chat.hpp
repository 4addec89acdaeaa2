// loom/chat/chat.hpp — chat templates: a model's `tokenizer.chat_template` (a Jinja template) rendered as
// Hugging Face transformers renders it (jinja2 with trim_blocks, lstrip_blocks, loop controls; its
// `tojson`, `raise_exception` and `strftime_now`), by a Jinja subset written for this job — the
// statements, expressions, filters, tests and methods real templates use (docs/chat.md lists them).
//
// Templates are untrusted input: they reach no file, environment or clock (strftime_now reads the
// clock the caller gives), every loop, recursion and the output are bounded, and an error — a syntax
// error, raise_exception(), `'a' + {}` — is one loom::Error naming the template's line.
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {
class GgufFile;
class Tokenizer;
} // namespace loom

namespace loom::chat {

// What a template sees: `messages`, `tools`, `add_generation_prompt`, `bos_token`, `eos_token`, and
// any further variables (`enable_thinking`, `date_string`, …). JSON key order is kept (dicts iterate
// in insertion order, as in Python). Messages are normalized as transformers does: keys whose value
// is null are dropped, and a reasoning field (reasoning_content / thinking / reasoning) is given as
// both `thinking` and `reasoning_content`.
struct RenderInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array(); // [{role, content, …}, …]
  nlohmann::ordered_json tools;                                      // an array, or null: `tools` is none
  bool add_generation_prompt = true;
  std::optional<std::string> bos_token, eos_token; // unset: undefined in the template (as transformers)
  nlohmann::ordered_json extra = nlohmann::ordered_json::object(); // more variables, by name
  std::optional<std::tm> now; // strftime_now()'s clock; unset: the local time at render
};

// What is wrong with OpenAI-style `messages` — a non-empty array of objects with a string "role" and a
// "content" that is a string, null or an array of {type, text: string} parts — or nullopt when nothing
// is. The one check of every command that takes messages (loom run --messages, loom ab's JSONL, serve).
std::optional<std::string> messages_problem(const nlohmann::ordered_json& messages);

// The text of a conversation's last user turn (of its last turn when no turn is a user's): its content
// string, or its text parts joined by newlines — what a report shows of the conversation, without markup.
// `messages` has passed messages_problem.
std::string last_user_text(const nlohmann::ordered_json& messages);

// Bounds for untrusted templates; exceeding one is an error naming it.
struct Limits {
  size_t max_output = size_t{16} << 20; // bytes rendered, macro calls' output included
  int64_t max_steps = 5'000'000;        // statements run and loop iterations, all together
  int max_depth = 200;                  // nested macro calls and expression nesting
};

class Template {
public:
  // Parses `source`; a syntax error throws loom::Error (parse_error): "<name> line N: what".
  explicit Template(std::string_view source, std::string name = "chat template");
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

  // The rendered prompt. raise_exception(msg) and every run-time error throw loom::Error
  // (invalid_argument): "<name> line N: msg".
  std::string render(const RenderInput& in, const Limits& limits = {}) const;
  const std::string& name() const noexcept;

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The built-in templates, for models without one: chatml, llama2, llama3, mistral, gemma, phi3.
std::optional<std::string_view> builtin_template(std::string_view name);
std::vector<std::string_view> builtin_template_names();

// The template a command uses: `spec` names a built-in template or a Jinja file; empty: the model's
// `tokenizer.chat_template`. Throws loom::Error saying what to do when there is none.
Template load_template(const std::string& spec, const GgufFile* model);
// The built-in template whose turn tokens the model's vocabulary holds (gemma, llama3, chatml, phi3), for a
// file without tokenizer.chat_template; nullopt when none matches.
std::optional<std::string_view> builtin_for_vocabulary(const GgufFile& model);

// A conversation as prompt tokens for a model: rendered with the tokenizer's BOS/EOS text (unless
// `in` sets them), then tokenized with the template's special-token text parsed (so its "<|im_end|>" is
// that one token) but the messages' and tools' own text as text: a user who writes "<|im_end|>" gets
// those characters, not a turn boundary (specials_in_content: parsed there too, the old way). BOS is
// added only when the model adds one and the rendered text does not already begin with it (as
// llama.cpp does: most templates write bos_token themselves).
struct ChatPrompt {
  std::string text;
  std::vector<int32_t> tokens;
  double render_ms = 0, tokenize_ms = 0; // the two parts' wall time (serve's TTFT breakdown)
};
ChatPrompt chat_prompt(const Template& t, RenderInput in, const Tokenizer& tok,
                       bool specials_in_content = false);

} // namespace loom::chat
