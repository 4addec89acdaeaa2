// loom/format/hf_checkpoint.hpp — Hugging Face checkpoint directories as models.
//
// A directory with config.json, model.safetensors (or shards listed by model.safetensors.index.json),
// tokenizer.json and optionally tokenizer_config.json / chat_template.jinja loads wherever a GGUF path
// does: GgufFile::open(dir) calls GgufFile::from_hf_dir, which synthesizes the GGUF metadata the rest of
// Loom reads (general.*, {arch}.*, tokenizer.ggml.*, tokenizer.chat_template) and renames the tensors
// to GGUF names. Tensor bytes stay in the mapped safetensors files; only what GGUF stores differently
// is copied (Llama's q/k rows, permuted from rotate-half to interleaved-pair RoPE order).
//
// Every file is untrusted input, like a GGUF file: the safetensors header length, each tensor's dtype,
// shape and byte range, the JSON files' sizes and nesting, and the shard names of the index are
// checked before anything is used; a bad checkpoint is a loom::Error naming the file and what is wrong.
#pragma once

#include "loom/sdk/dtype.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace loom {

// A safetensors header, checked against the file's bytes.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;          // as the header spells it: "F32", "BF16", "I64" …
  std::optional<DType> type;  // F32, F16, BF16; nullopt for the dtypes Loom does not compute with
  std::vector<int64_t> shape; // row-major, as in the header (shape[0] the slowest)
  int64_t n_elements = 0;
  uint64_t begin = 0, end = 0;   // data_offsets: relative to the data section
  const uint8_t* data = nullptr; // the tensor's first byte in the parsed bytes
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;               // 8 + header length
  std::vector<SafetensorsTensor> tensors; // sorted by name
};

// The most header bytes a safetensors file may declare (the reference implementation's limit).
constexpr uint64_t k_safetensors_max_header = 100ull << 20;

// Parses and checks the header of a whole safetensors file: the 8-byte little-endian header length
// (within the file and k_safetensors_max_header), the JSON (an object; nesting bounded), each tensor's
// dtype (a known safetensors dtype), shape (non-negative dimensions, at most 4, no overflow), its
// data_offsets (begin ≤ end within the data section, end − begin == elements × element size) and that
// no two tensors share bytes. `name` appears in messages. Throws loom::Error(parse_error).
SafetensorsHeader parse_safetensors(std::span<const uint8_t> file, const std::string& name);

} // namespace loom
