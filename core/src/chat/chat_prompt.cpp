// Chat templates meet models: which template a command uses, and a conversation as prompt tokens.
#include "loom/chat/chat.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <chrono>
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

std::optional<std::string> messages_problem(const nlohmann::ordered_json& m) {
  if (!m.is_array() || m.empty())
    return "\"messages\" must be a non-empty array of {role, content}, found " +
           (m.is_array() ? std::string("an empty array") : std::string(m.type_name()));
  for (size_t i = 0; i < m.size(); ++i) {
    const auto& msg = m[i];
    const std::string which = "message " + std::to_string(i);
    if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string())
      return which + " is not an object with a string \"role\"";
    const auto c = msg.find("content");
    if (c == msg.end() || c->is_null() || c->is_string()) continue;
    if (!c->is_array())
      return which + ": \"content\" must be a string, null or an array of {type, text} parts";
    for (const auto& part : *c)
      if (!part.is_object() || (part.contains("text") && !part["text"].is_string()))
        return which + ": each part of \"content\" must be an object {type, text: string}";
  }
  return std::nullopt;
}

namespace {

std::string content_text(const nlohmann::ordered_json& msg) {
  const auto c = msg.find("content");
  if (c == msg.end() || c->is_null()) return "";
  if (c->is_string()) return c->get<std::string>();
  std::string out;
  for (const auto& part : *c)
    if (part.contains("text")) out += (out.empty() ? "" : "\n") + part["text"].get<std::string>();
  return out;
}

} // namespace

std::string last_user_text(const nlohmann::ordered_json& messages) {
  if (messages.empty()) return "";
  for (auto it = messages.rbegin(); it != messages.rend(); ++it)
    if ((*it)["role"] == "user") return content_text(*it);
  return content_text(messages.back());
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

namespace {

// A user's text that spells a control token is marked before rendering (noncharacters U+FDD0 … U+FDD1
// around it, which no user text keeps) and found again in the rendered prompt, where it is tokenized as
// text. Marking only those spans, not whole messages, leaves what templates do to content (trim, compare,
// slice) unchanged.
constexpr std::string_view k_open = "\xEF\xB7\x90", k_close = "\xEF\xB7\x91";

std::vector<std::string_view> control_texts(const Tokenizer& tok) {
  std::vector<std::string_view> v;
  for (TokenId i = 0; i < tok.vocab_size(); ++i)
    if (const TokenType ty = tok.token_type(i); ty == TokenType::control || ty == TokenType::unknown)
      if (const std::string& p = tok.piece(i); !p.empty()) v.push_back(p);
  return v;
}

std::string mark_controls(std::string s, const std::vector<std::string_view>& controls) {
  for (const std::string_view m : {k_open, k_close})
    for (size_t at; (at = s.find(m)) != std::string::npos;)
      s.erase(at, m.size());
  std::vector<std::pair<size_t, size_t>> spans;
  for (const std::string_view c : controls)
    for (size_t at = s.find(c); at != std::string::npos; at = s.find(c, at + 1))
      spans.emplace_back(at, at + c.size());
  if (spans.empty()) return s;
  std::sort(spans.begin(), spans.end());
  std::string out;
  size_t pos = 0;
  for (size_t i = 0; i < spans.size();) {
    auto [b, e] = spans[i];
    for (++i; i < spans.size() && spans[i].first < e; ++i) // overlapping matches: one span
      e = std::max(e, spans[i].second);
    out.append(s, pos, b - pos).append(k_open).append(s, b, e - b).append(k_close);
    pos = e;
  }
  return out.append(s, pos);
}

void mark_strings(nlohmann::ordered_json& j, const std::vector<std::string_view>& controls, int depth) {
  if (j.is_string())
    j = mark_controls(j.get<std::string>(), controls);
  else if (depth < 256 && (j.is_array() || j.is_object()))
    for (auto& e : j)
      mark_strings(e, controls, depth + 1);
}

// The rendered text without its marks, and the byte ranges they enclosed.
std::string unmark(const std::string& text, std::vector<std::pair<size_t, size_t>>& literal) {
  std::string out;
  out.reserve(text.size());
  size_t open = std::string::npos;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, k_open.size(), k_open) == 0) {
      if (open == std::string::npos) open = out.size();
      i += k_open.size();
    } else if (text.compare(i, k_close.size(), k_close) == 0) {
      if (open != std::string::npos) literal.emplace_back(open, out.size());
      open = std::string::npos;
      i += k_close.size();
    } else {
      out += text[i++];
    }
  }
  if (open != std::string::npos) literal.emplace_back(open, out.size()); // a template cut the text
  return out;
}

} // namespace

ChatPrompt chat_prompt(const Template& t, RenderInput in, const Tokenizer& tok, bool specials_in_content) {
  std::string bos_text;
  if (tok.bos() >= 0) bos_text = tok.piece(tok.bos());
  if (!in.bos_token && tok.bos() >= 0) in.bos_token = bos_text;
  if (!in.eos_token && tok.eos() >= 0) in.eos_token = tok.piece(tok.eos());
  EncodeOptions o;
  o.parse_special = true;
  ChatPrompt p;
  const auto t0 = std::chrono::steady_clock::now();
  if (specials_in_content) {
    p.text = t.render(in);
  } else {
    const auto controls = control_texts(tok);
    mark_strings(in.messages, controls, 0);
    mark_strings(in.tools, controls, 0);
    p.text = unmark(t.render(in), o.literal);
  }
  if (!bos_text.empty() && p.text.rfind(bos_text, 0) == 0) o.add_bos = false; // the template wrote it
  o.add_eos = false;
  const auto t1 = std::chrono::steady_clock::now();
  p.tokens = tok.encode(p.text, o);
  p.render_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  p.tokenize_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  return p;
}

} // namespace loom::chat
