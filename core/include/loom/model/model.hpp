// loom/model/model.hpp — architecture + weights. The model builds a node list per batch shape and a
// Backend executes it, so backends plug in without touching the model.
#pragma once

#include "loom/attention.hpp"
#include "loom/format/gguf.hpp"
#include "loom/kv/kv_cache.hpp"
#include "loom/model/graph.hpp"
#include "loom/model/model_config.hpp"
#include "loom/sdk/executor.hpp"
#include "loom/sdk/lru_cache.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace loom {

class Model {
public:
  // Maps the GGUF file and validates its architecture and tensor shapes. Throws loom::Error.
  static std::unique_ptr<Model> load(const std::string& path);
  // The same file's first n_layers layers with its final norm and output head (n_layers in 1..n_layer):
  // self-speculative decoding's draft (LayerSkip / Draft & Verify). It shares this model's mapping, so its
  // weights are this model's (and a backend's copies of them).
  std::unique_ptr<Model> with_layers(int32_t n_layers) const;

  const ModelConfig& config() const noexcept { return cfg_; }
  const GgufFile& file() const noexcept { return file_; }

  // The graph for a batch of n_tokens rows of which n_outputs produce logits (cached per shape; held
  // by the pointer while the cache may drop it).
  std::shared_ptr<const Graph> graph(int32_t n_tokens, int32_t n_outputs);
  // Runs one batch: logits are [n_outputs][n_vocab], for batch.output_rows in order. The batch's
  // positions must already be allocated in `kv` for their sequences.
  // A store without memory gets the backend's (Backend::alloc); the backend gets the weights first if
  // it has not got them (load_into).
  // Returns the milliseconds the backend's compute took (the rest: the graph's lookup, the weights' first
  // load, the KV rows).
  double forward(Backend& be, const BatchView& batch, KVCacheStore& kv, std::span<float> logits);
  // Hands the weights to the backend (Backend::load), once per backend: it repacks or uploads them there,
  // not inside a forward.
  void load_into(Backend& be);
  const std::vector<WeightDesc>& weights() const noexcept { return weights_; }

  // The KV store's shape for this model (f32 rows; the caller sets dtype, block size, pool size). With a
  // backend that reads only each query's span (attn_span_only), what a sequence keeps follows the
  // attention: a window on every layer bounds every layer's rows; a window on some layers (Gemma 3: 5 in
  // 6) puts those in layer groups of their own (window_layers; a paged store keeps them apart) if the
  // backend reads such a pool (attn_kv_groups). Without a backend: every position is kept.
  KVShape kv_shape(int32_t n_ctx, int32_t n_seq_max, const Backend* be = nullptr) const;
  // What each layer's attention computes (default: standard causal, soft-capped as the file says).
  void set_attention(std::shared_ptr<const AttentionVariant> v) {
    std::lock_guard lock(mu_);
    attention_ = std::move(v);
    graphs_.clear();
  }
  const AttentionVariant& attention() const noexcept { return *attention_; }

private:
  explicit Model(GgufFile f, int32_t max_layers = 0);
  Graph build_graph(int32_t n_tokens, int32_t n_outputs) const; // every family of ModelConfig
  // A batch shape's graph and the backends (Backend::instance()) that said they run every node of it.
  struct Shape {
    Graph graph;
    std::vector<uint64_t> runs_on;
  };
  std::shared_ptr<Shape> shape(int32_t n_tokens, int32_t n_outputs); // with mu_ held

  GgufFile file_;
  ModelConfig cfg_;
  // The pipelines of one process share a Model (loom serve's, each with its step loop on a thread of its
  // own): the graph cache and the backends' lists are theirs under this lock.
  std::mutex mu_;
  LruCache<std::pair<int32_t, int32_t>, std::shared_ptr<Shape>> graphs_{64}; // prefill shapes vary per prompt
  std::shared_ptr<const AttentionVariant> attention_;
  std::vector<WeightDesc> weights_;           // what a backend loads
  std::map<std::string, int64_t> weight_ids_; // by tensor name
  std::vector<uint64_t> loaded_;              // Backend::instance() of those that have them
};

} // namespace loom
