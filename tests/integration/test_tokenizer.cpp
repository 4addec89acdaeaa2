// The GGUF tokenizers (loom/tokenizer/tokenizer.hpp) on the real vocabularies of the shared models, against
// reference tokenizations: llama.cpp's vocab test cases (ids from Hugging Face tokenizers) and SentencePiece
// outputs for two vocabs; special tokens, end of generation, incremental decoding, arbitrary bytes, long
// inputs. (Tiny vocabularies and malformed metadata: tests/unit/test_tokenizer.cpp.)
#include "encode_options.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

#include <chrono>
#include <cstdio>
#include <gtest/gtest.h>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

namespace {

using loom::DecodeState;
using loom::GgufFile;
using loom::TokenId;
using loom::Tokenizer;
using loom::TokenType;
using loom::test::k_no_bos;
using loom::test::opts;

// Tokenizers are loaded once per file and shared by the tests (encode/decode are const).
const Tokenizer& load(const std::filesystem::path& p) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& t = cache[p.string()];
  if (!t) {
    const GgufFile f = GgufFile::open(p.string());
    t = Tokenizer::from_gguf(f);
  }
  return *t;
}

// Test oracle: `s` with each maximal ill-formed subpart (Unicode §3.9, "U+FFFD substitution of
// maximal subparts") replaced by U+FFFD — what decode() must produce for raw bytes.
std::string sanitize(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    if (b0 < 0x80) {
      out.push_back(s[i++]);
      continue;
    }
    size_t need = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF)
      need = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF)
      need = 3, lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    else if (b0 >= 0xF0 && b0 <= 0xF4)
      need = 4, lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;
    while (k < need && i + k < s.size()) {
      const auto b = static_cast<uint8_t>(s[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) break;
      ++k;
    }
    if (need > 0 && k == need)
      out.append(s.substr(i, need));
    else
      out.append("\xEF\xBF\xBD");
    i += k;
  }
  return out;
}

bool is_valid_utf8(std::string_view s) {
  return sanitize(s) == s;
}

std::string show(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids)
    s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

// ---- llama.cpp vocab test cases (tests/test-tokenizer-0.cpp format) ----------------------------

struct VocabCase {
  std::string text;
  std::vector<TokenId> ids;
};

// .inp: cases separated by "\n__ggml_vocab_test__\n" (the file ends with one); .out: one line of
// space-separated ids per case.
std::vector<VocabCase> read_vocab_cases(const std::filesystem::path& inp, const std::filesystem::path& out) {
  const std::string raw = loom::test::read_file(inp);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(raw.substr(pos));
      break;
    }
    texts.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<VocabCase> cases;
  std::istringstream lines(loom::test::read_file(out));
  std::string line;
  for (size_t i = 0; std::getline(lines, line); ++i) {
    VocabCase c;
    c.text = i < texts.size() ? texts[i] : std::string();
    std::istringstream ids(line);
    for (TokenId id; ids >> id;)
      c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(texts.size(), cases.size()) << inp << " and " << out << " disagree on the number of cases";
  return cases;
}

class VocabCases : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabCases, EncodeMatchesReferenceAndRoundTrips) {
  const std::string name = std::string("vocab/ggml-vocab-") + GetParam() + ".gguf";
  LOOM_REQUIRE_MODEL(path, name);
  const Tokenizer& tok = load(path);
  const auto cases = read_vocab_cases(path.string() + ".inp", path.string() + ".out");
  ASSERT_FALSE(cases.empty());
  size_t passed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const VocabCase& c = cases[i];
    const std::vector<TokenId> ids = tok.encode(c.text, k_no_bos);
    EXPECT_EQ(show(ids), show(c.ids)) << GetParam() << " case " << i << ": '" << c.text << "'";
    if (ids == c.ids) ++passed;
    EXPECT_EQ(tok.decode(ids), c.text) << GetParam() << " case " << i << " does not round-trip";
  }
  std::printf("[ vocab    ] %s: %zu/%zu cases match\n", GetParam(), passed, cases.size());
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, VocabCases,
                         ::testing::Values("llama-spm", "phi-3", "gpt-2", "deepseek-coder", "falcon"));

TEST(Tokenizer, VocabModelsAndPreTokenizers) {
  const std::pair<const char*, const char*> expect[] = {
      {"llama-spm", "llama"}, {"phi-3", "llama"},       {"gpt-2", "gpt2"}, {"deepseek-coder", "gpt2"},
      {"falcon", "gpt2"},     {"deepseek-llm", "gpt2"}, {"mpt", "gpt2"},   {"starcoder", "gpt2"},
      {"refact", "gpt2"}};
  for (const auto& [name, model] : expect) {
    LOOM_REQUIRE_MODEL(path, std::string("vocab/ggml-vocab-") + name + ".gguf");
    const Tokenizer& tok = load(path);
    EXPECT_EQ(tok.model(), model) << name;
    if (std::string_view(model) == "gpt2") {
      EXPECT_EQ(tok.pre(), name) << name;
    }
  }
}

// Vocabularies without reference ids: every test string (and a few more) must round-trip.
class OtherVocabs : public ::testing::TestWithParam<const char*> {};

TEST_P(OtherVocabs, LoadAndRoundTrip) {
  LOOM_REQUIRE_MODEL(path, std::string("vocab/ggml-vocab-") + GetParam() + ".gguf");
  LOOM_REQUIRE_MODEL(inp, "vocab/ggml-vocab-gpt-2.gguf.inp");
  const Tokenizer& tok = load(path);
  EXPECT_EQ(tok.model(), "gpt2");
  EXPECT_EQ(tok.pre(), GetParam());
  auto cases = read_vocab_cases(inp, inp.string().substr(0, inp.string().size() - 4) + ".out");
  cases.push_back({"int main() {\n\treturn 0;   // done\n}\n", {}});
  cases.push_back({"  indented\t\ttabs  \r\n\r\nwindows", {}});
  for (const VocabCase& c : cases) {
    const std::vector<TokenId> ids = tok.encode(c.text, k_no_bos);
    if (!c.text.empty()) {
      EXPECT_FALSE(ids.empty());
    }
    for (TokenId id : ids)
      ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
    EXPECT_EQ(tok.decode(ids), c.text) << GetParam() << ": '" << c.text << "' -> " << show(ids);
  }
  // Words are found as single tokens, not spelled out byte by byte.
  EXPECT_LE(tok.encode("Hello world", k_no_bos).size(), 3u) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, OtherVocabs,
                         ::testing::Values("deepseek-llm", "mpt", "starcoder", "refact"));

TEST(Tokenizer, PreTokenizerSplitsDigitsAsTheModelsDo) {
  // starcoder/refact: digits one by one; deepseek-llm: digit runs.
  LOOM_REQUIRE_MODEL(sc, "vocab/ggml-vocab-starcoder.gguf");
  const Tokenizer& starcoder = load(sc);
  EXPECT_EQ(starcoder.encode("12345", k_no_bos).size(), 5u);
  LOOM_REQUIRE_MODEL(mpt_path, "vocab/ggml-vocab-mpt.gguf");
  const Tokenizer& mpt = load(mpt_path);
  // mpt (GPT-NeoX): runs of spaces are user-defined tokens, matched before BPE.
  const auto ids = mpt.encode("a    b", k_no_bos);
  ASSERT_FALSE(ids.empty());
  bool has_space_run = false;
  for (TokenId id : ids)
    has_space_run = has_space_run || mpt.piece(id) == "    " || mpt.piece(id) == "   ";
  EXPECT_TRUE(has_space_run) << show(ids);
  EXPECT_EQ(mpt.decode(ids), "a    b");
}

// ---- SentencePiece reference outputs ----------------------------------------------------------

void check_jsonl(const Tokenizer& tok, const std::filesystem::path& jsonl) {
  std::istringstream lines(loom::test::read_file(jsonl));
  std::string line;
  size_t n = 0, passed = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    const std::string text = j.at("text");
    const std::vector<TokenId> want = j.at("ids").get<std::vector<TokenId>>();
    const std::vector<std::string> pieces = j.at("pieces").get<std::vector<std::string>>();
    const std::string decoded = j.at("decoded");
    ++n;
    const std::vector<TokenId> ids = tok.encode(text, k_no_bos);
    EXPECT_EQ(show(ids), show(want)) << "'" << text << "'";
    ASSERT_EQ(want.size(), pieces.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(tok.piece(want[i]), pieces[i]) << "'" << text << "' #" << i;
    EXPECT_EQ(tok.decode(want), decoded) << "'" << text << "'";
    if (ids == want && tok.decode(want) == decoded) ++passed;
  }
  EXPECT_GT(n, 0u);
  std::printf("[ jsonl    ] %s: %zu/%zu strings match\n", jsonl.filename().string().c_str(), passed, n);
}

TEST(Tokenizer, Stories260KMatchesSentencePiece) {
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  LOOM_REQUIRE_MODEL(ref, "reference/tokenizer/tok512.jsonl");
  check_jsonl(load(model), ref);
}

TEST(Tokenizer, Llama2VocabMatchesSentencePiece) {
  LOOM_REQUIRE_MODEL(model, "vocab/ggml-vocab-llama-spm.gguf");
  LOOM_REQUIRE_MODEL(ref, "reference/tokenizer/llama2.jsonl");
  check_jsonl(load(model), ref);
}

TEST(Tokenizer, Llama2ScoresNotIdsDecideMerges) {
  LOOM_REQUIRE_MODEL(model, "llama-2-tiny-random.gguf");
  const Tokenizer& tok = load(model);
  EXPECT_EQ(tok.encode(" Hello", k_no_bos), (std::vector<TokenId>{29871, 15043}));
  EXPECT_EQ(tok.encode("Hello"), (std::vector<TokenId>{1, 15043})); // metadata default: BOS
  EXPECT_TRUE(tok.add_bos_default());
  EXPECT_FALSE(tok.add_eos_default());
  EXPECT_EQ(tok.encode("Hi", opts(false, false, true)).back(), 2);
}

TEST(Tokenizer, Stories260KPromptsAsRunC) {
  // reference/token_ids.txt: run.c prepends BOS and encodes "Once upon a time" like this.
  LOOM_REQUIRE_MODEL(model, "stories260K.gguf");
  const Tokenizer& tok = load(model);
  const auto ids = tok.encode("Once upon a time");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(tok.decode(ids), "Once upon a time");
  EXPECT_EQ(tok.decode(ids, /*special=*/true), "<s> Once upon a time"); // as llama.cpp prints it
}

// ---- other models ------------------------------------------------------------------------------

TEST(Tokenizer, NoByteFallbackUsesUnknownToken) {
  LOOM_REQUIRE_MODEL(model, "extra/babyllama-tok105.gguf");
  const Tokenizer& tok = load(model);
  EXPECT_EQ(tok.vocab_size(), 105);
  const auto ids = tok.encode("Führer 🦙 ½ once upon a time ☃", k_no_bos);
  ASSERT_FALSE(ids.empty());
  size_t unk = 0;
  for (TokenId id : ids) {
    ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
    unk += id == 0;
  }
  EXPECT_GE(unk, 4u); // ü, 🦙, ½, ☃ at least
  const std::string text = tok.decode(ids);
  EXPECT_NE(text.find("once upon a time"), std::string::npos) << text;
  EXPECT_TRUE(is_valid_utf8(text));
  // Plain ASCII is fully covered by the character vocabulary.
  EXPECT_EQ(tok.decode(tok.encode("the cat sat", k_no_bos)), "the cat sat");
}

TEST(Tokenizer, AidreamsLoads) {
  LOOM_REQUIRE_MODEL(model, "extra/aidreams260K.gguf");
  const Tokenizer& tok = load(model);
  EXPECT_EQ(tok.model(), "llama");
  EXPECT_EQ(tok.decode(tok.encode("I dreamed of a red ½ 🦙", k_no_bos)), "I dreamed of a red ½ 🦙");
}

// ---- special tokens, EOG ----------------------------------------------------------------------

TEST(Tokenizer, SpecialTokenParsing) {
  LOOM_REQUIRE_MODEL(model, "vocab/ggml-vocab-llama-spm.gguf");
  const Tokenizer& tok = load(model);
  EXPECT_EQ(tok.encode("<s>", opts(false, true)), (std::vector<TokenId>{1}));
  const auto plain = tok.encode("<s>", k_no_bos);
  EXPECT_GT(plain.size(), 1u);
  for (TokenId id : plain)
    EXPECT_NE(id, 1);
  EXPECT_EQ(tok.decode(plain), "<s>");

  // Text after a special token gets the SentencePiece space prefix again (as llama.cpp does).
  const auto ids = tok.encode("Hello</s>world", opts(true, true));
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 15043); // "▁Hello"
  EXPECT_EQ(ids[2], 2);
  EXPECT_EQ(tok.encode("world", k_no_bos), std::vector<TokenId>(ids.begin() + 3, ids.end()));
  EXPECT_EQ(tok.decode(ids), "Hello world");
  EXPECT_EQ(tok.decode(ids, true), "<s> Hello</s> world");
}

TEST(Tokenizer, UserDefinedTokensAreAlwaysMatched) {
  // deepseek-coder: "ü" is a user-defined token (Hugging Face added token), matched before BPE.
  LOOM_REQUIRE_MODEL(model, "vocab/ggml-vocab-deepseek-coder.gguf");
  const Tokenizer& tok = load(model);
  EXPECT_EQ(tok.token_type(32009), TokenType::user_defined);
  EXPECT_EQ(tok.encode("Führer", k_no_bos), (std::vector<TokenId>{37, 32009, 71, 6247}));
  // Control tokens only with parse_special.
  const std::string bos_text = tok.piece(32013);
  EXPECT_EQ(tok.encode(bos_text, opts(false, true)), (std::vector<TokenId>{32013}));
  EXPECT_GT(tok.encode(bos_text, k_no_bos).size(), 1u);
  EXPECT_EQ(tok.encode("x").front(), 32013); // add_bos_token = true in the metadata
}

TEST(Tokenizer, EndOfGenerationTokens) {
  auto eog_of = [](const char* rel) -> std::vector<TokenId> {
    const std::filesystem::path p = loom::test::models_dir() / rel;
    if (!std::filesystem::exists(p)) return {-2};
    return load(p).eog_tokens();
  };
  const auto llama = eog_of("vocab/ggml-vocab-llama-spm.gguf");
  if (llama == std::vector<TokenId>{-2}) GTEST_SKIP() << "vocab files missing";
  EXPECT_EQ(llama, (std::vector<TokenId>{2}));
  EXPECT_EQ(eog_of("vocab/ggml-vocab-gpt-2.gguf"), (std::vector<TokenId>{50256}));
  const auto phi3 = eog_of("vocab/ggml-vocab-phi-3.gguf");
  for (TokenId id : {2, 32000, 32007}) // </s>, <|endoftext|>, <|end|>
    EXPECT_NE(std::find(phi3.begin(), phi3.end(), id), phi3.end()) << id;
  const Tokenizer& phi = load(loom::test::models_dir() / "vocab/ggml-vocab-phi-3.gguf");
  EXPECT_TRUE(phi.is_eog(32007));
  EXPECT_FALSE(phi.is_eog(1));
  EXPECT_FALSE(phi.is_eog(-1));
  EXPECT_FALSE(phi.is_eog(1 << 30));
  EXPECT_EQ(phi.decode(std::vector<TokenId>{32007}), "");
  EXPECT_EQ(phi.decode(std::vector<TokenId>{32007}, true), "<|end|>");
  const auto ds = eog_of("vocab/ggml-vocab-deepseek-coder.gguf");
  EXPECT_NE(std::find(ds.begin(), ds.end(), 32014), ds.end());
}

// ---- incremental decoding ---------------------------------------------------------------------

void check_incremental(const Tokenizer& tok, const std::string& text) {
  const auto ids = tok.encode(text, k_no_bos);
  const std::string whole = tok.decode(ids);
  EXPECT_EQ(whole, text);
  DecodeState st;
  std::string out;
  for (TokenId id : ids) {
    std::string chunk;
    tok.decode_step(st, id, chunk);
    EXPECT_TRUE(is_valid_utf8(chunk)) << "token " << id << " emitted a partial character";
    out += chunk;
    EXPECT_LT(st.pending.size(), 4u);
  }
  tok.decode_flush(st, out);
  EXPECT_TRUE(st.pending.empty());
  EXPECT_EQ(out, whole);
}

TEST(Tokenizer, IncrementalDecodeEqualsWholeDecode) {
  const std::string text = "Führer 🦙 ½ — naïve 我想在apple工作 😶‍🌫️";
  for (const char* rel : {"vocab/ggml-vocab-llama-spm.gguf", "stories260K.gguf",
                          "vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-falcon.gguf"}) {
    LOOM_REQUIRE_MODEL(p, rel);
    SCOPED_TRACE(rel);
    check_incremental(load(p), text);
  }
}

TEST(Tokenizer, IncrementalDecodeHoldsBackPartialCharacters) {
  LOOM_REQUIRE_MODEL(p, "vocab/ggml-vocab-llama-spm.gguf");
  const Tokenizer& tok = load(p);
  // 🦙 = F0 9F A6 99 arrives as four <0xNN> tokens (ids 3 + byte).
  DecodeState st;
  std::string out;
  for (TokenId id : {3 + 0xF0, 3 + 0x9F, 3 + 0xA6})
    tok.decode_step(st, id, out);
  EXPECT_EQ(out, "");
  EXPECT_EQ(st.pending.size(), 3u);
  tok.decode_step(st, 3 + 0x99, out);
  EXPECT_EQ(out, "🦙");
  // An incomplete character at the end becomes U+FFFD; a stray continuation byte too.
  tok.decode_step(st, 3 + 0xE2, out);
  tok.decode_flush(st, out);
  EXPECT_EQ(out, "🦙\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode(std::vector<TokenId>{3 + 0x80, 3 + 'a'}), "\xEF\xBF\xBD"
                                                                 "a");
  // A lead byte followed by a non-continuation: replacement, then the next character.
  EXPECT_EQ(tok.decode(std::vector<TokenId>{3 + 0xC3, 3 + 'b'}), "\xEF\xBF\xBD"
                                                                 "b");
  // The space prefix is stripped once, at the start of the sequence only.
  DecodeState st2;
  std::string out2;
  tok.decode_step(st2, 1, out2);     // <s>: no text
  tok.decode_step(st2, 15043, out2); // "▁Hello"
  tok.decode_step(st2, 15043, out2);
  EXPECT_EQ(out2, "Hello Hello");
  EXPECT_THROW(tok.decode_step(st2, tok.vocab_size(), out2), loom::Error);
  EXPECT_THROW(tok.decode_step(st2, -1, out2), loom::Error);
}

// ---- robustness -------------------------------------------------------------------------------

TEST(Tokenizer, ArbitraryBytesEncodeAndDecode) {
  std::mt19937 rng(1234);
  // Vocabularies with a token for every byte. Not so: deepseek-coder (its only tokens for the bytes
  // C0 C1 F5..FF, never in valid UTF-8, are user-defined "À" "Á" "õ".."ÿ", which decode as their
  // text, as in llama.cpp), falcon, mpt, starcoder (no token for some such bytes: dropped or <unk>).
  const char* byte_exact[] = {"vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-gpt-2.gguf",
                              "stories260K.gguf"};
  for (const char* rel : byte_exact) {
    LOOM_REQUIRE_MODEL(p, rel);
    const Tokenizer& tok = load(p);
    for (int iter = 0; iter < 300; ++iter) {
      std::string s(rng() % 48, '\0');
      for (char& c : s) {
        const uint32_t r = rng();
        // Mostly high bytes and NULs, some ASCII, to hit ill-formed UTF-8 of every kind.
        c = static_cast<char>(r % 4 == 0 ? (r >> 8) % 128 : r % 4 == 1 ? 0 : 0x80 | ((r >> 8) & 0x7F));
      }
      const auto ids = tok.encode(s, k_no_bos);
      for (TokenId id : ids)
        ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
      // Byte fallback / byte-level BPE lose nothing: only ill-formed parts become U+FFFD.
      ASSERT_EQ(tok.decode(ids), sanitize(s)) << rel << " iteration " << iter;
      (void)tok.encode(s, opts(true, true));
    }
  }
  for (const char* rel : {"extra/babyllama-tok105.gguf", "vocab/ggml-vocab-deepseek-coder.gguf",
                          "vocab/ggml-vocab-falcon.gguf", "vocab/ggml-vocab-starcoder.gguf",
                          "vocab/ggml-vocab-mpt.gguf", "vocab/ggml-vocab-deepseek-llm.gguf"}) {
    LOOM_REQUIRE_MODEL(p, rel);
    const Tokenizer& tok = load(p);
    for (int iter = 0; iter < 200; ++iter) {
      std::string s(rng() % 48, '\0');
      for (char& c : s)
        c = static_cast<char>(rng());
      const std::string d = tok.decode(tok.encode(s, opts(std::nullopt, iter % 2 == 0)));
      EXPECT_TRUE(is_valid_utf8(d)) << rel;
    }
  }
}

TEST(Tokenizer, LongInputsAndThreads) {
  LOOM_REQUIRE_MODEL(p, "vocab/ggml-vocab-llama-spm.gguf");
  LOOM_REQUIRE_MODEL(g, "vocab/ggml-vocab-gpt-2.gguf");
  std::string text;
  for (int i = 0; i < 2000; ++i)
    text += "Once upon a time, 🦙 said: \"33333 3.3\"\n\t  Führer ½ 我想在apple工作. ";
  text += std::string(20000, ' ') + std::string(5000, 'a') + std::string(3000, '\n');
  for (const auto* path : {&p, &g}) {
    const Tokenizer& tok = load(*path);
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(text, k_no_bos);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ perf     ] %s: %zu bytes -> %zu tokens in %.1f ms\n", path->filename().string().c_str(),
                text.size(), ids.size(), ms);
    EXPECT_EQ(tok.decode(ids), text);
    std::vector<std::vector<TokenId>> results(4);
    std::vector<std::thread> threads;
    for (size_t k = 0; k < results.size(); ++k)
      threads.emplace_back([&, k] { results[k] = tok.encode(text.substr(0, 50000), k_no_bos); });
    for (auto& th : threads)
      th.join();
    for (const auto& r : results)
      EXPECT_EQ(r, results[0]);
  }
}

TEST(Tokenizer, LoadingLargeVocabIsFast) {
  LOOM_REQUIRE_MODEL(p, "vocab/ggml-vocab-deepseek-llm.gguf");
  const GgufFile f = GgufFile::open(p.string());
  const auto t0 = std::chrono::steady_clock::now();
  const auto tok = Tokenizer::from_gguf(f);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ perf     ] deepseek-llm (%d tokens, ~100k merges): from_gguf in %.1f ms\n",
              tok->vocab_size(), ms);
  EXPECT_EQ(tok->vocab_size(), 102400);
}

} // namespace
