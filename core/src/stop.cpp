// stop.cpp — stop reasons and the per-sequence StopTracker.
//
// Stop strings are matched on bytes. With valid UTF-8 on both sides a match can only start at a
// character boundary, so nothing held back or emitted ever splits a character.
//
// When several stop strings occur in the held text, the one that *ends* first wins (ties: the one
// that starts first, i.e. the longer). That is the match a byte-by-byte stream would have found
// first, so the result does not depend on how the text was split into tokens.
#include "loom/stop.hpp"

#include "loom/error.hpp"

#include <algorithm>

namespace loom {

std::string_view stop_reason_name(StopReason r) noexcept {
  switch (r) {
  case StopReason::none:
    return "none";
  case StopReason::eos:
    return "eos";
  case StopReason::stop_token:
    return "stop_token";
  case StopReason::stop_string:
    return "stop_string";
  case StopReason::max_tokens:
    return "max_tokens";
  case StopReason::max_context:
    return "max_context";
  case StopReason::timeout:
    return "timeout";
  case StopReason::cancelled:
    return "cancelled";
  case StopReason::custom:
    return "custom";
  case StopReason::error:
    return "error";
  }
  return "none";
}

StopTracker::StopTracker(StopConfig cfg) : cfg_(std::move(cfg)), start_(std::chrono::steady_clock::now()) {
  for (size_t i = 0; i < cfg_.strings.size(); ++i)
    if (cfg_.strings[i].empty())
      fail(Errc::invalid_argument, "stop",
           "stop string " + std::to_string(i) + " is empty; expected a non-empty string");
  if (cfg_.max_tokens < -1)
    fail(Errc::invalid_argument, "stop",
         "max_tokens = " + std::to_string(cfg_.max_tokens) + "; expected an integer ≥ 0, or -1 for no limit");
  if (cfg_.timeout_ms < 0)
    fail(Errc::invalid_argument, "stop",
         "timeout_ms = " + std::to_string(cfg_.timeout_ms) + "; expected an integer ≥ 0 (0 = no limit)");
}

StopStep StopTracker::on_token(TokenId id, std::string_view text) {
  ++n_generated_;
  StopStep step;
  const auto contains = [id](const std::vector<TokenId>& v) {
    return std::find(v.begin(), v.end(), id) != v.end();
  };

  // 1–2. End-of-generation and stop tokens: the token's own text is never streamed; the held text
  // can no longer become a stop string, so it is released.
  if (cfg_.eos && contains(cfg_.eog_tokens)) {
    step.emit = flush();
    step.reason = StopReason::eos;
    return step;
  }
  if (contains(cfg_.stop_tokens)) {
    step.emit = flush();
    step.reason = StopReason::stop_token;
    return step;
  }

  // 3. Stop strings over the held text plus the new text.
  held_.append(text);
  size_t best_end = std::string::npos, best_start = 0;
  const std::string* best = nullptr;
  for (const auto& s : cfg_.strings) {
    const size_t pos = held_.find(s);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (best == nullptr || end < best_end || (end == best_end && pos < best_start)) {
      best = &s;
      best_end = end;
      best_start = pos;
    }
  }
  if (best != nullptr) {
    step.emit = held_.substr(0, best_start);
    step.matched = *best;
    step.reason = StopReason::stop_string;
    held_.clear(); // the stop string and anything after it are dropped
    return step;
  }

  // No match: hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : cfg_.strings) {
    for (size_t len = std::min(held_.size(), s.size() - 1); len > hold; --len) {
      if (std::string_view(held_).substr(held_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  step.emit = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);

  // 4. Token budget, 5. wall clock: the sequence ends here, so nothing needs holding back any more.
  if (cfg_.max_tokens >= 0 && n_generated_ >= cfg_.max_tokens) {
    step.emit += flush();
    step.reason = StopReason::max_tokens;
  } else if (timed_out()) {
    step.emit += flush();
    step.reason = StopReason::timeout;
  }
  return step;
}

std::string StopTracker::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

bool StopTracker::timed_out() const {
  return cfg_.timeout_ms > 0 &&
         std::chrono::steady_clock::now() - start_ >= std::chrono::milliseconds(cfg_.timeout_ms);
}

} // namespace loom
