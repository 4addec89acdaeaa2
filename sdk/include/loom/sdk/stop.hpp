// loom/sdk/stop.hpp — the StopCriterion interface: the built-in stop rules and a plugin's implement it
// alike. A sequence's rules run in order after each generated token; the first that stops decides.
// Header-only: plugins compile it in.
#pragma once

#include "loom/sdk/abi.h"
#include "loom/sdk/types.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace loom {

// Why a sequence ended (the C ABI's loom_stop_reason, value for value).
enum class StopReason : uint8_t {
  none = LOOM_STOP_NONE,               // still running
  eos = LOOM_STOP_EOS,                 // an end-of-generation token (EOS, EOT, …)
  stop_token = LOOM_STOP_STOP_TOKEN,   // one of the configured stop token ids
  stop_string = LOOM_STOP_STOP_STRING, // one of the configured stop strings appeared in the text
  max_tokens = LOOM_STOP_MAX_TOKENS,   // the new-token budget is spent
  max_context = LOOM_STOP_MAX_CONTEXT, // the context window is full (or the prompt did not fit)
  timeout = LOOM_STOP_TIMEOUT,         // wall-clock limit
  cancelled = LOOM_STOP_CANCELLED,     // cancelled by the caller
  custom = LOOM_STOP_CUSTOM,           // a plugin criterion
  error = LOOM_STOP_ERROR,             // the request failed (GenerationResult::message says why)
};

// What a criterion sees after one generated token.
struct StopInput {
  TokenId token = -1;                 // the token just generated
  std::string_view piece;             // the text it added (empty while a UTF-8 character is incomplete,
                                      // and for an end-of-generation token that is not printed)
  std::span<const TokenId> generated; // every generated token, `token` last (the host may leave it
                                      // empty for a sequence without plugin criteria: none reads it)
};

// A criterion's answer.
struct StopVerdict {
  StopReason reason = StopReason::none; // none: go on
  // Bytes at the end of the sequence's text (this piece included) that are not part of the output:
  // a matched stop string and what followed it, or a stop token's own text. 0 keeps all of it.
  size_t drop = 0;
  std::string matched; // the stop string that matched (reason == stop_string)
};

class StopCriterion {
public:
  virtual ~StopCriterion() = default;
  virtual StopVerdict check(const StopInput& in) = 0;
  // A copy with the same state (forks, and the per-length checkpoints a truncate goes back to).
  virtual std::unique_ptr<StopCriterion> clone() const = 0;
  // Bytes at the end of the text so far that must not be streamed yet (they may still become a stop).
  virtual size_t holdback_bytes() const { return 0; }
  // The name in messages (the host names a plugin's by its TOML name).
  virtual std::string_view name() const noexcept { return "stop"; }
};

} // namespace loom
