// DecodeSession's verifier facet (loom_verify_api): the pipeline's verifier on this request's prompt and
// a candidate text, with the rows its own model evaluated counted for the request.
#include "loom/engine/decode_session.hpp"
#include "loom/error.hpp"

namespace loom {

namespace {
// Adds the rows a verifier's model evaluated during one call to `total` (also when the verifier throws).
class VerifierTokenCount {
public:
  VerifierTokenCount(const SessionContext& c, size_t& total)
      : c_(c), total_(total), before_(c.verifier_tokens ? c.verifier_tokens() : 0) {}
  ~VerifierTokenCount() {
    if (c_.verifier_tokens) total_ += c_.verifier_tokens() - before_;
  }
  VerifierTokenCount(const VerifierTokenCount&) = delete;
  VerifierTokenCount& operator=(const VerifierTokenCount&) = delete;

private:
  const SessionContext& c_;
  size_t& total_;
  size_t before_;
};
} // namespace

const std::string& DecodeSession::verifier_prompt() const {
  if (!ctx_.verifier)
    fail(Errc::not_found, "decoder",
         "the pipeline names no verifier; add a [verifier] section (name = a verifier plugin)");
  if (!prompt_text_) prompt_text_ = ctx_.tok.decode(prompt_); // once per request, not per candidate
  return *prompt_text_;
}

double DecodeSession::verify(std::string_view text) const {
  const std::string& prompt = verifier_prompt();
  const VerifierTokenCount count(ctx_, verifier_tokens_);
  return ctx_.verifier->score(prompt, text, task_);
}

std::vector<VerifyOutcome> DecodeSession::verify_many(std::span<const std::string_view> texts) const {
  const std::string& prompt = verifier_prompt();
  const VerifierTokenCount count(ctx_, verifier_tokens_);
  const std::vector<std::string_view> tasks(texts.size(), task_); // the request's, for each text
  std::vector<VerifyOutcome> r = ctx_.verifier->score_many(prompt, texts, tasks);
  if (r.size() != texts.size())
    fail(Errc::internal, "decoder",
         "the verifier gave " + std::to_string(r.size()) + " outcomes for " + std::to_string(texts.size()) +
             " texts");
  return r;
}

} // namespace loom
