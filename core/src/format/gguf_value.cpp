// format/gguf_value.cpp — GGUF metadata values and arrays (loom/format/gguf.hpp): GgufValue's conversions
// and one-line text, GgufArray's views of a file's bytes and owned elements.
#include "format/gguf_encoding.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace loom {

using namespace gguf_encoding;

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

} // namespace loom
