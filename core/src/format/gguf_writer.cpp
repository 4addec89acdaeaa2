// format/gguf_writer.cpp — GgufWriter (loom/format/gguf.hpp): GGUF v3 files from metadata and tensors, whole
// or streamed one tensor at a time.
#include "format/gguf_encoding.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>

namespace loom {

using namespace gguf_encoding;

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
