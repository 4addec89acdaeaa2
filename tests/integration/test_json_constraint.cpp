// JSON-schema constrained decoding on real vocabularies: a mask over its work budget fails the request,
// not the step; the property the `json_schema` stage exists for — whatever the logits, the output parses
// and fits (GPT-2's byte-level BPE); the trie walk's mask equals testing each token. (The matcher on texts
// and the stage's parameters: tests/unit/test_json_constraint.cpp.)
#include "json_schemas.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/sample/json_constraint.hpp"
#include "loom/sample/sampler.hpp"
#include "loom/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

#include <cstdio>
#include <cstdlib>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <random>

using namespace loom;

namespace {

using loom::test::kPerson;

// A step's mask has a bound: 64 open alternatives, each inside a string, over a 50k vocabulary would
// walk the whole trie 64 times; the stage fails (the engine fails that request alone) instead.
TEST(JsonSchemaSampler, AMaskOverItsWorkBudgetFailsTheRequestNotTheStep) {
  const auto path = test::models_dir() / "vocab" / "ggml-vocab-gpt-2.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "SKIPPED: " << path << " not found (LOOM_TEST_MODELS)";
  const GgufFile f = GgufFile::open(path.string());
  const auto tok = Tokenizer::from_gguf(f);
  nlohmann::json alts = nlohmann::json::array();
  for (int k = 0; k < 64; ++k)
    alts.push_back({{"type", "string"}, {"maxLength", 100 + k}});
  JsonMatcher m(JsonGrammar::compile(nlohmann::json{{"anyOf", alts}}.dump()));
  ASSERT_TRUE(m.feed("\""));
  std::vector<uint8_t> allowed;
  try {
    m.allowed_tokens(*tok, allowed);
    ADD_FAILURE() << "the mask of 64 open strings was computed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parse steps"), std::string::npos) << e.what();
  }
  JsonMatcher one(JsonGrammar::compile(kPerson)); // a normal schema is far inside the budget
  ASSERT_TRUE(one.feed(R"({"name": ")"));
  EXPECT_NO_THROW(one.allowed_tokens(*tok, allowed));
}

// A real byte-level BPE vocabulary (GPT-2's, 50257 tokens with multi-character pieces such as '":'
// and '"},'): random logits, the stage, then the arg-max — until the end token. Every output parses
// and has the schema's shape, whatever the logits favoured.
TEST(JsonSchemaSampler, RandomLogitsOnARealVocabularyAlwaysGiveJsonOfTheSchema) {
  const auto path = test::models_dir() / "vocab" / "ggml-vocab-gpt-2.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "SKIPPED: " << path << " not found (LOOM_TEST_MODELS)";
  const GgufFile f = GgufFile::open(path.string());
  const auto tok = Tokenizer::from_gguf(f);
  ASSERT_FALSE(tok->eog_tokens().empty());
  const auto V = static_cast<size_t>(tok->vocab_size());
  for (const char* schema : {kPerson, ""}) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      std::mt19937_64 rng(seed);
      std::normal_distribution<float> noise(0.0f, 1.0f);
      auto chain = std::make_unique<SamplerChain>();
      chain->add(create_sampler({"json_schema", {{"schema", std::string(schema)}}}));
      chain->add(create_sampler({"greedy", {}}));
      std::vector<TokenId> out;
      std::vector<float> logits(V);
      bool ended = false;
      for (int step = 0; step < 400 && !ended; ++step) {
        for (size_t i = 0; i < V; ++i)
          logits[i] = noise(rng);
        // Closing is likelier than not, so outputs end well within the budget; the end token is
        // favoured most, so it is taken the moment the stage allows it.
        for (const TokenId e : tok->eog_tokens())
          logits[static_cast<size_t>(e)] += 50.0f;
        for (size_t i = 0; i < V; ++i) {
          const std::string& p = tok->piece(static_cast<TokenId>(i));
          if (p.find_first_of("\"}]") != std::string::npos) logits[i] += 2.5f;
        }
        SamplerContext ctx{{}, out, &rng, &rng_uniform, tok.get()};
        const TokenId t = chain->sample(logits, ctx);
        chain->accept(t);
        if (tok->is_eog(t))
          ended = true;
        else
          out.push_back(t);
      }
      const std::string text = tok->decode(out);
      if (std::getenv("LOOM_TEST_VERBOSE")) std::fprintf(stderr, "%s\n", text.c_str());
      ASSERT_TRUE(ended) << "seed " << seed << ": no end within 400 tokens: " << text;
      const auto j = nlohmann::json::parse(text, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << "seed " << seed << ": does not parse: " << text;
      ASSERT_TRUE(j.is_object()) << text;
      if (*schema) {
        ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
        EXPECT_LE(j["name"].get<std::string>().size(), 12u) << text;
        ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer()) << text;
        for (const auto& [k, v] : j.items())
          EXPECT_TRUE(k == "name" || k == "age" || k == "email" || k == "tags") << text;
      }
    }
  }
}

// The mask the trie walk computes equals testing every token's bytes one by one.
TEST(JsonSchemaSampler, TheTrieMaskEqualsTestingEachToken) {
  const auto path = test::models_dir() / "vocab" / "ggml-vocab-llama-spm.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "SKIPPED: " << path << " not found (LOOM_TEST_MODELS)";
  const GgufFile f = GgufFile::open(path.string());
  const auto tok = Tokenizer::from_gguf(f);
  for (const char* prefix : {"", R"({"na)", R"({"name": "Ada)", R"({"name": "Ada", "age": 1)",
                             R"({"name": "Ada", "age": 12, "tags": [)"}) {
    JsonMatcher m(JsonGrammar::compile(kPerson));
    ASSERT_TRUE(m.feed(prefix)) << prefix;
    std::vector<uint8_t> allowed;
    m.allowed_tokens(*tok, allowed);
    size_t n_allowed = 0;
    for (TokenId i = 0; i < tok->vocab_size(); ++i) {
      DecodeState st;
      st.at_start = false;
      std::string bytes;
      tok->decode_step(st, i, bytes, false);
      bytes += st.pending;
      const bool want = tok->is_eog(i) ? m.can_end() : (!bytes.empty() && m.accepts(bytes));
      ASSERT_EQ(allowed[static_cast<size_t>(i)] != 0, want) << "prefix " << prefix << ", token " << i;
      n_allowed += want;
    }
    EXPECT_GT(n_allowed, 0u) << prefix;
  }
}

} // namespace
