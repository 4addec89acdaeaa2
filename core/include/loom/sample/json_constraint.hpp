// loom/sample/json_constraint.hpp — constrained decoding to JSON: a JSON schema compiled to a pushdown
// matcher over bytes, and the `json_schema` sampler stage that masks every token whose bytes cannot
// continue a text the schema accepts, so the output always parses (OpenAI's response_format
// json_object / json_schema; llama.cpp's json-schema-to-grammar, as a matcher instead of a GBNF).
//
// The schema subset (what OpenAI's strict mode accepts, and the usual pydantic output):
//   type (a name or a list of names), properties + required (keys in the schema's order; optional
//   keys may be left out; no other keys unless the object has no properties), additionalProperties
//   (an object without properties: its values' schema; true or absent = any value), items,
//   minItems / maxItems, minLength / maxLength, enum, const, anyOf / oneOf, allOf of one schema,
//   $ref to "#", "#/$defs/…" or "#/definitions/…".
// Read and not enforced: pattern, format, minimum / maximum, multipleOf, uniqueItems (the output
// still parses). Anything else (title, description, default, examples, …) is ignored.
// Bounds that keep a constrained model from running on forever: between two tokens of JSON nothing,
// one space, or a newline and at most 20 spaces or tabs (llama.cpp's rule); 20 digits in a number's
// integer or fraction part, 4 in its exponent; nesting 64 deep.
// Bounds that keep a hostile schema from costing the server (json_constraint.cpp's constants): a schema
// compiles to at most 4096 states, and one anyOf (through nested anyOfs and $refs) to at most 256
// alternatives — past either, compile() refuses it naming the part; one token mask takes at most 8M
// parse-stack advances — past it the stage throws, which fails that request alone (the mask is computed
// in the engine's step, so a bound per step, not a thread of its own, keeps the others' steps short).
#pragma once

#include "loom/sdk/types.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

class Tokenizer;
class Sampler;

class JsonGrammar {
public:
  // `schema`: a JSON schema (the subset above), or empty for "any JSON object" (json_object mode).
  // Throws loom::Error(invalid_argument) naming what is not supported or malformed.
  static std::shared_ptr<const JsonGrammar> compile(std::string_view schema);
  struct Node;
  ~JsonGrammar();
  JsonGrammar(const JsonGrammar&) = delete;
  JsonGrammar& operator=(const JsonGrammar&) = delete;
  const Node& node(uint32_t i) const;
  uint32_t root() const noexcept { return root_; }

private:
  JsonGrammar();
  friend class JsonSchemaCompiler;
  std::vector<Node> nodes_;
  uint32_t root_ = 0;
};

// Where a text is in the grammar: the set of parse stacks the bytes so far allow (several only under
// anyOf). Copyable; feed() on a copy to try a continuation.
class JsonMatcher {
public:
  explicit JsonMatcher(std::shared_ptr<const JsonGrammar> g);
  JsonMatcher(const JsonMatcher&);
  JsonMatcher& operator=(const JsonMatcher&);
  JsonMatcher(JsonMatcher&&) noexcept;
  JsonMatcher& operator=(JsonMatcher&&) noexcept;
  ~JsonMatcher();
  // Advances over `bytes`; false (and the state unchanged) when they cannot continue the text.
  bool feed(std::string_view bytes);
  bool accepts(std::string_view bytes) const; // feed() would succeed
  bool can_end() const;                       // the text so far is one complete value of the schema
  // The tokens that may come next: allowed[id] = 1 for a token whose bytes continue the text, and for
  // the end-of-generation tokens once can_end(); 0 otherwise (control tokens included).
  void allowed_tokens(const Tokenizer& tok, std::vector<uint8_t>& allowed) const;

  struct State;

private:
  std::shared_ptr<const JsonGrammar> g_;
  std::unique_ptr<State> s_;
};

// The `json_schema` sampler stage: removes the candidates the schema does not allow next (see
// JsonMatcher::allowed_tokens), so it goes before the selecting stages of a chain. `schema` as
// JsonGrammar::compile takes it. The stage reads the vocabulary from SamplerContext::tokenizer.
std::unique_ptr<Sampler> make_json_schema_sampler(std::string_view schema);

} // namespace loom
