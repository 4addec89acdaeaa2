// loom/tokenizer/tokenizer.hpp — tokenizers loaded from GGUF metadata (`tokenizer.ggml.*`).
//
// Two models, as llama.cpp names them in `tokenizer.ggml.model`:
//   "llama" — SentencePiece-style BPE: merge priority from `tokenizer.ggml.scores` (never from ids),
//             byte fallback (<0xNN> pieces), "▁" for spaces, optional space prefix.
//   "gpt2"  — byte-level BPE: merge ranks from `tokenizer.ggml.merges`, a pre-tokenizer regex set
//             chosen by `tokenizer.ggml.pre` (PCRE2, UTF + UCP, JIT), GPT-2's byte↔unicode map.
// Control/special tokens are matched in the text only when EncodeOptions::parse_special is set.
#pragma once

#include "loom/sdk/types.hpp"

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

class GgufFile;

// `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
enum class TokenType : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

struct EncodeOptions {
  std::optional<bool> add_bos; // nullopt: as the model's metadata says (tokenizer.ggml.add_bos_token)
  std::optional<bool> add_eos; // nullopt: as the model's metadata says (tokenizer.ggml.add_eos_token)
  bool parse_special = false;  // match control / user-defined token texts like "<s>", "<|eot_id|>"
  // With parse_special: byte ranges [begin, end) of the text that are literal text (a chat message's
  // content): no control token is matched in them, as if parse_special were off there.
  std::vector<std::pair<size_t, size_t>> literal = {};
};

// State of incremental detokenization for one sequence. Bytes of an incomplete UTF-8 character
// wait in `pending` until the character is complete.
struct DecodeState {
  std::string pending;  // incomplete UTF-8 tail, not yet emitted
  bool at_start = true; // nothing emitted yet for this sequence (SPM strips the prefix space here)
};

class Tokenizer {
public:
  virtual ~Tokenizer() = default;

  // Builds the tokenizer the GGUF metadata describes. Throws loom::Error (parse_error or
  // unsupported) naming the key that is missing, malformed or unknown.
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& f);

  virtual std::string_view model() const noexcept = 0; // "llama" | "gpt2"
  virtual std::string_view pre() const noexcept = 0;   // pre-tokenizer name ("default" if none)

  // Encodes UTF-8 text (invalid UTF-8 is encoded byte-wise, never rejected or crashing).
  virtual std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opts = {}) const = 0;
  // Decodes ids to text. Control tokens (BOS/EOS …) produce no text unless `special` is set;
  // SentencePiece strips the leading space of the first piece (as llama.cpp and run.c do).
  virtual std::string decode(std::span<const TokenId> ids, bool special = false) const = 0;
  // Appends the text of `id` to `out`, emitting only complete UTF-8 characters; the rest waits in
  // `st.pending`. Feeding a whole sequence this way yields exactly decode(ids).
  virtual void decode_step(DecodeState& st, TokenId id, std::string& out, bool special = false) const = 0;
  // Flushes what is left in st.pending at the end of a sequence (invalid bytes become U+FFFD).
  virtual void decode_flush(DecodeState& st, std::string& out) const = 0;

  virtual int32_t vocab_size() const noexcept = 0;
  virtual const std::string& piece(TokenId id) const = 0; // raw vocabulary string (throws if out of range)
  virtual TokenType token_type(TokenId id) const noexcept = 0;
  virtual float score(TokenId id) const noexcept = 0;

  virtual TokenId bos() const noexcept = 0; // -1 if none
  virtual TokenId eos() const noexcept = 0; // -1 if none
  // End-of-generation tokens: EOS, EOT (tokenizer.ggml.eot_token_id), EOM and control tokens whose
  // text is a known end marker (<|eot_id|>, <|im_end|>, <|endoftext|>, <end_of_turn> …).
  virtual const std::vector<TokenId>& eog_tokens() const noexcept = 0;
  virtual bool is_eog(TokenId id) const noexcept = 0;
  virtual bool add_bos_default() const noexcept = 0;
  virtual bool add_eos_default() const noexcept = 0;
};

} // namespace loom
