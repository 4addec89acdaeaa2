// Chat templates meet models: which template a command uses, and a conversation as prompt tokens.
#include "loom/chat.hpp"
#include "loom/error.hpp"
#include "loom/gguf.hpp"
#include "loom/tokenizer.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace loom::chat {

Template load_template(const std::string& spec, const GgufFile* model) {
  std::string names;
  for (const auto n : builtin_template_names())
    names += (names.empty() ? "" : ", ") + std::string(n);
  if (spec.empty()) {
    const auto t = model ? model->get_string_opt("tokenizer.chat_template") : std::nullopt;
    if (!t)
      fail(Errc::not_found, "chat",
           (model ? model->path() + " has no tokenizer.chat_template" : std::string("no model")) +
               "; name a template with --template (" + names + ", or a Jinja file)");
    return Template(*t, "tokenizer.chat_template");
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
