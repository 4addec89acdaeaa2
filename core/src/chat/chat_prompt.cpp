// Chat templates meet models: which template a command uses, and a conversation as prompt tokens.
#include "loom/chat.hpp"
#include "loom/error.hpp"
#include "loom/gguf.hpp"
#include "loom/tokenizer.hpp"

#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace loom::chat {

std::optional<std::string_view> builtin_for_vocabulary(const GgufFile& model) {
  const GgufValue* v = model.get_array("tokenizer.ggml.tokens", GgufType::string);
  if (!v) return std::nullopt;
  // Each format's end-of-turn token and another of its markers, most specific first.
  static constexpr std::array<std::array<std::string_view, 3>, 4> k_formats = {{
      {"gemma", "<start_of_turn>", "<end_of_turn>"},
      {"llama3", "<|start_header_id|>", "<|eot_id|>"},
      {"chatml", "<|im_start|>", "<|im_end|>"},
      {"phi3", "<|assistant|>", "<|end|>"},
  }};
  std::array<int, k_formats.size()> found{};
  for (size_t i = 0; i < v->items.size(); ++i) {
    const std::string_view piece = v->items.str(i);
    if (piece.size() < 5 || piece.front() != '<') continue;
    for (size_t f = 0; f < k_formats.size(); ++f)
      if (piece == k_formats[f][1] || piece == k_formats[f][2]) ++found[f];
  }
  for (size_t f = 0; f < k_formats.size(); ++f)
    if (found[f] == 2) return k_formats[f][0];
  return std::nullopt;
}

Template load_template(const std::string& spec, const GgufFile* model) {
  std::string names;
  for (const auto n : builtin_template_names())
    names += (names.empty() ? "" : ", ") + std::string(n);
  if (spec.empty()) {
    const auto t = model ? model->get_string_opt("tokenizer.chat_template") : std::nullopt;
    if (t) return Template(*t, "tokenizer.chat_template");
    // No template in the file (some conversions drop it): the built-in format whose turn markers the
    // vocabulary holds as tokens, as a user would pick by hand.
    if (const auto b = model ? builtin_for_vocabulary(*model) : std::nullopt)
      return Template(std::string(*builtin_template(*b)),
                      std::string(*b) + " (built in: " + model->path() +
                          " has no tokenizer.chat_template; its vocabulary "
                          "has this format's turn tokens)");
    fail(Errc::not_found, "chat",
         (model ? model->path() + " has no tokenizer.chat_template" : std::string("no model")) +
             "; name a template with --template (" + names + ", or a Jinja file)");
  }
  if (const auto b = builtin_template(spec)) return Template(*b, spec);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(spec, ec))
    fail(Errc::not_found, "chat",
         "template '" + spec + "': neither a built-in template (" + names + ") nor a file");
  std::ifstream f(spec, std::ios::binary);
  std::ostringstream text;
  text << f.rdbuf();
  if (!f && !f.eof()) fail(Errc::not_found, "chat", "template '" + spec + "': cannot read the file");
  return Template(text.str(), spec);
}

ChatPrompt chat_prompt(const Template& t, RenderInput in, const Tokenizer& tok) {
  std::string bos_text;
  if (tok.bos() >= 0) bos_text = tok.piece(tok.bos());
  if (!in.bos_token && tok.bos() >= 0) in.bos_token = bos_text;
  if (!in.eos_token && tok.eos() >= 0) in.eos_token = tok.piece(tok.eos());
  ChatPrompt p;
  p.text = t.render(in);
  EncodeOptions o;
  o.parse_special = true;
  if (!bos_text.empty() && p.text.rfind(bos_text, 0) == 0) o.add_bos = false; // the template wrote it
  o.add_eos = false;
  p.tokens = tok.encode(p.text, o);
  return p;
}

} // namespace loom::chat
