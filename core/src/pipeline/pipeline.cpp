// A request's whole path, start to end: Pipeline::create builds the components a TOML pipeline
// names; submit() tokenizes and hands the request to the Engine (engine.cpp: admission and the
// batched step loop, via scheduler.cpp), whose DecodeSession (decode_session.cpp) appends each
// sampled token, runs the stop rules and streams the text; the decoder drives it.
#include "loom/pipeline/pipeline.hpp"

#include "loom/error.hpp"
#include "pipeline/builder.hpp"

#include <algorithm>
#include <map>
#include <random>

namespace loom {

// A request's whole path starts here: the parts a TOML pipeline names, built in the order a user fixes
// them (pipeline/builder.cpp, a step each).
std::unique_ptr<Pipeline> Pipeline::create(const PipelineConfig& cfg) {
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->cfg_ = cfg;
  if (cfg.model.path.empty())
    fail(Errc::invalid_argument, "pipeline", cfg.source + ": [model] path is required (a .gguf file)");
  PipelineBuilder b(p->cfg_, *p);
  b.open_plugins();
  b.build_sampler_chain();
  b.build_stop_rules();
  b.choose_decoder();
  b.load_model();
  b.find_verifier_plugin();
  b.fill_request_template();
  b.choose_backend();
  b.make_kv_store(); // what it keeps depends on what the backend reads
  b.make_draft();
  b.make_model_judge();
  b.check_backends();
  b.load_weights();
  b.make_engine();
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
  m.kv = kv_->bytes_for(n_ctx_);                     // one sequence of the whole context
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

} // namespace loom
