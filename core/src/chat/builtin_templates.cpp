// Built-in chat templates for models whose GGUF has no `tokenizer.chat_template`: the prompt formats
// of the common families, written for the renderer in jinja*.cpp (each is a template, so `loom template
// render --template NAME` shows exactly what a model is fed).
#include "loom/chat/chat.hpp"

#include <array>
#include <utility>

namespace loom::chat {

namespace {

// ChatML (Qwen, Hermes, SmolLM, …): <|im_start|>role\ncontent<|im_end|>\n per message.
constexpr std::string_view k_chatml =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

// Llama 2 chat: [INST] … [/INST] turns, the system prompt in <<SYS>> inside the first one.
constexpr std::string_view k_llama2 =
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set system = none %}{%- set turns = messages %}{%- endif %}"
    "{%- for message in turns %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('llama2: roles must alternate user, assistant, user, … after an optional system "
    "message') }}"
    "{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{%- set content = message['content'] %}"
    "{%- if loop.first and system is not none %}"
    "{%- set content = '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + content %}"
    "{%- endif %}"
    "{{- bos_token + '[INST] ' + content | trim + ' [/INST]' }}"
    "{%- else %}"
    "{{- ' ' + message['content'] | trim + ' ' + eos_token }}"
    "{%- endif %}"
    "{%- endfor %}";

// Llama 3 / 3.1 / 3.2: header ids around the role, <|eot_id|> after each message.
constexpr std::string_view k_llama3 =
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}";

// Mistral instruct (v0.1–v0.3 without tools): [INST] … [/INST]; a system prompt joins the first user turn.
constexpr std::string_view k_mistral =
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set system = none %}{%- set turns = messages %}{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in turns %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('mistral: roles must alternate user, assistant, user, … after an optional system "
    "message') }}"
    "{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system is not none %}"
    "{{- '[INST] ' + system + '\\n\\n' + message['content'] + ' [/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + ' [/INST]' }}{%- endif %}"
    "{%- else %}{{- message['content'] + eos_token }}{%- endif %}"
    "{%- endfor %}";

// Gemma / Gemma 2: <start_of_turn>user|model … <end_of_turn>; a system prompt joins the first user turn.
constexpr std::string_view k_gemma =
    "{{- bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] | trim + '\\n\\n' %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set turns = messages %}{%- endif %}"
    "{%- for message in turns %}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{%- set prefix = system if loop.first and role == 'user' else '' %}"
    "{{- '<start_of_turn>' + role + '\\n' + prefix + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}";

// Phi-3 / Phi-3.5: <|role|>\ncontent<|end|>\n.
constexpr std::string_view k_phi3 =
    "{%- for message in messages %}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- else %}{{- eos_token }}{%- endif %}";

constexpr std::array<std::pair<std::string_view, std::string_view>, 6> k_builtin = {{
    {"chatml", k_chatml},
    {"llama2", k_llama2},
    {"llama3", k_llama3},
    {"mistral", k_mistral},
    {"gemma", k_gemma},
    {"phi3", k_phi3},
}};

} // namespace

std::optional<std::string_view> builtin_template(std::string_view name) {
  for (const auto& [n, src] : k_builtin)
    if (n == name) return src;
  return std::nullopt;
}

std::vector<std::string_view> builtin_template_names() {
  std::vector<std::string_view> out;
  for (const auto& b : k_builtin)
    out.push_back(b.first);
  return out;
}

} // namespace loom::chat
