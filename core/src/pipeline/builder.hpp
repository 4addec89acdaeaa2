// The steps Pipeline::create takes, in order (builder.cpp), and what `loom verify`'s StandaloneVerifier
// shares with them: the plugin directories, a path relative to the config, the process's model cache.
#pragma once

#include "loom/pipeline/pipeline.hpp"

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace loom {

// [plugins] paths (each relative to the config's directory when it is not found as given), then the
// default search directories (plugin_search_dirs).
std::vector<std::string> plugin_dirs(const PipelineConfig& cfg);
// "a, b, c": directories as error messages list them.
std::string joined(const std::vector<std::string>& dirs);
// A path the config gives: as given when it exists, else relative to the config's directory.
std::filesystem::path config_relative(const PipelineConfig& cfg, const std::string& path);
// One loaded Model per file and attention variant in the process (model_cache.cpp).
std::shared_ptr<Model> shared_model(const std::string& path, const AttentionChoice& choice);

// Builds a Pipeline's parts from its config, one named step at a time; each step throws loom::Error
// for what the config asks that is unavailable or invalid, in the order a user fixes them.
class PipelineBuilder {
public:
  PipelineBuilder(const PipelineConfig& config, Pipeline& pipeline) : cfg(config), p(pipeline) {}
  const PipelineConfig& cfg;
  Pipeline& p;

  void open_plugins();        // only the files providing what the config names that is not built in
  void build_sampler_chain(); // first: cheap to validate, a bad chain fails before the model loads
  void build_stop_rules();
  void choose_decoder();
  void load_model(); // the model with its attention variant, its tokenizer, the context
  void make_kv_store();
  void find_verifier_plugin();
  void fill_request_template();
  void choose_backend();
  void make_draft();       // [decoder] draft or draft_layers: its model, backend and KV
  void make_model_judge(); // [verifier] name = "model_judge"
  void check_backends();   // each runs its model's KV type and attention variant
  void load_weights();     // each backend gets its weights and KV pool now, not in the first forward
  void make_engine();

private:
  bool is_builtin_sampler(const std::string& name) const;
  [[noreturn]] void missing(int32_t kind, const std::string& what, const std::string& name,
                            const std::string& builtins) const;
  std::string cannot_run(const Backend& be, const Model& m) const;
  using Params = std::vector<std::pair<std::string, ParamValue>>;
  std::unique_ptr<Backend> make_backend(const std::string& name, int32_t threads, bool with_params,
                                        const std::string& where, const Params& extra = {});
  std::unique_ptr<Backend> make_auto_backend(int32_t threads, bool with_params, const std::string& where,
                                             const Params& extra);
  std::unique_ptr<KVCacheStore> make_store(const KVShape& sh) const;
  void check_kv_type(const Backend& be, const std::string& what) const;
  void check_attention(const Backend& be, const Model& m, const std::string& what) const;
  void check_draft_vocabulary(const Tokenizer& draft_tok, const std::string& what) const;

  std::vector<std::string> dirs_; // where plugins were looked for
  std::function<std::unique_ptr<Decoder>()> make_decoder_ = [] { return make_sample_decoder(); };
  KVShape shape_;
  RequestTemplate tmpl_;
  std::optional<DraftModel> draft_;
};

} // namespace loom
