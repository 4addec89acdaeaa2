// format/hf_config.hpp — a checkpoint's config.json: the model family and its hyperparameters,
// checked, and the general.* / {arch}.* GGUF keys they become (private header).
#pragma once

#include "format/hf_json.hpp"
#include "format/hf_metadata.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::hf {

// A model class Loom reads from a checkpoint, and what its tensors need.
struct HfArch {
  std::string_view hf;   // config.json architectures[0]
  std::string_view gguf; // general.architecture
  bool permute_qk;       // q/k rows from rotate-half to interleaved pairs (GGUF llama's RoPE layout)
  bool qkv_bias;         // q/k/v projections have biases
  bool qk_norm;          // per-head RMS norms of q and k
};

struct HfConfig {
  const HfArch* arch = nullptr;
  int64_t n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, n_vocab = 0, n_ctx = 0;
  bool head_dim_explicit = false;
  bool tied = false;
  std::string name;
  // Llama 3.1 rope_scaling ("rope_type": "llama3"): divisors of the RoPE frequencies.
  std::optional<std::vector<float>> rope_freqs;
};

// Reads config.json (parsed: `cfg`) of checkpoint `dir` and adds its keys to `meta`. Throws
// loom::Error for an unsupported family or feature and for a missing or malformed value.
HfConfig read_config(const json& cfg, const std::string& dir, Meta& meta);

} // namespace loom::hf
