// plugins/json_stop/json_stop.cpp — the "stop_json" plugin: the stop criterion "json_complete".
//
// Stops a sequence (LOOM_STOP_CUSTOM) as soon as the text generated so far contains one complete
// top-level JSON object or array, starting at the first '{' or '['. The text arrives in pieces
// (one per token), so the scanner keeps its state between calls: the nesting depth and whether it
// is inside a string or just after a backslash there. Brackets inside strings do not count.
//
// Key `allow_prefix` (bool, default true): text before the first '{' / '[' is allowed. When false,
// the first non-whitespace character must open the value; if it does not, the text is not a JSON
// value and this criterion never fires for the sequence (the other stop rules still apply).
//
// The scan is byte-wise: every byte JSON treats specially is ASCII, and UTF-8 continuation bytes
// never equal one, so multi-byte characters (even split across pieces) need no care.
#include "loom/sdk/plugin.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

namespace {

class JsonComplete final : public loom::StopCriterion {
public:
  explicit JsonComplete(const loom::sdk::Config& cfg) : allow_prefix_(cfg.get_bool("allow_prefix", true)) {}

  loom::StopVerdict check(const loom::StopInput& in) override {
    for (const char ch : in.piece) {
      if (state_ == State::complete || state_ == State::rejected) break;
      step(ch);
    }
    loom::StopVerdict v;
    if (state_ == State::complete) v.reason = loom::StopReason::custom;
    return v;
  }

  std::unique_ptr<loom::StopCriterion> clone() const override {
    return std::make_unique<JsonComplete>(*this);
  }

private:
  enum class State : uint8_t {
    before,   // no '{' / '[' yet
    inside,   // within the value, depth_ > 0
    complete, // the value closed: stop
    rejected, // allow_prefix = false and the text did not start with a value: never fires
  };

  static bool is_json_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

  void step(char ch) {
    if (state_ == State::before) {
      if (ch == '{' || ch == '[') {
        state_ = State::inside;
        depth_ = 1;
      } else if (!allow_prefix_ && !is_json_space(ch)) {
        state_ = State::rejected;
      }
      return;
    }
    // State::inside
    if (in_string_) {
      if (escaped_)
        escaped_ = false;
      else if (ch == '\\')
        escaped_ = true;
      else if (ch == '"')
        in_string_ = false;
      return;
    }
    switch (ch) {
    case '"':
      in_string_ = true;
      break;
    case '{':
    case '[':
      ++depth_;
      break;
    case '}':
    case ']':
      if (--depth_ == 0) state_ = State::complete;
      break;
    default:
      break;
    }
  }

  bool allow_prefix_;
  State state_ = State::before;
  uint64_t depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
};

} // namespace

LOOM_PLUGIN_DEFINE("stop_json", "1.0.0", LOOM_STOP("json_complete", JsonComplete));
