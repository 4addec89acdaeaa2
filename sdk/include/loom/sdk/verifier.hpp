// loom/sdk/verifier.hpp — the Verifier interface: the built-in model_judge and a plugin's verifier
// implement it alike. A verifier scores a candidate answer in [0, 1] (1 = certainly right).
// Header-only: plugins compile it in.
#pragma once

#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// One text's outcome when a verifier is asked about several: a score in [0, 1], or why that text could
// not be scored (the others still are).
struct VerifyOutcome {
  double score = 0;
  std::string error; // non-empty: this text failed
  bool ok() const noexcept { return error.empty(); }
};

class Verifier {
public:
  virtual ~Verifier() = default;
  // `text` as an answer to `prompt`; `task` is the request's task, a JSON object (e.g.
  // {"tests": [...]}) the caller gave with the request, "" when it has none. Must be safe for any text.
  virtual double score(std::string_view prompt, std::string_view text, std::string_view task) = 0;
  // Several texts of one prompt at once (a judge model scores them in one batched forward), text i with
  // tasks[i] (tasks empty: none has one): one outcome each, a failing text failing alone. By default one
  // by one through score().
  virtual std::vector<VerifyOutcome> score_many(std::string_view prompt,
                                                std::span<const std::string_view> texts,
                                                std::span<const std::string_view> tasks) {
    std::vector<VerifyOutcome> out(texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      try {
        out[i].score = score(prompt, texts[i], i < tasks.size() ? tasks[i] : std::string_view());
      } catch (const std::exception& e) {
        out[i].error = e.what();
      }
    }
    return out;
  }
};

} // namespace loom
