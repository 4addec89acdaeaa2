// libFuzzer target: the GGUF reader, and the model config and tokenizer built from what it accepts.
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/model/model_config.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = loom::GgufFile::parse(std::span<const uint8_t>(data, size), "fuzz.gguf");
    for (const auto& t : f.tensors())
      (void)t.name;
    try {
      (void)loom::ModelConfig::from_gguf(f);
    } catch (const loom::Error&) {
    }
    try {
      const auto tok = loom::Tokenizer::from_gguf(f);
      const auto ids = tok->encode("Hello world, it's 2024! Führer 🦙", {});
      (void)tok->decode(ids);
    } catch (const loom::Error&) {
    }
  } catch (const loom::Error&) {
  }
  return 0;
}
