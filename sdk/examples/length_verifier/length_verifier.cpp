// length_verifier — an out-of-tree verifier plugin, built against the installed SDK alone:
// it scores a candidate by how close its length in words is to a target,
//   score = max(0, 1 - |words - target_words| / target_words),
// so that self-consistency voting can prefer answers of the expected size.
//
//   [verifier]
//   name = "length_verifier"
//   target_words = 6
#include "loom/sdk/plugin.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

namespace {

class LengthVerifier final : public loom::Verifier {
public:
  explicit LengthVerifier(const loom::sdk::Config& cfg) {
    const int64_t t = cfg.get_i64("target_words", 6);
    if (t < 1 || t > 100000)
      throw loom::sdk::Error("length_verifier: target_words must be an integer in [1, 100000], got " +
                             std::to_string(t));
    target_ = static_cast<double>(t);
  }
  double score(std::string_view, std::string_view text, std::string_view /*task*/) override {
    size_t words = 0;
    bool in_word = false;
    for (char c : text) {
      const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
      if (!space && !in_word) ++words;
      in_word = !space;
    }
    return std::max(0.0, 1.0 - std::fabs(static_cast<double>(words) - target_) / target_);
  }

private:
  double target_ = 6;
};

} // namespace

LOOM_PLUGIN_DEFINE("length_verifier", "1.0.0", LOOM_VERIFIER("length_verifier", LengthVerifier));
