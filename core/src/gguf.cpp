#include "loom/gguf.hpp"

#include "file_type.hpp"
#include "loom/error.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <limits>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_set>

namespace loom {

namespace {

constexpr uint32_t k_magic = 0x46554747u; // "GGUF" little-endian
constexpr int k_max_depth = 4;            // nested arrays deeper than this are refused
constexpr uint32_t k_max_dims = 4;        // GGML_MAX_DIMS

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

size_t scalar_size(GgufType t) {
  switch (t) {
  case GgufType::u8:
  case GgufType::i8:
  case GgufType::boolean:
    return 1;
  case GgufType::u16:
  case GgufType::i16:
    return 2;
  case GgufType::u32:
  case GgufType::i32:
  case GgufType::f32:
    return 4;
  case GgufType::u64:
  case GgufType::i64:
  case GgufType::f64:
    return 8;
  case GgufType::string:
    return 8; // at least the length
  case GgufType::array:
    return 12; // at least type + count
  }
  return 1;
}

bool valid_type(uint32_t t) {
  return t <= 12;
}

bool is_number_or_bool(GgufType t) {
  return t != GgufType::string && t != GgufType::array;
}

// Host-memory estimates charged against GgufLimits::max_metadata_bytes (heap blocks of a
// std::string longer than the small-string buffer, hash-set nodes of the duplicate checks).
uint64_t string_heap(uint64_t len) {
  return len > 15 ? len + 1 : 0;
}
constexpr uint64_t k_set_entry_bytes = 48;

class Reader {
public:
  Reader(std::span<const uint8_t> b, const std::string& name, uint64_t limit)
      : b_(b), name_(name), limit_(limit) {}

  [[noreturn]] void error(uint64_t at, const std::string& what) const {
    fail(Errc::parse_error, "gguf",
         name_ + ": " + what + " (at byte offset " + std::to_string(at) + " of " + std::to_string(b_.size()) +
             "); the file is truncated or not a valid GGUF file — re-download or re-convert it");
  }

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return b_.size() - pos_; }
  uint64_t charged() const { return used_; }

  // Counts `bytes` of host memory the parse is about to allocate for `what`; past the limit it is an
  // error, before anything is allocated.
  void charge(uint64_t bytes, uint64_t at, const std::string& what) {
    if (bytes > limit_ || used_ > limit_ - bytes)
      fail(Errc::parse_error, "gguf",
           name_ + ": " + what + " needs " + mib(bytes) + " of memory, " + mib(used_) +
               " already taken: over the limit of " + mib(limit_) + " for metadata (at byte offset " +
               std::to_string(at) + "); real models need a few MiB — the file is corrupt or not a model");
    used_ += bytes;
  }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      error(pos_, std::string("expected ") + std::to_string(n) + " bytes for " + what + ", only " +
                      std::to_string(remaining()) + " left");
  }

  template <class T> T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // A length-prefixed string, as a view of the bytes.
  std::string_view read_view(const char* what) {
    const uint64_t at = pos_;
    const auto len = read<uint64_t>(what);
    if (len > remaining())
      error(at, std::string(what) + ": string length " + std::to_string(len) + " exceeds the " +
                    std::to_string(remaining()) + " bytes left");
    std::string_view s(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

  GgufValue read_value(GgufType t, int depth, std::string_view key) {
    GgufValue v;
    v.type = t;
    switch (t) {
    case GgufType::u8:
      v.u = read<uint8_t>("u8 value");
      break;
    case GgufType::i8:
      v.i = read<int8_t>("i8 value");
      break;
    case GgufType::u16:
      v.u = read<uint16_t>("u16 value");
      break;
    case GgufType::i16:
      v.i = read<int16_t>("i16 value");
      break;
    case GgufType::u32:
      v.u = read<uint32_t>("u32 value");
      break;
    case GgufType::i32:
      v.i = read<int32_t>("i32 value");
      break;
    case GgufType::u64:
      v.u = read<uint64_t>("u64 value");
      break;
    case GgufType::i64:
      v.i = read<int64_t>("i64 value");
      break;
    case GgufType::f32:
      v.f = static_cast<double>(read<float>("f32 value"));
      break;
    case GgufType::f64:
      v.f = read<double>("f64 value");
      break;
    case GgufType::boolean: {
      const uint64_t at = pos_;
      const auto b = read<uint8_t>("bool value");
      if (b > 1)
        error(at, "key '" + gguf_printable(key) + "': bool value must be 0 or 1, found " + std::to_string(b));
      v.u = b;
      break;
    }
    case GgufType::string: {
      const uint64_t at = pos_;
      const std::string_view s = read_view("string value");
      charge(string_heap(s.size()), at, "key '" + gguf_printable(key) + "': a string");
      v.str = std::string(s);
      break;
    }
    case GgufType::array:
      read_array(v, depth, key);
      break;
    }
    return v;
  }

private:
  void read_array(GgufValue& v, int depth, std::string_view key) {
    if (depth >= k_max_depth)
      error(pos_,
            "key '" + gguf_printable(key) + "': arrays nested deeper than " + std::to_string(k_max_depth));
    const uint64_t at = pos_;
    const auto et = read<uint32_t>("array element type");
    if (!valid_type(et))
      error(at, "key '" + gguf_printable(key) + "': unknown array element type " + std::to_string(et));
    v.elem_type = static_cast<GgufType>(et);
    const uint64_t at_n = pos_;
    const auto n = read<uint64_t>("array length");
    const uint64_t min_bytes = scalar_size(v.elem_type);
    if (n > remaining() / min_bytes)
      error(at_n, "key '" + gguf_printable(key) + "': array of " + std::to_string(n) + " " +
                      std::string(gguf_type_name(v.elem_type)) + " needs at least " + std::to_string(n) +
                      "×" + std::to_string(min_bytes) + " bytes, only " + std::to_string(remaining()) +
                      " left");
    const auto count = static_cast<size_t>(n);
    if (is_number_or_bool(v.elem_type)) {
      // Stays in the file: no per-element memory at all.
      const uint8_t* data = b_.data() + pos_;
      if (v.elem_type == GgufType::boolean)
        for (size_t k = 0; k < count; ++k)
          if (data[k] > 1)
            error(pos_ + k, "key '" + gguf_printable(key) + "': bool element " + std::to_string(k) +
                                " must be 0 or 1, found " + std::to_string(data[k]));
      pos_ += n * min_bytes;
      v.items = GgufArray::view_numbers(v.elem_type, data, count);
    } else if (v.elem_type == GgufType::string) {
      charge(n * sizeof(std::string_view), at_n,
             "key '" + gguf_printable(key) + "': an array of " + std::to_string(n) + " strings");
      std::vector<std::string_view> strs;
      strs.reserve(count);
      for (size_t k = 0; k < count; ++k)
        strs.push_back(read_view("a string array element"));
      v.items = GgufArray::view_strings(std::move(strs));
    } else {
      charge(n * sizeof(GgufValue), at_n,
             "key '" + gguf_printable(key) + "': an array of " + std::to_string(n) + " arrays");
      std::vector<GgufValue> items;
      items.reserve(count);
      for (size_t k = 0; k < count; ++k)
        items.push_back(read_value(GgufType::array, depth + 1, key));
      v.items = GgufArray::of_arrays(std::move(items));
    }
  }

  std::span<const uint8_t> b_;
  const std::string& name_;
  uint64_t pos_ = 0;
  uint64_t limit_ = 0;
  uint64_t used_ = 0;
};

// Scalar of `t` at p (little-endian, as in the file) into v's i/u/f.
void decode_scalar(GgufType t, const uint8_t* p, GgufValue& v) {
  auto get = [p](auto x) {
    std::memcpy(&x, p, sizeof x);
    return x;
  };
  switch (t) {
  case GgufType::u8:
  case GgufType::boolean:
    v.u = get(uint8_t{});
    break;
  case GgufType::i8:
    v.i = get(int8_t{});
    break;
  case GgufType::u16:
    v.u = get(uint16_t{});
    break;
  case GgufType::i16:
    v.i = get(int16_t{});
    break;
  case GgufType::u32:
    v.u = get(uint32_t{});
    break;
  case GgufType::i32:
    v.i = get(int32_t{});
    break;
  case GgufType::u64:
    v.u = get(uint64_t{});
    break;
  case GgufType::i64:
    v.i = get(int64_t{});
    break;
  case GgufType::f32:
    v.f = static_cast<double>(get(float{}));
    break;
  case GgufType::f64:
    v.f = get(double{});
    break;
  case GgufType::string:
  case GgufType::array:
    break;
  }
}

template <class T> void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

// A number or bool of type v.type, as the file stores it.
void put_scalar(std::vector<uint8_t>& out, const GgufValue& v) {
  switch (v.type) {
  case GgufType::u8:
    put<uint8_t>(out, static_cast<uint8_t>(v.u));
    break;
  case GgufType::i8:
    put<int8_t>(out, static_cast<int8_t>(v.i));
    break;
  case GgufType::u16:
    put<uint16_t>(out, static_cast<uint16_t>(v.u));
    break;
  case GgufType::i16:
    put<int16_t>(out, static_cast<int16_t>(v.i));
    break;
  case GgufType::u32:
    put<uint32_t>(out, static_cast<uint32_t>(v.u));
    break;
  case GgufType::i32:
    put<int32_t>(out, static_cast<int32_t>(v.i));
    break;
  case GgufType::u64:
    put<uint64_t>(out, v.u);
    break;
  case GgufType::i64:
    put<int64_t>(out, v.i);
    break;
  case GgufType::f32:
    put<float>(out, static_cast<float>(v.f));
    break;
  case GgufType::f64:
    put<double>(out, v.f);
    break;
  case GgufType::boolean:
    put<uint8_t>(out, v.u ? 1 : 0);
    break;
  case GgufType::string:
  case GgufType::array:
    LOOM_ASSERT(false, "put_scalar of a string or array");
  }
}

} // namespace

std::string_view gguf_type_name(GgufType t) noexcept {
  switch (t) {
  case GgufType::u8:
    return "u8";
  case GgufType::i8:
    return "i8";
  case GgufType::u16:
    return "u16";
  case GgufType::i16:
    return "i16";
  case GgufType::u32:
    return "u32";
  case GgufType::i32:
    return "i32";
  case GgufType::f32:
    return "f32";
  case GgufType::boolean:
    return "bool";
  case GgufType::string:
    return "string";
  case GgufType::array:
    return "array";
  case GgufType::u64:
    return "u64";
  case GgufType::i64:
    return "i64";
  case GgufType::f64:
    return "f64";
  }
  return "?";
}

bool GgufValue::is_integer() const noexcept {
  switch (type) {
  case GgufType::u8:
  case GgufType::i8:
  case GgufType::u16:
  case GgufType::i16:
  case GgufType::u32:
  case GgufType::i32:
  case GgufType::u64:
  case GgufType::i64:
    return true;
  default:
    return false;
  }
}

std::optional<int64_t> GgufValue::as_int() const noexcept {
  switch (type) {
  case GgufType::i8:
  case GgufType::i16:
  case GgufType::i32:
  case GgufType::i64:
    return i;
  case GgufType::u8:
  case GgufType::u16:
  case GgufType::u32:
  case GgufType::u64:
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  default:
    return std::nullopt;
  }
}

std::optional<double> GgufValue::as_number() const noexcept {
  if (is_float()) return f;
  if (auto v = as_int()) return static_cast<double>(*v);
  return std::nullopt;
}

std::string GgufValue::to_string(size_t max_items) const {
  switch (type) {
  case GgufType::string:
    return "\"" + gguf_printable(str, 60) + "\"";
  case GgufType::boolean:
    return u ? "true" : "false";
  case GgufType::f32:
  case GgufType::f64: {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", f);
    return buf;
  }
  case GgufType::array: {
    std::string s = "[" + std::string(gguf_type_name(elem_type)) + " × " + std::to_string(items.size()) + "]";
    if (max_items > 0 && !items.empty()) {
      s += " {";
      for (size_t k = 0; k < std::min(max_items, items.size()); ++k)
        s += (k ? ", " : "") + items[k].to_string(0);
      if (items.size() > max_items) s += ", ...";
      s += "}";
    }
    return s;
  }
  default:
    if (type == GgufType::u8 || type == GgufType::u16 || type == GgufType::u32 || type == GgufType::u64)
      return std::to_string(u);
    return std::to_string(i);
  }
}

std::string gguf_printable(std::string_view s, size_t max_bytes) {
  size_t cut = std::min(s.size(), max_bytes);
  while (cut < s.size() && cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80)
    --cut; // not inside a UTF-8 character
  return one_line(s.substr(0, cut)) + (cut < s.size() ? "..." : "");
}

// ---------------------------------------------------------------------------------------------
// GgufArray

GgufArray GgufArray::view_numbers(GgufType type, const uint8_t* data, size_t n) noexcept {
  GgufArray a;
  a.type_ = type;
  a.n_ = n;
  a.view_ = data;
  return a;
}

GgufArray GgufArray::view_strings(std::vector<std::string_view> strings) {
  GgufArray a;
  a.type_ = GgufType::string;
  a.n_ = strings.size();
  a.strs_ = std::move(strings);
  return a;
}

GgufArray GgufArray::of_arrays(std::vector<GgufValue> arrays) {
  GgufArray a;
  a.type_ = GgufType::array;
  a.n_ = arrays.size();
  a.nested_ = std::move(arrays);
  a.owned_ = true; // the GgufValues are the array's own (their elements may still be views)
  return a;
}

const uint8_t* GgufArray::number_bytes(size_t i) const noexcept {
  const uint8_t* base = owned_ ? own_bytes_.data() : view_;
  return base + i * scalar_size(type_);
}

std::string_view GgufArray::str(size_t i) const {
  LOOM_ASSERT(type_ == GgufType::string && i < n_, "GgufArray::str: not a string array or out of range");
  return owned_ ? std::string_view(own_strs_[i]) : strs_[i];
}

const GgufValue& GgufArray::nested(size_t i) const {
  LOOM_ASSERT(type_ == GgufType::array && i < n_,
              "GgufArray::nested: not an array of arrays or out of range");
  return nested_[i];
}

GgufValue GgufArray::operator[](size_t i) const {
  LOOM_ASSERT(i < n_, "GgufArray index out of range");
  if (type_ == GgufType::array) return nested_[i];
  GgufValue v;
  v.type = type_;
  if (type_ == GgufType::string)
    v.str = std::string(str(i));
  else
    decode_scalar(type_, number_bytes(i), v);
  return v;
}

std::optional<int64_t> GgufArray::as_int(size_t i) const noexcept {
  if (i >= n_ || !is_number_or_bool(type_) || type_ == GgufType::boolean) return std::nullopt;
  GgufValue v;
  v.type = type_;
  decode_scalar(type_, number_bytes(i), v);
  return v.as_int();
}

std::optional<double> GgufArray::as_number(size_t i) const noexcept {
  if (i >= n_ || !is_number_or_bool(type_) || type_ == GgufType::boolean) return std::nullopt;
  GgufValue v;
  v.type = type_;
  decode_scalar(type_, number_bytes(i), v);
  return v.as_number();
}

std::optional<bool> GgufArray::as_bool(size_t i) const noexcept {
  if (i >= n_ || type_ != GgufType::boolean) return std::nullopt;
  return *number_bytes(i) != 0;
}

void GgufArray::push_back(const GgufValue& e) {
  if (n_ == 0) {
    *this = GgufArray();
    type_ = e.type;
    owned_ = true;
  } else if (e.type != type_) {
    fail(Errc::invalid_argument, "gguf",
         "cannot append a " + std::string(gguf_type_name(e.type)) + " to an array of " +
             std::string(gguf_type_name(type_)));
  }
  if (!owned_) detach();
  if (type_ == GgufType::string)
    own_strs_.push_back(e.str);
  else if (type_ == GgufType::array)
    nested_.push_back(e);
  else
    put_scalar(own_bytes_, e);
  ++n_;
}

void GgufArray::detach() {
  if (type_ == GgufType::array) {
    for (auto& v : nested_)
      v.items.detach();
  } else if (!owned_) {
    if (type_ == GgufType::string) {
      own_strs_.assign(strs_.begin(), strs_.end());
      strs_ = {};
    } else if (n_ > 0) {
      own_bytes_.assign(view_, view_ + n_ * scalar_size(type_));
    }
    view_ = nullptr;
  }
  owned_ = true;
}

bool GgufArray::is_view() const noexcept {
  if (type_ == GgufType::array)
    return std::any_of(nested_.begin(), nested_.end(), [](const GgufValue& v) { return v.items.is_view(); });
  return !owned_ && n_ > 0;
}

uint64_t GgufArray::heap_bytes() const noexcept {
  uint64_t b = own_bytes_.capacity() + strs_.capacity() * sizeof(std::string_view) +
               own_strs_.capacity() * sizeof(std::string) + nested_.capacity() * sizeof(GgufValue);
  for (const auto& s : own_strs_)
    b += string_heap(s.size());
  for (const auto& v : nested_)
    b += string_heap(v.str.size()) + v.items.heap_bytes();
  return b;
}

struct GgufFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) munmap(addr, size);
  }
};

GgufFile::GgufFile(GgufFile&&) noexcept = default;

GgufFile GgufFile::shared_copy() const {
  GgufFile f;
  f.mapping_ = mapping_;
  f.bytes_ = bytes_;
  f.path_ = path_;
  f.version_ = version_;
  f.alignment_ = alignment_;
  f.data_offset_ = data_offset_;
  f.metadata_bytes_ = metadata_bytes_;
  f.kv_ = kv_;
  f.tensors_ = tensors_;
  f.hf_storage_ = hf_storage_;
  f.hf_bytes_ = hf_bytes_;
  return f;
}
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

namespace {
[[noreturn]] void not_regular(const std::string& shown, mode_t m) {
  fail(Errc::invalid_argument, "gguf",
       "'" + shown + "' is " + file_type_name(m) +
           ": expected a regular GGUF model file; give the path of the .gguf file");
}
} // namespace

GgufFile GgufFile::open(const std::string& path, const GgufLimits& limits) {
  const std::string shown = gguf_printable(path, 400);
  if (const size_t nul = path.find('\0'); nul != std::string::npos)
    fail(Errc::invalid_argument, "gguf",
         "model path '" + shown + "' holds a NUL byte at position " + std::to_string(nul) +
             ": expected a file path without NUL bytes; fix the path");
  // The type first: opening a FIFO would block until a writer appears, a directory cannot be mapped.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    fail(e == ENOENT ? Errc::not_found : Errc::invalid_argument, "gguf",
         "cannot open model file '" + shown + "': " + std::strerror(e) +
             "; check the path (scripts/fetch-models.sh downloads the demo model)");
  }
  if (S_ISDIR(st.st_mode)) return from_hf_dir(path, limits); // a Hugging Face checkpoint
  if (!S_ISREG(st.st_mode)) not_regular(shown, st.st_mode);
  // O_NONBLOCK: should the path be swapped for a FIFO after the stat, open still returns at once.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    fail(e == ENOENT ? Errc::not_found : Errc::invalid_argument, "gguf",
         "cannot open model file '" + shown + "': " + std::strerror(e) +
             "; check the path (scripts/fetch-models.sh downloads the demo model)");
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    not_regular(shown, st.st_mode);
  }
  auto m = std::make_shared<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size > 0) {
    m->addr = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->addr == MAP_FAILED) {
      m->addr = nullptr;
      const int e = errno;
      ::close(fd);
      fail(Errc::out_of_memory, "gguf", "cannot map '" + shown + "': " + std::strerror(e));
    }
  }
  ::close(fd);
  GgufFile f;
  f.mapping_ = m;
  f.bytes_ = std::span<const uint8_t>(static_cast<const uint8_t*>(m->addr), m->size);
  f.path_ = path;
  f.parse_all(limits);
  return f;
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, std::string name, const GgufLimits& limits) {
  GgufFile f;
  f.bytes_ = bytes;
  f.path_ = std::move(name);
  f.parse_all(limits);
  return f;
}

void GgufFile::parse_all(const GgufLimits& limits) {
  const std::string shown = gguf_printable(path_, 400);
  Reader r(bytes_, shown, limits.max_metadata_bytes);
  const auto magic = r.read<uint32_t>("the GGUF magic");
  if (magic != k_magic) {
    std::string found = hex(magic);
    r.error(0, "expected the magic 'GGUF' (0x46554747), found " + found +
                   (magic == 0x67676a74u || magic == 0x67676d66u || magic == 0x67676d6cu
                        ? " (an old GGML/GGJT file: convert it with llama.cpp's convert scripts)"
                        : ""));
  }
  version_ = r.read<uint32_t>("the version");
  if (version_ != 2 && version_ != 3) {
    if (version_ == 1)
      r.error(4, "GGUF version 1 is not supported (expected 2 or 3): re-convert with a current llama.cpp");
    if ((version_ & 0xFFFFu) == 0 && version_ != 0)
      r.error(4, "GGUF version " + std::to_string(version_) +
                     " looks byte-swapped: big-endian files are not supported");
    r.error(4, "expected GGUF version 2 or 3, found " + std::to_string(version_));
  }
  const uint64_t at_counts = r.pos();
  const auto n_tensors = r.read<uint64_t>("the tensor count");
  const auto n_kv = r.read<uint64_t>("the metadata count");
  // Each metadata entry needs ≥ 13 bytes, each tensor info ≥ 32: counts above that are lies.
  if (n_kv > r.remaining() / 13)
    r.error(at_counts + 8, "metadata count " + std::to_string(n_kv) + " cannot fit in the " +
                               std::to_string(r.remaining()) + " bytes left");
  if (n_tensors > r.remaining() / 32)
    r.error(at_counts, "tensor count " + std::to_string(n_tensors) + " cannot fit in the " +
                           std::to_string(r.remaining()) + " bytes left");

  // Keys and names are checked for duplicates as views of the file's bytes.
  r.charge(n_kv * (sizeof(GgufKV) + k_set_entry_bytes), at_counts + 8,
           std::to_string(n_kv) + " metadata entries");
  std::unordered_set<std::string_view> keys;
  keys.reserve(static_cast<size_t>(n_kv));
  kv_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t at = r.pos();
    const std::string_view key = r.read_view("a metadata key");
    if (!keys.insert(key).second) r.error(at, "duplicate metadata key '" + gguf_printable(key) + "'");
    r.charge(string_heap(key.size()), at, "a metadata key");
    GgufKV kv;
    kv.key = std::string(key);
    const uint64_t at_t = r.pos();
    const auto t = r.read<uint32_t>("a metadata value type");
    if (!valid_type(t))
      r.error(at_t, "key '" + gguf_printable(key) + "': unknown value type " + std::to_string(t) +
                        " (expected 0..12)");
    kv.value = r.read_value(static_cast<GgufType>(t), 0, key);
    kv_.push_back(std::move(kv));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (a->type != GgufType::u32 || a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > 65536)
      fail(Errc::parse_error, "gguf",
           shown + ": general.alignment must be a power-of-two u32, found " + a->to_string());
    alignment_ = static_cast<uint32_t>(a->u);
  }

  r.charge(n_tensors * (sizeof(GgufTensor) + k_set_entry_bytes + k_max_dims * sizeof(int64_t)), at_counts,
           std::to_string(n_tensors) + " tensor infos");
  std::unordered_set<std::string_view> names;
  names.reserve(static_cast<size_t>(n_tensors));
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    const uint64_t at = r.pos();
    const std::string_view name = r.read_view("a tensor name");
    if (!names.insert(name).second) r.error(at, "duplicate tensor name '" + gguf_printable(name) + "'");
    r.charge(string_heap(name.size()), at, "a tensor name");
    GgufTensor t;
    t.name = std::string(name);
    const std::string tn = gguf_printable(name);
    const uint64_t at_d = r.pos();
    const auto n_dims = r.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > k_max_dims)
      r.error(at_d, "tensor '" + tn + "': expected 1 to 4 dimensions, found " + std::to_string(n_dims));
    int64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t at_e = r.pos();
      const auto e = r.read<uint64_t>("a tensor dimension");
      if (e == 0 || e > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          static_cast<int64_t>(e) > std::numeric_limits<int64_t>::max() / n_el)
        r.error(at_e, "tensor '" + tn + "': dimension " + std::to_string(d) + " = " + std::to_string(e) +
                          " is zero or makes the element count overflow");
      t.ne.push_back(static_cast<int64_t>(e));
      n_el *= static_cast<int64_t>(e);
    }
    t.n_elements = n_el;
    const uint64_t at_ty = r.pos();
    const auto ty = r.read<uint32_t>("a tensor type");
    const auto tr = dtype_traits(ty);
    if (!tr) r.error(at_ty, "tensor '" + tn + "': unknown tensor type id " + std::to_string(ty));
    t.type = static_cast<DType>(ty);
    if (t.ne[0] % tr->block_size != 0)
      r.error(at_ty, "tensor '" + tn + "': row length " + std::to_string(t.ne[0]) +
                         " is not a multiple of the " + std::string(tr->name) + " block size " +
                         std::to_string(tr->block_size));
    const uint64_t n_blocks = static_cast<uint64_t>(n_el / tr->block_size);
    if (n_blocks > std::numeric_limits<uint64_t>::max() / tr->block_bytes)
      r.error(at_ty, "tensor '" + tn + "': byte size overflows");
    t.n_bytes = n_blocks * tr->block_bytes;
    const uint64_t at_o = r.pos();
    t.offset = r.read<uint64_t>("a tensor offset");
    if (t.offset % alignment_ != 0)
      r.error(at_o, "tensor '" + tn + "': offset " + std::to_string(t.offset) +
                        " is not a multiple of the alignment " + std::to_string(alignment_));
    tensors_.push_back(std::move(t));
  }
  metadata_bytes_ = r.charged();

  // Tensor data starts at the next multiple of the alignment.
  const uint64_t header_end = r.pos();
  data_offset_ = (header_end + alignment_ - 1) / alignment_ * alignment_;
  if (!tensors_.empty() && data_offset_ > bytes_.size())
    r.error(header_end,
            "tensor data would start at byte " + std::to_string(data_offset_) + ", past the end of the file");
  for (auto& t : tensors_) {
    const uint64_t avail = bytes_.size() - data_offset_;
    if (t.offset > avail || t.n_bytes > avail - t.offset)
      fail(Errc::parse_error, "gguf",
           shown + ": tensor '" + gguf_printable(t.name) + "' (" + std::string(dtype_name(t.type)) + ", " +
               std::to_string(t.n_bytes) + " bytes at data offset " + std::to_string(t.offset) +
               ") extends past the end of the file (" + std::to_string(avail) +
               " data bytes); the file is truncated — re-download it");
    t.offset += data_offset_;
    t.data = bytes_.data() + t.offset;
  }

  // No two tensors may share bytes: a write-through of one (or a repacked copy) would change the
  // other, and a converter never lays a file out that way.
  std::vector<const GgufTensor*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const auto& t : tensors_)
    by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const GgufTensor* x, const GgufTensor* y) {
    return x->offset != y->offset ? x->offset < y->offset : x->n_bytes < y->n_bytes;
  });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensor& p = *by_offset[k - 1];
    const GgufTensor& q = *by_offset[k];
    if (q.offset < p.offset + p.n_bytes) {
      const auto range = [this](const GgufTensor& t) {
        return "data bytes " + std::to_string(t.offset - data_offset_) + ".." +
               std::to_string(t.offset - data_offset_ + t.n_bytes);
      };
      fail(Errc::parse_error, "gguf",
           shown + ": tensors '" + gguf_printable(p.name) + "' (" + range(p) + ") and '" +
               gguf_printable(q.name) + "' (" + range(q) +
               ") overlap: expected each tensor in bytes of its own; the file is corrupt — "
               "re-convert it");
    }
  }
}

const GgufValue* GgufFile::find(std::string_view key) const noexcept {
  for (const auto& kv : kv_)
    if (kv.key == key) return &kv.value;
  return nullptr;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const noexcept {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {
[[noreturn]] void type_error(const std::string& path, std::string_view key, const char* expected,
                             const GgufValue& v) {
  fail(Errc::parse_error, "gguf",
       gguf_printable(path, 400) + ": metadata key '" + gguf_printable(key) + "' should be " + expected +
           ", found " + std::string(gguf_type_name(v.type)) + " " + v.to_string(3));
}
[[noreturn]] void missing(const std::string& path, std::string_view key) {
  fail(Errc::not_found, "gguf",
       gguf_printable(path, 400) + ": required metadata key '" + gguf_printable(key) + "' is missing");
}
} // namespace

std::optional<std::string> GgufFile::get_string_opt(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::string) type_error(path_, key, "a string", *v);
  return v->str;
}

std::string GgufFile::get_string(std::string_view key) const {
  auto v = get_string_opt(key);
  if (!v) missing(path_, key);
  return *v;
}

std::optional<int64_t> GgufFile::get_int_opt(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  auto i = v->as_int();
  if (!i) type_error(path_, key, "an integer", *v);
  return i;
}

int64_t GgufFile::get_int(std::string_view key) const {
  auto v = get_int_opt(key);
  if (!v) missing(path_, key);
  return *v;
}

std::optional<double> GgufFile::get_float_opt(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  auto d = v->as_number();
  if (!d) type_error(path_, key, "a number", *v);
  return d;
}

double GgufFile::get_float(std::string_view key) const {
  auto v = get_float_opt(key);
  if (!v) missing(path_, key);
  return *v;
}

std::optional<bool> GgufFile::get_bool_opt(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufType::boolean) type_error(path_, key, "a bool", *v);
  return v->u != 0;
}

const GgufValue* GgufFile::get_array(std::string_view key, GgufType elem) const {
  const GgufValue* v = find(key);
  if (!v) return nullptr;
  if (v->type != GgufType::array || v->elem_type != elem)
    type_error(path_, key, (std::string("an array of ") + std::string(gguf_type_name(elem))).c_str(), *v);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Writer

void GgufWriter::add(std::string key, GgufValue value) {
  if (value.type == GgufType::array && !value.items.empty() && value.items.elem_type() != value.elem_type)
    fail(Errc::invalid_argument, "gguf",
         "key '" + gguf_printable(key) + "': array declared of " +
             std::string(gguf_type_name(value.elem_type)) + " holds " +
             std::string(gguf_type_name(value.items.elem_type())) + " elements");
  value.items.detach();
  kv_.push_back({std::move(key), std::move(value)});
}
void GgufWriter::add_string(std::string key, std::string v) {
  GgufValue g;
  g.type = GgufType::string;
  g.str = std::move(v);
  add(std::move(key), std::move(g));
}
void GgufWriter::add_u32(std::string key, uint32_t v) {
  GgufValue g;
  g.type = GgufType::u32;
  g.u = v;
  add(std::move(key), std::move(g));
}
void GgufWriter::add_i32(std::string key, int32_t v) {
  GgufValue g;
  g.type = GgufType::i32;
  g.i = v;
  add(std::move(key), std::move(g));
}
void GgufWriter::add_f32(std::string key, float v) {
  GgufValue g;
  g.type = GgufType::f32;
  g.f = static_cast<double>(v);
  add(std::move(key), std::move(g));
}
void GgufWriter::add_bool(std::string key, bool v) {
  GgufValue g;
  g.type = GgufType::boolean;
  g.u = v ? 1 : 0;
  add(std::move(key), std::move(g));
}
void GgufWriter::add_string_array(std::string key, const std::vector<std::string>& v) {
  GgufValue g;
  g.type = GgufType::array;
  g.elem_type = GgufType::string;
  for (const auto& s : v) {
    GgufValue e;
    e.type = GgufType::string;
    e.str = s;
    g.items.push_back(std::move(e));
  }
  add(std::move(key), std::move(g));
}
void GgufWriter::add_tensor(std::string name, DType type, std::vector<int64_t> ne,
                            std::vector<uint8_t> data) {
  tensors_.push_back({std::move(name), type, std::move(ne), std::move(data)});
}

namespace {
void put_str(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}
void put_value(std::vector<uint8_t>& out, const GgufValue& v) {
  switch (v.type) {
  case GgufType::string:
    put_str(out, v.str);
    break;
  case GgufType::array: {
    const GgufArray& a = v.items;
    put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
    put<uint64_t>(out, a.size());
    for (size_t k = 0; k < a.size(); ++k) {
      if (v.elem_type == GgufType::string)
        put_str(out, a.str(k));
      else if (v.elem_type == GgufType::array)
        put_value(out, a.nested(k));
      else
        put_scalar(out, a[k]);
    }
    break;
  }
  default:
    put_scalar(out, v);
    break;
  }
}
} // namespace

namespace {
// Magic, version, counts, metadata and tensor infos (offsets from the aligned sizes), padded to the
// alignment: everything before the first tensor's bytes.
std::vector<uint8_t> gguf_header(const std::vector<GgufKV>& kvs,
                                 const std::vector<GgufWriter::TensorSpec>& tensors,
                                 const std::vector<uint64_t>& sizes, uint32_t alignment) {
  std::vector<uint8_t> out;
  put<uint32_t>(out, k_magic);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors.size());
  put<uint64_t>(out, kvs.size());
  for (const auto& kv : kvs) {
    put_str(out, kv.key);
    put<uint32_t>(out, static_cast<uint32_t>(kv.value.type));
    put_value(out, kv.value);
  }
  uint64_t off = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    put_str(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    for (auto e : t.ne)
      put<uint64_t>(out, static_cast<uint64_t>(e));
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, off);
    off += (sizes[i] + alignment - 1) / alignment * alignment;
  }
  out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
  return out;
}
} // namespace

std::vector<uint8_t> GgufWriter::serialize(uint32_t alignment) const {
  std::vector<TensorSpec> specs;
  std::vector<uint64_t> sizes;
  for (const auto& t : tensors_) {
    specs.push_back({t.name, t.type, t.ne});
    sizes.push_back(t.data.size());
  }
  std::vector<uint8_t> out = gguf_header(kv_, specs, sizes, alignment);
  for (const auto& t : tensors_) {
    out.insert(out.end(), t.data.begin(), t.data.end());
    out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
  }
  return out;
}

void GgufWriter::write_streaming(const std::string& path, const std::vector<TensorSpec>& tensors,
                                 const std::function<void(size_t, std::vector<uint8_t>&)>& fill,
                                 uint32_t alignment) const {
  std::vector<uint64_t> sizes;
  for (const auto& t : tensors) {
    int64_t rows = 1;
    for (size_t k = 1; k < t.ne.size(); ++k)
      rows *= t.ne[k];
    sizes.push_back(row_bytes(t.type, t.ne[0]) * static_cast<uint64_t>(rows));
  }
  const std::vector<uint8_t> out = gguf_header(kv_, tensors, sizes, alignment);
  std::ofstream f(path, std::ios::binary);
  if (!f) fail(Errc::invalid_argument, "gguf", "cannot write '" + path + "': " + std::strerror(errno));
  f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  std::vector<uint8_t> buf;
  const std::vector<char> pad(alignment, 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    buf.clear();
    fill(i, buf);
    LOOM_ASSERT(buf.size() == sizes[i], "tensor bytes differ from the declared shape");
    f.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    const size_t rem = buf.size() % alignment;
    if (rem) f.write(pad.data(), static_cast<std::streamsize>(alignment - rem));
  }
  if (!f) fail(Errc::invalid_argument, "gguf", "writing '" + path + "' failed: " + std::strerror(errno));
}

void GgufWriter::write(const std::string& path, uint32_t alignment) const {
  const auto bytes = serialize(alignment);
  std::ofstream f(path, std::ios::binary);
  if (!f) fail(Errc::invalid_argument, "gguf", "cannot write '" + path + "': " + std::strerror(errno));
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) fail(Errc::invalid_argument, "gguf", "writing '" + path + "' failed: " + std::strerror(errno));
}

} // namespace loom
