// model_judge — the verifier that asks a model: the candidate is rendered into a judge template, the
// model reads it, and the score is its probability of the `yes` token against the `no` token at the
// end: p(yes) / (p(yes) + p(no)). Built into the host (it runs a model, which plugins reach only
// through the engine): [verifier] name = "model_judge". The judge's KV keeps the longest prefix it
// shares with the previous judgement, so the candidates of one prompt pay for the prompt once.
#include "loom/model_judge.hpp"

#include "loom/error.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>

namespace loom {

namespace {

std::string param_str(const ParamValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  return "";
}

} // namespace

ModelJudgeOptions parse_model_judge_options(const std::vector<std::pair<std::string, ParamValue>>& params,
                                            const std::string& where) {
  ModelJudgeOptions o;
  for (const auto& kv : params) {
    const std::string& k = kv.first; // (not a structured binding: clang 14 cannot capture one)
    const ParamValue& v = kv.second;
    const auto want_str = [&]() {
      if (!std::holds_alternative<std::string>(v))
        fail(Errc::invalid_argument, "verifier", where + ": model_judge." + k + " must be a string");
      return param_str(v);
    };
    if (k == "model") {
      o.model = want_str();
    } else if (k == "template") {
      o.templ = want_str();
    } else if (k == "yes") {
      o.yes = want_str();
    } else if (k == "no") {
      o.no = want_str();
    } else if (k == "n_ctx") {
      if (!std::holds_alternative<int64_t>(v) || std::get<int64_t>(v) < 16 || std::get<int64_t>(v) > 1 << 20)
        fail(Errc::invalid_argument, "verifier",
             where + ": model_judge.n_ctx must be an integer in [16, 1048576]");
      o.n_ctx = static_cast<int32_t>(std::get<int64_t>(v));
    } else {
      fail(Errc::invalid_argument, "verifier",
           where + ": model_judge has no key '" + k + "' (expected model, template, yes, no, n_ctx)");
    }
  }
  if (o.model.empty())
    fail(Errc::invalid_argument, "verifier",
         where + ": model_judge needs model = \"self\" (the pipeline's model) or the path of a GGUF judge");
  if (o.templ.find("{candidate}") == std::string::npos)
    fail(Errc::invalid_argument, "verifier",
         where + ": model_judge.template must contain {candidate} (and may contain {prompt}); got " +
             user_value(o.templ, 60));
  if (o.yes.empty() || o.no.empty() || o.yes == o.no)
    fail(Errc::invalid_argument, "verifier", where + ": model_judge.yes and .no must be two different texts");
  return o;
}

ModelJudge::ModelJudge(std::shared_ptr<Model> model, std::unique_ptr<Tokenizer> tok,
                       std::unique_ptr<Backend> be, const ModelJudgeOptions& o, const std::string& where)
    : model_(std::move(model)), tok_(std::move(tok)), be_(std::move(be)), o_(o) {
  // yes / no: one token each (as the judge's tokenizer reads them after the template's text).
  const auto single = [&](const std::string& text, const char* key) {
    EncodeOptions eo;
    eo.add_bos = false;
    eo.add_eos = false;
    eo.parse_special = true;
    const auto ids = tok_->encode(text, eo);
    if (ids.size() != 1)
      fail(Errc::invalid_argument, "verifier",
           where + ": model_judge." + key + " = " + user_value(text, 40) + " is " +
               std::to_string(ids.size()) +
               " tokens for the judge's tokenizer; give a text that is one token (e.g. \" Yes\" / \" No\")");
    return ids[0];
  };
  yes_ = single(o_.yes, "yes");
  no_ = single(o_.no, "no");
  n_ctx_ = std::min(o_.n_ctx, model_->config().n_ctx_train > 0 ? model_->config().n_ctx_train : o_.n_ctx);
  kv_ = make_contiguous_kv_cache(model_->kv_shape(n_ctx_, 1));
  model_->load_into(*be_);
  kv_->attach(be_->alloc_kv(kv_->layout()));
}

ModelJudge::~ModelJudge() = default;

double ModelJudge::score(std::string_view prompt, std::string_view candidate) {
  std::string text;
  for (size_t i = 0; i < o_.templ.size();) {
    if (o_.templ.compare(i, 8, "{prompt}") == 0) {
      text += prompt;
      i += 8;
    } else if (o_.templ.compare(i, 11, "{candidate}") == 0) {
      text += candidate;
      i += 11;
    } else {
      text += o_.templ[i++];
    }
  }
  EncodeOptions eo;
  eo.parse_special = true;
  const std::vector<TokenId> toks = tok_->encode(text, eo);
  if (toks.empty()) fail(Errc::invalid_argument, "verifier", "model_judge: the judged text is empty");
  if (static_cast<int32_t>(toks.size()) > n_ctx_)
    fail(Errc::invalid_argument, "verifier",
         "model_judge: the judged text is " + std::to_string(toks.size()) + " tokens, the judge's context " +
             std::to_string(n_ctx_) + "; raise [verifier] n_ctx or shorten the template");
  std::lock_guard lock(mu_);
  // Keep the KV of the prefix shared with the last judgement (at least one token is evaluated anew).
  size_t keep = 0;
  while (keep < cached_.size() && keep + 1 < toks.size() && cached_[keep] == toks[keep])
    ++keep;
  if (kv_->contains(0)) {
    if (keep == 0)
      kv_->free(0);
    else
      kv_->truncate(0, static_cast<int32_t>(keep));
  }
  cached_.assign(toks.begin(), toks.begin() + static_cast<std::ptrdiff_t>(keep));
  const size_t n = toks.size() - keep;
  if (!kv_->allocate(0, static_cast<int32_t>(n)))
    fail(Errc::out_of_memory, "verifier", "model_judge: no KV room for " + std::to_string(n) + " tokens");
  std::vector<TokenId> rows(toks.begin() + static_cast<std::ptrdiff_t>(keep), toks.end());
  std::vector<Pos> pos(n);
  std::vector<SeqId> seqs(n, 0);
  for (size_t i = 0; i < n; ++i)
    pos[i] = static_cast<Pos>(keep + i);
  const std::vector<int32_t> out{static_cast<int32_t>(n) - 1};
  std::vector<float> logits(static_cast<size_t>(model_->config().n_vocab));
  try {
    model_->forward(*be_, BatchView{rows, pos, seqs, out}, *kv_, logits);
  } catch (...) {
    kv_->free(0);
    cached_.clear();
    throw;
  }
  cached_ = toks;
  ++calls_;
  const double ly = static_cast<double>(logits[static_cast<size_t>(yes_)]),
               ln = static_cast<double>(logits[static_cast<size_t>(no_)]);
  if (!std::isfinite(ly) && !std::isfinite(ln)) return 0.5;
  return 1.0 / (1.0 + std::exp(ln - ly)); // p(yes) / (p(yes) + p(no))
}

} // namespace loom
