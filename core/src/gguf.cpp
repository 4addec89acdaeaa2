#include "loom/gguf.hpp"

#include "loom/error.hpp"

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

class Reader {
public:
  Reader(std::span<const uint8_t> b, const std::string& name) : b_(b), name_(name) {}

  [[noreturn]] void error(uint64_t at, const std::string& what) const {
    fail(Errc::parse_error, "gguf",
         name_ + ": " + what + " (at byte offset " + std::to_string(at) + " of " + std::to_string(b_.size()) +
             "); the file is truncated or not a valid GGUF file — re-download or re-convert it");
  }

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return b_.size() - pos_; }

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

  std::string read_string(const char* what) {
    const uint64_t at = pos_;
    const auto len = read<uint64_t>(what);
    if (len > remaining())
      error(at, std::string(what) + ": string length " + std::to_string(len) + " exceeds the " +
                    std::to_string(remaining()) + " bytes left");
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

  GgufValue read_value(GgufType t, int depth, const std::string& key) {
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
      if (b > 1) error(at, "key '" + key + "': bool value must be 0 or 1, found " + std::to_string(b));
      v.u = b;
      break;
    }
    case GgufType::string:
      v.str = read_string("string value");
      break;
    case GgufType::array: {
      if (depth >= k_max_depth)
        error(pos_, "key '" + key + "': arrays nested deeper than " + std::to_string(k_max_depth));
      const uint64_t at = pos_;
      const auto et = read<uint32_t>("array element type");
      if (!valid_type(et)) error(at, "key '" + key + "': unknown array element type " + std::to_string(et));
      v.elem_type = static_cast<GgufType>(et);
      const uint64_t at_n = pos_;
      const auto n = read<uint64_t>("array length");
      const uint64_t min_bytes = scalar_size(v.elem_type);
      if (n > remaining() / min_bytes)
        error(at_n, "key '" + key + "': array of " + std::to_string(n) + " " +
                        std::string(gguf_type_name(v.elem_type)) + " needs at least " + std::to_string(n) +
                        "×" + std::to_string(min_bytes) + " bytes, only " + std::to_string(remaining()) +
                        " left");
      v.items.reserve(static_cast<size_t>(n));
      for (uint64_t k = 0; k < n; ++k)
        v.items.push_back(read_value(v.elem_type, depth + 1, key));
      break;
    }
    }
    return v;
  }

private:
  std::span<const uint8_t> b_;
  const std::string& name_;
  uint64_t pos_ = 0;
};

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
  case GgufType::string: {
    std::string s = str.size() > 60 ? str.substr(0, 57) + "..." : str;
    return "\"" + s + "\"";
  }
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

struct GgufFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr) munmap(addr, size);
  }
};

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    fail(errno == ENOENT ? Errc::not_found : Errc::invalid_argument, "gguf",
         "cannot open model file '" + path + "': " + std::strerror(errno) +
             "; check the path (scripts/fetch-models.sh downloads the demo model)");
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(Errc::invalid_argument, "gguf", "'" + path + "' is not a regular file; expected a .gguf model file");
  }
  auto m = std::make_shared<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size > 0) {
    m->addr = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->addr == MAP_FAILED) {
      m->addr = nullptr;
      const int e = errno;
      ::close(fd);
      fail(Errc::out_of_memory, "gguf", "cannot map '" + path + "': " + std::strerror(e));
    }
  }
  ::close(fd);
  GgufFile f;
  f.mapping_ = m;
  f.bytes_ = std::span<const uint8_t>(static_cast<const uint8_t*>(m->addr), m->size);
  f.path_ = path;
  f.parse_all();
  return f;
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, std::string name) {
  GgufFile f;
  f.bytes_ = bytes;
  f.path_ = std::move(name);
  f.parse_all();
  return f;
}

void GgufFile::parse_all() {
  Reader r(bytes_, path_);
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

  std::unordered_set<std::string> keys;
  kv_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t at = r.pos();
    GgufKV kv;
    kv.key = r.read_string("a metadata key");
    if (!keys.insert(kv.key).second) r.error(at, "duplicate metadata key '" + kv.key + "'");
    const uint64_t at_t = r.pos();
    const auto t = r.read<uint32_t>("a metadata value type");
    if (!valid_type(t))
      r.error(at_t, "key '" + kv.key + "': unknown value type " + std::to_string(t) + " (expected 0..12)");
    kv.value = r.read_value(static_cast<GgufType>(t), 0, kv.key);
    kv_.push_back(std::move(kv));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (a->type != GgufType::u32 || a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > 65536)
      fail(Errc::parse_error, "gguf",
           path_ + ": general.alignment must be a power-of-two u32, found " + a->to_string());
    alignment_ = static_cast<uint32_t>(a->u);
  }

  std::unordered_set<std::string> names;
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    const uint64_t at = r.pos();
    GgufTensor t;
    t.name = r.read_string("a tensor name");
    if (!names.insert(t.name).second) r.error(at, "duplicate tensor name '" + t.name + "'");
    const uint64_t at_d = r.pos();
    const auto n_dims = r.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > k_max_dims)
      r.error(at_d, "tensor '" + t.name + "': expected 1 to 4 dimensions, found " + std::to_string(n_dims));
    int64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t at_e = r.pos();
      const auto e = r.read<uint64_t>("a tensor dimension");
      if (e == 0 || e > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          static_cast<int64_t>(e) > std::numeric_limits<int64_t>::max() / n_el)
        r.error(at_e, "tensor '" + t.name + "': dimension " + std::to_string(d) + " = " + std::to_string(e) +
                          " is zero or makes the element count overflow");
      t.ne.push_back(static_cast<int64_t>(e));
      n_el *= static_cast<int64_t>(e);
    }
    t.n_elements = n_el;
    const uint64_t at_ty = r.pos();
    const auto ty = r.read<uint32_t>("a tensor type");
    const auto tr = dtype_traits(ty);
    if (!tr) r.error(at_ty, "tensor '" + t.name + "': unknown tensor type id " + std::to_string(ty));
    t.type = static_cast<DType>(ty);
    if (t.ne[0] % tr->block_size != 0)
      r.error(at_ty, "tensor '" + t.name + "': row length " + std::to_string(t.ne[0]) +
                         " is not a multiple of the " + std::string(tr->name) + " block size " +
                         std::to_string(tr->block_size));
    const uint64_t n_blocks = static_cast<uint64_t>(n_el / tr->block_size);
    if (n_blocks > std::numeric_limits<uint64_t>::max() / tr->block_bytes)
      r.error(at_ty, "tensor '" + t.name + "': byte size overflows");
    t.n_bytes = n_blocks * tr->block_bytes;
    const uint64_t at_o = r.pos();
    t.offset = r.read<uint64_t>("a tensor offset");
    if (t.offset % alignment_ != 0)
      r.error(at_o, "tensor '" + t.name + "': offset " + std::to_string(t.offset) +
                        " is not a multiple of the alignment " + std::to_string(alignment_));
    tensors_.push_back(std::move(t));
  }

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
           path_ + ": tensor '" + t.name + "' (" + std::string(dtype_name(t.type)) + ", " +
               std::to_string(t.n_bytes) + " bytes at data offset " + std::to_string(t.offset) +
               ") extends past the end of the file (" + std::to_string(avail) +
               " data bytes); the file is truncated — re-download it");
    t.offset += data_offset_;
    t.data = bytes_.data() + t.offset;
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
       path + ": metadata key '" + std::string(key) + "' should be " + expected + ", found " +
           std::string(gguf_type_name(v.type)) + " " + v.to_string(3));
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
  if (!v)
    fail(Errc::not_found, "gguf", path_ + ": required metadata key '" + std::string(key) + "' is missing");
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
  if (!v)
    fail(Errc::not_found, "gguf", path_ + ": required metadata key '" + std::string(key) + "' is missing");
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
  if (!v)
    fail(Errc::not_found, "gguf", path_ + ": required metadata key '" + std::string(key) + "' is missing");
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
template <class T> void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}
void put_str(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}
void put_value(std::vector<uint8_t>& out, const GgufValue& v) {
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
    put_str(out, v.str);
    break;
  case GgufType::array:
    put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
    put<uint64_t>(out, v.items.size());
    for (const auto& e : v.items)
      put_value(out, e);
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
