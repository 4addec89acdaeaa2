// loom/model.hpp — architecture + weights. The model builds a node list per batch shape and a
// Backend executes it, so backends plug in without touching the model.
#pragma once

#include "loom/attention.hpp"
#include "loom/backend.hpp"
#include "loom/gguf.hpp"
#include "loom/graph.hpp"
#include "loom/kv_cache.hpp"
#include "loom/model_config.hpp"

#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>

namespace loom {

class Model {
public:
  // Maps the GGUF file and validates its architecture and tensor shapes. Throws loom::Error.
  static std::unique_ptr<Model> load(const std::string& path);

  const ModelConfig& config() const noexcept { return cfg_; }
  const GgufFile& file() const noexcept { return file_; }

  // The graph for a batch of n_tokens rows of which n_outputs produce logits (cached per shape).
  const Graph& graph(int32_t n_tokens, int32_t n_outputs);
  // Runs one batch: logits are [n_outputs][n_vocab], for batch.output_rows in order. The batch's
  // positions must already be allocated in `kv` for their sequences.
  void forward(Backend& be, const BatchView& batch, KVCacheStore& kv, std::span<float> logits);

  KVShape kv_shape(int32_t n_ctx, int32_t n_seq_max) const noexcept;
  // What each layer's attention computes (default: standard causal, soft-capped as the file says).
  void set_attention(std::shared_ptr<const AttentionVariant> v) {
    attention_ = std::move(v);
    graphs_.clear();
  }
  const AttentionVariant& attention() const noexcept { return *attention_; }

private:
  explicit Model(GgufFile f);
  Graph build_graph(int32_t n_tokens, int32_t n_outputs) const; // every family of ModelConfig

  GgufFile file_;
  ModelConfig cfg_;
  std::map<std::pair<int32_t, int32_t>, Graph> graphs_;
  std::shared_ptr<const AttentionVariant> attention_;
};

} // namespace loom
