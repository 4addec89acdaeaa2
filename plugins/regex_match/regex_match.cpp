// "regex_match": a verifier that scores a candidate 1 when it matches a regular
// expression and 0 otherwise — for answers whose form is known (a number, a yes/no, a JSON key).
//
//   [verifier]
//   name = "regex_match"
//   pattern = '^\s*[0-9]+\s*$'   # ECMAScript syntax (required)
//   full = false                 # true: the whole text must match; false: a match anywhere
#include "loom/sdk/plugin.hpp"

#include <regex>
#include <string>

namespace {

class RegexMatch final : public loom::Verifier {
public:
  explicit RegexMatch(const loom::sdk::Config& cfg) {
    if (!cfg.has("pattern"))
      throw loom::sdk::Error("regex_match: the key 'pattern' is required (a regular expression)");
    const std::string p = cfg.get_str("pattern", "");
    full_ = cfg.get_bool("full", false);
    try {
      re_ = std::regex(p, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw loom::sdk::Error("regex_match: pattern does not compile (" + std::string(e.what()) +
                             "); expected an ECMAScript regular expression");
    }
  }
  double score(std::string_view, std::string_view text, std::string_view) override {
    const std::string t(text);
    return (full_ ? std::regex_match(t, re_) : std::regex_search(t, re_)) ? 1.0 : 0.0;
  }

private:
  std::regex re_;
  bool full_ = false;
};

} // namespace

LOOM_PLUGIN_DEFINE("regex_match", "1.0.0", LOOM_VERIFIER("regex_match", RegexMatch));
