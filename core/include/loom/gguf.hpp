// loom/gguf.hpp — reader for GGUF v2/v3 model files (llama.cpp's format).
//
// The file is untrusted input: every count, offset, size and string length is checked against the
// bytes that are actually there before it is used; a bad file is a loom::Error(parse_error) that
// names the file, what is wrong and the byte offset — never a crash or a huge allocation.
#pragma once

#include "loom/dtype.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// GGUF metadata value types (gguf.h `enum gguf_type`).
enum class GgufType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
std::string_view gguf_type_name(GgufType t) noexcept;

struct GgufValue {
  GgufType type = GgufType::u8;
  // Scalars: integers in i (signed types) or u (unsigned, bool), floats in f.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0.0;
  std::string str;                   // type == string
  GgufType elem_type = GgufType::u8; // type == array
  std::vector<GgufValue> items;      // type == array (arrays may nest)

  bool is_integer() const noexcept;
  bool is_float() const noexcept { return type == GgufType::f32 || type == GgufType::f64; }
  // Integer value as int64 (nullopt when not an integer or a u64 above INT64_MAX).
  std::optional<int64_t> as_int() const noexcept;
  std::optional<double> as_number() const noexcept;  // integer or float
  std::string to_string(size_t max_items = 8) const; // for `loom inspect`
};

struct GgufKV {
  std::string key;
  GgufValue value;
};

struct GgufTensor {
  std::string name;
  DType type = DType::f32;
  std::vector<int64_t> ne; // dims, ne[0] is the fastest-varying (row length)
  int64_t n_elements = 0;
  uint64_t offset = 0; // absolute byte offset in the file
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr; // points into the mapping; valid while the GgufFile lives

  int64_t rows() const noexcept { return ne.empty() ? 0 : n_elements / ne[0]; }
};

class GgufFile {
public:
  // Maps the file read-only and parses it. Throws loom::Error naming `path`.
  static GgufFile open(const std::string& path);
  // Parses bytes that stay owned by the caller (fuzzing, tests). `name` appears in messages.
  static GgufFile parse(std::span<const uint8_t> bytes, std::string name);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const noexcept { return path_; }
  uint32_t version() const noexcept { return version_; }
  uint64_t file_size() const noexcept { return bytes_.size(); }
  uint64_t data_offset() const noexcept { return data_offset_; }
  uint32_t alignment() const noexcept { return alignment_; }

  const std::vector<GgufKV>& metadata() const noexcept { return kv_; }
  const std::vector<GgufTensor>& tensors() const noexcept { return tensors_; }

  const GgufValue* find(std::string_view key) const noexcept;
  const GgufTensor* find_tensor(std::string_view name) const noexcept;

  // Typed getters: throw loom::Error naming the key when it is missing (without a default) or has
  // another type.
  std::string get_string(std::string_view key) const;
  std::optional<std::string> get_string_opt(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  std::optional<int64_t> get_int_opt(std::string_view key) const;
  double get_float(std::string_view key) const;
  std::optional<double> get_float_opt(std::string_view key) const;
  std::optional<bool> get_bool_opt(std::string_view key) const;
  // Array of elem type: throws when present with another type. nullptr when missing.
  const GgufValue* get_array(std::string_view key, GgufType elem) const;

private:
  GgufFile() = default;
  struct Mapping;
  void parse_all();

  std::shared_ptr<Mapping> mapping_;
  std::span<const uint8_t> bytes_;
  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKV> kv_;
  std::vector<GgufTensor> tensors_;
};

// Writer: builds a GGUF v3 file (used by `loom synth`, tests and fuzz seeds).
class GgufWriter {
public:
  void add(std::string key, GgufValue value);
  void add_string(std::string key, std::string v);
  void add_u32(std::string key, uint32_t v);
  void add_i32(std::string key, int32_t v);
  void add_f32(std::string key, float v);
  void add_bool(std::string key, bool v);
  void add_string_array(std::string key, const std::vector<std::string>& v);
  // data: raw bytes already in `type` (row_bytes(type, ne[0]) * rows).
  void add_tensor(std::string name, DType type, std::vector<int64_t> ne, std::vector<uint8_t> data);
  std::vector<uint8_t> serialize(uint32_t alignment = 32) const;
  void write(const std::string& path, uint32_t alignment = 32) const;

  // Writes metadata plus tensors whose bytes are produced one at a time by `fill(index, bytes)`
  // (bytes must be resized to row_bytes(type, ne[0]) · rows), so a large model never sits in memory.
  struct TensorSpec {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
  };
  void write_streaming(const std::string& path, const std::vector<TensorSpec>& tensors,
                       const std::function<void(size_t, std::vector<uint8_t>&)>& fill,
                       uint32_t alignment = 32) const;

private:
  struct T {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
  };
  std::vector<GgufKV> kv_;
  std::vector<T> tensors_;
};

} // namespace loom
