// Included by the cpu backend's files with AVX-512 code: GCC 12 warns inside its own AVX-512 headers
// (the _mm512_undefined_* pass-through operands of the unmasked intrinsics), a known false positive;
// silenced for the rest of the including file.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
