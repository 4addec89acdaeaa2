// loom/stop.hpp — when a sequence stops, and what text may be streamed so far.
//
// Every result carries a StopReason. Stop strings are matched on the generated text across token
// boundaries; text that could still be the start of a stop string is held back (not streamed) until
// it is resolved, and a matched stop string is never streamed (nor anything after it).
#pragma once

#include "loom/types.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

enum class StopReason : uint8_t {
  none,        // still running
  eos,         // an end-of-generation token (EOS, EOT, …)
  stop_token,  // one of the configured stop token ids
  stop_string, // one of the configured stop strings appeared in the text
  max_tokens,  // the new-token budget is spent
  max_context, // the context window is full (or the prompt did not fit)
  timeout,     // wall-clock limit
  cancelled,   // cancelled by the caller
  custom,      // a plugin criterion
  error,       // the request failed (GenerationResult::message says why)
};
std::string_view stop_reason_name(StopReason r) noexcept;

struct StopConfig {
  bool eos = true;                  // stop at end-of-generation tokens (false = --ignore-eos)
  std::vector<TokenId> eog_tokens;  // filled from the tokenizer
  std::vector<TokenId> stop_tokens; // extra ids that stop
  std::vector<std::string> strings; // stop strings (non-empty)
  int32_t max_tokens = -1;          // new tokens; -1 = until the context is full
  int64_t timeout_ms = 0;           // 0 = none
};

// What one generated token did to the stream.
struct StopStep {
  std::string emit;                     // text that may be streamed now
  StopReason reason = StopReason::none; // != none: the sequence is finished
  std::string matched;                  // the stop string that matched (reason == stop_string)
};

// Tracks one sequence: feed every generated token with its decoded text (possibly empty while a
// UTF-8 character is incomplete). Cheap to copy (beams / samples clone it).
class StopTracker {
public:
  explicit StopTracker(StopConfig cfg);

  // Called once per generated token, after sampling. `text` = newly decoded text of this token.
  StopStep on_token(TokenId id, std::string_view text);
  // Called when the sequence ends for a reason decided outside (max_context, cancelled …): returns
  // the held-back text that can now be streamed (no stop string matched it).
  std::string flush();
  // Whether the wall-clock limit has passed (checked by the engine between steps too).
  bool timed_out() const;

  size_t holdback_bytes() const noexcept { return held_.size(); }
  int32_t n_generated() const noexcept { return n_generated_; }
  const StopConfig& config() const noexcept { return cfg_; }

private:
  StopConfig cfg_;
  std::string held_; // text not yet streamed: may be the start of a stop string
  int32_t n_generated_ = 0;
  std::chrono::steady_clock::time_point start_;
};

} // namespace loom
