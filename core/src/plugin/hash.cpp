// sha256 of a plugin file (OpenSSL's EVP): of an open descriptor's bytes (what is then loaded), or of a
// path opened with open_regular_file (never a FIFO).
#include "plugin_internal.hpp"

#include <cerrno>
#include <cstring>
#include <openssl/evp.h>
#include <string>
#include <unistd.h>
#include <vector>

namespace loom {

std::string file_sha256(const std::string& path) {
  std::string why;
  const int fd = plugin::open_regular_file(path, why); // never blocks on a FIFO
  if (fd < 0) fail(Errc::not_found, "plugin", one_line(path + ": cannot read the file to hash it: " + why));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  try {
    return plugin::fd_sha256(fd);
  } catch (const Error& e) {
    const std::string what = e.what(), prefix = "plugin: ";
    fail(e.code(), "plugin",
         one_line(path + ": " + (what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what)));
  }
}

std::string plugin::fd_sha256(int fd) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx);
    fail(Errc::internal, "plugin", "OpenSSL SHA-256 is unavailable");
  }
  std::vector<char> buf(1 << 16);
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      EVP_MD_CTX_free(ctx);
      fail(Errc::not_found, "plugin", std::string("cannot read the file to hash it: ") + std::strerror(e));
    }
    if (n == 0) break;
    EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(n));
    at += n;
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx, md, &n);
  EVP_MD_CTX_free(ctx);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

} // namespace loom
