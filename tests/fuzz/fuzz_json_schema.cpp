// libFuzzer target: JSON-schema compilation (response_format's json_schema, a client's input) within its
// bounds — states, alternatives, nesting — and the matcher fed the text after the first NUL byte.
#include "loom/error.hpp"
#include "loom/sample/json_constraint.hpp"

#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view schema = in.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  try {
    loom::JsonMatcher m(loom::JsonGrammar::compile(schema));
    for (size_t i = 0; i < text.size(); i += 7) // a token's worth of bytes at a time
      if (!m.feed(text.substr(i, 7))) break;
    (void)m.can_end();
  } catch (const loom::Error&) {
  }
  return 0;
}
