// libFuzzer target: the safetensors header reader of Hugging Face checkpoints
// (loom/format/hf_checkpoint.hpp). An input that starts with '{' is a header: it is given its 8-byte length
// and 64 data bytes (so the seeds are JSON text, and mutations reach the checks of dtypes, shapes and
// offsets); any other input is a whole file (mutations reach the header length).
#include "loom/error.hpp"
#include "loom/format/hf_checkpoint.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> file;
  std::span<const uint8_t> bytes(data, size);
  if (size > 0 && data[0] == '{') {
    file.resize(8);
    for (int k = 0; k < 8; ++k)
      file[static_cast<size_t>(k)] = static_cast<uint8_t>(static_cast<uint64_t>(size) >> (8 * k));
    file.insert(file.end(), data, data + size);
    for (int k = 0; k < 64; ++k)
      file.push_back(static_cast<uint8_t>(k));
    bytes = file;
  }
  try {
    const auto h = loom::parse_safetensors(bytes, "fuzz.safetensors");
    volatile uint8_t sink = 0;
    for (const auto& t : h.tensors) // every accepted range is readable
      if (t.end > t.begin) sink = static_cast<uint8_t>(sink ^ t.data[0] ^ t.data[t.end - t.begin - 1]);
    (void)sink;
  } catch (const loom::Error&) {
  }
  return 0;
}
