// The GGUF tokenizers (loom/tokenizer/tokenizer.hpp) on tiny vocabularies made in memory: SentencePiece and
// byte-level BPE encode and decode, every malformed metadata key a one-line error, every known pre-tokenizer
// compiles. (The real vocabularies against reference tokenizations: tests/integration/test_tokenizer.cpp.)
#include "encode_options.hpp"
#include "gguf_values.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <gtest/gtest.h>
#include <map>
#include <optional>
#include <string>

namespace {

using loom::Errc;
using loom::GgufFile;
using loom::GgufType;
using loom::GgufValue;
using loom::GgufWriter;
using loom::TokenId;
using loom::Tokenizer;
using namespace loom::test; // gguf_values.hpp, encode_options.hpp

// ---- malformed metadata -----------------------------------------------------------------------

// A tiny valid SentencePiece vocabulary; `edit` changes or removes (nullopt) keys.
using Meta = std::map<std::string, std::optional<GgufValue>>;

Meta tiny_llama() {
  Meta m;
  m["tokenizer.ggml.model"] = str_value("llama");
  m["tokenizer.ggml.tokens"] = strings({"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b",
                                        "\xE2\x96\x81"
                                        "a",
                                        "ab"});
  m["tokenizer.ggml.scores"] = array_of(GgufType::f32, {0, 0, 0, -1, -2, -3, -4, -5});
  m["tokenizer.ggml.token_type"] = array_of(GgufType::i32, {2, 3, 3, 1, 1, 1, 1, 1});
  m["tokenizer.ggml.bos_token_id"] = u32_value(1);
  m["tokenizer.ggml.eos_token_id"] = u32_value(2);
  return m;
}

Meta tiny_gpt2() {
  Meta m;
  m["tokenizer.ggml.model"] = str_value("gpt2");
  m["tokenizer.ggml.pre"] = str_value("gpt-2");
  m["tokenizer.ggml.tokens"] = strings({"a", "b", "\xC4\xA0", "ab",
                                        "\xC4\xA0"
                                        "a",
                                        "<|endoftext|>"});
  m["tokenizer.ggml.token_type"] = array_of(GgufType::i32, {1, 1, 1, 1, 1, 3});
  m["tokenizer.ggml.merges"] = strings({"a b", "\xC4\xA0 a"});
  m["tokenizer.ggml.eos_token_id"] = u32_value(5);
  return m;
}

std::unique_ptr<Tokenizer> build(const Meta& m) {
  GgufWriter w;
  for (const auto& [k, v] : m)
    if (v) w.add(k, *v);
  const std::vector<uint8_t> bytes = w.serialize();
  const GgufFile f = GgufFile::parse(bytes, "test.gguf");
  return Tokenizer::from_gguf(f);
}

// Expects loom::Error with `code` whose message contains `needle`.
void expect_error(const Meta& m, Errc code, const std::string& needle) {
  try {
    build(m);
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const loom::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "multi-line message: " << e.what();
  }
}

TEST(Tokenizer, TinyVocabulariesWork) {
  const auto spm = build(tiny_llama());
  // "▁a" (score -4) beats "ab" (-5): ▁a ▁a b.
  EXPECT_EQ(spm->encode("a ab", k_no_bos), (std::vector<TokenId>{6, 6, 5}));
  EXPECT_EQ(spm->decode(std::vector<TokenId>{1, 6, 6, 5}), "a ab");
  EXPECT_EQ(spm->encode("c", k_no_bos), (std::vector<TokenId>{3, 0})); // no byte tokens: <unk>
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.add_space_prefix"] = bool_value(false);
    m["tokenizer.ggml.remove_extra_whitespaces"] = bool_value(true);
    const auto t = build(m);
    EXPECT_EQ(t->encode("  a   ab ", k_no_bos), (std::vector<TokenId>{4, 6, 5})); // "a▁ab": a ▁a b
    EXPECT_EQ(t->decode(std::vector<TokenId>{6, 7}), " aab");                     // no prefix space to strip
  }
  const auto bpe = build(tiny_gpt2());
  EXPECT_EQ(bpe->encode("ab a", k_no_bos), (std::vector<TokenId>{3, 4}));
  EXPECT_EQ(bpe->decode(std::vector<TokenId>{3, 4}), "ab a");
  EXPECT_EQ(bpe->encode("x", k_no_bos), (std::vector<TokenId>{})); // no token for the byte, no <unk>
  EXPECT_EQ(bpe->eog_tokens(), (std::vector<TokenId>{5}));
  EXPECT_EQ(bpe->bos(), -1);
  EXPECT_FALSE(bpe->add_bos_default());
  EXPECT_THROW(bpe->encode("a", opts(true, false)), loom::Error);
}

TEST(Tokenizer, BadMetadataIsAnError) {
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.tokens"] = std::nullopt;
    expect_error(m, Errc::parse_error, "tokenizer.ggml.tokens is missing");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.tokens"] = array_of(GgufType::i32, {1, 2, 3});
    expect_error(m, Errc::parse_error,
                 "tokenizer.ggml.tokens should be an array of strings, found an array of i32");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.tokens"] = str_value("abc");
    expect_error(m, Errc::parse_error, "tokenizer.ggml.tokens should be an array of strings");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.tokens"] = strings({});
    expect_error(m, Errc::parse_error, "tokenizer.ggml.tokens is empty");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.scores"] = array_of(GgufType::f32, {0, 0, 0});
    expect_error(m, Errc::parse_error, "tokenizer.ggml.scores has 3 entries, expected 8");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.scores"] = strings({"a", "b", "c", "d", "e", "f", "g", "h"});
    expect_error(m, Errc::parse_error, "tokenizer.ggml.scores should be an array of f32");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.token_type"] = array_of(GgufType::i32, {1, 1});
    expect_error(m, Errc::parse_error, "tokenizer.ggml.token_type has 2 entries, expected 8");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.model"] = std::nullopt;
    expect_error(m, Errc::parse_error, "tokenizer.ggml.model is missing");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.model"] = str_value("bert");
    expect_error(m, Errc::unsupported, "tokenizer.ggml.model is 'bert'");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.model"] = u32_value(3);
    expect_error(m, Errc::parse_error, "tokenizer.ggml.model should be a string");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.bos_token_id"] = u32_value(100);
    expect_error(m, Errc::parse_error,
                 "tokenizer.ggml.bos_token_id = 100 is out of range: the vocabulary has 8");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.eot_token_id"] = u32_value(8);
    expect_error(m, Errc::parse_error, "tokenizer.ggml.eot_token_id = 8 is out of range");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.eos_token_id"] = str_value("2");
    expect_error(m, Errc::parse_error, "tokenizer.ggml.eos_token_id should be an integer token id");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.add_bos_token"] = str_value("yes");
    expect_error(m, Errc::parse_error, "tokenizer.ggml.add_bos_token should be a bool");
  }
  {
    Meta m = tiny_llama();
    m["tokenizer.ggml.bos_token_id"] = u32_value(0xFFFFFFFFu); // "none", as converters write it
    m["tokenizer.ggml.add_bos_token"] = bool_value(true);
    expect_error(m, Errc::parse_error, "add_bos_token is true but the vocabulary has no BOS token");
  }
  {
    Meta m = tiny_gpt2();
    m["tokenizer.ggml.pre"] = str_value("nonsense-7b");
    expect_error(m, Errc::unsupported,
                 "unknown pre-tokenizer tokenizer.ggml.pre = 'nonsense-7b'; known: default, gpt-2");
    expect_error(m, Errc::unsupported, "llama-bpe");
  }
  {
    Meta m = tiny_gpt2();
    m["tokenizer.ggml.merges"] = std::nullopt;
    expect_error(m, Errc::parse_error, "tokenizer.ggml.merges is missing");
  }
  {
    Meta m = tiny_gpt2();
    m["tokenizer.ggml.merges"] = array_of(GgufType::i32, {1});
    expect_error(m, Errc::parse_error, "tokenizer.ggml.merges should be an array of strings");
  }
  {
    // "none" ids are accepted: the tokenizer just has no BOS.
    Meta m = tiny_llama();
    m["tokenizer.ggml.bos_token_id"] = u32_value(0xFFFFFFFFu);
    const auto t = build(m);
    EXPECT_EQ(t->bos(), -1);
    EXPECT_FALSE(t->add_bos_default());
  }
}

TEST(Tokenizer, EveryKnownPreTokenizerCompilesAndSplits) {
  const char* names[] = {"default",      "gpt-2",          "llama-bpe",   "llama3",    "dbrx",   "smaug-bpe",
                         "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon",    "mpt",    "starcoder",
                         "refact",       "command-r",      "qwen2",       "stablelm2", "olmo",   "poro-chat",
                         "jais",         "tekken",         "chatglm-bpe", "viking",    "gpt-4o", "bailingmoe",
                         "seed-coder",   "grok-2",         "smollm",      "exaone"};
  const std::string text = "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～ \n\n  3.14 'RE x\xFF\xC3";
  for (const char* name : names) {
    Meta m = tiny_gpt2();
    m["tokenizer.ggml.pre"] = str_value(name);
    const auto t = build(m);
    EXPECT_EQ(t->pre(), name);
    (void)t->encode(text, k_no_bos);
    (void)t->encode(text + std::string(3000, ' ') + "x", k_no_bos);
  }
}

} // namespace
