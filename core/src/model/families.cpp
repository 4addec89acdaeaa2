// families.cpp — the families Loom runs (family.hpp), one file each in families/.
#include "family.hpp"

#include <array>

namespace loom {

extern const Family family_llama, family_qwen2, family_qwen3, family_qwen3moe, family_gemma2, family_gemma3,
    family_phi3, family_smollm3, family_gpt_oss;

namespace {
const std::array<const Family*, 9> k_families = {&family_llama,    &family_qwen2,   &family_qwen3,
                                                 &family_qwen3moe, &family_gemma2,  &family_gemma3,
                                                 &family_phi3,     &family_smollm3, &family_gpt_oss};
} // namespace

int32_t dense_layer(GraphBuilder& b, int32_t l, int32_t x) {
  return b.ffn_block(l, b.attention_block(l, x));
}
int32_t moe_layer(GraphBuilder& b, int32_t l, int32_t x) {
  return b.moe_block(l, b.attention_block(l, x));
}

const Family* find_family(std::string_view arch) noexcept {
  for (const Family* f : k_families)
    if (f->arch == arch) return f;
  return nullptr;
}

std::string supported_archs() {
  std::string s;
  for (const Family* f : k_families)
    s += (s.empty() ? "" : ", ") + std::string(f->arch);
  return s;
}

} // namespace loom
