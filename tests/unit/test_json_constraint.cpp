// JSON-schema constrained decoding: the matcher on texts, the mask on a real vocabulary, and the
// property the `json_schema` stage exists for — whatever the logits, the output parses and fits.
#include "loom/error.hpp"
#include "loom/gguf.hpp"
#include "loom/json_constraint.hpp"
#include "loom/sampler.hpp"
#include "loom/tokenizer.hpp"
#include "test_util.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <random>

using namespace loom;

namespace {

bool matches(const std::string& schema, const std::string& text) {
  JsonMatcher m(JsonGrammar::compile(schema));
  return m.feed(text) && m.can_end();
}

bool prefix_ok(const std::string& schema, const std::string& text) {
  JsonMatcher m(JsonGrammar::compile(schema));
  return m.feed(text);
}

const char* kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer"},
    "email": {"type": ["string", "null"]},
    "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "maxItems": 2}
  },
  "required": ["name", "age"]
})";

TEST(JsonMatcher, AnyObjectModeTakesEveryObjectAndNothingElse) {
  EXPECT_TRUE(matches("", R"({})"));
  EXPECT_TRUE(matches("", R"( {"a": [1, -2.5e+3, true, null, {"b": "\u00e9\n"}], "c": "é"})"));
  EXPECT_FALSE(matches("", R"([1])"));
  EXPECT_FALSE(matches("", R"("x")"));
  EXPECT_FALSE(prefix_ok("", R"({"a": 01})")); // no leading zeros
  EXPECT_FALSE(prefix_ok("", R"({"a": tru})"
                             "e")); // 'tru}' is no literal
  EXPECT_FALSE(prefix_ok("", R"({"a" 1})"));
  EXPECT_FALSE(prefix_ok("", R"({"a": 1,})"));
  EXPECT_FALSE(prefix_ok("", "{\"a\": \"x\ny\"}")); // a raw newline inside a string
  EXPECT_FALSE(matches("", R"({"a": 1} )"));        // nothing after the value
  EXPECT_FALSE(matches("", R"({"a": 1)"));          // not complete
  // Between tokens: nothing, one space, or a newline and at most 20 spaces or tabs.
  EXPECT_TRUE(matches("", "{\n  \"a\": [\n\t\t1\n  ]\n}"));
  EXPECT_FALSE(prefix_ok("", "{  "));
  EXPECT_FALSE(prefix_ok("", "{ \n"));
  EXPECT_FALSE(prefix_ok("", "{\n\n"));
  EXPECT_TRUE(prefix_ok("", "{\n" + std::string(20, ' ')));
  EXPECT_FALSE(prefix_ok("", "{\n" + std::string(21, ' ')));
}

TEST(JsonMatcher, ObjectsFollowTheSchemasPropertiesInOrder) {
  EXPECT_TRUE(matches(kPerson, R"({"name": "Ada", "age": 36})"));
  EXPECT_TRUE(matches(kPerson, R"({"name":"Ada","age":36,"email":null,"tags":["a",3]})"));
  EXPECT_TRUE(matches(kPerson, R"({"name": "Ada", "age": 36, "tags": []})")); // optional email left out
  EXPECT_FALSE(prefix_ok(kPerson, R"({"age")"));                              // name is required first
  EXPECT_FALSE(prefix_ok(kPerson, R"({"name": "Ada", "nick")"));              // not a property
  EXPECT_FALSE(prefix_ok(kPerson, R"({"name": 1)"));                          // wrong type
  EXPECT_FALSE(prefix_ok(kPerson, R"({"name": "Ada", "age": 3.5)"));          // integer
  EXPECT_FALSE(prefix_ok(kPerson, R"({"name": "Ada"})"));                     // age missing
  EXPECT_FALSE(prefix_ok(kPerson, R"({"name": "Ada", "age": 1, "tags": ["c")"));
  EXPECT_FALSE(prefix_ok(kPerson, R"({"name": "Ada", "age": 1, "tags": ["a", "b", "a")")); // maxItems
  EXPECT_FALSE(prefix_ok(kPerson, R"({"name": "Ada", "age": 1, "tags": [], "email")"));    // order
  EXPECT_FALSE(prefix_ok(kPerson, R"({"name": "Ada Lovelace 1815", )"));                   // maxLength 12
  EXPECT_TRUE(prefix_ok(kPerson, R"({"name": "Ada Lovelace", )"));
  // After the last property no comma can come: there is nothing left to write after it.
  EXPECT_FALSE(prefix_ok(kPerson, R"({"name": "A", "age": 1, "email": "e", "tags": [],)"));
}

TEST(JsonMatcher, StringsNumbersLiteralsAndUnicode) {
  const std::string s = R"({"type": "string", "minLength": 2})";
  EXPECT_TRUE(matches(s, R"("ab")"));
  EXPECT_TRUE(matches(s, R"("\"\\\/\b\f\n\r\t\u0041")"));
  EXPECT_TRUE(matches(s, "\"h\xc3\xa9\"")); // 2 characters, 3 bytes
  EXPECT_FALSE(prefix_ok(s, "\"a\xc3\""));  // a lead byte without its continuation
  EXPECT_FALSE(prefix_ok(s, "\"\x80"));     // a stray continuation byte
  EXPECT_FALSE(matches(s, R"("a")"));       // minLength
  EXPECT_FALSE(prefix_ok(s, R"("\x")"));    // no such escape
  EXPECT_FALSE(prefix_ok(s, R"("\u00g")"));
  const std::string n = R"({"type": "number"})";
  for (const char* ok : {"0", "-0", "12", "-3.25", "1e9", "6.02E+23", "1.5e-7"})
    EXPECT_TRUE(matches(n, ok)) << ok;
  for (const char* bad : {"-", "01", "1.", ".5", "1e", "+1", "1e+"})
    EXPECT_FALSE(matches(n, bad)) << bad;
  EXPECT_FALSE(prefix_ok(n, std::string(21, '7'))); // at most 20 digits
  EXPECT_TRUE(matches(R"({"enum": [1, 10, "x"]})", "1"));
  EXPECT_TRUE(matches(R"({"enum": [1, 10, "x"]})", "10"));
  EXPECT_FALSE(matches(R"({"enum": [1, 10, "x"]})", "100"));
  EXPECT_TRUE(matches(R"({"const": {"k": [true]}})", R"({"k":[true]})"));
  EXPECT_TRUE(matches(R"({"type": "boolean"})", "false"));
  EXPECT_FALSE(matches(R"({"type": "boolean"})", "null"));
}

TEST(JsonMatcher, AnyOfRefsAndRecursion) {
  const std::string tree = R"({
    "$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
    "$ref": "#/$defs/node"})";
  EXPECT_TRUE(matches(tree, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4}]}]})"));
  EXPECT_FALSE(prefix_ok(tree, R"({"v": 1, "kids": [{"w")"));
  const std::string either = R"({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
    "required": ["a"]}, {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "null"}},
    "required": ["a", "b"]}]})";
  EXPECT_TRUE(matches(either, R"({"a": 1})"));
  EXPECT_TRUE(matches(either, R"({"a": "s", "b": null})"));
  EXPECT_FALSE(matches(either, R"({"a": "s"})"));
  EXPECT_FALSE(prefix_ok(either, R"({"a": 1, "b")"));
}

TEST(JsonMatcher, UnsupportedOrMalformedSchemasAreClearErrors) {
  const auto error_of = [](const std::string& schema) -> std::string {
    try {
      (void)JsonGrammar::compile(schema);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "strnig"})").find("unknown type 'strnig'"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref": "http://x/y"})").find("not supported"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref": "#/$defs/missing"})").find("names no schema"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "string", "minLength": 3, "maxLength": 2})").find("maxLength < minLength"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})").find("'b'"),
            std::string::npos);
  EXPECT_NE(error_of("false").find("allows no value"), std::string::npos);
}

// A schema small in bytes whose alternatives multiply ($defs nesting anyOf of 9 $refs 7 levels deep: 9^7
// stacks per byte, 89 s for one token before) is refused when it compiles, naming the part too large; so
// is one with too many states. A schema as wide as the budget allows still compiles.
TEST(JsonMatcher, SchemasOverTheirBudgetAreRefusedNamingThePart) {
  const auto nested = [](int fan, int levels) {
    nlohmann::json defs = nlohmann::json::object();
    for (int l = 0; l < levels; ++l) {
      nlohmann::json alts = nlohmann::json::array();
      for (int k = 0; k < fan; ++k)
        alts.push_back({{"$ref", "#/$defs/d" + std::to_string(l + 1)}});
      defs["d" + std::to_string(l)] = {{"anyOf", alts}};
    }
    defs["d" + std::to_string(levels)] = {{"type", "string"}};
    return nlohmann::json{{"$defs", defs}, {"$ref", "#/$defs/d0"}}.dump();
  };
  const std::string bomb = nested(9, 7);
  EXPECT_LT(bomb.size(), 2000u);
  try {
    (void)JsonGrammar::compile(bomb);
    ADD_FAILURE() << "the 9^7 schema compiled";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("expands to more than"), std::string::npos) << w;
    EXPECT_NE(w.find("#/$defs/d"), std::string::npos) << w;
  }
  EXPECT_NO_THROW((void)JsonGrammar::compile(nested(4, 4))); // 256 alternatives: the budget
  // An anyOf that leads back to itself without a value between (the fuzzer found one: 10 s per byte).
  try {
    (void)JsonGrammar::compile(
        R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]}}, "$ref": "#/$defs/a"})");
    ADD_FAILURE() << "a left-recursive anyOf compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lead back to it"), std::string::npos) << e.what();
  }
  nlohmann::json inner = {{"type", "object"}, {"properties", nlohmann::json::object()}};
  for (int k = 0; k < 64; ++k)
    inner["properties"]["p" + std::to_string(k)] = {{"type", "string"}};
  nlohmann::json wide = {{"type", "object"}, {"properties", nlohmann::json::object()}};
  for (int k = 0; k < 64; ++k) // 64 objects of 64 strings: 4161 states
    wide["properties"]["o" + std::to_string(k)] = inner;
  try {
    (void)JsonGrammar::compile(wide.dump());
    ADD_FAILURE() << "a schema of 4161 states compiled";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("states"), std::string::npos) << e.what();
  }
}

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

TEST(JsonSchemaSampler, IsABuiltInStageWithAStringParameter) {
  EXPECT_NO_THROW((void)create_sampler({"json_schema", {}}));
  EXPECT_NO_THROW((void)create_sampler({"json_schema", {{"schema", std::string(kPerson)}}}));
  try {
    (void)create_sampler({"json_schema", {{"schema", int64_t{3}}}});
    FAIL() << "an integer schema was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected a string"), std::string::npos) << e.what();
  }
  try {
    (void)create_sampler({"json_schema", {{"schema", std::string(R"({"type": 1})")}}});
    FAIL() << "a malformed schema was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("json_schema"), std::string::npos) << e.what();
  }
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
