// tokenizer/pretokenizer.hpp — regex pre-tokenizers for byte-level BPE (private header).
//
// A pre-tokenizer is an ordered list of PCRE2 regexes (UTF + UCP, JIT-compiled). Each regex
// splits every piece produced by the previous ones: matches and the text between matches both
// become pieces (Hugging Face's Split(..., behavior="isolated") in a Sequence; llama.cpp's
// unicode_regex_split). Invalid UTF-8 never matches and ends up in the gaps, byte for byte.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::tok {

struct Span {
  size_t begin = 0; // byte offset into the text
  size_t end = 0;   // one past the last byte
};

// Properties of a `tokenizer.ggml.pre` value besides its regexes (as llama.cpp sets them).
struct PreTokenizerTraits {
  bool ignore_merges = false; // a piece that is itself a token is emitted without merging
  bool add_bos = false;       // default of tokenizer.ggml.add_bos_token
};

class PreTokenizer {
public:
  // The pre-tokenizer `name` (a tokenizer.ggml.pre value), or nullptr if it is not known.
  // Throws loom::Error(internal) if a built-in regex fails to compile.
  static std::unique_ptr<PreTokenizer> create(std::string_view name);
  // All known names, comma-separated (for error messages).
  static std::string known_names();

  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;
  ~PreTokenizer();

  const PreTokenizerTraits& traits() const noexcept { return traits_; }

  // Splits `text` into contiguous, non-empty pieces covering all of it, appended to `out`.
  // Thread-safe (matching scratch space is per thread).
  void split(std::string_view text, std::vector<Span>& out) const;

private:
  struct Regex;
  PreTokenizer() = default;

  std::vector<std::unique_ptr<Regex>> regexes_; // applied in order
  PreTokenizerTraits traits_;
};

} // namespace loom::tok
