// `loom verify`'s verifier: a config's [verifier] on its own, without the pipeline's model — a plugin
// found on the config's plugin paths, or the built-in model_judge with its judge model.
#include "loom/error.hpp"
#include "loom/model/reference_backend.hpp"
#include "pipeline/builder.hpp"
#include "plugin/plugin_internal.hpp"

namespace loom {

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
  const std::vector<std::string> dirs = plugin_dirs(cfg);
  if (cfg.verifier.name == "model_judge") { // built in: a model on the reference backend (or a plugin's)
    const ModelJudgeOptions jo = parse_model_judge_options(cfg.verifier.params, cfg.verifier.where);
    std::string path = jo.model == "self" ? cfg.model.path : jo.model;
    if (path.empty())
      fail(Errc::invalid_argument, "verify",
           cfg.source +
               ": model_judge.model = \"self\" needs a pipeline model (-c with [model] path); give the "
               "judge's GGUF path instead");
    const std::filesystem::path jp = config_relative(cfg, path);
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
    fail(Errc::not_found, "verify",
         cfg.source + ": verifier '" + cfg.verifier.name + "' is not provided by a plugin in [" +
             joined(dirs) + "] (verifiers found: " + v->registry_->available(LOOM_KIND_VERIFIER) + ")" +
             v->registry_->failures());
  }
  v->verifier_ = plugin::make_plugin_verifier(*f, cfg.verifier.name, cfg.verifier.params, cfg.verifier.where);
  v->name_ = cfg.verifier.name;
  return v;
}

} // namespace loom
