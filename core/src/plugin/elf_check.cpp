// Checking a plugin file before anything maps or runs it: a regular file (a FIFO, directory or
// device is never opened for reading), holding a complete ELF shared object for this host.
//
// dlopen() maps every PT_LOAD segment from the file; a segment that reaches past the end of a
// truncated or partly written file is mapped anyway, and touching it kills the process with SIGBUS.
// So every PT_LOAD (and PT_DYNAMIC) range is checked against the file size here, by reading the
// headers with pread() (never mmap).
#include "format/file_type.hpp"
#include "plugin_internal.hpp"

#include <cerrno>
#include <cstring>
#include <elf.h>
#include <fcntl.h>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace loom::plugin {

namespace {

static_assert(sizeof(void*) == 8, "the plugin file check reads 64-bit ELF files only");

constexpr uint16_t k_host_machine =
#if defined(__x86_64__)
    EM_X86_64;
#elif defined(__aarch64__)
    EM_AARCH64;
#elif defined(__riscv) && __riscv_xlen == 64
    EM_RISCV;
#elif defined(__powerpc64__)
    EM_PPC64;
#elif defined(__s390x__)
    EM_S390;
#else
#error "add this machine's EM_* constant to the plugin file check"
#endif

constexpr unsigned char k_host_data = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;

const char* machine_name(uint16_t m) {
  switch (m) {
  case EM_386:
    return "x86 (32-bit)";
  case EM_X86_64:
    return "x86-64";
  case EM_ARM:
    return "ARM (32-bit)";
  case EM_AARCH64:
    return "AArch64";
  case EM_RISCV:
    return "RISC-V";
  case EM_PPC64:
    return "PowerPC 64";
  case EM_S390:
    return "s390x";
  default:
    return nullptr;
  }
}

std::string machine_text(uint16_t m) {
  const char* n = machine_name(m);
  return (n ? std::string(n) + " " : std::string()) + "(e_machine " + std::to_string(m) + ")";
}

std::string truncated(const std::string& what, uint64_t end, uint64_t size) {
  return "not a complete ELF shared object: " + what + " ends at byte " + std::to_string(end) +
         " but the file has " + std::to_string(size) + " bytes (truncated or partly written?)";
}

// a + b, or UINT64_MAX when it overflows (an end offset that is certainly past the file).
uint64_t end_of(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool read_at(int fd, void* buf, size_t n, uint64_t off) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return true;
}

std::optional<FileProblem> check_elf(int fd, uint64_t size) {
  auto problem = [](std::string why) { return FileProblem{Errc::invalid_argument, std::move(why)}; };
  unsigned char ident[EI_NIDENT] = {};
  if (size < SELFMAG || !read_at(fd, ident, SELFMAG, 0) || std::memcmp(ident, ELFMAG, SELFMAG) != 0)
    return problem("not a shared library: the file does not begin with the ELF magic bytes (\\x7fELF)");
  if (size < EI_NIDENT || !read_at(fd, ident, EI_NIDENT, 0))
    return problem(truncated("the ELF identification", EI_NIDENT, size));
  if (ident[EI_CLASS] != ELFCLASS64)
    return problem(std::string("not a shared library for this host: ") +
                   (ident[EI_CLASS] == ELFCLASS32 ? "a 32-bit ELF file (ELFCLASS32)"
                                                  : "ELF class " + std::to_string(ident[EI_CLASS])) +
                   ", the host is 64-bit");
  if (ident[EI_DATA] != k_host_data)
    return problem(std::string("not a shared library for this host: ") +
                   (ident[EI_DATA] == ELFDATA2MSB   ? "a big-endian ELF file"
                    : ident[EI_DATA] == ELFDATA2LSB ? "a little-endian ELF file"
                                                    : "ELF data encoding " + std::to_string(ident[EI_DATA])) +
                   ", the host is " + (k_host_data == ELFDATA2LSB ? "little-endian" : "big-endian"));
  Elf64_Ehdr eh{};
  if (size < sizeof eh || !read_at(fd, &eh, sizeof eh, 0))
    return problem(truncated("the ELF header", sizeof eh, size));
  if (eh.e_machine != k_host_machine)
    return problem("not a shared library for this host: built for " + machine_text(eh.e_machine) +
                   ", the host is " + machine_text(k_host_machine));
  if (eh.e_type != ET_DYN)
    return problem(std::string("not a shared library: its ELF type is ") +
                   (eh.e_type == ET_EXEC   ? "ET_EXEC (an executable)"
                    : eh.e_type == ET_REL  ? "ET_REL (an object file, not linked)"
                    : eh.e_type == ET_CORE ? "ET_CORE (a core dump)"
                                           : std::to_string(eh.e_type)) +
                   ", not ET_DYN");

  // Program headers: the table, then every loadable segment, inside the file.
  if (eh.e_phnum == 0) return problem("not a shared library: the ELF file has no program headers");
  if (eh.e_phnum == PN_XNUM)
    return problem("not a usable shared library: extended program header numbering (PN_XNUM)");
  if (eh.e_phentsize != sizeof(Elf64_Phdr))
    return problem("not a shared library for this host: program header entries are " +
                   std::to_string(eh.e_phentsize) + " bytes, not " + std::to_string(sizeof(Elf64_Phdr)));
  const uint64_t ph_end = end_of(eh.e_phoff, uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr));
  if (ph_end > size) return problem(truncated("the program header table", ph_end, size));
  size_t n_load = 0;
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    if (!read_at(fd, &ph, sizeof ph, eh.e_phoff + uint64_t{i} * sizeof ph))
      return problem("cannot read program header " + std::to_string(i) + ": " + std::strerror(errno));
    if (ph.p_type != PT_LOAD && ph.p_type != PT_DYNAMIC) continue;
    if (ph.p_type == PT_LOAD) ++n_load;
    const uint64_t end = end_of(ph.p_offset, ph.p_filesz);
    if (ph.p_filesz > 0 && end > size)
      return problem(truncated(std::string(ph.p_type == PT_LOAD ? "PT_LOAD" : "PT_DYNAMIC") + " segment " +
                                   std::to_string(i),
                               end, size));
  }
  if (n_load == 0) return problem("not a shared library: the ELF file has no PT_LOAD segment");

  // Section headers, when there are any (a stripped file may have none).
  if (eh.e_shoff != 0) {
    if (eh.e_shentsize != sizeof(Elf64_Shdr))
      return problem("not a shared library for this host: section header entries are " +
                     std::to_string(eh.e_shentsize) + " bytes, not " + std::to_string(sizeof(Elf64_Shdr)));
    // e_shnum 0 with a table: the count is in section 0 (SHN_LORESERVE or more sections).
    const uint64_t n_sh = eh.e_shnum == 0 ? 1 : eh.e_shnum;
    const uint64_t sh_end = end_of(eh.e_shoff, n_sh * sizeof(Elf64_Shdr));
    if (sh_end > size) return problem(truncated("the section header table", sh_end, size));
  }
  return std::nullopt;
}

} // namespace

std::optional<FileProblem> check_plugin_file(const std::string& path) {
  struct stat lst {};
  if (::lstat(path.c_str(), &lst) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return FileProblem{Errc::not_found, "no such file"};
    return FileProblem{Errc::not_found, std::string("cannot stat the file: ") + std::strerror(errno)};
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ELOOP)
      return FileProblem{Errc::invalid_argument,
                         "symlink loop: resolving the symbolic link never ends (too many levels of "
                         "symbolic links)"};
    if (S_ISLNK(lst.st_mode) && (e == ENOENT || e == ENOTDIR))
      return FileProblem{Errc::not_found, "no such file: a dangling symbolic link"};
    return FileProblem{Errc::not_found, std::string("cannot stat the file: ") + std::strerror(e)};
  }
  if (!S_ISREG(st.st_mode))
    return FileProblem{Errc::invalid_argument, std::string("not a regular file but ") +
                                                   file_type_name(st.st_mode) +
                                                   "; a plugin must be a shared library file"};
  // Regular, so O_NONBLOCK changes nothing for reads; it only keeps open() from blocking should the
  // path have been replaced by a FIFO since the stat() above (checked again on the descriptor).
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (f.fd < 0)
    return FileProblem{Errc::not_found, std::string("cannot open the file: ") + std::strerror(errno)};
  return check_plugin_fd(f.fd);
}

std::optional<FileProblem> check_plugin_fd(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return FileProblem{Errc::invalid_argument, "not a regular file; a plugin must be a shared library file"};
  return check_elf(fd, static_cast<uint64_t>(st.st_size));
}

std::optional<PluginDescriptor> read_plugin_descriptor(const std::string& path) {
  std::string why;
  Fd f;
  f.fd = open_regular_file(path, why);
  if (f.fd < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return std::nullopt;
  const auto size = static_cast<uint64_t>(st.st_size);
  Elf64_Ehdr eh{};
  if (size < sizeof eh || !read_at(f.fd, &eh, sizeof eh, 0) ||
      std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0 || eh.e_shnum > 4096 ||
      eh.e_shstrndx >= eh.e_shnum)
    return std::nullopt;
  const uint64_t table = static_cast<uint64_t>(eh.e_shnum) * sizeof(Elf64_Shdr);
  if (eh.e_shoff > size || table > size - eh.e_shoff) return std::nullopt;
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  if (!read_at(f.fd, sh.data(), table, eh.e_shoff)) return std::nullopt;
  const auto inside = [&](const Elf64_Shdr& h) {
    return h.sh_type != SHT_NOBITS && h.sh_offset <= size && h.sh_size <= size - h.sh_offset;
  };
  const Elf64_Shdr& strtab = sh[eh.e_shstrndx];
  if (!inside(strtab) || strtab.sh_size > (1u << 20)) return std::nullopt;
  std::string names(strtab.sh_size, '\0');
  if (!read_at(f.fd, names.data(), names.size(), strtab.sh_offset)) return std::nullopt;
  constexpr char k_section[] = ".loom_plugin";
  constexpr char k_magic[] = "loom-plugin-descriptor-2";
  for (const Elf64_Shdr& h : sh) {
    if (h.sh_name >= names.size() || std::strcmp(names.c_str() + h.sh_name, k_section) != 0) continue;
    if (!inside(h) || h.sh_size > (1u << 16)) return std::nullopt;
    std::string bytes(h.sh_size, '\0');
    if (!read_at(f.fd, bytes.data(), bytes.size(), h.sh_offset)) return std::nullopt;
    // NUL-terminated strings: the magic, the plugin name, "kind:name" per factory, an empty one last.
    std::vector<std::string> parts;
    size_t at = 0;
    while (at < bytes.size()) {
      const size_t end = bytes.find('\0', at);
      if (end == std::string::npos) return std::nullopt;
      parts.push_back(bytes.substr(at, end - at));
      at = end + 1;
      if (parts.back().empty()) break;
    }
    if (parts.size() < 3 || parts[0] != k_magic || parts.back() != "" || parts[1].empty())
      return std::nullopt;
    PluginDescriptor d;
    d.name = parts[1];
    for (size_t i = 2; i + 1 < parts.size(); ++i) {
      const std::string& e = parts[i];
      if (e.size() < 3 || e[1] != ':' || e[0] < '0' || e[0] > '9') return std::nullopt;
      d.provides.emplace_back(e[0] - '0', e.substr(2));
    }
    return d;
  }
  return std::nullopt;
}

int open_regular_file(const std::string& path, std::string& why) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    why = errno == ELOOP ? "symlink loop" : std::strerror(errno);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    why = std::string("not a regular file but ") + file_type_name(st.st_mode);
    return -1;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    why = std::strerror(errno);
    return -1;
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    why = "not a regular file";
    return -1;
  }
  return fd;
}

} // namespace loom::plugin

namespace loom {} // namespace loom
