// file_type.hpp — what a path that is not a regular file is, in words ("a FIFO (named pipe)"), for
// the messages of every reader of untrusted files (GGUF models, plugins).
#pragma once

#include <sys/stat.h>

namespace loom {

inline const char* file_type_name(mode_t mode) noexcept {
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISREG(mode)) return "a regular file";
  return "not a regular file";
}

} // namespace loom
