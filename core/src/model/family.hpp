// family.hpp — one architecture (general.architecture) as Loom runs it: the features and keys it reads on
// top of the shared ones (ModelConfig::from_gguf), and how a layer of its graph is made of GraphBuilder's
// blocks. Each family is a file of its own in families/ (start from the closest one); families.cpp lists
// them. ModelConfig validates the tensors its features imply.
#pragma once

#include "graph_builder.hpp"
#include "loom/format/gguf.hpp"
#include "loom/model/model_config.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom {

struct Family {
  std::string_view arch; // general.architecture
  // Sets the family's features and reads its own keys (`a`: the key prefix, "qwen3moe."), after the
  // shared sizes, RoPE, sliding window and soft-caps are read.
  void (*configure)(ModelConfig& c, const GgufFile& f, const std::string& a);
  // Layer l on the residual stream x; returns the new stream.
  int32_t (*layer)(GraphBuilder& b, int32_t l, int32_t x);
};

// The layers most families are made of: attention then a dense FFN; attention then a mixture of experts.
int32_t dense_layer(GraphBuilder& b, int32_t l, int32_t x);
int32_t moe_layer(GraphBuilder& b, int32_t l, int32_t x);

// The family of an architecture; nullptr when Loom runs none of that name.
const Family* find_family(std::string_view arch) noexcept;
// "llama, qwen2, …": the architectures Loom runs, for messages.
std::string supported_archs();

// Reading a family's keys: each throws loom::Error naming the file, the key, what was expected and what
// was found (model_config.cpp).
namespace keys {
[[noreturn]] void bad(const GgufFile& f, const std::string& msg);
int32_t positive(const GgufFile& f, const std::string& key, int64_t v, int64_t max = 1 << 24);
// An optional float key that must be finite, ≥ `min` and fit a float (`what`: the expected range).
std::optional<float> finite_at_least(const GgufFile& f, const std::string& key, double min, const char* what);
// A RoPE base (rope.freq_base or rope.freq_base_swa): 10000 when absent.
float rope_base(const GgufFile& f, const std::string& key);
// A window on the first n − 1 of every n layers and the n-th in full (llama.cpp's sliding-window pattern n:
// Gemma 2 and gpt-oss 2, Gemma 3 6), unless the file has {arch}.attention.sliding_window_pattern.
void window_pattern(ModelConfig& c, const GgufFile& f, const std::string& a, int32_t n);
} // namespace keys

} // namespace loom
