// format/gguf.cpp — GGUF v2/v3 model files read as untrusted input (GgufFile, loom/format/gguf.hpp).
//
// Every count, offset, size and string length is checked against the bytes that are actually there
// before it is used, and every allocation is charged against GgufLimits first; a bad file is a
// loom::Error(parse_error) naming the file, what is wrong and the byte offset.
#include "loom/format/gguf.hpp"

#include "format/file_type.hpp"
#include "format/gguf_encoding.hpp"
#include "format/mapped_file.hpp"
#include "loom/error.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_set>

namespace loom {

namespace {

using namespace gguf_encoding;

constexpr int k_max_depth = 4;     // nested arrays deeper than this are refused
constexpr uint32_t k_max_dims = 4; // GGML_MAX_DIMS

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// Host memory a hash-set node of the duplicate checks takes (an estimate, as string_heap).
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

// ---- the steps of a parse -------------------------------------------------------------------------

// The magic and the version (2 or 3).
uint32_t read_magic_and_version(Reader& r) {
  const auto magic = r.read<uint32_t>("the GGUF magic");
  if (magic != k_magic) {
    std::string found = hex(magic);
    r.error(0, "expected the magic 'GGUF' (0x46554747), found " + found +
                   (magic == 0x67676a74u || magic == 0x67676d66u || magic == 0x67676d6cu
                        ? " (an old GGML/GGJT file: convert it with llama.cpp's convert scripts)"
                        : ""));
  }
  const auto version = r.read<uint32_t>("the version");
  if (version != 2 && version != 3) {
    if (version == 1)
      r.error(4, "GGUF version 1 is not supported (expected 2 or 3): re-convert with a current llama.cpp");
    if ((version & 0xFFFFu) == 0 && version != 0)
      r.error(4, "GGUF version " + std::to_string(version) +
                     " looks byte-swapped: big-endian files are not supported");
    r.error(4, "expected GGUF version 2 or 3, found " + std::to_string(version));
  }
  return version;
}

struct Counts {
  uint64_t at = 0; // byte offset of the tensor count (the metadata count follows)
  uint64_t n_tensors = 0, n_kv = 0;
};

// The tensor and metadata counts. Each metadata entry needs ≥ 13 bytes, each tensor info ≥ 32:
// counts above that are lies.
Counts read_counts(Reader& r) {
  Counts c;
  c.at = r.pos();
  c.n_tensors = r.read<uint64_t>("the tensor count");
  c.n_kv = r.read<uint64_t>("the metadata count");
  if (c.n_kv > r.remaining() / 13)
    r.error(c.at + 8, "metadata count " + std::to_string(c.n_kv) + " cannot fit in the " +
                          std::to_string(r.remaining()) + " bytes left");
  if (c.n_tensors > r.remaining() / 32)
    r.error(c.at, "tensor count " + std::to_string(c.n_tensors) + " cannot fit in the " +
                      std::to_string(r.remaining()) + " bytes left");
  return c;
}

// The metadata entries: unique keys (checked as views of the file's bytes), known value types.
std::vector<GgufKV> read_metadata(Reader& r, const Counts& c) {
  r.charge(c.n_kv * (sizeof(GgufKV) + k_set_entry_bytes), c.at + 8,
           std::to_string(c.n_kv) + " metadata entries");
  std::unordered_set<std::string_view> keys;
  keys.reserve(static_cast<size_t>(c.n_kv));
  std::vector<GgufKV> kvs;
  kvs.reserve(static_cast<size_t>(c.n_kv));
  for (uint64_t k = 0; k < c.n_kv; ++k) {
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
    kvs.push_back(std::move(kv));
  }
  return kvs;
}

// general.alignment: a power-of-two u32 up to 65536.
uint32_t checked_alignment(const GgufValue& a, const std::string& shown) {
  if (a.type != GgufType::u32 || a.u == 0 || (a.u & (a.u - 1)) != 0 || a.u > 65536)
    fail(Errc::parse_error, "gguf",
         shown + ": general.alignment must be a power-of-two u32, found " + a.to_string());
  return static_cast<uint32_t>(a.u);
}

// A tensor's dimensions (1 to 4, none zero) and element count, without overflow.
void read_dims(Reader& r, GgufTensor& t, const std::string& tn) {
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
}

// A tensor's type (known, its block dividing the rows) and byte size.
void read_type(Reader& r, GgufTensor& t, const std::string& tn) {
  const uint64_t at_ty = r.pos();
  const auto ty = r.read<uint32_t>("a tensor type");
  const auto tr = dtype_traits(ty);
  if (!tr) r.error(at_ty, "tensor '" + tn + "': unknown tensor type id " + std::to_string(ty));
  t.type = static_cast<DType>(ty);
  if (t.ne[0] % tr->block_size != 0)
    r.error(at_ty, "tensor '" + tn + "': row length " + std::to_string(t.ne[0]) +
                       " is not a multiple of the " + std::string(tr->name) + " block size " +
                       std::to_string(tr->block_size));
  const uint64_t n_blocks = static_cast<uint64_t>(t.n_elements / tr->block_size);
  if (n_blocks > std::numeric_limits<uint64_t>::max() / tr->block_bytes)
    r.error(at_ty, "tensor '" + tn + "': byte size overflows");
  t.n_bytes = n_blocks * tr->block_bytes;
}

// The tensor infos: unique names, shapes, types and offsets (within the data section, aligned).
std::vector<GgufTensor> read_tensor_infos(Reader& r, const Counts& c, uint32_t alignment) {
  r.charge(c.n_tensors * (sizeof(GgufTensor) + k_set_entry_bytes + k_max_dims * sizeof(int64_t)), c.at,
           std::to_string(c.n_tensors) + " tensor infos");
  std::unordered_set<std::string_view> names;
  names.reserve(static_cast<size_t>(c.n_tensors));
  std::vector<GgufTensor> tensors;
  tensors.reserve(static_cast<size_t>(c.n_tensors));
  for (uint64_t k = 0; k < c.n_tensors; ++k) {
    const uint64_t at = r.pos();
    const std::string_view name = r.read_view("a tensor name");
    if (!names.insert(name).second) r.error(at, "duplicate tensor name '" + gguf_printable(name) + "'");
    r.charge(string_heap(name.size()), at, "a tensor name");
    GgufTensor t;
    t.name = std::string(name);
    const std::string tn = gguf_printable(name);
    read_dims(r, t, tn);
    read_type(r, t, tn);
    const uint64_t at_o = r.pos();
    t.offset = r.read<uint64_t>("a tensor offset");
    if (t.offset % alignment != 0)
      r.error(at_o, "tensor '" + tn + "': offset " + std::to_string(t.offset) +
                        " is not a multiple of the alignment " + std::to_string(alignment));
    tensors.push_back(std::move(t));
  }
  return tensors;
}

// Each tensor's bytes within the file: its offset made absolute, its data pointing into `bytes`.
void place_tensor_data(std::vector<GgufTensor>& tensors, std::span<const uint8_t> bytes, uint64_t data_offset,
                       const std::string& shown) {
  for (auto& t : tensors) {
    const uint64_t avail = bytes.size() - data_offset;
    if (t.offset > avail || t.n_bytes > avail - t.offset)
      fail(Errc::parse_error, "gguf",
           shown + ": tensor '" + gguf_printable(t.name) + "' (" + std::string(dtype_name(t.type)) + ", " +
               std::to_string(t.n_bytes) + " bytes at data offset " + std::to_string(t.offset) +
               ") extends past the end of the file (" + std::to_string(avail) +
               " data bytes); the file is truncated — re-download it");
    t.offset += data_offset;
    t.data = bytes.data() + t.offset;
  }
}

// No two tensors may share bytes: a write-through of one (or a repacked copy) would change the
// other, and a converter never lays a file out that way.
void check_no_overlap(const std::vector<GgufTensor>& tensors, uint64_t data_offset,
                      const std::string& shown) {
  std::vector<const GgufTensor*> by_offset;
  by_offset.reserve(tensors.size());
  for (const auto& t : tensors)
    by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const GgufTensor* x, const GgufTensor* y) {
    return x->offset != y->offset ? x->offset < y->offset : x->n_bytes < y->n_bytes;
  });
  const auto range = [data_offset](const GgufTensor& t) {
    return "data bytes " + std::to_string(t.offset - data_offset) + ".." +
           std::to_string(t.offset - data_offset + t.n_bytes);
  };
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensor& p = *by_offset[k - 1];
    const GgufTensor& q = *by_offset[k];
    if (q.offset < p.offset + p.n_bytes)
      fail(Errc::parse_error, "gguf",
           shown + ": tensors '" + gguf_printable(p.name) + "' (" + range(p) + ") and '" +
               gguf_printable(q.name) + "' (" + range(q) +
               ") overlap: expected each tensor in bytes of its own; the file is corrupt — re-convert it");
  }
}

} // namespace

// The file's mapping, shared by a GgufFile and its shared_copy()s.
struct GgufFile::Mapping : MappedFile {};

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
[[noreturn]] void cannot_open(const std::string& shown, int e) {
  fail(e == ENOENT ? Errc::not_found : Errc::invalid_argument, "gguf",
       "cannot open model file '" + shown + "': " + std::strerror(e) +
           "; check the path (scripts/fetch-models.sh downloads the demo model)");
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
  if (::stat(path.c_str(), &st) != 0) cannot_open(shown, errno);
  if (S_ISDIR(st.st_mode)) return from_hf_dir(path, limits); // a Hugging Face checkpoint
  if (!S_ISREG(st.st_mode)) not_regular(shown, st.st_mode);
  // O_NONBLOCK: should the path be swapped for a FIFO after the stat, open still returns at once.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) cannot_open(shown, errno);
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    not_regular(shown, st.st_mode);
  }
  auto m = std::make_shared<Mapping>();
  if (const int e = m->map(fd, static_cast<size_t>(st.st_size)); e != 0) {
    ::close(fd);
    fail(Errc::out_of_memory, "gguf", "cannot map '" + shown + "': " + std::strerror(e));
  }
  ::close(fd);
  GgufFile f;
  f.mapping_ = m;
  f.bytes_ = m->bytes();
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
  version_ = read_magic_and_version(r);
  const Counts counts = read_counts(r);
  kv_ = read_metadata(r, counts);
  if (const GgufValue* a = find("general.alignment")) alignment_ = checked_alignment(*a, shown);
  tensors_ = read_tensor_infos(r, counts, alignment_);
  metadata_bytes_ = r.charged();

  // Tensor data starts at the next multiple of the alignment.
  const uint64_t header_end = r.pos();
  data_offset_ = (header_end + alignment_ - 1) / alignment_ * alignment_;
  if (!tensors_.empty() && data_offset_ > bytes_.size())
    r.error(header_end,
            "tensor data would start at byte " + std::to_string(data_offset_) + ", past the end of the file");
  place_tensor_data(tensors_, bytes_, data_offset_, shown);
  check_no_overlap(tensors_, data_offset_, shown);
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

} // namespace loom
