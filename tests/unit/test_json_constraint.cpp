// JSON-schema constrained decoding without a vocabulary file: the matcher on texts (objects, strings,
// numbers, anyOf and $refs, errors, budgets) and the `json_schema` stage's parameter. (On real
// vocabularies — the mask, and output that parses and fits whatever the logits:
// tests/integration/test_json_constraint.cpp.)
#include "json_schemas.hpp"
#include "loom/error.hpp"
#include "loom/sample/json_constraint.hpp"
#include "loom/sample/sampler.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace loom;

namespace {

using loom::test::kPerson;

bool matches(const std::string& schema, const std::string& text) {
  JsonMatcher m(JsonGrammar::compile(schema));
  return m.feed(text) && m.can_end();
}

bool prefix_ok(const std::string& schema, const std::string& text) {
  JsonMatcher m(JsonGrammar::compile(schema));
  return m.feed(text);
}

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

} // namespace
