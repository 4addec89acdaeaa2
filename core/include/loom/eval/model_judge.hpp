// loom/eval/model_judge.hpp — the built-in verifier "model_judge": a model scores a candidate by the
// probability it gives to a "yes" token after a judge template (see core/src/model_judge.cpp).
#pragma once

#include "loom/kv/kv_cache.hpp"
#include "loom/model/model.hpp"
#include "loom/pipeline/pipeline_config.hpp"
#include "loom/sdk/executor.hpp"
#include "loom/sdk/verifier.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

struct ModelJudgeOptions {
  std::string model; // "self": the pipeline's model; else a GGUF path
  // The text the judge reads: {prompt} and {candidate} are replaced; special-token text is parsed.
  std::string templ = "{prompt}{candidate}\n\nIs the answer above correct? Answer yes or no.\nAnswer:";
  std::string yes = " yes", no = " no"; // one token each for the judge's tokenizer
  int32_t n_ctx = 4096;                 // the judge's context (capped at the model's training length)
  int32_t batch = 8;                    // the most candidates one judge forward takes (1..64)
};

// [verifier] name = "model_judge" keys: model, template, yes, no, n_ctx, batch; anything else is an error.
ModelJudgeOptions parse_model_judge_options(const std::vector<std::pair<std::string, ParamValue>>& params,
                                            const std::string& where);

// A Verifier (loom/sdk/verifier.hpp) as a plugin's is; the task is not shown to the judge.
class ModelJudge final : public Verifier {
public:
  // The model is shared (the pipeline's own for "self"); the backend is the judge's own.
  ModelJudge(std::shared_ptr<Model> model, std::unique_ptr<Tokenizer> tok, std::unique_ptr<Backend> be,
             const ModelJudgeOptions& o, const std::string& where);
  ~ModelJudge() override;
  ModelJudge(const ModelJudge&) = delete;
  ModelJudge& operator=(const ModelJudge&) = delete;
  // p(yes) / (p(yes) + p(no)) at the end of the template with the prompt and candidate in it.
  double score(std::string_view prompt, std::string_view candidate, std::string_view task) override;
  // Several candidates of one prompt at once: their common prefix is evaluated once (sequence 0), each
  // candidate's rest in a sequence forked from it (sharing its blocks), up to `batch` candidates per
  // forward. One outcome per candidate: a score, or why that candidate could not be judged (e.g. longer
  // than the judge's context). The tasks are not shown to the judge.
  std::vector<VerifyOutcome> score_many(std::string_view prompt, std::span<const std::string_view> candidates,
                                        std::span<const std::string_view> tasks) override;
  size_t calls() const noexcept { return calls_; }             // candidates judged
  size_t forwards() const noexcept { return forwards_; }       // judge forwards run
  size_t tokens_evaluated() const noexcept { return tokens_; } // token rows those forwards evaluated

private:
  std::shared_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Backend> be_;
  ModelJudgeOptions o_;
  std::unique_ptr<KVCacheStore> kv_;
  std::vector<TokenId> cached_; // the tokens whose K/V sequence 0 holds
  TokenId yes_ = -1, no_ = -1;
  int32_t n_ctx_ = 0;
  size_t calls_ = 0, forwards_ = 0, tokens_ = 0;

  std::vector<TokenId> render(std::string_view prompt, std::string_view candidate) const;
  // sequence 0 := toks[0, n), evaluated; want_logits: the logits after toks[n - 1]
  void extend_base(std::span<const TokenId> toks, size_t n, std::vector<float>* want_logits);
  double judge(const float* logits) const;
  std::mutex mu_;
};

} // namespace loom
