// tokenizer/tokenizer.cpp — GGUF vocabulary loading, Tokenizer::from_gguf and the shared parts
// of encoding (special tokens, BOS/EOS) and decoding (UTF-8 safe, incremental).
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "tokenizer/utf8.hpp"
#include "tokenizer/vocab.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace loom {

namespace tok {

namespace {

[[noreturn]] void bad(const Vocab& v, const std::string& msg) {
  fail(Errc::parse_error, "tokenizer", v.source + ": " + msg);
}

std::string describe(const GgufValue& v) {
  if (v.type == GgufType::array)
    return "an array of " + std::string(gguf_type_name(v.elem_type)) + " × " + std::to_string(v.items.size());
  return std::string(gguf_type_name(v.type)) + " " + v.to_string(3);
}

// The array at `key` (nullptr when missing); throws when it is not an array whose elements pass
// `elem_ok`.
template <class Pred>
const GgufValue* find_array(const GgufFile& f, const Vocab& v, std::string_view key, Pred elem_ok,
                            const char* expected) {
  const GgufValue* a = f.find(key);
  if (!a) return nullptr;
  if (a->type != GgufType::array || !elem_ok(a->elem_type))
    bad(v, std::string(key) + " should be " + expected + ", found " + describe(*a));
  return a;
}

void check_length(const Vocab& v, std::string_view key, size_t n, size_t n_tokens) {
  if (n != n_tokens)
    bad(v, std::string(key) + " has " + std::to_string(n) + " entries, expected " + std::to_string(n_tokens) +
               " (one per token of tokenizer.ggml.tokens)");
}

std::optional<TokenId> read_id(const GgufFile& f, const Vocab& v, std::string_view key) {
  const GgufValue* x = f.find(key);
  if (!x) return std::nullopt;
  if (!x->is_integer()) bad(v, std::string(key) + " should be an integer token id, found " + describe(*x));
  const std::optional<int64_t> id = x->as_int();
  // -1 and UINT32_MAX (and anything beyond int64) are how converters write "no such token".
  if (!id || *id == -1 || *id == static_cast<int64_t>(std::numeric_limits<uint32_t>::max())) return -1;
  const auto n = static_cast<int64_t>(v.pieces.size());
  if (*id < 0 || *id >= n)
    bad(v, std::string(key) + " = " + std::to_string(*id) + " is out of range: the vocabulary has " +
               std::to_string(n) + " tokens (ids 0.." + std::to_string(n - 1) + ")");
  return static_cast<TokenId>(*id);
}

std::optional<bool> read_bool(const GgufFile& f, const Vocab& v, std::string_view key) {
  const GgufValue* x = f.find(key);
  if (!x) return std::nullopt;
  if (x->type == GgufType::boolean) return x->u != 0;
  if (x->is_integer()) {
    const auto i = x->as_int();
    if (i && (*i == 0 || *i == 1)) return *i == 1;
  }
  bad(v, std::string(key) + " should be a bool, found " + describe(*x));
}

bool is_number_type(GgufType t) {
  return t == GgufType::f32 || t == GgufType::f64 || t == GgufType::i32 || t == GgufType::u32 ||
         t == GgufType::i64 || t == GgufType::u64 || t == GgufType::i16 || t == GgufType::u16 ||
         t == GgufType::i8 || t == GgufType::u8;
}
bool is_integer_type(GgufType t) {
  return is_number_type(t) && t != GgufType::f32 && t != GgufType::f64;
}

// Token texts llama.cpp treats as end of generation / end of turn / fill-in-the-middle markers.
constexpr std::string_view k_eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",         "<|endoftext|>",     "<|end_of_text|>",
    "<EOT>",      "_<EOT>",     "[EOT]",   "<｜end▁of▁sentence｜>", "<end_of_utterance>"};
constexpr std::string_view k_eog_texts[] = {"<|eot_id|>",
                                            "<|im_end|>",
                                            "<|end|>",
                                            "<|return|>",
                                            "<|call|>",
                                            "<|flush|>",
                                            "<|calls|>",
                                            "<end_of_turn>",
                                            "<|endoftext|>",
                                            "</s>",
                                            "<|eom_id|>",
                                            "<EOT>",
                                            "_<EOT>",
                                            "[EOT]",
                                            "[EOS]",
                                            "<|end_of_text|>",
                                            "<end_of_utterance>",
                                            "<eos>",
                                            "<turn|>",
                                            "<|tool_response>",
                                            "<｜end▁of▁sentence｜>",
                                            "[e~["};
// FIM pad / repo / file-separator markers: also end generation (llama.cpp special_eog_ids).
constexpr std::string_view k_fim_eog_texts[] = {"<|fim_pad|>", "<fim-pad>",    "<fim_pad>",     "<PAD>",
                                                "[PAD]",       "<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                                "<REPO>",      "<reponame>",   "<|file_sep|>"};
// FIM prefix / suffix / middle markers: control tokens, not end of generation.
constexpr std::string_view k_fim_texts[] = {
    "<|fim_prefix|>",  "<fim-prefix>",   "<fim_prefix>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>",
    "<|fim_suffix|>",  "<fim-suffix>",   "<fim_suffix>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>",
    "<|fim_middle|>",  "<fim-middle>",   "<fim_middle>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>",
    "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"};

template <size_t N> bool in(const std::string_view (&list)[N], std::string_view s) {
  return std::find(std::begin(list), std::end(list), s) != std::end(list);
}

} // namespace

Vocab read_vocab(const GgufFile& f) {
  Vocab v;
  v.source = f.path();

  const GgufValue* model = f.find("tokenizer.ggml.model");
  if (!model) bad(v, "tokenizer.ggml.model is missing: the file has no tokenizer (is it a GGUF model file?)");
  if (model->type != GgufType::string)
    bad(v, "tokenizer.ggml.model should be a string, found " + describe(*model));
  v.model = model->str;
  if (const GgufValue* pre = f.find("tokenizer.ggml.pre")) {
    if (pre->type != GgufType::string)
      bad(v, "tokenizer.ggml.pre should be a string, found " + describe(*pre));
    v.pre = pre->str;
  }
  if (v.pre.empty()) v.pre = "default";

  const GgufValue* tokens = find_array(
      f, v, "tokenizer.ggml.tokens", [](GgufType t) { return t == GgufType::string; }, "an array of strings");
  if (!tokens) bad(v, "tokenizer.ggml.tokens is missing: the file has no vocabulary");
  if (tokens->items.empty())
    bad(v, "tokenizer.ggml.tokens is empty: the vocabulary needs at least one token");
  if (tokens->items.size() > static_cast<size_t>(std::numeric_limits<TokenId>::max()))
    bad(v, "tokenizer.ggml.tokens has " + std::to_string(tokens->items.size()) +
               " entries, more than token ids allow");
  const size_t n = tokens->items.size();
  v.pieces.reserve(n);
  for (size_t i = 0; i < n; ++i)
    v.pieces.emplace_back(tokens->items.str(i));

  v.scores.assign(n, 0.0f);
  if (const GgufValue* a = find_array(f, v, "tokenizer.ggml.scores", is_number_type, "an array of f32")) {
    check_length(v, "tokenizer.ggml.scores", a->items.size(), n);
    for (size_t i = 0; i < n; ++i) {
      const double x = a->items.as_number(i).value_or(0.0);
      // NaN would break the merge order; it ranks below every real score instead.
      v.scores[i] = std::isnan(x) ? -std::numeric_limits<float>::infinity() : static_cast<float>(x);
    }
  }

  v.types.assign(n, TokenType::normal);
  if (const GgufValue* a =
          find_array(f, v, "tokenizer.ggml.token_type", is_integer_type, "an array of i32")) {
    check_length(v, "tokenizer.ggml.token_type", a->items.size(), n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = a->items.as_int(i).value_or(0);
      // Values llama.cpp does not know are "undefined" there too: such tokens decode to nothing.
      v.types[i] = (t >= 1 && t <= 6) ? static_cast<TokenType>(t) : TokenType::undefined;
    }
  }

  if (const GgufValue* a = find_array(
          f, v, "tokenizer.ggml.merges", [](GgufType t) { return t == GgufType::string; },
          "an array of strings")) {
    v.merges.reserve(a->items.size());
    for (size_t i = 0; i < a->items.size(); ++i)
      v.merges.emplace_back(a->items.str(i));
  }

  v.bos = read_id(f, v, "tokenizer.ggml.bos_token_id");
  v.eos = read_id(f, v, "tokenizer.ggml.eos_token_id");
  v.eot = read_id(f, v, "tokenizer.ggml.eot_token_id");
  v.eom = read_id(f, v, "tokenizer.ggml.eom_token_id");
  v.unk = read_id(f, v, "tokenizer.ggml.unknown_token_id");
  v.pad = read_id(f, v, "tokenizer.ggml.padding_token_id");
  v.add_bos = read_bool(f, v, "tokenizer.ggml.add_bos_token");
  v.add_eos = read_bool(f, v, "tokenizer.ggml.add_eos_token");
  v.add_space_prefix = read_bool(f, v, "tokenizer.ggml.add_space_prefix");
  v.remove_extra_whitespaces = read_bool(f, v, "tokenizer.ggml.remove_extra_whitespaces").value_or(false);
  return v;
}

// ---- TokenizerBase ------------------------------------------------------------------------------

TokenizerBase::TokenizerBase(Vocab v, const Settings& s) : vocab_(std::move(v)), s_(s) {
  const size_t n = vocab_.pieces.size();
  piece_to_id_.reserve(n);
  // A duplicated piece keeps its first id for encoding; every id still decodes.
  for (size_t i = 0; i < n; ++i)
    piece_to_id_.emplace(vocab_.pieces[i], static_cast<TokenId>(i));

  const bool explicit_bos = vocab_.add_bos.value_or(false);
  const bool explicit_eos = vocab_.add_eos.value_or(false);
  if (s_.add_bos && s_.bos < 0) {
    if (explicit_bos) bad(vocab_, "tokenizer.ggml.add_bos_token is true but the vocabulary has no BOS token");
    s_.add_bos = false;
  }
  if (s_.add_eos && s_.eos < 0) {
    if (explicit_eos) bad(vocab_, "tokenizer.ggml.add_eos_token is true but the vocabulary has no EOS token");
    s_.add_eos = false;
  }
  init_special_tokens();
}

void TokenizerBase::init_special_tokens() {
  const size_t n = vocab_.pieces.size();
  auto make_control = [&](size_t id) { vocab_.types[id] = TokenType::control; };

  // Recognize markers by their text (as llama.cpp does; GGUF has no per-token attributes) and
  // treat them as control tokens even where the converter typed them otherwise.
  std::vector<TokenId> eog;
  for (size_t id = 0; id < n; ++id) {
    const std::string& p = vocab_.pieces[id];
    if (s_.eot < 0 && in(k_eot_texts, p)) s_.eot = static_cast<TokenId>(id);
    if (s_.eom < 0 && p == "<|eom_id|>") s_.eom = static_cast<TokenId>(id);
    if (in(k_eot_texts, p) || in(k_fim_texts, p) || p == "<|eom_id|>") make_control(id);
    if (in(k_eog_texts, p) || in(k_fim_eog_texts, p)) {
      eog.push_back(static_cast<TokenId>(id));
      make_control(id);
    }
  }
  for (TokenId id : {s_.eos, s_.eot, s_.eom})
    if (id >= 0) eog.push_back(id);

  // gpt-oss / solar-open: "<|end|>" ends a message, not the generation, when these exist.
  auto has = [&](std::string_view text) {
    return std::any_of(eog.begin(), eog.end(),
                       [&](TokenId id) { return vocab_.pieces[static_cast<size_t>(id)] == text; });
  };
  auto drop = [&](std::string_view text, TokenType as) {
    for (TokenId id : eog)
      if (vocab_.pieces[static_cast<size_t>(id)] == text && id != s_.eos)
        vocab_.types[static_cast<size_t>(id)] = as;
    eog.erase(std::remove_if(
                  eog.begin(), eog.end(),
                  [&](TokenId id) { return vocab_.pieces[static_cast<size_t>(id)] == text && id != s_.eos; }),
              eog.end());
  };
  if ((has("<|return|>") && has("<|call|>") && has("<|end|>")) ||
      (has("<|calls|>") && has("<|flush|>") && has("<|end|>")))
    drop("<|end|>", TokenType::user_defined);
  // Gemma 4: "</s>" is not an end marker there.
  if (has("<|tool_response>") && has("</s>")) drop("</s>", TokenType::normal);

  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  eog_ = std::move(eog);
  is_eog_.assign(n, 0);
  for (TokenId id : eog_)
    is_eog_[static_cast<size_t>(id)] = 1;

  // Tokens matched in the text before tokenization, longest first.
  for (size_t id = 0; id < n; ++id) {
    const TokenType t = vocab_.types[id];
    if ((t == TokenType::control || t == TokenType::user_defined || t == TokenType::unknown) &&
        !vocab_.pieces[id].empty())
      special_.push_back(static_cast<TokenId>(id));
  }
  std::stable_sort(special_.begin(), special_.end(), [&](TokenId a, TokenId b) {
    return vocab_.pieces[static_cast<size_t>(a)].size() > vocab_.pieces[static_cast<size_t>(b)].size();
  });
}

std::optional<uint8_t> TokenizerBase::parse_byte_piece(std::string_view p) noexcept {
  if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(p[3]), lo = hex(p[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

std::array<TokenId, 256> TokenizerBase::find_byte_tokens() const {
  std::array<TokenId, 256> ids{};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    ids[static_cast<size_t>(b)] = find(buf);
  }
  return ids;
}

std::vector<TokenizerBase::Fragment> TokenizerBase::partition(std::string_view text,
                                                              const EncodeOptions& opts) const {
  std::vector<Fragment> frags, next;
  if (text.empty()) return frags;
  frags.push_back({0, text.size(), -1});
  // Whether [at, at + n) overlaps a literal range (where only user-defined tokens match).
  const auto literal = [&](size_t at, size_t n) {
    for (const auto& [b, e] : opts.literal)
      if (at < e && b < at + n) return true;
    return false;
  };
  for (TokenId id : special_) {
    // Without parse_special only user-defined tokens (Hugging Face "added tokens" that are not
    // special) are matched, as Hugging Face and llama.cpp do.
    const bool user_defined = vocab_.types[static_cast<size_t>(id)] == TokenType::user_defined;
    if (!opts.parse_special && !user_defined) continue;
    const std::string& p = vocab_.pieces[static_cast<size_t>(id)];
    next.clear();
    bool found = false;
    for (const Fragment& f : frags) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view s = text.substr(f.off, f.len);
      size_t pos = 0;
      for (size_t from = 0, m; (m = s.find(p, from)) != std::string_view::npos;) {
        if (!user_defined && literal(f.off + m, p.size())) { // written by a user: text
          from = m + 1;
          continue;
        }
        if (m > pos) next.push_back({f.off + pos, m - pos, -1});
        next.push_back({0, 0, id});
        found = true;
        pos = from = m + p.size();
      }
      if (pos < s.size()) next.push_back({f.off + pos, s.size() - pos, -1});
    }
    if (found) frags.swap(next);
  }
  return frags;
}

std::vector<TokenId> TokenizerBase::encode(std::string_view text, const EncodeOptions& opts) const {
  const bool add_bos = opts.add_bos.value_or(s_.add_bos);
  const bool add_eos = opts.add_eos.value_or(s_.add_eos);
  if (add_bos && s_.bos < 0)
    fail(Errc::invalid_argument, "tokenizer", "add_bos requested but the vocabulary has no BOS token");
  if (add_eos && s_.eos < 0)
    fail(Errc::invalid_argument, "tokenizer", "add_eos requested but the vocabulary has no EOS token");

  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (add_bos) out.push_back(s_.bos);
  bool after_special = true;
  for (const Fragment& f : partition(text, opts)) {
    if (f.id >= 0) {
      out.push_back(f.id);
      after_special = true;
    } else {
      encode_text(text.substr(f.off, f.len), after_special, out);
      after_special = false;
    }
  }
  if (add_eos) out.push_back(s_.eos);
  return out;
}

std::string_view TokenizerBase::token_text(TokenId id, bool special) const {
  const auto i = static_cast<size_t>(id);
  const TokenType t = vocab_.types[i];
  if (t == TokenType::control || t == TokenType::unknown)
    return special ? std::string_view(vocab_.pieces[i]) : "";
  return text_[i];
}

void TokenizerBase::decode_step(DecodeState& st, TokenId id, std::string& out, bool special) const {
  if (id < 0 || id >= vocab_size())
    fail(Errc::invalid_argument, "tokenizer",
         "cannot decode token id " + std::to_string(id) + ": the vocabulary has " +
             std::to_string(vocab_size()) + " tokens");
  std::string_view t = token_text(id, special);
  if (t.empty()) return; // hidden control token: the sequence has not started yet
  if (st.at_start) {
    st.at_start = false;
    if (s_.add_space_prefix && t.front() == ' ') t.remove_prefix(1);
  }
  st.pending.append(t);
  utf8_drain(st.pending, out, false);
}

void TokenizerBase::decode_flush(DecodeState& st, std::string& out) const {
  utf8_drain(st.pending, out, true);
}

std::string TokenizerBase::decode(std::span<const TokenId> ids, bool special) const {
  DecodeState st;
  std::string out;
  for (TokenId id : ids)
    decode_step(st, id, out, special);
  decode_flush(st, out);
  return out;
}

const std::string& TokenizerBase::piece(TokenId id) const {
  if (id < 0 || id >= vocab_size())
    fail(Errc::invalid_argument, "tokenizer",
         "token id " + std::to_string(id) + " is out of range: the vocabulary has " +
             std::to_string(vocab_size()) + " tokens");
  return vocab_.pieces[static_cast<size_t>(id)];
}

TokenType TokenizerBase::token_type(TokenId id) const noexcept {
  if (id < 0 || id >= vocab_size()) return TokenType::undefined;
  return vocab_.types[static_cast<size_t>(id)];
}

float TokenizerBase::score(TokenId id) const noexcept {
  if (id < 0 || id >= vocab_size()) return 0.0f;
  return vocab_.scores[static_cast<size_t>(id)];
}

bool TokenizerBase::is_eog(TokenId id) const noexcept {
  return id >= 0 && id < vocab_size() && is_eog_[static_cast<size_t>(id)] != 0;
}

} // namespace tok

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  tok::Vocab v = tok::read_vocab(f);
  if (v.model == "llama") return tok::make_spm_tokenizer(std::move(v));
  if (v.model == "gpt2") return tok::make_bpe_tokenizer(std::move(v));
  fail(Errc::unsupported, "tokenizer",
       f.path() + ": tokenizer.ggml.model is '" + v.model +
           "'; Loom supports 'llama' (SentencePiece BPE) and 'gpt2' (byte-level BPE)");
}

} // namespace loom
