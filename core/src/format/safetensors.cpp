// format/safetensors.cpp — the header of a safetensors file, checked against the file's bytes
// (parse_safetensors, loom/format/hf_checkpoint.hpp).
#include "format/hf_json.hpp"
#include "loom/format/gguf.hpp"
#include "loom/format/hf_checkpoint.hpp"

#include <algorithm>
#include <limits>

namespace loom {

namespace {

using hf::as_int;
using hf::describe;
using hf::json;
using hf::member;

constexpr uint32_t k_max_dims = 4;

struct StDtype {
  std::string_view name;
  size_t size;
  std::optional<DType> type; // what Loom computes with
};
constexpr StDtype k_st_dtypes[] = {
    {"F32", 4, DType::f32},      {"F16", 2, DType::f16},       {"BF16", 2, DType::bf16},
    {"F64", 8, std::nullopt},    {"I64", 8, std::nullopt},     {"I32", 4, std::nullopt},
    {"I16", 2, std::nullopt},    {"I8", 1, std::nullopt},      {"U64", 8, std::nullopt},
    {"U32", 4, std::nullopt},    {"U16", 2, std::nullopt},     {"U8", 1, std::nullopt},
    {"BOOL", 1, std::nullopt},   {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
    {"F8_E8M0", 1, std::nullopt}};

const StDtype* find_dtype(std::string_view name) {
  for (const auto& d : k_st_dtypes)
    if (d.name == name) return &d;
  return nullptr;
}

// The 8-byte little-endian header length, checked against the limit and the file.
uint64_t header_length(std::span<const uint8_t> file, const std::string& shown) {
  if (file.size() < 8)
    hf::bad(shown, "the file has " + std::to_string(file.size()) +
                       " bytes, fewer than the 8-byte header length of a safetensors file; it is truncated — "
                       "re-download it");
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k)
    n = n << 8 | file[static_cast<size_t>(k)];
  if (n > k_safetensors_max_header)
    hf::bad(shown, "header length " + std::to_string(n) + " is over the limit of " +
                       mib(k_safetensors_max_header) + ": not a safetensors file, or a corrupt one");
  if (n > file.size() - 8)
    hf::bad(shown, "header length " + std::to_string(n) + " runs past the end of the file (" +
                       std::to_string(file.size()) + " bytes): the file is truncated — re-download it");
  return n;
}

// A tensor's dtype and shape (`tn`: the tensor as messages name it); the dtype's element size.
const StDtype& read_dtype_and_shape(const json& v, SafetensorsTensor& t, const std::string& tn,
                                    const std::string& shown) {
  const json* dt = member(v, "dtype");
  if (!dt || !dt->is_string())
    hf::bad(shown,
            tn + ": 'dtype' should be a string such as \"F32\", found " + (dt ? describe(*dt) : "nothing"));
  t.dtype = dt->get<std::string>();
  const StDtype* d = find_dtype(t.dtype);
  if (!d)
    hf::bad(shown,
            tn + ": unknown dtype '" + gguf_printable(t.dtype) +
                "' (expected F32, F16, BF16, F64, I64, I32, I16, I8, U64, U32, U16, U8, BOOL or F8_*)");
  t.type = d->type;
  const json* sh = member(v, "shape");
  if (!sh || !sh->is_array())
    hf::bad(shown,
            tn + ": 'shape' should be a list of dimensions, found " + (sh ? describe(*sh) : "nothing"));
  if (sh->size() > k_max_dims)
    hf::bad(shown, tn + ": " + std::to_string(sh->size()) + " dimensions, more than the " +
                       std::to_string(k_max_dims) + " Loom supports");
  int64_t n_el = 1;
  for (const auto& e : *sh) {
    const auto x = as_int(e);
    if (!x || *x < 0) hf::bad(shown, tn + ": dimension " + describe(e) + " should be a non-negative integer");
    if (*x > 0 && n_el > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(d->size) / *x)
      hf::bad(shown, tn + ": shape " + describe(*sh) + " makes the byte size overflow");
    t.shape.push_back(*x);
    n_el *= *x;
  }
  t.n_elements = n_el;
  return *d;
}

// A tensor's data_offsets: a range of the data section that holds exactly its elements.
void read_data_offsets(const json& v, SafetensorsTensor& t, size_t el_size, uint64_t data_size,
                       const std::string& tn, const std::string& shown) {
  const json* off = member(v, "data_offsets");
  if (!off || !off->is_array() || off->size() != 2 || !as_int((*off)[0]) || !as_int((*off)[1]))
    hf::bad(shown,
            tn + ": 'data_offsets' should be [begin, end], found " + (off ? describe(*off) : "nothing"));
  const auto b = *as_int((*off)[0]), e = *as_int((*off)[1]);
  if (b < 0 || e < b || static_cast<uint64_t>(e) > data_size)
    hf::bad(shown, tn + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                       "] are not a range within the " + std::to_string(data_size) +
                       " data bytes: the file is truncated or corrupt — re-download it");
  t.begin = static_cast<uint64_t>(b);
  t.end = static_cast<uint64_t>(e);
  const uint64_t want = static_cast<uint64_t>(t.n_elements) * el_size;
  if (t.end - t.begin != want)
    hf::bad(shown, tn + ": shape " + hf::shape_str(t.shape) + " of " + t.dtype + " needs " +
                       std::to_string(want) + " bytes but data_offsets span " +
                       std::to_string(t.end - t.begin) + ": the header is corrupt");
}

// One entry of the header: {"dtype": …, "shape": […], "data_offsets": [begin, end]}.
SafetensorsTensor read_tensor(const std::string& key, const json& v, std::span<const uint8_t> data,
                              const std::string& shown) {
  const std::string tn = "tensor '" + gguf_printable(key) + "'";
  if (!v.is_object())
    hf::bad(shown, tn + " should be an object with dtype, shape and data_offsets, found " + describe(v));
  SafetensorsTensor t;
  t.name = key;
  const StDtype& d = read_dtype_and_shape(v, t, tn, shown);
  read_data_offsets(v, t, d.size, data.size(), tn, shown);
  t.data = data.data() + t.begin;
  return t;
}

// No two tensors may share bytes.
void check_no_overlap(const std::vector<SafetensorsTensor>& tensors, const std::string& shown) {
  std::vector<const SafetensorsTensor*> by_off;
  for (const auto& t : tensors)
    if (t.end > t.begin) by_off.push_back(&t);
  std::sort(by_off.begin(), by_off.end(),
            [](const SafetensorsTensor* x, const SafetensorsTensor* y) { return x->begin < y->begin; });
  for (size_t k = 1; k < by_off.size(); ++k)
    if (by_off[k]->begin < by_off[k - 1]->end)
      hf::bad(shown, "tensors '" + gguf_printable(by_off[k - 1]->name) + "' (data bytes " +
                         std::to_string(by_off[k - 1]->begin) + ".." + std::to_string(by_off[k - 1]->end) +
                         ") and '" + gguf_printable(by_off[k]->name) + "' (" +
                         std::to_string(by_off[k]->begin) + ".." + std::to_string(by_off[k]->end) +
                         ") overlap: expected each tensor in bytes of its own; the file is corrupt");
}

SafetensorsHeader parse_header(std::span<const uint8_t> file, const std::string& name) {
  const std::string shown = gguf_printable(name, 400);
  const uint64_t n = header_length(file, shown);
  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), static_cast<size_t>(n));
  const json j = hf::parse_json(text, shown + " (header)", true);
  if (!j.is_object()) hf::bad(shown, "the header should be a JSON object of tensors, found " + describe(j));
  const std::span<const uint8_t> data = file.subspan(static_cast<size_t>(h.data_offset));
  for (const auto& [key, v] : j.items()) {
    if (key == "__metadata__") {
      if (!v.is_object())
        hf::bad(shown, "'__metadata__' should be an object of strings, found " + describe(v));
      continue;
    }
    h.tensors.push_back(read_tensor(key, v, data, shown));
  }
  check_no_overlap(h.tensors, shown);
  return h;
}

} // namespace

SafetensorsHeader parse_safetensors(std::span<const uint8_t> file, const std::string& name) {
  try {
    return parse_header(file, name);
  } catch (const json::exception& e) { // the reads check types before they convert: a net under them
    hf::bad(gguf_printable(name, 400), "unexpected header content (" + gguf_printable(e.what(), 160) + ")");
  }
}

} // namespace loom
