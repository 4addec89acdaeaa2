// loom/pipeline/pipeline_config.hpp — the pipeline file (TOML, DESIGN §5), validated.
//
// Every key is checked: a wrong type, an unknown key or an out-of-range value is a loom::Error
// naming the file, line and column and the expected form. `--set section.key=value` overrides any
// key before validation (the value is a TOML literal; a bare word that is not one is a string).
#pragma once

#include "loom/sample/sampler.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace loom {

struct PipelineConfig {
  std::string source = "<defaults>"; // the file the config came from (for messages)

  struct ModelSection {
    std::string path;  // GGUF file; relative paths: current directory, else the pipeline's directory
    int32_t n_ctx = 0; // context window; 0 = the model's training context, capped at 4096
  } model;
  struct BackendSection {
    std::string name = "auto"; // "reference" is built in; "auto": the cpu plugin when it runs the model
    int32_t threads = 0;       // 0 = all cores
    std::vector<std::pair<std::string, ParamValue>> params; // a plugin backend's other keys
  } backend;
  struct AttentionSection {
    std::string variant = "model"; // model (the GGUF's metadata) | standard | sliding_window
    std::string kernel = "auto";   // auto (the backend's) | naive | flash
    int32_t window = 0;            // sliding_window: tokens attended (incl. the current one); model: override
    int32_t sinks = 0;             // with a window: the first positions, attended by every query
    std::optional<float> softcap;  // overrides the model's attn_logit_softcapping (0 = off)
  } attention;
  struct KVCacheSection {
    std::string store = "contiguous"; // contiguous | paged
    int32_t block_size = 16;
    std::string dtype = "f32";
    bool prefix_cache = true; // paged: full blocks found again by content (prompts with a common prefix)
    // paged: sliding-window layers keep every position, as the others (llama.cpp's --swa-full); false: they
    // keep their window only (a hybrid model's in layer groups of their own)
    bool swa_full = false;
    // Positions the store holds in all. contiguous: max_tokens / n_ctx slabs (at least one); paged:
    // max_tokens / block_size blocks (a request may then get less than n_ctx). 0 = 64 sequences of n_ctx.
    int32_t max_tokens = 0;
  } kv_cache;
  struct SchedulerSection {
    int32_t max_batch_tokens = 2048; // token rows per forward: decodes first, then prefill chunks
    int32_t max_sequences = 64;      // requests running at once (`--parallel` sets it for a run)
  } scheduler;

  struct ServeSection {
    std::string name; // the model name `loom serve` answers to ("": the pipeline file's stem)
    // An A/B split ([serve] ab = { A = 0.5, B = 0.5 }): this name then serves no model of its own but
    // sends each request to one of the named pipelines, by weight.
    std::vector<std::pair<std::string, double>> ab;
  } serve;
  struct DecoderSection {
    std::string name = "sample"; // built-in: sample (greedy or sampling, per the chain); else a plugin
    std::vector<std::pair<std::string, ParamValue>> params; // the other keys: the decoder plugin reads them
    std::string where;                                      // "p.toml:7:1"
    // A second model the host loads for the decoder (speculative decoding's draft): a GGUF with the
    // target's vocabulary, run on draft_backend (default: [backend] name) with draft_threads
    // (0 = [backend] threads).
    std::string draft;
    std::string draft_backend;
    int32_t draft_threads = 0;
    // Or a draft made of the target's own first draft_layers layers, final norm and head (0: none): no
    // second file, the target's weights (self-speculation, LayerSkip / Draft & Verify).
    int32_t draft_layers = 0;
  } decoder;
  struct VerifierSection { // [verifier]: a verifier plugin decoders may consult (session_verify)
    std::string name;      // "" = none
    std::vector<std::pair<std::string, ParamValue>> params;
    std::string where;
  } verifier;
  std::vector<SamplerSpec> samplers;      // [[sampler]] in order; empty = the default chain
  std::vector<SamplerSpec> stop_criteria; // [[stop_criterion]]: plugin stop criteria (name + keys)
  struct StopSection {
    int32_t max_tokens = 128; // new tokens; -1 = until the context is full
    std::vector<std::string> strings;
    std::vector<int64_t> token_ids;
    bool eos = true;
    int64_t timeout_ms = 0; // 0 = none
  } stop;
  struct RunSection {
    std::optional<uint64_t> seed; // unset = random (the result reports the seed used)
    std::optional<bool> add_bos;  // unset = as the model's metadata says
    bool parse_special = false;   // match special-token text in prompts
    bool echo = true;             // `loom run` streams the prompt before the generation
  } run;
  struct PluginsSection {
    std::vector<std::string> paths;            // plugin directories, searched before the one next to `loom`
    std::map<std::string, std::string> sha256; // [plugins.sha256] plugin name = "hex": pinned hashes
  } plugins;
  std::string base_dir; // directory of the pipeline file ("" for none)

  // Resolved model path (see ModelSection::path).
  std::string resolved_model_path() const;
  std::string resolved_draft_path() const;                 // [decoder] draft, resolved like [model] path
  std::string resolve_path(const std::string& path) const; // as given, else relative to base_dir
};

// "section.key=value" (or "sampler.N.key=value" for the N-th [[sampler]], 0-based).
struct ConfigOverride {
  std::string key;
  std::string value;
  // A front end's default rather than an override: applied only where the file sets no value at `key`
  // (loom serve's paged store with its prefix cache).
  bool if_absent = false;
};
ConfigOverride parse_override(const std::string& arg); // throws on a missing '=' or empty key

// Parses TOML text; `source` names it in messages.
PipelineConfig parse_pipeline(const std::string& text, const std::string& source,
                              const std::vector<ConfigOverride>& overrides = {});
PipelineConfig load_pipeline(const std::string& path, const std::vector<ConfigOverride>& overrides = {});
// Applies overrides to an existing config (the CLI's -m mode has no file).
PipelineConfig apply_overrides(const PipelineConfig& base, const std::vector<ConfigOverride>& overrides);
// The resolved pipeline as TOML, every key shown (`loom config show`).
std::string to_toml(const PipelineConfig& cfg);

} // namespace loom
