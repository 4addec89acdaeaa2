// sample/stop.cpp — stop reasons, the built-in stop criteria and the per-sequence StopTracker.
//
// Stop strings are matched on bytes. With valid UTF-8 on both sides a match can only start at a
// character boundary, so nothing held back or emitted ever splits a character.
//
// When several stop strings occur in the held text, the one that *ends* first wins (ties: the one
// that starts first, i.e. the longer). That is the match a byte-by-byte stream would have found
// first, so the result does not depend on how the text was split into tokens.
#include "loom/sample/stop.hpp"

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

namespace {

bool contains(const std::vector<TokenId>& v, TokenId id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}

// A set of token ids that ends the sequence with `reason` (end-of-generation tokens: eos; configured
// stop tokens: stop_token). The token's own text is never part of the output.
class TokenSetStop final : public StopCriterion {
public:
  TokenSetStop(std::vector<TokenId> ids, StopReason reason, std::string_view name)
      : ids_(std::move(ids)), reason_(reason), name_(name) {}
  std::string_view name() const noexcept override { return name_; }
  StopVerdict check(const StopInput& in) override {
    if (!contains(ids_, in.token)) return {};
    return {reason_, in.piece.size(), {}};
  }
  std::unique_ptr<StopCriterion> clone() const override { return std::make_unique<TokenSetStop>(*this); }

private:
  std::vector<TokenId> ids_;
  StopReason reason_;
  std::string_view name_; // a literal
};

// Stop strings over the text across token boundaries. `window_` is the end of the text that may still
// begin a stop string: it is held back from streaming.
class StringStop final : public StopCriterion {
public:
  explicit StringStop(std::vector<std::string> strings)
      : strings_(std::make_shared<const std::vector<std::string>>(std::move(strings))) {}
  std::string_view name() const noexcept override { return "stop_strings"; }
  StopVerdict check(const StopInput& in) override {
    window_.append(in.piece);
    size_t best_end = std::string::npos, best_start = 0;
    const std::string* best = nullptr;
    for (const auto& s : *strings_) {
      const size_t pos = window_.find(s);
      if (pos == std::string::npos) continue;
      const size_t end = pos + s.size();
      if (best == nullptr || end < best_end || (end == best_end && pos < best_start)) {
        best = &s;
        best_end = end;
        best_start = pos;
      }
    }
    if (best != nullptr) { // the stop string and anything after it are dropped
      StopVerdict v{StopReason::stop_string, window_.size() - best_start, *best};
      window_.clear();
      return v;
    }
    // No match: keep the longest suffix that is a proper prefix of some stop string.
    size_t hold = 0;
    for (const auto& s : *strings_)
      for (size_t len = std::min(window_.size(), s.size() - 1); len > hold; --len)
        if (std::string_view(window_).substr(window_.size() - len) == std::string_view(s).substr(0, len)) {
          hold = len;
          break;
        }
    window_.erase(0, window_.size() - hold);
    return {};
  }
  size_t holdback_bytes() const override { return window_.size(); }
  std::unique_ptr<StopCriterion> clone() const override { return std::make_unique<StringStop>(*this); }

private:
  std::shared_ptr<const std::vector<std::string>> strings_;
  std::string window_;
};

class MaxTokensStop final : public StopCriterion {
public:
  explicit MaxTokensStop(int32_t max) : max_(max) {}
  std::string_view name() const noexcept override { return "max_tokens"; }
  StopVerdict check(const StopInput&) override {
    ++n_;
    return n_ >= max_ ? StopVerdict{StopReason::max_tokens, 0, {}} : StopVerdict{};
  }
  std::unique_ptr<StopCriterion> clone() const override { return std::make_unique<MaxTokensStop>(*this); }

private:
  int32_t max_;
  int32_t n_ = 0;
};

class TimeoutStop final : public StopCriterion {
public:
  explicit TimeoutStop(int64_t ms) : ms_(ms), start_(std::chrono::steady_clock::now()) {}
  std::string_view name() const noexcept override { return "timeout"; }
  StopVerdict check(const StopInput&) override {
    return std::chrono::steady_clock::now() - start_ >= std::chrono::milliseconds(ms_)
               ? StopVerdict{StopReason::timeout, 0, {}}
               : StopVerdict{};
  }
  std::unique_ptr<StopCriterion> clone() const override { return std::make_unique<TimeoutStop>(*this); }

private:
  int64_t ms_;
  std::chrono::steady_clock::time_point start_;
};

} // namespace

std::unique_ptr<StopCriterion> make_eos_stop(std::vector<TokenId> eog_tokens) {
  return std::make_unique<TokenSetStop>(std::move(eog_tokens), StopReason::eos, "eos");
}
std::unique_ptr<StopCriterion> make_stop_tokens(std::vector<TokenId> stop_tokens) {
  return std::make_unique<TokenSetStop>(std::move(stop_tokens), StopReason::stop_token, "stop_tokens");
}
std::unique_ptr<StopCriterion> make_stop_strings(std::vector<std::string> strings) {
  for (size_t i = 0; i < strings.size(); ++i)
    if (strings[i].empty())
      fail(Errc::invalid_argument, "stop",
           "stop string " + std::to_string(i) + " is empty; expected a non-empty string");
  return std::make_unique<StringStop>(std::move(strings));
}
std::unique_ptr<StopCriterion> make_max_tokens(int32_t max_tokens) {
  if (max_tokens < 0)
    fail(Errc::invalid_argument, "stop",
         "max_tokens = " + std::to_string(max_tokens) + "; expected an integer ≥ 0");
  return std::make_unique<MaxTokensStop>(max_tokens);
}
std::unique_ptr<StopCriterion> make_timeout(int64_t timeout_ms) {
  if (timeout_ms <= 0)
    fail(Errc::invalid_argument, "stop",
         "timeout_ms = " + std::to_string(timeout_ms) + "; expected an integer > 0");
  return std::make_unique<TimeoutStop>(timeout_ms);
}

StopTracker::StopTracker(StopConfig cfg, std::vector<std::unique_ptr<StopCriterion>> custom)
    : start_(std::chrono::steady_clock::now()) {
  if (cfg.max_tokens < -1)
    fail(Errc::invalid_argument, "stop",
         "max_tokens = " + std::to_string(cfg.max_tokens) + "; expected an integer ≥ 0, or -1 for no limit");
  if (cfg.timeout_ms < 0)
    fail(Errc::invalid_argument, "stop",
         "timeout_ms = " + std::to_string(cfg.timeout_ms) + "; expected an integer ≥ 0 (0 = no limit)");
  if (cfg.eos && !cfg.eog_tokens.empty()) criteria_.push_back(make_eos_stop(cfg.eog_tokens));
  if (!cfg.stop_tokens.empty()) criteria_.push_back(make_stop_tokens(cfg.stop_tokens));
  if (!cfg.strings.empty()) criteria_.push_back(make_stop_strings(cfg.strings));
  if (cfg.max_tokens >= 0) criteria_.push_back(make_max_tokens(cfg.max_tokens));
  if (cfg.timeout_ms > 0) criteria_.push_back(make_timeout(cfg.timeout_ms));
  for (auto& c : custom)
    if (c) criteria_.push_back(std::move(c));
  cfg_ = std::make_shared<const StopConfig>(std::move(cfg));
}

StopTracker::StopTracker(const StopTracker& o)
    : cfg_(o.cfg_), held_(o.held_), n_generated_(o.n_generated_), start_(o.start_) {
  criteria_.reserve(o.criteria_.size());
  for (const auto& c : o.criteria_)
    criteria_.push_back(c->clone());
}

StopTracker& StopTracker::operator=(const StopTracker& o) {
  if (this != &o) *this = StopTracker(o); // clones first: a throwing clone leaves *this as it was
  return *this;
}

StopTracker::~StopTracker() = default;

StopStep StopTracker::on_token(TokenId id, std::string_view text, std::span<const TokenId> generated) {
  ++n_generated_;
  held_.append(text);
  const StopInput in{id, text, generated};
  StopStep step;
  for (auto& c : criteria_) {
    StopVerdict v = c->check(in);
    if (v.reason == StopReason::none) continue;
    // The sequence ends here: what is not dropped can be streamed, nothing needs holding back.
    const size_t drop = std::min(v.drop, held_.size());
    step.emit = held_.substr(0, held_.size() - drop);
    held_.clear();
    step.reason = v.reason;
    step.matched = std::move(v.matched);
    return step;
  }
  size_t hold = 0;
  for (const auto& c : criteria_)
    hold = std::max(hold, c->holdback_bytes());
  hold = std::min(hold, held_.size());
  step.emit = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return step;
}

std::string StopTracker::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

bool StopTracker::timed_out() const {
  return cfg_->timeout_ms > 0 &&
         std::chrono::steady_clock::now() - start_ >= std::chrono::milliseconds(cfg_->timeout_ms);
}

} // namespace loom
