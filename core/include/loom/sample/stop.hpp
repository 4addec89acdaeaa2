// loom/sample/stop.hpp — when a sequence stops, and what text may be streamed so far.
//
// Every result carries a StopReason. Stop strings are matched on the generated text across token
// boundaries; text that could still be the start of a stop string is held back (not streamed) until
// it is resolved, and a matched stop string is never streamed (nor anything after it).
#pragma once

#include "loom/sdk/stop.hpp"
#include "loom/sdk/types.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

std::string_view stop_reason_name(StopReason r) noexcept;

struct StopConfig {
  bool eos = true;                  // stop at end-of-generation tokens (false = --ignore-eos)
  std::vector<TokenId> eog_tokens;  // filled from the tokenizer
  std::vector<TokenId> stop_tokens; // extra ids that stop
  std::vector<std::string> strings; // stop strings (non-empty)
  int32_t max_tokens = -1;          // new tokens; -1 = until the context is full
  int64_t timeout_ms = 0;           // 0 = none
};

// StopReason, StopInput, StopVerdict and StopCriterion are the SDK's (loom/sdk/stop.hpp): the built-in
// rules below (end-of-generation tokens, stop tokens, stop strings with hold-back, the token budget, the
// wall clock) and a plugin's criterion are StopCriterion objects alike, run in order by a sequence's
// StopTracker after each generated token.

// The built-in rules (StopTracker makes them from a StopConfig; usable on their own).
std::unique_ptr<StopCriterion> make_eos_stop(std::vector<TokenId> eog_tokens);      // reason eos
std::unique_ptr<StopCriterion> make_stop_tokens(std::vector<TokenId> stop_tokens);  // stop_token
std::unique_ptr<StopCriterion> make_stop_strings(std::vector<std::string> strings); // stop_string
std::unique_ptr<StopCriterion> make_max_tokens(int32_t max_tokens);                 // max_tokens
// The clock starts now; a clone keeps the start.
std::unique_ptr<StopCriterion> make_timeout(int64_t timeout_ms); // timeout

// What one generated token did to the stream.
struct StopStep {
  std::string emit;                     // text that may be streamed now
  StopReason reason = StopReason::none; // != none: the sequence is finished
  std::string matched;                  // the stop string that matched (reason == stop_string)
};

// The stop rules of one sequence: StopConfig's built-in criteria (end-of-generation tokens, stop
// tokens, stop strings, the token budget, the wall clock — in that order), then the custom ones (plugin
// criteria), and the text not streamed yet. Feed every generated token with its decoded text; a copy
// clones every criterion with its state (beams, samples and checkpoints copy it).
class StopTracker {
public:
  explicit StopTracker(StopConfig cfg, std::vector<std::unique_ptr<StopCriterion>> custom = {});
  StopTracker(const StopTracker& o);
  StopTracker& operator=(const StopTracker& o);
  StopTracker(StopTracker&&) noexcept = default;
  StopTracker& operator=(StopTracker&&) noexcept = default;
  ~StopTracker();

  // Called once per generated token, after sampling. `text` = newly decoded text of this token;
  // `generated` = every generated token, `id` last (for custom criteria; may be empty without them).
  // The first criterion that stops decides the reason.
  StopStep on_token(TokenId id, std::string_view text, std::span<const TokenId> generated = {});
  // Called when the sequence ends for a reason decided outside (max_context, cancelled …): returns
  // the held-back text that can now be streamed (no stop string matched it).
  std::string flush();
  // Whether the wall-clock limit has passed.
  bool timed_out() const;

  size_t holdback_bytes() const noexcept { return held_.size(); }
  int32_t n_generated() const noexcept { return n_generated_; }
  const StopConfig& config() const noexcept { return *cfg_; }
  size_t n_criteria() const noexcept { return criteria_.size(); }

private:
  std::shared_ptr<const StopConfig> cfg_; // shared by copies: a checkpoint per token stays cheap
  std::vector<std::unique_ptr<StopCriterion>> criteria_;
  std::string held_; // text not yet streamed: may still become (part of) a stop
  int32_t n_generated_ = 0;
  std::chrono::steady_clock::time_point start_;
};

} // namespace loom
