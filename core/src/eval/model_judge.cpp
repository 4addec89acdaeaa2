// model_judge — the verifier that asks a model: the candidate is rendered into a judge template, the
// model reads it, and the score is its probability of the `yes` token against the `no` token at the
// end: p(yes) / (p(yes) + p(no)). Built into the host (it runs a model, which plugins reach only
// through the engine): [verifier] name = "model_judge". The judge's KV keeps the longest prefix it
// shares with the previous judgement, so the candidates of one prompt pay for the prompt once.
#include "loom/eval/model_judge.hpp"

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
    } else if (k == "batch") {
      if (!std::holds_alternative<int64_t>(v) || std::get<int64_t>(v) < 1 || std::get<int64_t>(v) > 64)
        fail(Errc::invalid_argument, "verifier",
             where + ": model_judge.batch must be an integer in [1, 64] (candidates per judge forward)");
      o.batch = static_cast<int32_t>(std::get<int64_t>(v));
    } else {
      fail(Errc::invalid_argument, "verifier",
           where + ": model_judge has no key '" + k + "' (expected model, template, yes, no, n_ctx, batch)");
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
  // A paged store: sequence 0 holds the prefix the candidates share, sequences 1..batch the candidates
  // of one forward, forked from it (its full blocks shared, not copied). Room for two full contexts.
  KVShape shape = model_->kv_shape(n_ctx_, o_.batch + 1);
  const int64_t blocks = (n_ctx_ + shape.block_size - 1) / shape.block_size;
  shape.n_blocks = 2 * blocks + o_.batch;
  kv_ = make_paged_kv_cache(shape);
  model_->load_into(*be_);
  kv_->memory().attach(be_->alloc(kv_->memory().layout().bytes(), BufferUsage::kv));
}

ModelJudge::~ModelJudge() = default;

std::vector<TokenId> ModelJudge::render(std::string_view prompt, std::string_view candidate) const {
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
  std::vector<TokenId> toks = tok_->encode(text, eo);
  if (toks.empty()) fail(Errc::invalid_argument, "verifier", "model_judge: the judged text is empty");
  if (static_cast<int32_t>(toks.size()) > n_ctx_)
    fail(Errc::invalid_argument, "verifier",
         "model_judge: the judged text is " + std::to_string(toks.size()) + " tokens, the judge's context " +
             std::to_string(n_ctx_) + "; raise [verifier] n_ctx or shorten the template");
  return toks;
}

double ModelJudge::judge(const float* logits) const {
  const double ly = static_cast<double>(logits[static_cast<size_t>(yes_)]),
               ln = static_cast<double>(logits[static_cast<size_t>(no_)]);
  if (!std::isfinite(ly) && !std::isfinite(ln)) return 0.5;
  return 1.0 / (1.0 + std::exp(ln - ly)); // p(yes) / (p(yes) + p(no))
}

// Sequence 0 := the K/V of toks[0, n): what it shares with the last judgement is kept, the rest
// evaluated in one forward. want_logits: the logits after toks[n - 1] (then at least one token is
// evaluated anew). Called with mu_ held.
void ModelJudge::extend_base(std::span<const TokenId> toks, size_t n, std::vector<float>* want_logits) {
  size_t keep = 0;
  const size_t keep_max = want_logits ? n - 1 : n;
  while (keep < cached_.size() && keep < keep_max && cached_[keep] == toks[keep])
    ++keep;
  if (kv_->contains(0)) {
    if (keep == 0)
      kv_->free(0);
    else
      kv_->truncate(0, static_cast<int32_t>(keep));
  }
  cached_.assign(toks.begin(), toks.begin() + static_cast<std::ptrdiff_t>(keep));
  if (keep == n) return;
  const size_t m = n - keep;
  if (!kv_->allocate(0, static_cast<int32_t>(m)))
    fail(Errc::out_of_memory, "verifier", "model_judge: no KV room for " + std::to_string(m) + " tokens");
  const std::vector<TokenId> rows(toks.begin() + static_cast<std::ptrdiff_t>(keep),
                                  toks.begin() + static_cast<std::ptrdiff_t>(n));
  std::vector<Pos> pos(m);
  const std::vector<SeqId> seqs(m, 0);
  for (size_t i = 0; i < m; ++i)
    pos[i] = static_cast<Pos>(keep + i);
  const std::vector<int32_t> out{static_cast<int32_t>(m) - 1};
  std::vector<float> scratch;
  std::vector<float>& logits = want_logits ? *want_logits : scratch;
  logits.resize(static_cast<size_t>(model_->config().n_vocab));
  try {
    model_->forward(*be_, BatchView{rows, pos, seqs, out}, *kv_, logits);
  } catch (...) {
    kv_->free(0);
    cached_.clear();
    throw;
  }
  ++forwards_;
  tokens_ += m;
  cached_.assign(toks.begin(), toks.begin() + static_cast<std::ptrdiff_t>(n));
}

double ModelJudge::score(std::string_view prompt, std::string_view candidate, std::string_view /*task*/) {
  const std::vector<TokenId> toks = render(prompt, candidate);
  std::lock_guard lock(mu_);
  std::vector<float> logits;
  extend_base(toks, toks.size(), &logits);
  ++calls_;
  return judge(logits.data());
}

std::vector<VerifyOutcome> ModelJudge::score_many(std::string_view prompt,
                                                  std::span<const std::string_view> candidates,
                                                  std::span<const std::string_view> /*tasks*/) {
  std::vector<VerifyOutcome> res(candidates.size());
  std::vector<std::vector<TokenId>> toks(candidates.size());
  std::vector<size_t> todo; // the candidates that rendered
  for (size_t i = 0; i < candidates.size(); ++i) {
    try {
      toks[i] = render(prompt, candidates[i]);
      todo.push_back(i);
    } catch (const std::exception& e) {
      res[i].error = e.what();
    }
  }
  if (todo.empty()) return res;
  if (todo.size() == 1) { // alone: one forward on sequence 0, as score()
    std::lock_guard lock(mu_);
    try {
      std::vector<float> logits;
      extend_base(toks[todo[0]], toks[todo[0]].size(), &logits);
      ++calls_;
      res[todo[0]].score = judge(logits.data());
    } catch (const std::exception& e) {
      res[todo[0]].error = e.what();
    }
    return res;
  }
  // The prefix every candidate shares (each keeps at least its last token to evaluate).
  size_t lcp = toks[todo[0]].size() - 1;
  for (size_t i : todo) {
    lcp = std::min(lcp, toks[i].size() - 1);
    size_t k = 0;
    while (k < lcp && toks[i][k] == toks[todo[0]][k])
      ++k;
    lcp = k;
  }
  const size_t n_vocab = static_cast<size_t>(model_->config().n_vocab);
  constexpr size_t kMaxRows = 2048; // rows of one candidates' forward (a lone longer candidate still runs)
  std::lock_guard lock(mu_);
  size_t next = 0; // todo[next..] are still to judge
  try {
    extend_base(toks[todo[0]], lcp, nullptr);
    std::vector<float> logits;
    while (next < todo.size()) {
      std::vector<TokenId> rows;
      std::vector<Pos> pos;
      std::vector<SeqId> seqs;
      std::vector<int32_t> outs;
      std::vector<size_t> who;
      SeqId sid = 1;
      struct Release { // the forked sequences go back however this batch ends (an exception included)
        KVCacheStore& kv;
        SeqId last;
        ~Release() {
          for (SeqId q = 1; q <= last; ++q)
            if (kv.contains(q)) kv.free(q);
        }
      } release{*kv_, o_.batch};
      // A candidate of this batch not scored when it throws: judged as failed with the rest (below).
      struct Rewind {
        size_t& next;
        const std::vector<size_t>& who;
        bool armed = true;
        ~Rewind() {
          if (armed) next -= who.size();
        }
      } rewind{next, who};
      while (next < todo.size() && sid <= o_.batch) {
        const std::vector<TokenId>& t = toks[todo[next]];
        const size_t m = t.size() - lcp;
        if (!who.empty() && rows.size() + m > kMaxRows) break;
        bool ok = lcp == 0 || kv_->fork(0, sid);
        if (ok && !kv_->allocate(sid, static_cast<int32_t>(m))) {
          if (lcp > 0) kv_->free(sid);
          ok = false;
        }
        if (!ok) {
          if (!who.empty()) break; // the rest in the next forward
          fail(Errc::out_of_memory, "verifier",
               "model_judge: no KV room for a candidate of " + std::to_string(t.size()) + " tokens");
        }
        for (size_t k = lcp; k < t.size(); ++k) {
          rows.push_back(t[k]);
          pos.push_back(static_cast<Pos>(k));
          seqs.push_back(sid);
        }
        outs.push_back(static_cast<int32_t>(rows.size()) - 1);
        who.push_back(todo[next]);
        ++sid;
        ++next;
      }
      logits.resize(outs.size() * n_vocab);
      model_->forward(*be_, BatchView{rows, pos, seqs, outs}, *kv_, logits);
      rewind.armed = false;
      ++forwards_;
      tokens_ += rows.size();
      for (size_t j = 0; j < who.size(); ++j) {
        res[who[j]].score = judge(logits.data() + j * n_vocab);
        ++calls_;
      }
    }
  } catch (const std::exception& e) { // the candidates not judged yet fail with it
    for (size_t j = next; j < todo.size(); ++j)
      res[todo[j]].error = e.what();
  }
  return res;
}

} // namespace loom
