// loom/model_config.hpp — hyper-parameters of a decoder-only model, from GGUF metadata.
#pragma once

#include "loom/dtype.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

class GgufFile;

enum class RopeScaling { none, linear, yarn };

struct RopeConfig {
  int32_t n_dims = 0;     // rotated dims per head (≤ head_dim)
  float theta = 10000.0f; // freq_base
  bool neox = false;      // false: adjacent pairs (GGUF llama); true: rotate-half (NeoX / HF)
  RopeScaling scaling = RopeScaling::none;
  float factor = 1.0f;  // linear: positions / factor; yarn: context extension factor
  int32_t orig_ctx = 0; // yarn: original training context
  float yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;
};

struct ModelConfig {
  std::string arch;   // "llama"
  std::string name;   // general.name (may be empty)
  int32_t n_embd = 0; // model width
  int32_t n_layer = 0;
  int32_t n_head = 0;
  int32_t n_head_kv = 0; // == n_head: MHA; 1: MQA; otherwise GQA
  int32_t head_dim = 0;
  int32_t n_ff = 0; // SwiGLU hidden width
  int32_t n_vocab = 0;
  int32_t n_ctx_train = 0; // context length the model was trained with
  float norm_eps = 1e-5f;
  RopeConfig rope;
  // Attention beyond the shape, from {arch}.attention.sliding_window (0: none),
  // {arch}.attention.sliding_window_pattern (a bool per layer, true = sliding; or a period N: every
  // N-th layer attends in full; absent: every layer slides) and {arch}.attn_logit_softcapping.
  int32_t sliding_window = 0;
  std::vector<bool> sliding_layers; // n_layer entries when sliding_window > 0
  float attn_softcap = 0.0f;
  bool tied_output = false;       // no output.weight: the embedding is the output head
  DType weight_type = DType::f32; // the type most matrices are stored in (general.file_type-ish)

  int32_t n_gqa() const noexcept { return n_head / n_head_kv; }
  int64_t n_params = 0;      // sum of all tensor elements
  uint64_t weight_bytes = 0; // sum of all tensor bytes as stored

  // Reads and validates the architecture's keys and the tensor shapes. Throws loom::Error naming
  // the key or tensor and what was expected.
  static ModelConfig from_gguf(const GgufFile& f);
  // KV cache bytes for one token of one sequence at `kv_type` (2 · L · H_kv · D · bytes).
  uint64_t kv_bytes_per_token(DType kv_type) const noexcept;
};

} // namespace loom
