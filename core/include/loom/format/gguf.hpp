// loom/format/gguf.hpp — reader for GGUF v2/v3 model files (llama.cpp's format).
//
// The file is untrusted input: every count, offset, size and string length is checked against the
// bytes that are actually there before it is used; a bad file is a loom::Error(parse_error) that
// names the file, what is wrong and the byte offset — never a crash or a huge allocation.
#pragma once

#include "loom/sdk/dtype.hpp"

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

struct GgufValue;

// A metadata array, stored compactly. Parsed from a file, it is a view of the file's bytes: numbers
// and bools stay where they are in the file (read with memcpy; bounds were checked at parse), strings
// are string_views into the file (16 bytes each), and arrays of arrays (rare; bounded by the parse's
// metadata-memory cap) are GgufValues. A view is valid while its GgufFile lives (for
// GgufFile::parse, while the caller's bytes do); detach() copies it into storage of its own.
// Arrays built with push_back (writer side) own their elements.
class GgufArray {
public:
  GgufType elem_type() const noexcept { return type_; }
  size_t size() const noexcept { return n_; }
  bool empty() const noexcept { return n_ == 0; }

  // Element i (i < size()). str: string arrays (asserts the type). as_int: integer arrays (nullopt
  // for other types and for a u64 above INT64_MAX). as_number: integer or float arrays. as_bool:
  // bool arrays. nested: arrays of arrays (asserts the type).
  std::string_view str(size_t i) const;
  std::optional<int64_t> as_int(size_t i) const noexcept;
  std::optional<double> as_number(size_t i) const noexcept;
  std::optional<bool> as_bool(size_t i) const noexcept;
  const GgufValue& nested(size_t i) const;
  // Element i as a standalone value of type elem_type() (copies a string; a nested array stays a
  // view).
  GgufValue operator[](size_t i) const;

  // Appends an element of type e.type (the first element fixes elem_type(); another type is a
  // loom::Error). The array then owns its elements.
  void push_back(const GgufValue& e);
  // Copies viewed elements (recursively) into storage of the array's own.
  void detach();
  // Whether any element points into a file's bytes.
  bool is_view() const noexcept;
  // Host memory the elements take beyond sizeof(GgufArray): 0 for a view of numbers.
  uint64_t heap_bytes() const noexcept;

  // Views (the parser's constructors): n numbers or bools of `type` at `data`, little-endian as in
  // the file; strings; nested arrays (owned).
  static GgufArray view_numbers(GgufType type, const uint8_t* data, size_t n) noexcept;
  static GgufArray view_strings(std::vector<std::string_view> strings);
  static GgufArray of_arrays(std::vector<GgufValue> arrays);

private:
  const uint8_t* number_bytes(size_t i) const noexcept;

  GgufType type_ = GgufType::u8;
  size_t n_ = 0;
  bool owned_ = false;
  const uint8_t* view_ = nullptr;      // numbers/bools, view: n_ · element size bytes
  std::vector<uint8_t> own_bytes_;     // numbers/bools, owned
  std::vector<std::string_view> strs_; // strings, view
  std::vector<std::string> own_strs_;  // strings, owned
  std::vector<GgufValue> nested_;      // arrays of arrays
};

struct GgufValue {
  GgufType type = GgufType::u8;
  // Scalars: integers in i (signed types) or u (unsigned, bool), floats in f.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0.0;
  std::string str;                   // type == string
  GgufType elem_type = GgufType::u8; // type == array (equals items.elem_type() once it has elements)
  GgufArray items;                   // type == array (arrays may nest)

  bool is_integer() const noexcept;
  bool is_float() const noexcept { return type == GgufType::f32 || type == GgufType::f64; }
  // Integer value as int64 (nullopt when not an integer or a u64 above INT64_MAX).
  std::optional<int64_t> as_int() const noexcept;
  std::optional<double> as_number() const noexcept;  // integer or float
  std::string to_string(size_t max_items = 8) const; // for `loom inspect`: one line, escaped
};

// `s` made safe to echo inside a one-line message: control characters, backslashes and bytes that
// are not valid UTF-8 become escapes (\n, \\, \xff); more than `max_bytes` are cut with "...".
std::string gguf_printable(std::string_view s, size_t max_bytes = 200);

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

// Limits on what a parse may allocate.
struct GgufLimits {
  // Host memory for the parsed metadata and tensor infos (keys, scalar strings, string views of
  // string arrays, nested arrays, tensor names and shapes). Real models need a few MiB.
  uint64_t max_metadata_bytes = uint64_t{1} << 30;
};

class GgufFile {
public:
  // Maps the file read-only and parses it. Throws loom::Error naming `path`: also when the path
  // holds a NUL byte or names something other than a regular file (a directory, a FIFO, a device).
  static GgufFile open(const std::string& path, const GgufLimits& limits = {});
  // Parses bytes that stay owned by the caller (fuzzing, tests). `name` appears in messages.
  static GgufFile parse(std::span<const uint8_t> bytes, std::string name, const GgufLimits& limits = {});
  // A Hugging Face checkpoint directory as a GGUF file (loom/format/hf_checkpoint.hpp; open() calls it for a
  // directory): metadata synthesized from its JSON files, tensors renamed, their bytes in the mapped
  // safetensors files. version() is 0, file_size() the bytes of the safetensors files.
  static GgufFile from_hf_dir(const std::string& dir, const GgufLimits& limits = {});

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();
  // A second GgufFile over the same mapping (no new map, no parse): tensor data at the same addresses, so
  // backends that key copies by address share them (a draft of the target's own first layers).
  GgufFile shared_copy() const;

  const std::string& path() const noexcept { return path_; }
  uint32_t version() const noexcept { return version_; }
  uint64_t file_size() const noexcept { return bytes_.size() + hf_bytes_; }
  uint64_t data_offset() const noexcept { return data_offset_; }
  uint32_t alignment() const noexcept { return alignment_; }
  // Host memory the parsed metadata and tensor infos take, as estimated against GgufLimits.
  uint64_t metadata_bytes() const noexcept { return metadata_bytes_; }

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
  void parse_all(const GgufLimits& limits);

  std::shared_ptr<Mapping> mapping_;
  std::span<const uint8_t> bytes_;
  std::string path_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  uint64_t metadata_bytes_ = 0;
  std::vector<GgufKV> kv_;
  std::vector<GgufTensor> tensors_;
  std::shared_ptr<const void> hf_storage_; // from_hf_dir: the mapped shards and converted tensors
  uint64_t hf_bytes_ = 0;
};

// Writer: builds a GGUF v3 file (used by `loom synth`, tests and fuzz seeds).
class GgufWriter {
public:
  // Stores a copy of its own (arrays are detached from the file they came from).
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
