// A request's whole path, start to end: Pipeline::create builds the components a TOML pipeline
// names; submit() tokenizes and hands the request to the Engine (engine.cpp: admission and the
// batched step loop, via scheduler.cpp), whose DecodeSession (decode_session.cpp) appends each
// sampled token, runs the stop rules and streams the text; the decoder drives it.
#include "loom/pipeline.hpp"

#include "loom/error.hpp"
#include "plugin/plugin_internal.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <unistd.h>

namespace loom {

namespace {
// One loaded Model per file (and attention variant) in the process: pipelines that name the same
// file — `loom ab`'s variants, a draft that is the target — share its mapping, graphs and repacks.
std::shared_ptr<Model> shared_model(const std::string& path, const AttentionChoice& choice) {
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, std::weak_ptr<Model>> cache;
  std::error_code ec;
  const std::string key = std::filesystem::weakly_canonical(path, ec).string();
  const std::string ckey = choice.variant + "|" + choice.kernel + "|" + std::to_string(choice.window) + "|" +
                           std::to_string(choice.sinks) + "|" +
                           (choice.softcap ? std::to_string(*choice.softcap) : std::string("-"));
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[{ec ? path : key, ckey}];
  if (auto m = slot.lock()) return m;
  std::shared_ptr<Model> m = Model::load(path);
  m->set_attention(make_attention_variant(m->config(), choice));
  slot = m;
  return m;
}
} // namespace

std::unique_ptr<Pipeline> Pipeline::create(const PipelineConfig& cfg) {
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->cfg_ = cfg;
  if (cfg.model.path.empty())
    fail(Errc::invalid_argument, "pipeline", cfg.source + ": [model] path is required (a .gguf file)");

  // Plugins, when the pipeline names anything that is not built in.
  p->registry_ = std::make_unique<PluginRegistry>();
  const auto& builtin = builtin_samplers();
  auto is_builtin = [&](const std::string& n) {
    return std::any_of(builtin.begin(), builtin.end(), [&](const SamplerInfo& i) { return i.name == n; });
  };
  const bool needs_plugins = cfg.backend.name != "reference" || cfg.decoder.name != "sample" ||
                             !cfg.verifier.name.empty() || !cfg.stop_criteria.empty() ||
                             std::any_of(cfg.samplers.begin(), cfg.samplers.end(),
                                         [&](const SamplerSpec& s) { return !is_builtin(s.name); });
  std::vector<std::string> dirs;
  if (needs_plugins) {
    for (const auto& d : cfg.plugins.paths) {
      std::filesystem::path pd(d);
      if (pd.is_relative() && !std::filesystem::exists(pd) && !cfg.base_dir.empty())
        pd = std::filesystem::path(cfg.base_dir) / pd;
      dirs.push_back(pd.string());
    }
    dirs = plugin_search_dirs(dirs);
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
      if (!is_builtin(sp.name)) want(LOOM_KIND_SAMPLER, sp.name);
    for (const auto& sc : cfg.stop_criteria)
      want(LOOM_KIND_STOP, sc.name);
    if (!cfg.verifier.name.empty() && cfg.verifier.name != "model_judge")
      want(LOOM_KIND_VERIFIER, cfg.verifier.name);
    p->registry_->discover(dirs, cfg.plugins.sha256, only);
  }
  auto missing = [&](int32_t kind, const std::string& what, const std::string& name,
                     const std::string& builtins) {
    std::string dl;
    for (const auto& d : dirs)
      dl += (dl.empty() ? "" : ", ") + d;
    fail(Errc::not_found, "pipeline",
         cfg.source + ": " + what + " '" + name + "' is neither built in (" + builtins +
             ") nor provided by a plugin in [" + dl + "] (plugins found: " + p->registry_->available(kind) +
             ")" + p->registry_->failures());
  };

  // Samplers first: cheap to validate, so a bad chain fails before the model loads.
  if (cfg.samplers.empty()) {
    p->chain_ = make_default_chain(SamplingParams{});
  } else {
    std::string names;
    for (const auto& i : builtin)
      names += (names.empty() ? "" : ", ") + i.name;
    for (const auto& s : cfg.samplers) {
      if (is_builtin(s.name)) {
        p->chain_.add(create_sampler(s));
      } else if (auto f = p->registry_->find(LOOM_KIND_SAMPLER, s.name)) {
        p->chain_.add(plugin::make_plugin_sampler(*f, s));
      } else {
        missing(LOOM_KIND_SAMPLER, "sampler", s.name, names);
      }
    }
  }
  for (const auto& s : cfg.stop_criteria) {
    if (auto f = p->registry_->find(LOOM_KIND_STOP, s.name)) {
      p->stop_plugins_.push_back(plugin::make_plugin_stop(*f, s));
    } else {
      missing(LOOM_KIND_STOP, "stop criterion", s.name, "none: [stop] holds the built-in rules");
    }
  }
  std::function<std::unique_ptr<Decoder>()> make_decoder = [] { return make_sample_decoder(); };
  if (cfg.decoder.name != "sample") {
    if (auto f = p->registry_->find(LOOM_KIND_DECODER, cfg.decoder.name)) {
      make_decoder =
          plugin::make_plugin_decoder_factory(*f, cfg.decoder.name, cfg.decoder.params, cfg.decoder.where);
    } else {
      missing(LOOM_KIND_DECODER, "decoder", cfg.decoder.name, "sample");
    }
  }

  AttentionChoice choice{cfg.attention.variant, cfg.attention.kernel, cfg.attention.window,
                         cfg.attention.sinks, cfg.attention.softcap};
  try {
    p->model_ = shared_model(cfg.resolved_model_path(), choice);
  } catch (const Error& e) {
    if (std::string_view(e.component()) != "attention") throw;
    fail(e.code(), "pipeline",
         cfg.source + ": [attention] " + std::string(e.what()).substr(e.component().size() + 2));
  }
  p->tok_ = Tokenizer::from_gguf(p->model_->file());
  const ModelConfig& mc = p->model_->config();
  if (p->tok_->vocab_size() != mc.n_vocab)
    fail(Errc::parse_error, "pipeline",
         cfg.resolved_model_path() + ": the tokenizer has " + std::to_string(p->tok_->vocab_size()) +
             " tokens but the model's embedding has " + std::to_string(mc.n_vocab) + " rows");
  p->n_ctx_ = cfg.model.n_ctx > 0 ? cfg.model.n_ctx : std::min(mc.n_ctx_train, 4096);
  const auto kv_type = dtype_from_name(cfg.kv_cache.dtype);
  if (!kv_type || !kv_dtype_valid(*kv_type))
    fail(Errc::invalid_argument, "pipeline",
         cfg.source + ": [kv_cache] dtype = " + user_value(cfg.kv_cache.dtype) +
             "; expected f32, f16, bf16 or q8_0");
  { // one sequence's KV must fit in this machine's memory: refuse up front, before any allocation
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const double need = static_cast<double>(p->n_ctx_) * static_cast<double>(mc.kv_bytes_per_token(*kv_type));
    const double have = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
    if (have > 0 && need > have)
      fail(Errc::out_of_memory, "pipeline",
           cfg.source + ": a sequence of " + std::to_string(p->n_ctx_) + " positions needs " +
               std::to_string(static_cast<uint64_t>(need / (1 << 30))) +
               " GiB of KV cache but this machine has " +
               std::to_string(static_cast<uint64_t>(have / (1 << 30))) +
               " GiB; lower [model] n_ctx (--ctx-size)");
  }
  // contiguous: sequences that can live at once, [kv_cache] max_tokens / n_ctx slabs (default 64,
  // allocated lazily). paged: max_tokens / block_size blocks shared by any number of sequences.
  const bool paged = cfg.kv_cache.store == "paged";
  if (paged) {
    p->n_seq_max_ = 4096;
  } else {
    p->n_seq_max_ = cfg.kv_cache.max_tokens > 0 ? std::max(1, cfg.kv_cache.max_tokens / p->n_ctx_) : 64;
    if (cfg.kv_cache.max_tokens > 0 && cfg.kv_cache.max_tokens < p->n_ctx_)
      fail(Errc::invalid_argument, "pipeline",
           cfg.source + ": [kv_cache] max_tokens = " + std::to_string(cfg.kv_cache.max_tokens) +
               " is smaller than the context (" + std::to_string(p->n_ctx_) +
               ") for the contiguous store; raise it, lower [model] n_ctx, or use store = \"paged\"");
  }
  KVShape shape = p->model_->kv_shape(p->n_ctx_, p->n_seq_max_);
  const auto blocks_for = [&](int64_t positions) {
    return (positions + cfg.kv_cache.block_size - 1) / cfg.kv_cache.block_size;
  };
  shape.prefix_cache = paged && cfg.kv_cache.prefix_cache;
  shape.dtype = *kv_type;
  if (paged)
    shape.n_blocks =
        cfg.kv_cache.max_tokens > 0 ? blocks_for(cfg.kv_cache.max_tokens) : 64 * blocks_for(p->n_ctx_);
  shape.block_size = cfg.kv_cache.block_size;
  const auto make_store = [&](const KVShape& sh) {
    return cfg.kv_cache.store == "paged" ? make_paged_kv_cache(sh) : make_contiguous_kv_cache(sh);
  };
  p->kv_ = make_store(shape);
  RequestTemplate tmpl;
  tmpl.make_decoder = make_decoder;
  if (!cfg.verifier.name.empty() && cfg.verifier.name != "model_judge") { // model_judge: below (a model)
    if (auto f = p->registry_->find(LOOM_KIND_VERIFIER, cfg.verifier.name))
      tmpl.verifier =
          plugin::make_plugin_verifier(*f, cfg.verifier.name, cfg.verifier.params, cfg.verifier.where);
    else
      missing(LOOM_KIND_VERIFIER, "verifier", cfg.verifier.name, "none");
  }
  tmpl.make_stop_criteria = [pp = p.get()] {
    std::vector<std::unique_ptr<StopCriterion>> v;
    for (const auto& sp : pp->stop_plugins_)
      v.push_back(sp->clone());
    return v;
  };
  tmpl.make_chain = [pp = p.get()] { return pp->chain_.clone(); };
  tmpl.stop.eos = cfg.stop.eos;
  tmpl.stop.eog_tokens = p->tok_->eog_tokens();
  for (int64_t id : cfg.stop.token_ids)
    tmpl.stop.stop_tokens.push_back(static_cast<TokenId>(id));
  tmpl.stop.strings = cfg.stop.strings;
  tmpl.stop.max_tokens = cfg.stop.max_tokens;
  tmpl.stop.timeout_ms = cfg.stop.timeout_ms;
  // Whether a backend runs this model as configured (every node of a decode graph, the KV rows' type,
  // the attention variant); "" when it does, else why not.
  const auto cannot_run = [&](const Backend& be, const Model& m) -> std::string {
    if (!be.supports_kv_dtype(shape.dtype)) return "it does not read " + cfg.kv_cache.dtype + " KV rows";
    const AttentionVariant& v = m.attention();
    if (!be.supports_attention(v.kernel(), v.features()))
      return "it runs no " + std::string(attn_kernel_name(v.kernel())) + " kernel for attention variant " +
             std::string(v.name());
    const Graph& g = const_cast<Model&>(m).graph(1, 1);
    for (const Node& n : g.nodes)
      if (!be.supports(g, n)) {
        std::string w;
        for (int32_t s : n.src)
          if (s >= 0 && g.tensors[static_cast<size_t>(s)].kind == TensorKind::weight)
            w = " (" + g.tensors[static_cast<size_t>(s)].name + ", " +
                std::string(dtype_name(g.tensors[static_cast<size_t>(s)].dtype)) + ")";
        return "it does not compute " + std::string(op_name(n.op)) + w;
      }
    return {};
  };
  // extra: keys added for this backend only (the draft model's cpu backend: exact_logits = false)
  const auto make_backend =
      [&](const std::string& name, int32_t threads, bool with_params, const std::string& where,
          std::vector<std::pair<std::string, ParamValue>> extra = {}) -> std::unique_ptr<Backend> {
    if (name == "reference") return make_reference_backend();
    if (name == "auto") { // the fastest backend present that runs the model, else the reference
      std::string why;
      if (auto f = p->registry_->find(LOOM_KIND_BACKEND, "cpu")) {
        std::vector<std::pair<std::string, ParamValue>> params;
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
          why = cannot_run(*be, *p->model_);
          if (why.empty()) return be;
          why = "the cpu backend cannot run this model: " + why;
        }
      } else {
        std::string dl;
        for (const auto& d : dirs)
          dl += (dl.empty() ? "" : ", ") + d;
        why = "no cpu backend plugin in [" + dl + "]" + p->registry_->failures();
      }
      if (with_params && !cfg.backend.params.empty())
        fail(Errc::unsupported, "pipeline",
             where + ": keys for the cpu backend were given (" + cfg.backend.params.front().first +
                 ", ...) but " + why + "; remove them or fix the cpu backend");
      p->backend_note_ = "using the reference backend (plain f32, slow): " + why;
      return make_reference_backend();
    }
    if (auto f = p->registry_->find(LOOM_KIND_BACKEND, name)) {
      std::vector<std::pair<std::string, ParamValue>> params;
      params.emplace_back("threads", int64_t{threads});
      if (with_params) params.insert(params.end(), cfg.backend.params.begin(), cfg.backend.params.end());
      if (name == "cpu") params.insert(params.end(), extra.begin(), extra.end());
      return plugin::make_plugin_backend(*f, name, params, where);
    }
    missing(LOOM_KIND_BACKEND, "backend", name, "reference, auto");
    return nullptr; // not reached: missing() throws
  };
  p->backend_ = make_backend(cfg.backend.name, cfg.backend.threads, true, cfg.source + ": [backend]");
  p->backend_name_ = std::string(p->backend_->name());
  std::optional<DraftModel> draft;
  if (cfg.decoder.draft_layers > 0) { // the target's own first layers: its mapping, its tokenizer
    if (cfg.decoder.draft_layers >= mc.n_layer)
      fail(Errc::invalid_argument, "pipeline",
           cfg.source + ": [decoder] draft_layers = " + std::to_string(cfg.decoder.draft_layers) +
               ": expected fewer than the target's " + std::to_string(mc.n_layer) + " layers");
    p->draft_model_ = p->model_->with_layers(cfg.decoder.draft_layers);
    p->draft_model_->set_attention(make_attention_variant(
        p->draft_model_->config(), AttentionChoice{"model", cfg.attention.kernel, 0, 0, {}}));
  }
  if (!cfg.decoder.draft.empty() || cfg.decoder.draft_layers > 0) {
    const std::string path =
        cfg.decoder.draft_layers > 0 ? cfg.resolved_model_path() : cfg.resolved_draft_path();
    const std::string what =
        cfg.source + (cfg.decoder.draft_layers > 0
                          ? ": [decoder] draft_layers = " + std::to_string(cfg.decoder.draft_layers)
                          : ": [decoder] draft = " + user_value(cfg.decoder.draft));
    if (cfg.decoder.draft_layers == 0) {
      if (!std::filesystem::is_regular_file(path) &&
          !std::filesystem::is_directory(path)) // dir: HF checkpoint
        fail(Errc::not_found, "pipeline",
             what + ": no such file" + (path != cfg.decoder.draft ? " (looked at " + path + ")" : "") +
                 "; give the path of a GGUF model with the target's vocabulary");
      try {
        p->draft_model_ = shared_model(path, AttentionChoice{"model", cfg.attention.kernel, 0, 0, {}});
      } catch (const Error& e) {
        fail(e.code(), "pipeline", what + " cannot be loaded: " + e.what());
      }
    }
    const auto draft_tok = Tokenizer::from_gguf(p->draft_model_->file());
    const int32_t dv = p->draft_model_->config().n_vocab;
    if (dv != mc.n_vocab || draft_tok->vocab_size() != p->tok_->vocab_size())
      fail(Errc::invalid_argument, "pipeline",
           what + " has a vocabulary of " + std::to_string(dv) + " tokens but the target (" +
               cfg.resolved_model_path() + ") has " + std::to_string(mc.n_vocab) +
               "; a draft must share the target's tokenizer");
    for (TokenId i = 0; i < dv; ++i)
      if (draft_tok->piece(i) != p->tok_->piece(i))
        fail(Errc::invalid_argument, "pipeline",
             what + ": token " + std::to_string(i) + " is " + user_value(draft_tok->piece(i), 40) +
                 " in the draft but " + user_value(p->tok_->piece(i), 40) +
                 " in the target; a draft must share the target's tokenizer");
    const std::string be = cfg.decoder.draft_backend.empty() ? p->backend_name_ : cfg.decoder.draft_backend;
    // A draft's logits need no exact route (speculative sampling is exact for whatever q it drew from):
    // on the cpu backend its head takes its type's fast kernel (a tied Q4_0 embedding: 20% of a
    // SmolLM2 draft step on the exact route), unless [backend] exact_logits is set for both.
    std::vector<std::pair<std::string, ParamValue>> draft_extra;
    const bool user_exact = std::any_of(cfg.backend.params.begin(), cfg.backend.params.end(),
                                        [](const auto& kv) { return kv.first == "exact_logits"; });
    if (!user_exact || be != p->backend_name_) draft_extra.emplace_back("exact_logits", false);
    p->draft_backend_ =
        make_backend(be, cfg.decoder.draft_threads > 0 ? cfg.decoder.draft_threads : cfg.backend.threads,
                     be == p->backend_name_, cfg.source + ": [decoder] draft_backend", draft_extra);
    KVShape dshape = p->draft_model_->kv_shape(p->n_ctx_, p->n_seq_max_);
    dshape.block_size = cfg.kv_cache.block_size;
    dshape.n_blocks = shape.n_blocks;
    dshape.prefix_cache = shape.prefix_cache;
    dshape.dtype = shape.dtype;
    p->draft_kv_ = make_store(dshape);
    draft.emplace(
        DraftModel{*p->draft_model_, *p->draft_backend_, *p->draft_kv_, cfg.decoder.draft_layers > 0});
  }
  // The built-in model_judge verifier: the judge model (the pipeline's own for "self") on a backend of
  // the pipeline's kind, its own KV.
  if (cfg.verifier.name == "model_judge") {
    const ModelJudgeOptions jo = parse_model_judge_options(cfg.verifier.params, cfg.verifier.where);
    std::shared_ptr<Model> jm = p->model_;
    if (jo.model != "self") {
      std::filesystem::path jp(jo.model);
      if (jp.is_relative() && !std::filesystem::exists(jp) && !cfg.base_dir.empty())
        jp = std::filesystem::path(cfg.base_dir) / jp;
      if (!std::filesystem::is_regular_file(jp))
        fail(Errc::not_found, "pipeline",
             cfg.verifier.where + ": model_judge.model = " + user_value(jo.model) +
                 ": no such file; give \"self\" or the path of a GGUF model");
      jm = shared_model(jp.string(), AttentionChoice{"model", cfg.attention.kernel, 0, 0, {}});
    }
    p->judge_ = std::make_shared<ModelJudge>(
        jm, Tokenizer::from_gguf(jm->file()),
        make_backend(cfg.backend.name, cfg.backend.threads, true, cfg.verifier.where + " (model_judge)"), jo,
        cfg.verifier.where);
    tmpl.verifier = p->judge_; // several candidates of a round: one batched forward (score_many)
    tmpl.verifier_tokens = [j = p->judge_.get()] { return j->tokens_evaluated(); };
  }
  // The backends must read and write KV rows of the configured type.
  const auto check_kv_type = [&](const Backend& be, const std::string& what) {
    if (!be.supports_kv_dtype(shape.dtype))
      fail(Errc::unsupported, "pipeline",
           cfg.source + ": [kv_cache] dtype = " + user_value(cfg.kv_cache.dtype) + " is not supported by " +
               what + " '" + std::string(be.name()) +
               "' (it reads f32 KV rows only; plugins built against SDK 1.4 or later can say otherwise); use "
               "dtype = \"f32\"");
  };
  check_kv_type(*p->backend_, "backend");
  // ... and run the attention the model's variant asks for, with the kernel strategy asked for.
  const auto check_attention = [&](const Backend& be, const Model& m, const std::string& what) {
    const AttentionVariant& v = m.attention();
    if (be.supports_attention(v.kernel(), v.features())) return;
    std::string can; // the kernels it does run this variant with, for the message
    for (AttnKernel k : {AttnKernel::auto_, AttnKernel::naive, AttnKernel::flash})
      if (be.supports_attention(k, v.features()))
        can += std::string(can.empty() ? "" : " or ") + "\"" + attn_kernel_name(k) + "\"";
    std::string feats;
    const uint32_t f = v.features();
    for (auto [bit, name] :
         {std::pair{attn_window, "a sliding window"}, std::pair{attn_softcap, "soft-capping"},
          std::pair{attn_sinks, "attention sinks"}})
      if (f & bit) feats += std::string(feats.empty() ? " with " : " and ") + name;
    fail(Errc::unsupported, "pipeline",
         cfg.source + ": [attention] kernel = \"" + attn_kernel_name(v.kernel()) + "\" for variant " +
             std::string(v.name()) + feats + " is not supported by " + what + " '" + std::string(be.name()) +
             "'" +
             (can.empty()
                  ? std::string("; it runs no kernel for this variant: use backend \"cpu\" (every variant) "
                                "or another variant")
                  : " (it runs kernel = " + can +
                        " for it); set attention.kernel to that or use backend "
                        "\"cpu\""));
  };
  check_attention(*p->backend_, *p->model_, "backend");
  if (p->draft_backend_) check_attention(*p->draft_backend_, *p->draft_model_, "the draft model's backend");
  if (p->draft_backend_) check_kv_type(*p->draft_backend_, "the draft model's backend");
  { // The load step: each backend gets its model's weights once (it repacks or uploads them now, not
    // inside the first forward) and allocates its KV pool.
    const auto t0 = std::chrono::steady_clock::now();
    p->model_->load_into(*p->backend_);
    p->kv_->attach(p->backend_->alloc(p->kv_->layout().bytes(), BufferUsage::kv));
    if (p->draft_backend_) {
      p->draft_model_->load_into(*p->draft_backend_);
      p->draft_kv_->attach(p->draft_backend_->alloc(p->draft_kv_->layout().bytes(), BufferUsage::kv));
    }
    p->load_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  p->engine_ = std::make_unique<Engine>(*p->model_, *p->tok_, *p->backend_, *p->kv_, p->n_ctx_,
                                        std::move(tmpl), draft);
  p->engine_->set_max_running(static_cast<size_t>(cfg.scheduler.max_sequences));
  p->engine_->set_max_batch_tokens(cfg.scheduler.max_batch_tokens);
  for (int64_t id : cfg.stop.token_ids)
    if (id >= mc.n_vocab)
      fail(Errc::invalid_argument, "pipeline",
           cfg.source + ": [stop] token_ids contains " + std::to_string(id) +
               ", outside the vocabulary (0.." + std::to_string(mc.n_vocab - 1) + ")");
  return p;
}

std::vector<TokenId> Pipeline::tokenize(std::string_view text) const {
  EncodeOptions o;
  o.add_bos = cfg_.run.add_bos;
  o.parse_special = cfg_.run.parse_special;
  return tok_->encode(text, o);
}

MemoryReport Pipeline::memory() const noexcept {
  MemoryReport m;
  m.weights = model_->config().weight_bytes;
  m.kv =
      static_cast<uint64_t>(n_ctx_) * model_->config().kv_bytes_per_token(kv_->shape().dtype); // one sequence
  const uint64_t used = backend_->workspace_bytes(); // activations + scratch, as the backend holds them
  m.activations = std::min<uint64_t>(backend_->activation_bytes(), used);
  m.workspace = used - m.activations;
  return m;
}

RequestId Pipeline::submit(const GenerationRequest& req, StreamCallback on_text) {
  EngineRequest er;
  er.prompt = req.prompt_tokens ? *req.prompt_tokens : tokenize(req.prompt);
  er.seed = req.seed ? *req.seed : cfg_.run.seed ? *cfg_.run.seed : std::random_device{}();
  er.max_new_tokens = req.max_new_tokens ? *req.max_new_tokens : cfg_.stop.max_tokens;
  er.on_text = std::move(on_text);
  er.decoder = req.decoder;
  er.task = req.task;
  return engine_->submit(std::move(er));
}

GenerationResult Pipeline::generate(const GenerationRequest& req, const StreamCallback& on_text) {
  return generate_all({req}, 1, on_text).front();
}

std::vector<GenerationResult> Pipeline::generate_all(const std::vector<GenerationRequest>& reqs,
                                                     size_t parallel, const StreamCallback& on_text) {
  std::vector<GenerationResult> out(reqs.size());
  std::map<RequestId, size_t> index;
  const size_t was = engine_->max_running(); // this call's limit only
  engine_->set_max_running(std::max<size_t>(1, parallel));
  struct Restore {
    Engine& e;
    size_t n;
    ~Restore() { e.set_max_running(n); }
  } restore{*engine_, was};
  for (size_t i = 0; i < reqs.size(); ++i)
    index[submit(reqs[i], reqs.size() == 1 ? on_text : StreamCallback{})] = i;
  size_t n_done = 0;
  while (n_done < reqs.size()) {
    for (auto& [id, res] : engine_->step()) {
      auto it = index.find(id);
      if (it == index.end()) continue;
      out[it->second] = std::move(res);
      ++n_done;
    }
  }
  return out;
}

std::vector<VerifyOutcome> StandaloneVerifier::score_all(std::span<const Item> items) const {
  std::vector<VerifyOutcome> out(items.size());
  for (size_t i = 0; i < items.size();) {
    size_t e = i + 1; // the run of items with this prompt, at once (a judge batches them)
    while (e < items.size() && items[e].prompt == items[i].prompt)
      ++e;
    std::vector<std::string_view> texts, tasks;
    for (size_t k = i; k < e; ++k) {
      texts.push_back(items[k].text);
      tasks.push_back(items[k].task);
    }
    std::vector<VerifyOutcome> r = verifier_->score_many(items[i].prompt, texts, tasks);
    if (r.size() != texts.size())
      fail(Errc::internal, "verify",
           "the verifier gave " + std::to_string(r.size()) + " outcomes for " + std::to_string(texts.size()) +
               " texts");
    std::move(r.begin(), r.end(), out.begin() + static_cast<std::ptrdiff_t>(i));
    i = e;
  }
  return out;
}

size_t StandaloneVerifier::judge_forwards() const noexcept {
  return judge_ ? judge_->forwards() : 0;
}

std::unique_ptr<StandaloneVerifier> StandaloneVerifier::create(const PipelineConfig& cfg) {
  if (cfg.verifier.name.empty())
    fail(Errc::invalid_argument, "verify",
         cfg.source + ": no verifier named; give one with --verifier NAME (or a [verifier] section)");
  std::unique_ptr<StandaloneVerifier> v(new StandaloneVerifier());
  v->registry_ = std::make_unique<PluginRegistry>();
  std::vector<std::string> dirs;
  for (const auto& d : cfg.plugins.paths) {
    std::filesystem::path pd(d);
    if (pd.is_relative() && !std::filesystem::exists(pd) && !cfg.base_dir.empty())
      pd = std::filesystem::path(cfg.base_dir) / pd;
    dirs.push_back(pd.string());
  }
  dirs = plugin_search_dirs(dirs);
  if (cfg.verifier.name == "model_judge") { // built in: a model on the reference backend (or a plugin's)
    const ModelJudgeOptions jo = parse_model_judge_options(cfg.verifier.params, cfg.verifier.where);
    std::string path = jo.model == "self" ? cfg.model.path : jo.model;
    if (path.empty())
      fail(Errc::invalid_argument, "verify",
           cfg.source +
               ": model_judge.model = \"self\" needs a pipeline model (-c with [model] path); give the "
               "judge's GGUF path instead");
    std::filesystem::path jp(path);
    if (jp.is_relative() && !std::filesystem::exists(jp) && !cfg.base_dir.empty())
      jp = std::filesystem::path(cfg.base_dir) / jp;
    if (!std::filesystem::is_regular_file(jp))
      fail(Errc::not_found, "verify", "model_judge.model = " + user_value(path) + ": no such file");
    std::shared_ptr<Model> jm = Model::load(jp.string());
    jm->set_attention(make_attention_variant(jm->config(), AttentionChoice{"model", "auto", 0, 0, {}}));
    std::unique_ptr<Backend> be;
    const std::string bn = cfg.backend.name == "auto" ? "cpu" : cfg.backend.name;
    if (bn != "reference") {
      DiscoverOptions ob;
      ob.named_only = true;
      ob.only.emplace_back(LOOM_KIND_BACKEND, bn);
      v->registry_->discover(dirs, cfg.plugins.sha256, ob);
      if (auto f = v->registry_->find(LOOM_KIND_BACKEND, bn)) {
        std::vector<std::pair<std::string, ParamValue>> params;
        params.emplace_back("threads", int64_t{cfg.backend.threads});
        be = plugin::make_plugin_backend(*f, bn, params, cfg.source + ": [backend]");
      }
    }
    if (!be) be = make_reference_backend();
    auto judge = std::make_shared<ModelJudge>(jm, Tokenizer::from_gguf(jm->file()), std::move(be), jo,
                                              cfg.verifier.where);
    v->judge_ = judge.get();
    v->verifier_ = std::move(judge);
    v->name_ = cfg.verifier.name;
    return v;
  }
  DiscoverOptions only;
  only.named_only = true;
  only.only.emplace_back(LOOM_KIND_VERIFIER, cfg.verifier.name);
  v->registry_->discover(dirs, cfg.plugins.sha256, only);
  const auto f = v->registry_->find(LOOM_KIND_VERIFIER, cfg.verifier.name);
  if (!f) {
    std::string dl;
    for (const auto& d : dirs)
      dl += (dl.empty() ? "" : ", ") + d;
    fail(Errc::not_found, "verify",
         cfg.source + ": verifier '" + cfg.verifier.name + "' is not provided by a plugin in [" + dl +
             "] (verifiers found: " + v->registry_->available(LOOM_KIND_VERIFIER) + ")" +
             v->registry_->failures());
  }
  v->verifier_ = plugin::make_plugin_verifier(*f, cfg.verifier.name, cfg.verifier.params, cfg.verifier.where);
  v->name_ = cfg.verifier.name;
  return v;
}

} // namespace loom
