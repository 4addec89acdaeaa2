// format/gguf_file_type.hpp — general.file_type as llama.cpp writes it (private header): `loom synth`
// and `loom quantize` label their files the way llama-quantize does.
#pragma once

#include "loom/sdk/dtype.hpp"

#include <cstdint>

namespace loom {

// llama.cpp's llama_ftype for general.file_type (a k-quant alone: its "_S" mix).
inline uint32_t file_type(DType t) {
  switch (t) {
  case DType::f32:
    return 0;
  case DType::f16:
    return 1;
  case DType::q4_0:
    return 2;
  case DType::q4_1:
    return 3;
  case DType::q8_0:
    return 7;
  case DType::q5_0:
    return 8;
  case DType::q5_1:
    return 9;
  case DType::q2_k:
    return 10;
  case DType::q3_k:
    return 11; // Q3_K_S
  case DType::q4_k:
    return 14; // Q4_K_S
  case DType::q5_k:
    return 16; // Q5_K_S
  case DType::q6_k:
    return 18;
  case DType::iq4_nl:
    return 25;
  case DType::iq4_xs:
    return 30;
  case DType::bf16:
    return 32;
  case DType::mxfp4:
    return 38; // MXFP4_MOE
  default:
    return 0;
  }
}

inline bool is_quantized(DType t) {
  return t != DType::f32 && t != DType::f16 && t != DType::bf16;
}

} // namespace loom
