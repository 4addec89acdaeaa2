// graph_builder.hpp — the blocks every family's graph is made of (graph_builder.cpp): inputs, embeddings,
// an attention block, a dense feed-forward block, a mixture-of-experts block, the output head. A family
// (family.hpp, families/*.cpp) puts them together per layer. Tensors and nodes are added in a fixed order
// that backends and tests depend on: the inputs, Llama 3.1's RoPE divisors, the embeddings, per layer
// the blocks as the family calls them, the output head. A step's argument expressions that add tensors
// (weight(), add_activation()) are kept as they were written: the order in which C++ evaluates function
// arguments decides the order of those tensors.
#pragma once

#include "loom/attention.hpp"
#include "loom/format/gguf.hpp"
#include "loom/model/model_config.hpp"
#include "loom/sdk/graph.hpp"

#include <array>
#include <cstdint>
#include <string>

namespace loom {

class GraphBuilder {
public:
  GraphBuilder(const ModelConfig& c, const GgufFile& file, const AttentionVariant& attention, Graph& g);

  const ModelConfig& config() const noexcept { return c_; }

  // A tensor of the file as a weight of the graph.
  int32_t weight(const std::string& name);
  // tokens and positions (one per batch token), out_ids (the rows whose logits are wanted).
  void add_inputs();
  // Llama 3.1's RoPE frequency divisors (rope_freqs.weight), when the file has them.
  void add_rope_freqs();
  // The token embeddings' rows of the batch's tokens (Gemma: scaled by √n_embd).
  int32_t embeddings(int32_t tok_embd);
  // Layer l's attention block on the residual stream x: norm, q/k/v, RoPE, attention, output projection
  // (Gemma 2/3: post-norm), residual add.
  int32_t attention_block(int32_t l, int32_t x);
  // Layer l's dense feed-forward block on x: norm, gate and up, SwiGLU (Gemma: GeGLU), down (Gemma 2/3:
  // post-norm), residual add.
  int32_t ffn_block(int32_t l, int32_t x);
  // Layer l's mixture-of-experts block on x: norm, the router's logits, the route (k experts and their
  // weights, ModelConfig::moe), each token's experts' gate and up, SwiGLU, down, their weighted sum,
  // residual add.
  int32_t moe_block(int32_t l, int32_t x);
  // The output rows of x, the final norm, the logits (tied models: the token embeddings; Gemma 2:
  // soft-capped). Returns the logits tensor.
  int32_t output_head(int32_t x, int32_t tok_embd);

private:
  struct Qkv {
    int32_t q, k, v;
  };
  Qkv qkv(const std::string& p, int32_t h);
  int32_t attention(int32_t l, const std::string& p, int32_t q, int32_t k, int32_t v);
  int32_t input(const char* name, int64_t n);
  int32_t rows(const std::string& name, int64_t r0, int64_t n);
  int32_t norm(int32_t xin, int32_t w, const std::string& out, std::array<int64_t, 4> ne);
  int32_t bin(OpKind op, int32_t a, int32_t b, const std::string& out, std::array<int64_t, 4> ne);
  int32_t matmul(int32_t w, int32_t x, const std::string& out, std::array<int64_t, 4> ne);
  int32_t rope_node(int32_t xin, const std::string& out, int64_t H, bool local);

  const ModelConfig& c_;
  const GgufFile& file_;
  const AttentionVariant& attention_;
  Graph& g_;
  const int64_t T_, E_, D_, Hq_, Hkv_, F_; // tokens, n_embd, head_dim, q heads, kv heads, n_ff
  const RopeParams rope_, rope_swa_;
  int32_t rope_freqs_ = -1;
};

} // namespace loom
