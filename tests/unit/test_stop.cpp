// Unit tests for loom/sample/stop.hpp: stop reasons, stop strings across token boundaries, hold-back.
#include "loom/error.hpp"
#include "loom/sample/stop.hpp"

#include <chrono>
#include <gtest/gtest.h>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace loom {
namespace {

constexpr TokenId kText = 100; // an ordinary token id
constexpr TokenId kEos = 2;

StopConfig config(std::vector<std::string> strings = {}) {
  StopConfig c;
  c.eog_tokens = {kEos};
  c.strings = std::move(strings);
  return c;
}

// Feeds `pieces` as ordinary tokens; returns everything emitted (and the held text if `flush_at_end`
// and no stop happened) plus the final step.
struct Fed {
  std::string emitted;
  StopStep last;
  int steps = 0;
};

Fed feed(StopTracker& t, const std::vector<std::string>& pieces, bool flush_at_end = true) {
  Fed f;
  for (const auto& p : pieces) {
    f.last = t.on_token(kText, p);
    f.emitted += f.last.emit;
    ++f.steps;
    if (f.last.reason != StopReason::none) return f;
  }
  if (flush_at_end) f.emitted += t.flush();
  return f;
}

TEST(StopReasonName, AllNames) {
  EXPECT_EQ(stop_reason_name(StopReason::none), "none");
  EXPECT_EQ(stop_reason_name(StopReason::eos), "eos");
  EXPECT_EQ(stop_reason_name(StopReason::stop_token), "stop_token");
  EXPECT_EQ(stop_reason_name(StopReason::stop_string), "stop_string");
  EXPECT_EQ(stop_reason_name(StopReason::max_tokens), "max_tokens");
  EXPECT_EQ(stop_reason_name(StopReason::max_context), "max_context");
  EXPECT_EQ(stop_reason_name(StopReason::timeout), "timeout");
  EXPECT_EQ(stop_reason_name(StopReason::cancelled), "cancelled");
  EXPECT_EQ(stop_reason_name(StopReason::custom), "custom");
}

TEST(StopTracker, EosStopsAndIsNotEmitted) {
  StopTracker t(config());
  EXPECT_EQ(t.on_token(kText, "Hello").emit, "Hello");
  EXPECT_EQ(t.on_token(kText, " world").emit, " world");
  const StopStep s = t.on_token(kEos, "</s>");
  EXPECT_EQ(s.reason, StopReason::eos);
  EXPECT_EQ(s.emit, "");
  EXPECT_EQ(t.n_generated(), 3);
}

TEST(StopTracker, EosReleasesHeldText) {
  StopTracker t(config({"STOP"}));
  EXPECT_EQ(t.on_token(kText, "a ST").emit, "a ");
  const StopStep s = t.on_token(kEos, "</s>");
  EXPECT_EQ(s.reason, StopReason::eos);
  EXPECT_EQ(s.emit, "ST"); // "ST" can no longer become "STOP"
}

TEST(StopTracker, IgnoreEos) {
  StopConfig c = config();
  c.eos = false;
  StopTracker t(c);
  const StopStep s = t.on_token(kEos, "</s>");
  EXPECT_EQ(s.reason, StopReason::none);
  EXPECT_EQ(s.emit, "</s>");
}

TEST(StopTracker, StopToken) {
  StopConfig c = config();
  c.stop_tokens = {7, 9};
  StopTracker t(c);
  EXPECT_EQ(t.on_token(kText, "x").reason, StopReason::none);
  const StopStep s = t.on_token(9, "<|im_end|>");
  EXPECT_EQ(s.reason, StopReason::stop_token);
  EXPECT_EQ(s.emit, "");
}

TEST(StopTracker, StopStringSplitAcrossThreeTokens) {
  StopTracker t(config({"STOP"}));
  const Fed f = feed(t, {"abc", "ST", "O", "P", "never"});
  EXPECT_EQ(f.last.reason, StopReason::stop_string);
  EXPECT_EQ(f.last.matched, "STOP");
  EXPECT_EQ(f.steps, 4);
  EXPECT_EQ(f.emitted, "abc");
  EXPECT_EQ(t.holdback_bytes(), 0u);
}

TEST(StopTracker, DoubleNewlineSplitAcrossTokens) {
  StopTracker t(config({"\n\n"}));
  const Fed f = feed(t, {"line one", "\n", "\n", "line two"});
  EXPECT_EQ(f.last.reason, StopReason::stop_string);
  EXPECT_EQ(f.emitted, "line one");
  EXPECT_EQ(f.emitted.find('\n'), std::string::npos);
}

TEST(StopTracker, HoldsBackAPossibleStart) {
  StopTracker t(config({"STOP"}));
  EXPECT_EQ(t.on_token(kText, "xyST").emit, "xy");
  EXPECT_EQ(t.holdback_bytes(), 2u);
  EXPECT_EQ(t.on_token(kText, "O").emit, "");
  EXPECT_EQ(t.holdback_bytes(), 3u);
}

TEST(StopTracker, TextAfterTheStopStringIsDropped) {
  StopTracker t(config({"STOP"}));
  const StopStep s = t.on_token(kText, "fooSTOPbar");
  EXPECT_EQ(s.reason, StopReason::stop_string);
  EXPECT_EQ(s.emit, "foo");
  EXPECT_EQ(s.matched, "STOP");
  EXPECT_EQ(t.flush(), "");
}

TEST(StopTracker, FailedPartialMatchIsReleased) {
  StopTracker t(config({"STOP"}));
  EXPECT_EQ(t.on_token(kText, "ST").emit, "");
  const StopStep s = t.on_token(kText, "OX");
  EXPECT_EQ(s.reason, StopReason::none);
  EXPECT_EQ(s.emit, "STOX");
  EXPECT_EQ(t.holdback_bytes(), 0u);
}

TEST(StopTracker, PartialMatchRestartsInsideHeldText) {
  // "aa" is held; "aab" then matches starting one byte later.
  StopTracker t(config({"aab"}));
  EXPECT_EQ(t.on_token(kText, "aa").emit, "");
  const StopStep s = t.on_token(kText, "ab");
  EXPECT_EQ(s.reason, StopReason::stop_string);
  EXPECT_EQ(s.emit, "a");
}

TEST(StopTracker, OverlappingStopStringsIndependentOfTokenisation) {
  // "bc" ends before "abcd" does: it is what a byte-by-byte stream meets first.
  for (const auto& pieces :
       std::vector<std::vector<std::string>>{{"abcd"}, {"ab", "cd"}, {"a", "b", "c", "d"}}) {
    StopTracker t(config({"abcd", "bc"}));
    const Fed f = feed(t, pieces);
    EXPECT_EQ(f.last.reason, StopReason::stop_string);
    EXPECT_EQ(f.last.matched, "bc");
    EXPECT_EQ(f.emitted, "a");
  }
  // Same end: the one that starts first (the longer) wins.
  StopTracker t(config({"bc", "abc"}));
  const StopStep s = t.on_token(kText, "xabc");
  EXPECT_EQ(s.matched, "abc");
  EXPECT_EQ(s.emit, "x");
}

TEST(StopTracker, MultiByteText) {
  StopTracker t(config({"。"})); // U+3002, three bytes
  EXPECT_EQ(t.on_token(kText, "你好").emit, "你好");
  const StopStep s = t.on_token(kText, "。再见");
  EXPECT_EQ(s.reason, StopReason::stop_string);
  EXPECT_EQ(s.emit, "");

  StopTracker u(config({"é!"}));
  EXPECT_EQ(u.on_token(kText, "café").emit, "caf"); // the whole two-byte "é" is held
  EXPECT_EQ(u.holdback_bytes(), 2u);
  EXPECT_EQ(u.on_token(kText, "").emit, ""); // an incomplete character decodes to nothing yet
  EXPECT_EQ(u.on_token(kText, "?").emit, "é?");
}

TEST(StopTracker, MaxTokensFlushesHeldText) {
  StopConfig c = config({"STOP"});
  c.max_tokens = 2;
  StopTracker t(c);
  EXPECT_EQ(t.on_token(kText, "x").reason, StopReason::none);
  const StopStep s = t.on_token(kText, "ST");
  EXPECT_EQ(s.reason, StopReason::max_tokens);
  EXPECT_EQ(s.emit, "ST");
  EXPECT_EQ(t.holdback_bytes(), 0u);
}

TEST(StopTracker, StopStringWinsOverMaxTokens) {
  StopConfig c = config({"STOP"});
  c.max_tokens = 1;
  StopTracker t(c);
  const StopStep s = t.on_token(kText, "aSTOP");
  EXPECT_EQ(s.reason, StopReason::stop_string);
  EXPECT_EQ(s.emit, "a");
}

TEST(StopTracker, Timeout) {
  StopConfig c = config({"STOP"});
  c.timeout_ms = 1;
  StopTracker t(c);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(t.timed_out());
  const StopStep s = t.on_token(kText, "abS");
  EXPECT_EQ(s.reason, StopReason::timeout);
  EXPECT_EQ(s.emit, "abS");

  StopTracker none(config()); // timeout_ms = 0: never
  EXPECT_FALSE(none.timed_out());
}

TEST(StopTracker, FlushReturnsHeldText) {
  StopTracker t(config({"</answer>"}));
  EXPECT_EQ(t.on_token(kText, "42 </ans").emit, "42 ");
  EXPECT_EQ(t.flush(), "</ans");
  EXPECT_EQ(t.holdback_bytes(), 0u);
  EXPECT_EQ(t.flush(), "");
}

TEST(StopTracker, CopiesAreIndependent) {
  StopTracker a(config({"STOP"}));
  (void)a.on_token(kText, "ST");
  StopTracker b = a;
  EXPECT_EQ(a.on_token(kText, "OP").reason, StopReason::stop_string);
  const StopStep s = b.on_token(kText, "AR");
  EXPECT_EQ(s.reason, StopReason::none);
  EXPECT_EQ(s.emit, "STAR");
  EXPECT_EQ(b.n_generated(), 2);
}

// ---- one StopCriterion interface for built-in and custom rules --------------------------------

// A custom criterion (as a plugin's adapter is): stops with `custom` once the generated text it saw
// contains "END"; holds back one byte while its last piece ended in 'E' or "EN".
struct EndWord final : StopCriterion {
  std::string seen;
  std::vector<size_t> lengths; // generated.size() at each call
  std::string_view name() const noexcept override { return "end_word"; }
  StopVerdict check(const StopInput& in) override {
    seen += in.piece;
    lengths.push_back(in.generated.size());
    return seen.find("END") != std::string::npos ? StopVerdict{StopReason::custom, 0, {}} : StopVerdict{};
  }
  size_t holdback_bytes() const override {
    if (seen.size() >= 2 && seen.compare(seen.size() - 2, 2, "EN") == 0) return 2;
    return !seen.empty() && seen.back() == 'E' ? 1 : 0;
  }
  std::unique_ptr<StopCriterion> clone() const override { return std::make_unique<EndWord>(*this); }
};

StopTracker with_end_word(StopConfig c) {
  std::vector<std::unique_ptr<StopCriterion>> custom;
  custom.push_back(std::make_unique<EndWord>());
  return StopTracker(std::move(c), std::move(custom));
}

TEST(StopCriterion, TheBuiltInRulesAreCriteriaToo) {
  auto eos = make_eos_stop({kEos});
  EXPECT_EQ(eos->name(), "eos");
  EXPECT_EQ(eos->check({kText, "a", {}}).reason, StopReason::none);
  const StopVerdict v = eos->check({kEos, "</s>", {}});
  EXPECT_EQ(v.reason, StopReason::eos);
  EXPECT_EQ(v.drop, 4u); // an end token's own text is not output

  auto strings = make_stop_strings({"STOP"});
  EXPECT_EQ(strings->check({kText, "abST", {}}).reason, StopReason::none);
  EXPECT_EQ(strings->holdback_bytes(), 2u);
  auto copy = strings->clone(); // state travels with a clone
  const StopVerdict m = copy->check({kText, "OPxyz", {}});
  EXPECT_EQ(m.reason, StopReason::stop_string);
  EXPECT_EQ(m.matched, "STOP");
  EXPECT_EQ(m.drop, 7u); // "STOPxyz": the match and what followed it
  EXPECT_EQ(strings->check({kText, "OX", {}}).reason, StopReason::none); // the original did not move

  auto max = make_max_tokens(2);
  EXPECT_EQ(max->check({kText, "", {}}).reason, StopReason::none);
  EXPECT_EQ(max->check({kText, "", {}}).reason, StopReason::max_tokens);
  EXPECT_THROW(make_stop_strings({""}), Error);
  EXPECT_THROW(make_timeout(0), Error);
}

TEST(StopTracker, ACustomCriterionRunsAfterTheBuiltInOnesWithTheGeneratedTokens) {
  StopConfig c = config({"STOP"});
  c.max_tokens = 3;
  StopTracker t = with_end_word(c);
  EXPECT_EQ(t.n_criteria(), 4u); // eos, stop strings, max tokens, then end_word
  const std::vector<TokenId> gen = {kText, kText, kText};
  EXPECT_EQ(t.on_token(kText, "ab", std::span(gen).first(1)).emit, "ab");
  // "E" is held back by the custom criterion, not only by the stop strings.
  EXPECT_EQ(t.on_token(kText, "cE", std::span(gen).first(2)).emit, "c");
  EXPECT_EQ(t.holdback_bytes(), 1u);
  // The third token reaches max_tokens: a built-in rule decides first and everything is released.
  const StopStep s = t.on_token(kText, "ND", std::span(gen).first(3));
  EXPECT_EQ(s.reason, StopReason::max_tokens);
  EXPECT_EQ(s.emit, "END");
}

TEST(StopTracker, ACustomStopReleasesWhatEveryCriterionHeld) {
  StopTracker t = with_end_word(config({"S\x01"}));
  EXPECT_EQ(t.on_token(kText, "xS").emit, "x"); // "S" held for the stop string
  EXPECT_EQ(t.on_token(kText, "EN").emit, "S"); // "SEN" can no longer be "S\x01"; "EN" is end_word's
  const StopStep s = t.on_token(kText, "D!");
  EXPECT_EQ(s.reason, StopReason::custom);
  EXPECT_EQ(s.emit, "END!"); // a custom stop drops nothing
  EXPECT_EQ(t.holdback_bytes(), 0u);
}

TEST(StopTracker, CopiesCloneEveryCriterionWithItsState) {
  StopTracker a = with_end_word(config());
  (void)a.on_token(kText, "xE");
  StopTracker b = a;
  EXPECT_EQ(a.on_token(kText, "ND").reason, StopReason::custom);
  const StopStep s = b.on_token(kText, "NX"); // b's end_word saw "xE" too, and nothing of a's "ND"
  EXPECT_EQ(s.reason, StopReason::none);
  EXPECT_EQ(s.emit, "ENX");
  StopTracker c = with_end_word(config());
  c = b; // assignment clones as well
  EXPECT_EQ(c.on_token(kText, "END").reason, StopReason::custom);
  EXPECT_EQ(b.on_token(kText, "q").reason, StopReason::none);
}

TEST(StopTracker, RejectsBadConfig) {
  try {
    StopTracker t(config({"ok", ""}));
    ADD_FAILURE() << "empty stop string accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
  }
  StopConfig c = config();
  c.max_tokens = -2;
  EXPECT_THROW(StopTracker{c}, Error);
  c = config();
  c.timeout_ms = -1;
  EXPECT_THROW(StopTracker{c}, Error);
}

// Property: for any split of a text into tokens, the emitted stream (plus a final flush) is the text
// up to the first stop string — the one that ends first — and never contains a stop string.
TEST(StopTracker, AnySplitGivesTheSameStream) {
  const std::vector<std::string> stops{"</s>", "ab", "bba", "\n\n", "é!"};
  std::mt19937_64 rng(2024);
  const std::vector<std::string> alphabet{"a", "b", "<", "/", "s", ">", "\n", "é", "!", "x"};
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    const size_t len = rng() % 24;
    for (size_t i = 0; i < len; ++i)
      text += alphabet[rng() % alphabet.size()];
    // Reference: earliest end, ties earliest start.
    size_t best_end = std::string::npos, best_start = std::string::npos;
    for (const auto& s : stops) {
      const size_t pos = text.find(s);
      if (pos == std::string::npos) continue;
      if (pos + s.size() < best_end || (pos + s.size() == best_end && pos < best_start)) {
        best_end = pos + s.size();
        best_start = pos;
      }
    }
    const std::string expected = best_end == std::string::npos ? text : text.substr(0, best_start);
    // Random split at character boundaries (é is two bytes).
    std::vector<std::string> pieces;
    std::string cur;
    for (size_t i = 0; i < text.size();) {
      const size_t n = static_cast<unsigned char>(text[i]) >= 0xC0 ? 2 : 1;
      cur += text.substr(i, n);
      i += n;
      if (rng() % 3 == 0) {
        pieces.push_back(cur);
        cur.clear();
      }
    }
    pieces.push_back(cur);
    StopTracker t(config(stops));
    const Fed f = feed(t, pieces);
    ASSERT_EQ(f.emitted, expected) << "text '" << text << "'";
    EXPECT_EQ(f.last.reason == StopReason::stop_string, best_end != std::string::npos);
    for (const auto& s : stops)
      EXPECT_EQ(f.emitted.find(s), std::string::npos);
  }
}

} // namespace
} // namespace loom
