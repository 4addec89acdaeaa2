// loom/model/model_config.hpp — hyper-parameters of a decoder-only model, from GGUF metadata.
#pragma once

#include "loom/sdk/dtype.hpp"
#include "loom/sdk/graph.hpp"

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
  float attn_factor = 1.0f; // rope.scaling.attn_factor: the rotated values' magnitude (YaRN's own on top)
  // Sliding-window layers' own base, unscaled (Gemma 3's local layers: 10 000); 0: as the others.
  float theta_swa = 0.0f;
};

// Mixture of experts (the families whose FFN is GraphBuilder::moe_block): n_expert experts of width
// n_ff_exp stacked in ffn_{gate,up,down}_exps.weight, a router ffn_gate_inp.weight, k = n_used experts a
// token, weighted as `gating` says ({arch}.expert_count, expert_used_count, expert_feed_forward_length,
// expert_weights_scale, expert_weights_norm, expert_gating_func).
struct MoeConfig {
  int32_t n_expert = 0; // 0: a dense model
  int32_t n_used = 0;
  int32_t n_ff_exp = 0;
  MoeGating gating = MoeGating::softmax;
  bool norm = false;           // the k weights renormalised to sum 1
  float weights_scale = 1.0f;  // then scaled
  bool selection_bias = false; // exp_probs_b.bias [n_expert]: added to choose, not to weigh
  bool router_bias = false;    // ffn_gate_inp.bias [n_expert]: added to the router's logits (gpt-oss)
  bool expert_biases = false; // ffn_{gate,up}_exps.bias [n_ff_exp, n_expert], ffn_down_exps.bias [n_embd, ·]
  bool oai_glu = false;       // the experts' unit is gpt-oss's clamped SwiGLU (swiglu_oai) instead of SwiGLU
};

struct ModelConfig {
  std::string arch;   // general.architecture: a family of core/src/model/families/
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
  std::vector<bool> rope_layers;    // n_layer entries (false: no RoPE, SmolLM3's every fourth); empty: all
  float attn_softcap = 0.0f;
  bool tied_output = false; // no output.weight: the embedding is the output head
  // Family features (set by each family's file, core/src/model/families/).
  bool qkv_bias = false;         // attn_{q,k,v}.bias
  bool qk_norm = false;          // attn_{q,k}_norm.weight [head_dim]
  bool fused_qkv = false;        // attn_qkv.weight [n_embd, q_dim + 2·kv_dim] (q rows, then k, then v)
  bool fused_gate_up = false;    // ffn_up.weight [n_embd, 2·n_ff] (gate rows, then up); no ffn_gate
  bool post_norms = false;       // post_attention_norm.weight, post_ffw_norm.weight after each block's output
  bool geglu = false;            // gelu(gate) ⊙ up instead of silu(gate) ⊙ up
  bool rope_freqs = false;       // rope_freqs.weight [n_dims/2]: frequency divisors (Llama 3.1 rope scaling)
  bool attn_out_bias = false;    // attn_output.bias [n_embd] (gpt-oss)
  bool attn_sink_logits = false; // attn_sinks.weight [n_head]: learned per-head sink logits (gpt-oss)
  std::string ffn_norm =
      "ffn_norm";          // the FFN's input norm, blk.<l>.<ffn_norm>.weight (gpt-oss: post_attention_norm)
  float embd_scale = 0.0f; // embeddings multiplied by this (0: not scaled)
  float final_softcap = 0.0f;     // logits = c·tanh(logits/c) (0: off)
  float attn_scale = 0.0f;        // scores scaled by this (0: 1/√head_dim)
  MoeConfig moe;                  // n_expert > 0: the FFN is a mixture of experts
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
