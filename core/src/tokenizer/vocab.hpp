// tokenizer/vocab.hpp — vocabulary loading and the parts shared by both tokenizers (private).
//
// TokenizerBase owns the vocabulary and implements special-token partitioning, BOS/EOS, EOG
// detection and (incremental) detokenization; SpmTokenizer and BpeTokenizer add the encoding of
// plain text and the decoding of normal pieces.
#pragma once

#include "loom/tokenizer/tokenizer.hpp"

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom {
class GgufFile;
}

namespace loom::tok {

// What `tokenizer.ggml.*` says, validated: array lengths agree, ids are in range.
struct Vocab {
  std::string source;              // file path or name, for messages
  std::string model;               // tokenizer.ggml.model: "llama" | "gpt2"
  std::string pre;                 // tokenizer.ggml.pre, "default" when missing
  std::vector<std::string> pieces; // [n_tokens] raw vocabulary strings
  std::vector<float> scores;       // [n_tokens], 0 when the file has none
  std::vector<TokenType> types;    // [n_tokens], normal when the file has none
  std::vector<std::string> merges; // [n_merges] "left right" (gpt2 only), index = rank
  // Special ids as the file has them (nullopt: key missing; -1: key present but "none").
  std::optional<TokenId> bos, eos, eot, eom, unk, pad;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  bool remove_extra_whitespaces = false;
};

// Reads and validates the vocabulary. Throws loom::Error(parse_error) naming the bad key.
Vocab read_vocab(const GgufFile& f);

// Resolved settings (model defaults + metadata) handed to TokenizerBase.
struct Settings {
  TokenId bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, pad = -1;
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false; // SPM: prepend " " to text at the start / after a special token
};

class TokenizerBase : public Tokenizer {
public:
  std::string_view pre() const noexcept override { return vocab_.pre; }

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opts = {}) const override;
  std::string decode(std::span<const TokenId> ids, bool special = false) const override;
  void decode_step(DecodeState& st, TokenId id, std::string& out, bool special = false) const override;
  void decode_flush(DecodeState& st, std::string& out) const override;

  int32_t vocab_size() const noexcept override { return static_cast<int32_t>(vocab_.pieces.size()); }
  const std::string& piece(TokenId id) const override;
  TokenType token_type(TokenId id) const noexcept override;
  float score(TokenId id) const noexcept override;

  TokenId bos() const noexcept override { return s_.bos; }
  TokenId eos() const noexcept override { return s_.eos; }
  const std::vector<TokenId>& eog_tokens() const noexcept override { return eog_; }
  bool is_eog(TokenId id) const noexcept override;
  bool add_bos_default() const noexcept override { return s_.add_bos; }
  bool add_eos_default() const noexcept override { return s_.add_eos; }

protected:
  TokenizerBase(Vocab v, const Settings& s);

  // Encodes one piece of plain text (no special tokens in it). `after_special` is true at the
  // start of the input and right after a special token (where SPM adds its space prefix).
  virtual void encode_text(std::string_view text, bool after_special, std::vector<TokenId>& out) const = 0;

  // Fills text_ (the detokenized bytes of every non-control token); `normal_text` decodes a
  // normal piece (SPM: "▁" → " "; GPT-2: code points → bytes). Call from the derived constructor.
  template <class F> void build_texts(F normal_text) {
    text_.assign(vocab_.pieces.size(), std::string());
    for (size_t id = 0; id < vocab_.pieces.size(); ++id)
      build_text(static_cast<TokenId>(id), normal_text);
  }

  TokenId find(std::string_view piece) const noexcept {
    const auto it = piece_to_id_.find(piece);
    return it == piece_to_id_.end() ? -1 : it->second;
  }
  // The <0xNN> token of each byte (-1 where the vocabulary has none).
  std::array<TokenId, 256> find_byte_tokens() const;

  Vocab vocab_;
  Settings s_;

private:
  struct Fragment {
    size_t off = 0, len = 0; // raw text [off, off + len) when id < 0
    TokenId id = -1;         // a special token
  };
  std::vector<Fragment> partition(std::string_view text, const EncodeOptions& opts) const;
  std::string_view token_text(TokenId id, bool special) const;
  void init_special_tokens();

  template <class F> void build_text(TokenId id, F& normal_text) {
    const std::string& p = vocab_.pieces[static_cast<size_t>(id)];
    switch (vocab_.types[static_cast<size_t>(id)]) {
    case TokenType::normal:
      text_[static_cast<size_t>(id)] = normal_text(p);
      break;
    case TokenType::user_defined:
      text_[static_cast<size_t>(id)] = p;
      break;
    case TokenType::byte:
      if (auto b = parse_byte_piece(p))
        text_[static_cast<size_t>(id)] = std::string(1, static_cast<char>(*b));
      else
        text_[static_cast<size_t>(id)] = normal_text(p);
      break;
    default:
      break; // control / unknown: piece itself only when `special`; unused: nothing
    }
  }

public:
  // "<0xNN>" → NN (two hex digits), else nullopt.
  static std::optional<uint8_t> parse_byte_piece(std::string_view p) noexcept;

private:
  std::unordered_map<std::string_view, TokenId> piece_to_id_; // views into vocab_.pieces
  std::vector<std::string> text_;                             // [n_tokens] decoded bytes
  std::vector<TokenId> special_; // control / user-defined / unknown ids, longest text first
  std::vector<TokenId> eog_;
  std::vector<uint8_t> is_eog_; // [n_tokens]
};

std::unique_ptr<Tokenizer> make_spm_tokenizer(Vocab v);
std::unique_ptr<Tokenizer> make_bpe_tokenizer(Vocab v);

} // namespace loom::tok
