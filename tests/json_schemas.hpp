// tests/json_schemas.hpp — JSON schemas shared by the constrained-decoding tests (unit: the matcher on
// texts; integration: the mask on real vocabularies).
#pragma once

namespace loom::test {

// An object with a bounded string, an integer, a nullable string and a short array of an enum; name and
// age required.
inline constexpr const char* kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer"},
    "email": {"type": ["string", "null"]},
    "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "maxItems": 2}
  },
  "required": ["name", "age"]
})";

} // namespace loom::test
