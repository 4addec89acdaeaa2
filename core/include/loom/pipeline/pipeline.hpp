// loom/pipeline/pipeline.hpp — a pipeline built from its config: model + tokenizer + backend + KV cache +
// sampler chain + stop rules. Read core/src/pipeline/pipeline.cpp first: a request's path starts there.
#pragma once

#include "loom/engine/engine.hpp"
#include "loom/eval/model_judge.hpp"
#include "loom/kv/kv_cache.hpp"
#include "loom/model/model.hpp"
#include "loom/pipeline/pipeline_config.hpp"
#include "loom/plugin/plugin_host.hpp"
#include "loom/sample/sampler.hpp"
#include "loom/sample/stop.hpp"
#include "loom/sdk/executor.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

struct GenerationRequest {
  std::string prompt;                                // text, tokenized with the pipeline's [run] settings
  std::optional<std::vector<TokenId>> prompt_tokens; // used instead of `prompt` when set
  std::optional<int32_t> max_new_tokens;             // overrides [stop] max_tokens
  std::optional<uint64_t> seed;                      // overrides [run] seed
  std::function<std::unique_ptr<Decoder>()> decoder; // overrides [decoder] (`loom explain`'s tracer)
  std::string task{}; // the task solved, a JSON object ("" none): given to the [verifier] with each candidate
};

struct MemoryReport {
  uint64_t weights = 0;     // tensor bytes of the model as stored
  uint64_t kv = 0;          // KV cache of one sequence at the full context
  uint64_t activations = 0; // what the backend holds for activations (after any reuse)
  uint64_t workspace = 0;   // the backend's other scratch (GEMM panels)
};

class Pipeline {
public:
  // Loads the model and tokenizer and builds every component the config names. Throws loom::Error
  // for anything the config asks that is unavailable or invalid.
  static std::unique_ptr<Pipeline> create(const PipelineConfig& cfg);

  // One request, start to end (submit + step until it finishes).
  GenerationResult generate(const GenerationRequest& req, const StreamCallback& on_text = {});
  // Many requests through the engine, at most `parallel` at a time; results in input order.
  std::vector<GenerationResult> generate_all(const std::vector<GenerationRequest>& reqs, size_t parallel,
                                             const StreamCallback& on_text = {});
  // The underlying engine (submit / step / cancel) for callers that drive the loop themselves.
  Engine& engine() noexcept { return *engine_; }
  RequestId submit(const GenerationRequest& req, StreamCallback on_text = {});

  const PipelineConfig& config() const noexcept { return cfg_; }
  const Model& model() const noexcept { return *model_; }
  const Tokenizer& tokenizer() const noexcept { return *tok_; }
  int32_t n_ctx() const noexcept { return n_ctx_; }
  MemoryReport memory() const noexcept;
  const KVCacheStore& kv_store() const noexcept { return *kv_; }
  const Backend& backend() const noexcept { return *backend_; }
  // Milliseconds the load step took: the backends' Backend::load (repacks, uploads) and KV pools.
  double load_ms() const noexcept { return load_ms_; }
  // The backend's name ([backend] name, or what "auto" chose: "cpu", else "reference").
  const std::string& backend_name() const noexcept { return backend_name_; }
  // Why "auto" fell back to the reference backend (one line; empty when it did not).
  const std::string& backend_note() const noexcept { return backend_note_; }
  std::vector<TokenId> tokenize(std::string_view text) const; // with the [run] BOS/special settings

private:
  friend class PipelineBuilder; // Pipeline::create's steps fill these
  Pipeline() = default;
  std::unique_ptr<PluginRegistry> registry_; // first: destroyed last, after every plugin object
  PipelineConfig cfg_;
  std::shared_ptr<Model> model_; // shared by the pipelines of one process that load the same file
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Backend> backend_;
  std::string backend_name_, backend_note_;
  std::unique_ptr<KVCacheStore> kv_;
  SamplerChain chain_;
  std::vector<std::unique_ptr<StopCriterion>> stop_plugins_; // prototypes, cloned per sequence
  std::shared_ptr<Model> draft_model_;                       // [decoder] draft (speculative decoding)
  std::unique_ptr<Backend> draft_backend_;
  std::unique_ptr<KVCacheStore> draft_kv_;
  std::shared_ptr<ModelJudge> judge_; // [verifier] name = "model_judge"; before engine_: outlives its calls
  std::unique_ptr<Engine> engine_;
  int32_t n_ctx_ = 0;
  double load_ms_ = 0;
  int32_t n_seq_max_ = 0;
};

// The [verifier] of a config on its own, without a model (`loom verify`): its plugin found on the
// config's [plugins] paths (then next to `loom`), its keys checked as a pipeline would.
class StandaloneVerifier {
public:
  static std::unique_ptr<StandaloneVerifier> create(const PipelineConfig& cfg);
  // A score in [0, 1]; throws loom::Error when the verifier fails or returns anything else.
  double score(std::string_view prompt, std::string_view text, std::string_view task = {}) const {
    return verifier_->score(prompt, text, task);
  }
  // Every item (prompt, text, task) in order, one outcome each (a failing item fails alone): a judge
  // model scores each run of items with the same prompt in batched forwards.
  struct Item {
    std::string_view prompt, text, task;
  };
  std::vector<VerifyOutcome> score_all(std::span<const Item> items) const;
  // The judge model's forwards so far (model_judge; 0 for a plugin).
  size_t judge_forwards() const noexcept;
  const std::string& name() const noexcept { return name_; }

private:
  StandaloneVerifier() = default;
  std::unique_ptr<PluginRegistry> registry_; // first: destroyed after the verifier object
  std::shared_ptr<Verifier> verifier_;       // model_judge or a plugin's
  const ModelJudge* judge_ = nullptr;        // verifier_, when it is model_judge (its forward count)
  std::string name_;
};

} // namespace loom
