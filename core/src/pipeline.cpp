// A request's whole path, start to end: tokenize → prefill → (sample → stop → stream → decode)*.
#include "loom/pipeline.hpp"

#include "loom/error.hpp"

#include <algorithm>
#include <chrono>
#include <random>

namespace loom {

namespace {
using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
} // namespace

std::unique_ptr<Pipeline> Pipeline::create(const PipelineConfig& cfg) {
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->cfg_ = cfg;
  if (cfg.backend.name != "reference")
    fail(Errc::not_found, "pipeline",
         cfg.source + ": [backend] name = \"" + cfg.backend.name +
             "\" is not available; built-in backends: reference (the plugin backends are not part of this "
             "build)");
  if (cfg.decoder.name != "sample")
    fail(Errc::not_found, "pipeline",
         cfg.source + ": [decoder] name = \"" + cfg.decoder.name +
             "\" is not available; built-in decoders: sample");
  if (cfg.kv_cache.store != "contiguous")
    fail(Errc::unsupported, "pipeline",
         cfg.source + ": [kv_cache] store = \"" + cfg.kv_cache.store +
             "\" is not available on the reference backend; use store = \"contiguous\"");
  if (cfg.kv_cache.dtype != "f32")
    fail(Errc::unsupported, "pipeline",
         cfg.source + ": [kv_cache] dtype = \"" + cfg.kv_cache.dtype +
             "\" is not available on the reference backend; use dtype = \"f32\"");
  if (cfg.attention.kernel != "naive")
    fail(Errc::unsupported, "pipeline",
         cfg.source + ": [attention] kernel = \"" + cfg.attention.kernel +
             "\" is not available on the reference backend; use kernel = \"naive\"");
  if (cfg.model.path.empty())
    fail(Errc::invalid_argument, "pipeline", cfg.source + ": [model] path is required (a .gguf file)");

  // Samplers first: cheap to validate, so a bad chain fails before the model loads.
  if (cfg.samplers.empty()) {
    p->chain_ = make_default_chain(SamplingParams{});
  } else {
    for (const auto& s : cfg.samplers)
      p->chain_.add(create_sampler(s));
  }

  p->model_ = Model::load(cfg.resolved_model_path());
  p->tok_ = Tokenizer::from_gguf(p->model_->file());
  const ModelConfig& mc = p->model_->config();
  if (p->tok_->vocab_size() != mc.n_vocab)
    fail(Errc::parse_error, "pipeline",
         cfg.resolved_model_path() + ": the tokenizer has " + std::to_string(p->tok_->vocab_size()) +
             " tokens but the model's embedding has " + std::to_string(mc.n_vocab) + " rows");
  if (cfg.attention.variant == "sliding_window") p->model_->set_attention_window(cfg.attention.window);
  p->n_ctx_ = cfg.model.n_ctx > 0 ? cfg.model.n_ctx : std::min(mc.n_ctx_train, 4096);
  KVShape shape = p->model_->kv_shape(p->n_ctx_, 1);
  if (cfg.kv_cache.max_tokens > 0 && cfg.kv_cache.max_tokens < p->n_ctx_)
    fail(Errc::invalid_argument, "pipeline",
         cfg.source + ": [kv_cache] max_tokens = " + std::to_string(cfg.kv_cache.max_tokens) +
             " is smaller than the context (" + std::to_string(p->n_ctx_) +
             "); raise it or lower [model] n_ctx");
  p->kv_ = make_contiguous_kv_cache(shape);
  p->backend_ = make_reference_backend();
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
  m.kv = kv_->bytes_capacity();
  m.activations = backend_->workspace_bytes();
  return m;
}

GenerationResult Pipeline::generate(const GenerationRequest& req, const StreamCallback& on_text) {
  const auto t_start = Clock::now();
  GenerationResult res;
  res.seed = req.seed ? *req.seed : cfg_.run.seed ? *cfg_.run.seed : std::random_device{}();
  std::mt19937_64 rng(res.seed);

  res.prompt_tokens = req.prompt_tokens ? *req.prompt_tokens : tokenize(req.prompt);
  const auto n_prompt = static_cast<int32_t>(res.prompt_tokens.size());
  res.metrics.n_prompt = n_prompt;
  const int32_t n_vocab = model_->config().n_vocab;
  if (n_prompt == 0)
    fail(Errc::invalid_argument, "pipeline",
         "the prompt is empty and no BOS token is added: there is nothing to condition on (give a prompt or "
         "enable [run] add_bos)");
  for (TokenId t : res.prompt_tokens)
    if (t < 0 || t >= n_vocab)
      fail(Errc::invalid_argument, "pipeline",
           "prompt token " + std::to_string(t) + " is outside the vocabulary (0.." +
               std::to_string(n_vocab - 1) + ")");

  StopConfig sc;
  sc.eos = cfg_.stop.eos;
  sc.eog_tokens = tok_->eog_tokens();
  for (int64_t id : cfg_.stop.token_ids)
    sc.stop_tokens.push_back(static_cast<TokenId>(id));
  sc.strings = cfg_.stop.strings;
  sc.max_tokens = req.max_new_tokens ? *req.max_new_tokens : cfg_.stop.max_tokens;
  sc.timeout_ms = cfg_.stop.timeout_ms;
  StopTracker stop(sc);

  if (n_prompt >= n_ctx_) { // a clean stop, not an error: the request ends, the pipeline goes on
    res.stop_reason = StopReason::max_context;
    res.message = "the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                  std::to_string(n_ctx_) +
                  " (prompt + at least one new token); shorten the prompt or raise [model] n_ctx";
    res.metrics.total_ms = ms_between(t_start, Clock::now());
    return res;
  }
  if (sc.max_tokens == 0) {
    res.stop_reason = StopReason::max_tokens;
    res.metrics.total_ms = ms_between(t_start, Clock::now());
    return res;
  }

  // Incremental detokenization continues from the prompt, so SentencePiece's leading-space rule
  // applies only when the prompt produced no text.
  DecodeState ds;
  {
    std::string prompt_text;
    for (TokenId t : res.prompt_tokens)
      tok_->decode_step(ds, t, prompt_text);
    ds.pending.clear();
  }
  const std::unique_ptr<Sampler> chain_owner = chain_.clone(); // per-request state (penalties …)
  auto& chain = static_cast<SamplerChain&>(*chain_owner);
  chain.reset();

  const SeqId seq = 0;
  kv_->free(seq);
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  std::vector<Pos> positions(static_cast<size_t>(n_prompt));
  for (int32_t i = 0; i < n_prompt; ++i)
    positions[static_cast<size_t>(i)] = i;
  std::vector<SeqId> seqs(static_cast<size_t>(n_prompt), seq);
  int32_t out_row = n_prompt - 1;
  if (!kv_->allocate(seq, n_prompt))
    LOOM_ASSERT(false, "KV allocation for a prompt that fits the context failed");
  const auto t_prefill0 = Clock::now();
  model_->forward(*backend_,
                  BatchView{res.prompt_tokens, positions, seqs, std::span<const int32_t>(&out_row, 1)}, *kv_,
                  logits);
  const auto t_prefill1 = Clock::now();

  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    res.text += s;
    if (on_text) on_text(s);
  };

  Clock::time_point t_first{};
  while (true) {
    SamplerContext ctx{res.prompt_tokens, res.tokens, &rng};
    const TokenId tok = chain.sample(logits, ctx);
    res.logprobs.push_back(token_logprob(logits, tok));
    chain.accept(tok);
    res.tokens.push_back(tok);
    if (res.tokens.size() == 1) t_first = Clock::now();

    std::string piece;
    if (!tok_->is_eog(tok) || !sc.eos) tok_->decode_step(ds, tok, piece);
    StopStep st = stop.on_token(tok, piece);
    emit(st.emit);
    if (st.reason != StopReason::none) {
      res.stop_reason = st.reason;
      res.stop_string = st.matched;
      break;
    }
    const Pos pos = n_prompt + static_cast<int32_t>(res.tokens.size()) - 1;
    if (pos >= n_ctx_ || !kv_->allocate(seq, 1)) {
      emit(stop.flush());
      res.stop_reason = StopReason::max_context;
      break;
    }
    if (stop.timed_out()) {
      emit(stop.flush());
      res.stop_reason = StopReason::timeout;
      break;
    }
    int32_t zero = 0;
    model_->forward(*backend_,
                    BatchView{std::span<const TokenId>(&res.tokens.back(), 1), std::span<const Pos>(&pos, 1),
                              std::span<const SeqId>(&seq, 1), std::span<const int32_t>(&zero, 1)},
                    *kv_, logits);
  }
  kv_->free(seq);
  if (res.stop_reason != StopReason::eos && res.stop_reason != StopReason::stop_string &&
      res.stop_reason != StopReason::stop_token) {
    std::string tail; // bytes of a UTF-8 character the budget cut in half
    tok_->decode_flush(ds, tail);
    emit(tail);
  }

  const auto t_end = Clock::now();
  auto& m = res.metrics;
  m.n_generated = static_cast<int32_t>(res.tokens.size());
  m.total_ms = ms_between(t_start, t_end);
  m.ttft_ms = ms_between(t_start, t_first);
  const double prefill_s = std::chrono::duration<double>(t_prefill1 - t_prefill0).count();
  m.prefill_tok_s = prefill_s > 0 ? n_prompt / prefill_s : 0;
  if (m.n_generated > 1) {
    const double decode_ms = ms_between(t_first, t_end);
    m.tpot_ms = decode_ms / (m.n_generated - 1);
    m.decode_tok_s = decode_ms > 0 ? (m.n_generated - 1) * 1000.0 / decode_ms : 0;
  }
  return res;
}

} // namespace loom
