// loom/dtype.hpp — element types of tensors (GGML numbering, as GGUF stores them) and conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace loom {

// Values are GGML's type ids (ggml.h `enum ggml_type`), so a GGUF tensor type maps 1:1.
enum class DType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  bf16 = 30,
};

struct DTypeTraits {
  std::string_view name;
  int64_t block_size;  // elements per block (1 for plain types)
  size_t block_bytes;  // bytes per block
  bool can_dequantize; // loom can convert it to f32
};

// nullopt for an id GGML does not define (or that Loom does not know the size of).
std::optional<DTypeTraits> dtype_traits(uint32_t id) noexcept;
DTypeTraits dtype_traits(DType t) noexcept;
std::string_view dtype_name(DType t) noexcept;
std::optional<DType> dtype_from_name(std::string_view name) noexcept; // "f32", "q4_0", ... (case-insensitive)

// Bytes of one row of n elements; n must be a multiple of the block size (checked by callers).
size_t row_bytes(DType t, int64_t n) noexcept;

float fp16_to_fp32(uint16_t h) noexcept;
uint16_t fp32_to_fp16(float f) noexcept;
inline float bf16_to_fp32(uint16_t h) noexcept {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t fp32_to_bf16(float f) noexcept; // round to nearest even, NaN kept

// Converts n elements (a multiple of the block size) of type t at src into f32. Throws
// loom::Error(unsupported) for a type that cannot be dequantized.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// Quantizes n floats (a multiple of the block size) into type t (f32, f16, bf16, q8_0, q4_0).
void quantize_row(DType t, const float* src, void* dst, int64_t n);

} // namespace loom
