// libFuzzer target: the pipeline loader (TOML parse + validation + --set overrides + to_toml).
#include "loom/error.hpp"
#include "loom/pipeline/pipeline_config.hpp"

#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The first line, when it looks like one, is also tried as a --set override.
  std::vector<loom::ConfigOverride> overrides;
  const auto nl = text.find('\n');
  const std::string first = text.substr(0, nl);
  try {
    if (first.find('=') != std::string::npos && first.size() < 200)
      overrides.push_back(loom::parse_override(first));
  } catch (const loom::Error&) {
  }
  try {
    const auto cfg = loom::parse_pipeline(text, "fuzz.toml", overrides);
    const std::string again = loom::to_toml(cfg);
    const auto cfg2 = loom::parse_pipeline(again, "resolved.toml");
    if (loom::to_toml(cfg2) != again) __builtin_trap(); // the resolved form must be a fixed point
  } catch (const loom::Error&) {
  }
  return 0;
}
