// `loom serve`: what one OpenAI request asks of the engine (Ask), read from its body: the prompt (a chat's
// messages through the template, or a completion's text or token ids), the lengths, the sampling and stop
// rules, logprobs and tool calls. Every value is checked here: what is wrong is the client's 4xx, naming
// the field.
#pragma once

#include "serve.hpp"

namespace loom::cli::serve {

// What one OpenAI request asks of the engine.
struct Ask {
  std::vector<TokenId> prompt;
  int64_t n = 1;
  int32_t max_tokens = -1;
  std::optional<uint64_t> seed;
  bool stream = false, include_usage = false;
  bool logprobs = false;
  int32_t top_logprobs = 0; // alternatives per token (chat: top_logprobs; completions: logprobs = N)
  json ab; // the A/B split that chose this pipeline ({split, variant}), reported in every reply
  // tool_choice "required" or a named function: the reply is constrained to one call's JSON
  // ({"name", "arguments"} of the allowed functions), so a call always comes, whatever the model.
  std::string forced_call_schema;
  bool tools = false; // the request gave tools (and tool_choice is not "none"): replies are parsed for calls
  std::shared_ptr<SequenceTemplate> sequence;
  // The prompt's chat template and tokenizer: the first parts of its time to first token.
  double render_ms = 0, tokenize_ms = 0;
};

// The Ask of a body that passed check_shape (chat: /v1/chat/completions, else /v1/completions). Throws
// BadRequest.
Ask ask_of(const json& j, Service& s, bool chat);

} // namespace loom::cli::serve
