// tests/encode_options.hpp — the encode options of the tokenizer tests (unit: tiny vocabularies made in
// memory; integration: the real vocabularies of the shared models).
#pragma once

#include "loom/tokenizer/tokenizer.hpp"

#include <optional>

namespace loom::test {

// No BOS, no EOS, special-token text encoded as plain text.
inline const EncodeOptions k_no_bos{.add_bos = false, .add_eos = false, .parse_special = false};

inline EncodeOptions opts(std::optional<bool> bos, bool parse_special,
                          std::optional<bool> eos = std::nullopt) {
  return {.add_bos = bos, .add_eos = eos, .parse_special = parse_special};
}

} // namespace loom::test
