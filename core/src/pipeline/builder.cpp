// Pipeline::create's steps (see builder.hpp for their order): plugins, sampler chain, stop rules,
// decoder, model, KV store, verifier, backend choice, draft, judge, checks, load, engine.
#include "pipeline/builder.hpp"

#include "loom/error.hpp"
#include "loom/model/reference_backend.hpp"
#include "plugin/plugin_internal.hpp"

#include <algorithm>
#include <chrono>
#include <unistd.h>

namespace loom {

std::vector<std::string> plugin_dirs(const PipelineConfig& cfg) {
  std::vector<std::string> dirs;
  for (const auto& d : cfg.plugins.paths)
    dirs.push_back(config_relative(cfg, d).string());
  return plugin_search_dirs(dirs);
}

std::string joined(const std::vector<std::string>& dirs) {
  std::string dl;
  for (const auto& d : dirs)
    dl += (dl.empty() ? "" : ", ") + d;
  return dl;
}

std::filesystem::path config_relative(const PipelineConfig& cfg, const std::string& path) {
  std::filesystem::path p(path);
  if (p.is_relative() && !std::filesystem::exists(p) && !cfg.base_dir.empty())
    p = std::filesystem::path(cfg.base_dir) / p;
  return p;
}

bool PipelineBuilder::is_builtin_sampler(const std::string& name) const {
  const auto& builtin = builtin_samplers();
  return std::any_of(builtin.begin(), builtin.end(), [&](const SamplerInfo& i) { return i.name == name; });
}

void PipelineBuilder::missing(int32_t kind, const std::string& what, const std::string& name,
                              const std::string& builtins) const {
  fail(Errc::not_found, "pipeline",
       cfg.source + ": " + what + " '" + name + "' is neither built in (" + builtins +
           ") nor provided by a plugin in [" + joined(dirs_) +
           "] (plugins found: " + p.registry_->available(kind) + ")" + p.registry_->failures());
}

void PipelineBuilder::open_plugins() {
  p.registry_ = std::make_unique<PluginRegistry>();
  const bool needs_plugins = cfg.backend.name != "reference" || cfg.decoder.name != "sample" ||
                             !cfg.verifier.name.empty() || !cfg.stop_criteria.empty() ||
                             std::any_of(cfg.samplers.begin(), cfg.samplers.end(),
                                         [&](const SamplerSpec& s) { return !is_builtin_sampler(s.name); });
  if (!needs_plugins) return;
  dirs_ = plugin_dirs(cfg);
  // Only the files that provide what this pipeline names are opened (their static descriptors say
  // so without loading them); a pin is checked before its file is opened.
  DiscoverOptions only;
  only.named_only = true;
  const auto want = [&](int32_t kind, const std::string& name) { only.only.emplace_back(kind, name); };
  for (const std::string& be : {cfg.backend.name, cfg.decoder.draft_backend})
    if (be == "auto")
      want(LOOM_KIND_BACKEND, "cpu");
    else if (!be.empty() && be != "reference")
      want(LOOM_KIND_BACKEND, be);
  if (cfg.decoder.name != "sample") want(LOOM_KIND_DECODER, cfg.decoder.name);
  for (const auto& sp : cfg.samplers)
    if (!is_builtin_sampler(sp.name)) want(LOOM_KIND_SAMPLER, sp.name);
  for (const auto& sc : cfg.stop_criteria)
    want(LOOM_KIND_STOP, sc.name);
  if (!cfg.verifier.name.empty() && cfg.verifier.name != "model_judge")
    want(LOOM_KIND_VERIFIER, cfg.verifier.name);
  p.registry_->discover(dirs_, cfg.plugins.sha256, only);
}

void PipelineBuilder::build_sampler_chain() {
  if (cfg.samplers.empty()) {
    p.chain_ = make_default_chain(SamplingParams{});
    return;
  }
  std::string names;
  for (const auto& i : builtin_samplers())
    names += (names.empty() ? "" : ", ") + i.name;
  for (const auto& s : cfg.samplers) {
    if (is_builtin_sampler(s.name)) {
      p.chain_.add(create_sampler(s));
    } else if (auto f = p.registry_->find(LOOM_KIND_SAMPLER, s.name)) {
      p.chain_.add(plugin::make_plugin_sampler(*f, s));
    } else {
      missing(LOOM_KIND_SAMPLER, "sampler", s.name, names);
    }
  }
}

void PipelineBuilder::build_stop_rules() {
  for (const auto& s : cfg.stop_criteria) {
    if (auto f = p.registry_->find(LOOM_KIND_STOP, s.name))
      p.stop_plugins_.push_back(plugin::make_plugin_stop(*f, s));
    else
      missing(LOOM_KIND_STOP, "stop criterion", s.name, "none: [stop] holds the built-in rules");
  }
}

void PipelineBuilder::choose_decoder() {
  if (cfg.decoder.name == "sample") return;
  if (auto f = p.registry_->find(LOOM_KIND_DECODER, cfg.decoder.name))
    make_decoder_ =
        plugin::make_plugin_decoder_factory(*f, cfg.decoder.name, cfg.decoder.params, cfg.decoder.where);
  else
    missing(LOOM_KIND_DECODER, "decoder", cfg.decoder.name, "sample");
}

void PipelineBuilder::load_model() {
  AttentionChoice choice{cfg.attention.variant, cfg.attention.kernel, cfg.attention.window,
                         cfg.attention.sinks, cfg.attention.softcap};
  try {
    p.model_ = shared_model(cfg.resolved_model_path(), choice);
  } catch (const Error& e) {
    if (std::string_view(e.component()) != "attention") throw;
    fail(e.code(), "pipeline",
         cfg.source + ": [attention] " + std::string(e.what()).substr(e.component().size() + 2));
  }
  p.tok_ = Tokenizer::from_gguf(p.model_->file());
  const ModelConfig& mc = p.model_->config();
  if (p.tok_->vocab_size() != mc.n_vocab)
    fail(Errc::parse_error, "pipeline",
         cfg.resolved_model_path() + ": the tokenizer has " + std::to_string(p.tok_->vocab_size()) +
             " tokens but the model's embedding has " + std::to_string(mc.n_vocab) + " rows");
  p.n_ctx_ = cfg.model.n_ctx > 0 ? cfg.model.n_ctx : std::min(mc.n_ctx_train, 4096);
}

// contiguous: sequences that can live at once, [kv_cache] max_tokens / n_ctx slabs (default 64, allocated
// lazily). paged: max_tokens / block_size blocks shared by any number of sequences.
void PipelineBuilder::make_kv_store() {
  const ModelConfig& mc = p.model_->config();
  const auto kv_type = dtype_from_name(cfg.kv_cache.dtype);
  if (!kv_type || !kv_dtype_valid(*kv_type))
    fail(Errc::invalid_argument, "pipeline",
         cfg.source + ": [kv_cache] dtype = " + user_value(cfg.kv_cache.dtype) +
             "; expected f32, f16, bf16 or q8_0");
  { // one sequence's KV must fit in this machine's memory: refuse up front, before any allocation
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const double need = static_cast<double>(p.n_ctx_) * static_cast<double>(mc.kv_bytes_per_token(*kv_type));
    const double have = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
    if (have > 0 && need > have)
      fail(Errc::out_of_memory, "pipeline",
           cfg.source + ": a sequence of " + std::to_string(p.n_ctx_) + " positions needs " +
               std::to_string(static_cast<uint64_t>(need / (1 << 30))) +
               " GiB of KV cache but this machine has " +
               std::to_string(static_cast<uint64_t>(have / (1 << 30))) +
               " GiB; lower [model] n_ctx (--ctx-size)");
  }
  const bool paged = cfg.kv_cache.store == "paged";
  if (paged) {
    p.n_seq_max_ = 4096;
  } else {
    p.n_seq_max_ = cfg.kv_cache.max_tokens > 0 ? std::max(1, cfg.kv_cache.max_tokens / p.n_ctx_) : 64;
    if (cfg.kv_cache.max_tokens > 0 && cfg.kv_cache.max_tokens < p.n_ctx_)
      fail(Errc::invalid_argument, "pipeline",
           cfg.source + ": [kv_cache] max_tokens = " + std::to_string(cfg.kv_cache.max_tokens) +
               " is smaller than the context (" + std::to_string(p.n_ctx_) +
               ") for the contiguous store; raise it, lower [model] n_ctx, or use store = \"paged\"");
  }
  // What a sequence keeps follows the attention and what the backend reads (Model::kv_shape); a
  // contiguous store, or swa_full, keeps every position.
  shape_ = p.model_->kv_shape(p.n_ctx_, p.n_seq_max_,
                              paged && !cfg.kv_cache.swa_full ? p.backend_.get() : nullptr);
  const auto blocks_for = [&](int64_t positions) {
    return (positions + cfg.kv_cache.block_size - 1) / cfg.kv_cache.block_size;
  };
  shape_.prefix_cache = paged && cfg.kv_cache.prefix_cache;
  shape_.step_positions = cfg.scheduler.max_batch_tokens;
  shape_.dtype = *kv_type;
  if (paged)
    shape_.n_blocks =
        cfg.kv_cache.max_tokens > 0 ? blocks_for(cfg.kv_cache.max_tokens) : 64 * blocks_for(p.n_ctx_);
  shape_.block_size = cfg.kv_cache.block_size;
  p.kv_ = make_store(shape_);
}

std::unique_ptr<KVCacheStore> PipelineBuilder::make_store(const KVShape& sh) const {
  return cfg.kv_cache.store == "paged" ? make_paged_kv_cache(sh) : make_contiguous_kv_cache(sh);
}

void PipelineBuilder::find_verifier_plugin() {
  if (cfg.verifier.name.empty() || cfg.verifier.name == "model_judge") return; // model_judge: a model, later
  if (auto f = p.registry_->find(LOOM_KIND_VERIFIER, cfg.verifier.name))
    tmpl_.verifier =
        plugin::make_plugin_verifier(*f, cfg.verifier.name, cfg.verifier.params, cfg.verifier.where);
  else
    missing(LOOM_KIND_VERIFIER, "verifier", cfg.verifier.name, "none");
}

// What a request gets when it names nothing of its own: the decoder, a clone of the chain and of the stop
// plugins per sequence, the [stop] rules.
void PipelineBuilder::fill_request_template() {
  tmpl_.make_decoder = make_decoder_;
  tmpl_.make_stop_criteria = [pp = &p] {
    std::vector<std::unique_ptr<StopCriterion>> v;
    for (const auto& sp : pp->stop_plugins_)
      v.push_back(sp->clone());
    return v;
  };
  tmpl_.make_chain = [pp = &p] { return pp->chain_.clone(); };
  tmpl_.stop.eos = cfg.stop.eos;
  tmpl_.stop.eog_tokens = p.tok_->eog_tokens();
  for (int64_t id : cfg.stop.token_ids)
    tmpl_.stop.stop_tokens.push_back(static_cast<TokenId>(id));
  tmpl_.stop.strings = cfg.stop.strings;
  tmpl_.stop.max_tokens = cfg.stop.max_tokens;
  tmpl_.stop.timeout_ms = cfg.stop.timeout_ms;
}

// Whether a backend runs this model as configured (every node of a decode graph, the KV rows' type, the
// attention variant); "" when it does, else why not.
std::string PipelineBuilder::cannot_run(const Backend& be, const Model& m) const {
  // (the KV store is made after the backend: its type from the configuration)
  if (const auto t = dtype_from_name(cfg.kv_cache.dtype); t && !be.supports_kv_dtype(*t))
    return "it does not read " + cfg.kv_cache.dtype + " KV rows";
  const AttentionVariant& v = m.attention();
  if (!be.supports_attention(v.kernel(), v.features()))
    return "it runs no " + std::string(attn_kernel_name(v.kernel())) + " kernel for attention variant " +
           std::string(v.name());
  const auto g = const_cast<Model&>(m).graph(1, 1);
  for (const Node& n : g->nodes)
    if (!be.supports(*g, n)) {
      std::string w;
      for (int32_t s : n.src)
        if (s >= 0 && g->tensors[static_cast<size_t>(s)].kind == TensorKind::weight)
          w = " (" + g->tensors[static_cast<size_t>(s)].name + ", " +
              std::string(dtype_name(g->tensors[static_cast<size_t>(s)].dtype)) + ")";
      return "it does not compute " + std::string(op_name(n.op)) + w;
    }
  return {};
}

// extra: keys added for this backend only (the draft model's cpu backend: exact_logits = false).
std::unique_ptr<Backend> PipelineBuilder::make_backend(const std::string& name, int32_t threads,
                                                       bool with_params, const std::string& where,
                                                       const Params& extra) {
  if (name == "reference") return make_reference_backend();
  if (name == "auto") return make_auto_backend(threads, with_params, where, extra);
  if (auto f = p.registry_->find(LOOM_KIND_BACKEND, name)) {
    Params params;
    params.emplace_back("threads", int64_t{threads});
    if (with_params) params.insert(params.end(), cfg.backend.params.begin(), cfg.backend.params.end());
    if (name == "cpu") params.insert(params.end(), extra.begin(), extra.end());
    return plugin::make_plugin_backend(*f, name, params, where);
  }
  missing(LOOM_KIND_BACKEND, "backend", name, "reference, auto");
}

// "auto": the fastest backend present that runs the model (cpu), else the reference, with a note why.
std::unique_ptr<Backend> PipelineBuilder::make_auto_backend(int32_t threads, bool with_params,
                                                            const std::string& where, const Params& extra) {
  std::string why;
  if (auto f = p.registry_->find(LOOM_KIND_BACKEND, "cpu")) {
    Params params;
    params.emplace_back("threads", int64_t{threads});
    if (with_params) params.insert(params.end(), cfg.backend.params.begin(), cfg.backend.params.end());
    params.insert(params.end(), extra.begin(), extra.end());
    std::unique_ptr<Backend> be;
    try {
      be = plugin::make_plugin_backend(*f, "cpu", params, where);
    } catch (const Error& e) {
      if (with_params && !cfg.backend.params.empty()) throw; // a bad key of the user's: say so
      why = std::string("the cpu plugin failed to start: ") + e.what();
    }
    if (be) {
      why = cannot_run(*be, *p.model_);
      if (why.empty()) return be;
      why = "the cpu backend cannot run this model: " + why;
    }
  } else {
    why = "no cpu backend plugin in [" + joined(dirs_) + "]" + p.registry_->failures();
  }
  if (with_params && !cfg.backend.params.empty())
    fail(Errc::unsupported, "pipeline",
         where + ": keys for the cpu backend were given (" + cfg.backend.params.front().first +
             ", ...) but " + why + "; remove them or fix the cpu backend");
  p.backend_note_ = "using the reference backend (plain f32, slow): " + why;
  return make_reference_backend();
}

void PipelineBuilder::choose_backend() {
  p.backend_ = make_backend(cfg.backend.name, cfg.backend.threads, true, cfg.source + ": [backend]");
  p.backend_name_ = std::string(p.backend_->name());
}

void PipelineBuilder::check_draft_vocabulary(const Tokenizer& draft_tok, const std::string& what) const {
  const ModelConfig& mc = p.model_->config();
  const int32_t dv = p.draft_model_->config().n_vocab;
  if (dv != mc.n_vocab || draft_tok.vocab_size() != p.tok_->vocab_size())
    fail(Errc::invalid_argument, "pipeline",
         what + " has a vocabulary of " + std::to_string(dv) + " tokens but the target (" +
             cfg.resolved_model_path() + ") has " + std::to_string(mc.n_vocab) +
             "; a draft must share the target's tokenizer");
  for (TokenId i = 0; i < dv; ++i)
    if (draft_tok.piece(i) != p.tok_->piece(i))
      fail(Errc::invalid_argument, "pipeline",
           what + ": token " + std::to_string(i) + " is " + user_value(draft_tok.piece(i), 40) +
               " in the draft but " + user_value(p.tok_->piece(i), 40) +
               " in the target; a draft must share the target's tokenizer");
}

void PipelineBuilder::make_draft() {
  const int32_t layers = cfg.decoder.draft_layers;
  if (cfg.decoder.draft.empty() && layers == 0) return;
  const int32_t n_layer = p.model_->config().n_layer;
  const std::string what = cfg.source + (layers > 0 ? ": [decoder] draft_layers = " + std::to_string(layers)
                                                    : ": [decoder] draft = " + user_value(cfg.decoder.draft));
  if (layers > 0) { // the target's own first layers: its mapping, its tokenizer
    if (layers >= n_layer)
      fail(Errc::invalid_argument, "pipeline",
           cfg.source + ": [decoder] draft_layers = " + std::to_string(layers) +
               ": expected fewer than the target's " + std::to_string(n_layer) + " layers");
    p.draft_model_ = p.model_->with_layers(layers);
    p.draft_model_->set_attention(make_attention_variant(
        p.draft_model_->config(), AttentionChoice{"model", cfg.attention.kernel, 0, 0, {}}));
  } else {
    const std::string path = cfg.resolved_draft_path();
    if (!std::filesystem::is_regular_file(path) && !std::filesystem::is_directory(path)) // dir: HF checkpoint
      fail(Errc::not_found, "pipeline",
           what + ": no such file" + (path != cfg.decoder.draft ? " (looked at " + path + ")" : "") +
               "; give the path of a GGUF model with the target's vocabulary");
    try {
      p.draft_model_ = shared_model(path, AttentionChoice{"model", cfg.attention.kernel, 0, 0, {}});
    } catch (const Error& e) {
      fail(e.code(), "pipeline", what + " cannot be loaded: " + e.what());
    }
  }
  check_draft_vocabulary(*Tokenizer::from_gguf(p.draft_model_->file()), what);
  const std::string be = cfg.decoder.draft_backend.empty() ? p.backend_name_ : cfg.decoder.draft_backend;
  // A draft's logits need no exact route (speculative sampling is exact for whatever q it drew from): on
  // the cpu backend its head takes its type's fast kernel (a tied Q4_0 embedding: 20% of a SmolLM2 draft
  // step on the exact route), unless [backend] exact_logits is set for both.
  Params draft_extra;
  const bool user_exact = std::any_of(cfg.backend.params.begin(), cfg.backend.params.end(),
                                      [](const auto& kv) { return kv.first == "exact_logits"; });
  if (!user_exact || be != p.backend_name_) draft_extra.emplace_back("exact_logits", false);
  p.draft_backend_ =
      make_backend(be, cfg.decoder.draft_threads > 0 ? cfg.decoder.draft_threads : cfg.backend.threads,
                   be == p.backend_name_, cfg.source + ": [decoder] draft_backend", draft_extra);
  KVShape dshape = p.draft_model_->kv_shape(
      p.n_ctx_, p.n_seq_max_,
      cfg.kv_cache.store == "paged" && !cfg.kv_cache.swa_full ? p.draft_backend_.get() : nullptr);
  dshape.block_size = cfg.kv_cache.block_size;
  dshape.n_blocks = shape_.n_blocks;
  dshape.prefix_cache = shape_.prefix_cache;
  dshape.step_positions = shape_.step_positions;
  dshape.dtype = shape_.dtype;
  p.draft_kv_ = make_store(dshape);
  draft_.emplace(DraftModel{*p.draft_model_, *p.draft_backend_, *p.draft_kv_, layers > 0});
}

// The built-in model_judge verifier: the judge model (the pipeline's own for "self") on a backend of the
// pipeline's kind, its own KV.
void PipelineBuilder::make_model_judge() {
  if (cfg.verifier.name != "model_judge") return;
  const ModelJudgeOptions jo = parse_model_judge_options(cfg.verifier.params, cfg.verifier.where);
  std::shared_ptr<Model> jm = p.model_;
  if (jo.model != "self") {
    const std::filesystem::path jp = config_relative(cfg, jo.model);
    if (!std::filesystem::is_regular_file(jp))
      fail(Errc::not_found, "pipeline",
           cfg.verifier.where + ": model_judge.model = " + user_value(jo.model) +
               ": no such file; give \"self\" or the path of a GGUF model");
    jm = shared_model(jp.string(), AttentionChoice{"model", cfg.attention.kernel, 0, 0, {}});
  }
  p.judge_ = std::make_shared<ModelJudge>(
      jm, Tokenizer::from_gguf(jm->file()),
      make_backend(cfg.backend.name, cfg.backend.threads, true, cfg.verifier.where + " (model_judge)"), jo,
      cfg.verifier.where);
  tmpl_.verifier = p.judge_; // several candidates of a round: one batched forward (score_many)
  tmpl_.verifier_tokens = [j = p.judge_.get()] { return j->tokens_evaluated(); };
}

// The backends must read and write KV rows of the configured type ...
void PipelineBuilder::check_kv_type(const Backend& be, const std::string& what) const {
  if (!be.supports_kv_dtype(shape_.dtype))
    fail(Errc::unsupported, "pipeline",
         cfg.source + ": [kv_cache] dtype = " + user_value(cfg.kv_cache.dtype) + " is not supported by " +
             what + " '" + std::string(be.name()) +
             "' (it reads f32 KV rows only; plugins built against SDK 1.4 or later can say otherwise); use "
             "dtype = \"f32\"");
}

// ... and run the attention the model's variant asks for, with the kernel strategy asked for.
void PipelineBuilder::check_attention(const Backend& be, const Model& m, const std::string& what) const {
  const AttentionVariant& v = m.attention();
  if (be.supports_attention(v.kernel(), v.features())) return;
  std::string can; // the kernels it does run this variant with, for the message
  for (AttnKernel k : {AttnKernel::auto_, AttnKernel::naive, AttnKernel::flash})
    if (be.supports_attention(k, v.features()))
      can += std::string(can.empty() ? "" : " or ") + "\"" + attn_kernel_name(k) + "\"";
  std::string feats;
  const uint32_t f = v.features();
  for (auto [bit, name] : {std::pair{attn_window, "a sliding window"},
                           std::pair{attn_softcap, "soft-capping"}, std::pair{attn_sinks, "attention sinks"}})
    if (f & bit) feats += std::string(feats.empty() ? " with " : " and ") + name;
  fail(Errc::unsupported, "pipeline",
       cfg.source + ": [attention] kernel = \"" + attn_kernel_name(v.kernel()) + "\" for variant " +
           std::string(v.name()) + feats + " is not supported by " + what + " '" + std::string(be.name()) +
           "'" +
           (can.empty()
                ? std::string("; it runs no kernel for this variant: use backend \"cpu\" (every variant) "
                              "or another variant")
                : " (it runs kernel = " + can +
                      " for it); set attention.kernel to that or use backend \"cpu\""));
}

void PipelineBuilder::check_backends() {
  check_kv_type(*p.backend_, "backend");
  check_attention(*p.backend_, *p.model_, "backend");
  if (p.draft_backend_) check_attention(*p.draft_backend_, *p.draft_model_, "the draft model's backend");
  if (p.draft_backend_) check_kv_type(*p.draft_backend_, "the draft model's backend");
}

// Each backend gets its model's weights once (it repacks or uploads them now, not inside the first
// forward) and allocates its KV pool.
void PipelineBuilder::load_weights() {
  const auto t0 = std::chrono::steady_clock::now();
  p.model_->load_into(*p.backend_);
  p.kv_->memory().attach(p.backend_->alloc(p.kv_->memory().layout().bytes(), BufferUsage::kv));
  if (p.draft_backend_) {
    p.draft_model_->load_into(*p.draft_backend_);
    p.draft_kv_->memory().attach(
        p.draft_backend_->alloc(p.draft_kv_->memory().layout().bytes(), BufferUsage::kv));
  }
  p.load_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void PipelineBuilder::make_engine() {
  const ModelConfig& mc = p.model_->config();
  p.engine_ =
      std::make_unique<Engine>(*p.model_, *p.tok_, *p.backend_, *p.kv_, p.n_ctx_, std::move(tmpl_), draft_);
  p.engine_->set_max_running(static_cast<size_t>(cfg.scheduler.max_sequences));
  p.engine_->set_max_batch_tokens(cfg.scheduler.max_batch_tokens);
  for (int64_t id : cfg.stop.token_ids)
    if (id >= mc.n_vocab)
      fail(Errc::invalid_argument, "pipeline",
           cfg.source + ": [stop] token_ids contains " + std::to_string(id) +
               ", outside the vocabulary (0.." + std::to_string(mc.n_vocab - 1) + ")");
}

} // namespace loom
