// format/hf_tokenizer.hpp — a checkpoint's tokenizer: tokenizer.json (+ tokenizer_config.json,
// chat_template.jinja) read into tokenizer.ggml.* and tokenizer.chat_template (private header).
#pragma once

#include "format/hf_config.hpp"
#include "format/hf_json.hpp"
#include "format/hf_metadata.hpp"

#include <string>

namespace loom::hf {

// Reads the tokenizer files of checkpoint `dir` into `meta`. Token ids are bounded by h.n_vocab;
// config.json (`cfg`) supplies BOS/EOS ids that tokenizer_config.json does not name.
void read_tokenizer(const std::string& dir, const HfConfig& h, const json& cfg, Meta& meta);

} // namespace loom::hf
