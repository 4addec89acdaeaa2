// format/hf_files.cpp — the files of a Hugging Face checkpoint directory (format/hf_files.hpp).
#include "format/hf_files.hpp"

#include "format/file_type.hpp"
#include "loom/format/gguf.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace loom::hf {

namespace {

int open_regular(const std::string& path, const std::string& what) {
  // O_NONBLOCK: should the path be swapped for a FIFO after the stat, open still returns at once.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    bad(gguf_printable(path, 400),
        "cannot open " + what + (fd < 0 ? std::string(": ") + std::strerror(e) : ""), Errc::invalid_argument);
  }
  return fd;
}

} // namespace

void bad(const std::string& where, const std::string& msg, Errc code) {
  fail(code, "hf", where + ": " + msg);
}

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::optional<struct stat> stat_regular(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT) return std::nullopt;
    bad(gguf_printable(path, 400), std::string("cannot read ") + what + ": " + std::strerror(e),
        Errc::invalid_argument);
  }
  if (!S_ISREG(st.st_mode))
    bad(gguf_printable(path, 400),
        std::string("is ") + file_type_name(st.st_mode) + ": expected " + what + " as a regular file",
        Errc::invalid_argument);
  return st;
}

std::optional<std::string> read_small(const std::string& path, uint64_t max, const std::string& what) {
  const auto st = stat_regular(path, what);
  if (!st) return std::nullopt;
  const std::string shown = gguf_printable(path, 400);
  if (static_cast<uint64_t>(st->st_size) > max)
    bad(shown, what + " is " + mib(static_cast<uint64_t>(st->st_size)) + ", over the limit of " + mib(max) +
                   ": expected a JSON file of a Hugging Face checkpoint — the file is corrupt or not what "
                   "its name says");
  const int fd = open_regular(path, what);
  std::string s;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      bad(shown, "cannot read " + what + ": " + std::strerror(e), Errc::invalid_argument);
    }
    if (n == 0) break;
    s.append(buf, static_cast<size_t>(n));
    if (s.size() > max) {
      ::close(fd);
      bad(shown, what + " grew past " + mib(max) + " while being read", Errc::invalid_argument);
    }
  }
  ::close(fd);
  return s;
}

std::unique_ptr<MappedFile> map_file(const std::string& path, const std::string& what) {
  const int fd = open_regular(path, what);
  struct stat st {};
  (void)fstat(fd, &st);
  auto m = std::make_unique<MappedFile>();
  if (const int e = m->map(fd, static_cast<size_t>(st.st_size)); e != 0) {
    ::close(fd);
    bad(gguf_printable(path, 400), std::string("cannot map ") + what + ": " + std::strerror(e),
        Errc::out_of_memory);
  }
  ::close(fd);
  return m;
}

} // namespace loom::hf
