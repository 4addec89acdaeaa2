// format/mapped_file.hpp — a whole file mapped read-only (private header), the one shape of the
// mappings the model-file readers keep alive: a GGUF file's, a checkpoint's safetensors shards.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <span>
#include <sys/mman.h>

namespace loom {

struct MappedFile {
  void* addr = nullptr;
  size_t size = 0;

  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (addr) munmap(addr, size);
  }

  // Maps `n` bytes of `fd` (nothing for an empty file). Returns 0, or the errno of a failed mmap
  // (addr stays null): the caller closes fd and words the error for its format.
  int map(int fd, size_t n) noexcept {
    size = n;
    if (n == 0) return 0;
    addr = mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr != MAP_FAILED) return 0;
    addr = nullptr;
    return errno;
  }

  std::span<const uint8_t> bytes() const noexcept { return {static_cast<const uint8_t*>(addr), size}; }
};

} // namespace loom
