// Loading plugins: Boost.DLL (RTLD_NOW | RTLD_LOCAL), score, ABI handshake, optional sha256 pin; the
// registry (discovery, named-only loading from static descriptors, lookup). The file checks are in
// elf_check.cpp, hashing in hash.cpp, the child-process probe of `loom plugins` in probe.cpp.
#define BOOST_DLL_USE_STD_FS 1
#include "plugin_internal.hpp"

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <openssl/evp.h>
#include <poll.h>
#include <set>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

namespace loom {

namespace fs = std::filesystem;
using plugin::factory_at;
using plugin::k_max_factories;
using plugin::plugin_description;

struct PluginLibrary::Handle {
  boost::dll::shared_library lib;
};

void PluginLibrary::shut_down() noexcept {
  if (shut_down_) return;
  shut_down_ = true;
  if (plugin_ && plugin_->struct_size >= offsetof(loom_plugin, shutdown) + sizeof(plugin_->shutdown) &&
      plugin_->shutdown)
    plugin_->shutdown();
}

PluginLibrary::~PluginLibrary() {
  // One PluginLibrary per mapped file (see loaded_libraries()): this runs when its last user goes — in
  // production at exit (retained_libraries()), after shut_down() ran there.
  shut_down();
  // No dlclose in production: promote the library to RTLD_NODELETE so unloading the handle keeps
  // it mapped (plugin threads or atexit hooks may still run). Tests set LOOM_TEST_REAL_UNLOAD=1.
  const char* real = std::getenv("LOOM_TEST_REAL_UNLOAD");
  if (!(real && std::string(real) == "1") && !load_path_.empty()) {
    if (void* h = dlopen(load_path_.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) dlclose(h);
  }
  // The descriptor named the library to the dynamic loader, which finds a loaded library by that name: it
  // stays open while the library is mapped (in production, for the process's life), so its number never
  // names another file while the loader still knows it.
  handle_.reset();
  if (fd_ >= 0 && !load_path_.empty()) {
    void* still = dlopen(load_path_.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (still) {
      dlclose(still);
      return; // mapped for good: its descriptor with it
    }
  }
  if (fd_ >= 0) ::close(fd_);
}

std::string_view kind_name(int32_t kind) noexcept {
  switch (kind) {
  case LOOM_KIND_BACKEND:
    return "backend";
  case LOOM_KIND_DECODER:
    return "decoder";
  case LOOM_KIND_SAMPLER:
    return "sampler";
  case LOOM_KIND_STOP:
    return "stop";
  case LOOM_KIND_VERIFIER:
    return "verifier";
  default:
    return "unknown";
  }
}

std::vector<std::string> plugin_search_dirs(const std::vector<std::string>& configured) {
  std::vector<std::string> dirs = configured;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back(exe.parent_path().string());
  return dirs;
}

PluginRegistry::~PluginRegistry() {
  // Libraries are shared-owned by objects made from them; the registry only drops its references.
  libs_.clear();
}

namespace {
// Every mapped plugin file has exactly one PluginLibrary in the process, shared by all registries
// and objects, so shutdown() runs once, when the last user is gone.
std::mutex& libraries_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::weak_ptr<PluginLibrary>>& loaded_libraries() {
  static std::map<std::string, std::weak_ptr<PluginLibrary>> m;
  return m;
}
bool real_unload() {
  const char* real = std::getenv("LOOM_TEST_REAL_UNLOAD");
  return real && std::string(real) == "1";
}
// Production: a library, once initialised, stays for the process's life — it stays mapped anyway (no
// dlclose), and a plugin whose shutdown() ran is never initialised again — and is shut down at exit,
// newest first. The handler is registered after each library's init, so it runs before the static
// destructors of the plugins loaded until then (registered while dlopen ran their constructors).
std::vector<std::shared_ptr<PluginLibrary>>& retained_libraries() {
  static std::vector<std::shared_ptr<PluginLibrary>> v;
  return v;
}
void shut_down_retained() noexcept {
  std::vector<std::shared_ptr<PluginLibrary>> libs;
  {
    std::lock_guard<std::mutex> lock(libraries_mutex());
    libs = retained_libraries();
  }
  for (auto it = libs.rbegin(); it != libs.rend(); ++it)
    (*it)->shut_down();
}
} // namespace

namespace {
// The pin for a plugin file: a key that is its path (as given in the pipeline, absolute or relative to the
// current directory) or its file name. Never the name the plugin declares: any file can declare any name.
std::optional<std::string> pin_of(const std::map<std::string, std::string>& pins, const std::string& file) {
  const fs::path f(file);
  for (const auto& [key, sha] : pins) {
    if (key == file || key == f.filename().string()) return sha;
    std::error_code ec;
    if (fs::equivalent(key, f, ec) && !ec) return sha;
  }
  return std::nullopt;
}

// A plugin file that cannot be loaded: one line whatever the file name or the plugin's strings hold.
[[noreturn]] void refuse(const std::string& path, Errc c, const std::string& why) {
  fail(c, "plugin", one_line(path + ": " + why));
}

void check_pin(const std::string& path, const std::optional<std::string>& pin, const std::string& sha) {
  if (pin && *pin != sha)
    refuse(path, Errc::invalid_argument,
           "sha256 is " + sha + " but the pipeline pins " + *pin +
               " — the file changed; rebuild it or update the pin");
}

// An open file descriptor, closed unless released.
struct OwnedFd {
  int fd;
  explicit OwnedFd(int f) : fd(f) {}
  ~OwnedFd() {
    if (fd >= 0) ::close(fd);
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
};

// Before anything maps the file: a regular file holding a complete ELF shared object for this host. From
// here on one open descriptor: its bytes are checked, hashed and loaded (through /proc/self/fd), so a file
// replaced after the check or the hash is not what runs.
int open_checked(const std::string& path) {
  if (const auto problem = plugin::check_plugin_file(path)) refuse(path, problem->code, problem->why);
  std::string open_error;
  const int fd = plugin::open_regular_file(path, open_error);
  if (fd < 0) refuse(path, Errc::not_found, "cannot open the file: " + open_error);
  return fd;
}

// The one dlopen that runs its constructors (its message is dlerror()'s, clean); Boost.DLL's load then
// finds the library mapped and only takes a reference — nothing is unloaded in between.
boost::dll::shared_library map_library(const std::string& path, const std::string& load_path) {
  void* own = dlopen(load_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!own) {
    const char* e = dlerror();
    std::string why = e ? e : "unknown dlopen error";
    if (why.rfind(load_path + ": ", 0) == 0) why = why.substr(load_path.size() + 2);
    refuse(path, Errc::invalid_argument, "cannot be loaded as a shared library: " + why);
  }
  boost::dll::shared_library dl;
  try {
    dl.load(load_path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    dlclose(own);
    refuse(path, Errc::invalid_argument, std::string("cannot be loaded as a shared library: ") + e.what());
  }
  dlclose(own); // Boost.DLL's handle keeps it
  return dl;
}

// loom_plugin_init, called with the host's table and ABI; what it logs while it runs is kept: with a
// refusal it is the reason, else it is logged as a warning.
const loom_plugin* init_plugin(const std::string& path, boost::dll::shared_library& dl) {
  const auto init = dl.get<const loom_plugin*(const loom_host*, uint32_t, uint32_t)>("loom_plugin_init");
  const loom_plugin* p = nullptr;
  std::string said;
  {
    plugin::InitLogCapture capture;
    p = init(host_api(), LOOM_ABI_MAJOR, LOOM_ABI_MINOR);
    said = std::move(capture.text);
  }
  if (!p)
    refuse(path, Errc::abi_mismatch,
           "loom_plugin_init refused the host (ABI " + std::to_string(LOOM_ABI_MAJOR) + "." +
               std::to_string(LOOM_ABI_MINOR) + ")" + (said.empty() ? "" : ": \"" + said + "\"") +
               ". A plugin for another ABI major needs a rebuild against this SDK (sdk/CHANGELOG.md says "
               "what each major changed); one built for a newer minor needs a newer Loom");
  if (!said.empty()) host_api()->log(LOOM_LOG_WARN, path.c_str(), said.c_str()); // not a refusal: log it
  return p;
}

// The loom_plugin table a host can read: initialised, of this ABI major, complete.
void check_plugin_table(const std::string& path, const loom_plugin& p) {
  if (p.struct_size == 0)
    refuse(path, Errc::abi_mismatch,
           "its loom_plugin table has struct_size 0: the table was not initialised (a "
           "hand-written table must set struct_size = sizeof(loom_plugin); "
           "LOOM_PLUGIN_DEFINE does)");
  if (p.abi_major != LOOM_ABI_MAJOR)
    refuse(path, Errc::abi_mismatch,
           "built for ABI " + std::to_string(p.abi_major) + "." + std::to_string(p.abi_minor) +
               ", the host speaks ABI " + std::to_string(LOOM_ABI_MAJOR) + "." +
               std::to_string(LOOM_ABI_MINOR) + " (the major must match); rebuild it against this SDK");
  if (p.struct_size < LOOM_PLUGIN_SIZE_MIN) // fields after shutdown are minor additions, read if present
    refuse(path, Errc::abi_mismatch,
           "its loom_plugin table has struct_size " + std::to_string(p.struct_size) + ", smaller than ABI " +
               std::to_string(LOOM_ABI_MAJOR) + ".0's " + std::to_string(LOOM_PLUGIN_SIZE_MIN) +
               " bytes; rebuild it against this SDK");
  if (!p.name || !p.version || (p.n_factories > 0 && !p.factories))
    refuse(path, Errc::invalid_argument,
           "its loom_plugin table is incomplete (name, version or factories missing)");
  if (p.n_factories > k_max_factories)
    refuse(path, Errc::invalid_argument,
           "its loom_plugin table claims " + std::to_string(p.n_factories) + " factories (more than " +
               std::to_string(k_max_factories) + "): the table is not initialised");
  if (p.n_factories > 0 && p.factories[0].struct_size == 0)
    refuse(path, Errc::abi_mismatch,
           "its factory 0 has struct_size 0: the loom_factory entries were not initialised "
           "(a hand-written entry must set struct_size = sizeof(loom_factory); "
           "LOOM_SAMPLER() and the other SDK macros do)");
  if (p.n_factories > 0 && p.factories[0].struct_size < sizeof(loom_factory))
    refuse(path, Errc::abi_mismatch, "its loom_factory entries are smaller than the least a host reads");
}

// Per factory: why this host never uses it ("" when usable). A factory without a name or create function
// refuses the whole file.
std::vector<std::string> factory_problems(const std::string& path, const loom_plugin& p) {
  std::vector<std::string> problems(p.n_factories);
  for (size_t i = 0; i < p.n_factories; ++i) {
    const loom_factory& f = factory_at(p, i);
    std::string& problem = problems[i];
    if (f.struct_size == 0) {
      problem = "struct_size is 0: the loom_factory entry was not initialised (hand-written without "
                "sizeof(loom_factory)?)";
    } else if (f.struct_size < sizeof(loom_factory)) {
      problem = "struct_size " + std::to_string(f.struct_size) + " is smaller than ABI " +
                std::to_string(LOOM_ABI_MAJOR) + "'s loom_factory (" + std::to_string(sizeof(loom_factory)) +
                " bytes)";
    } else if (!f.name || !f.create) {
      refuse(path, Errc::invalid_argument,
             "factory " + std::to_string(i) + " has no name or create function");
    } else if (kind_name(f.kind) == "unknown") {
      problem = "kind " + std::to_string(f.kind) +
                " is none of backend (1), decoder (2), sampler (3), stop (4); this host cannot use it "
                "(built for a newer SDK?)";
    }
  }
  return problems;
}
} // namespace

std::shared_ptr<PluginLibrary> PluginRegistry::load(const std::string& path,
                                                    const std::optional<std::string>& pin) {
  OwnedFd owned{open_checked(path)};
  if (const auto problem = plugin::check_plugin_fd(owned.fd)) refuse(path, problem->code, problem->why);
  std::error_code ec;
  std::string canonical = fs::weakly_canonical(path, ec).string();
  if (ec || canonical.empty()) canonical = path;
  std::lock_guard<std::mutex> lock(libraries_mutex());
  (void)retained_libraries(); // made before any plugin's statics: destroyed after them
  if (auto it = loaded_libraries().find(canonical); it != loaded_libraries().end())
    if (auto existing = it->second.lock()) {
      check_pin(path, pin, existing->sha256_);
      return existing;
    }
  std::shared_ptr<PluginLibrary> lib(new PluginLibrary());
  lib->path_ = canonical;
  try {
    lib->sha256_ = plugin::fd_sha256(owned.fd);
  } catch (const Error& e) {
    refuse(path, e.code(), "cannot read the file to hash it");
  }
  check_pin(path, pin, lib->sha256_);
  lib->fd_ = std::exchange(owned.fd, -1);
  lib->load_path_ = "/proc/self/fd/" + std::to_string(lib->fd_);
  lib->handle_ = std::make_unique<PluginLibrary::Handle>();
  lib->handle_->lib = map_library(path, lib->load_path_);
  auto& dl = lib->handle_->lib;
  if (!dl.has("loom_plugin_init"))
    refuse(path, Errc::invalid_argument,
           "does not export loom_plugin_init (not a Loom plugin, or built without LOOM_PLUGIN_DEFINE)");
  if (dl.has("loom_plugin_score")) {
    lib->score_ = dl.get<int32_t()>("loom_plugin_score")();
    if (lib->score_ <= 0)
      refuse(path, Errc::unsupported, "loom_plugin_score() is 0: the plugin cannot run on this machine");
  }
  const loom_plugin* p = init_plugin(path, dl);
  check_plugin_table(path, *p);
  lib->factory_problems_ = factory_problems(path, *p);
  lib->plugin_ = p;
  loaded_libraries()[canonical] = lib;
  if (!real_unload()) {
    retained_libraries().push_back(lib);
    std::atexit(&shut_down_retained);
  }
  return lib;
}

namespace {
// Every libloom-*.so in `dirs`, in order (sorted within a directory), once each: by its canonical path. A
// path that does not resolve (a dangling symlink, a symlink loop) is listed as found; loading it says why
// it is unusable.
std::vector<std::string> plugin_files(const std::vector<std::string>& dirs) {
  std::vector<std::string> files;
  for (const auto& d : dirs) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    std::vector<std::string> here;
    for (fs::directory_iterator it(d, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::path found = it->path().lexically_normal();
      const std::string name = found.filename().string();
      if (name.rfind("libloom-", 0) != 0 || found.extension() != ".so") continue;
      std::error_code cec;
      const fs::path canonical = fs::canonical(found, cec);
      here.push_back(cec ? found.string() : canonical.string());
    }
    std::sort(here.begin(), here.end());
    for (auto& f : here)
      if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
  }
  return files;
}

// A file without a static descriptor (a hand-written loom_plugin_init): listed with that reason (or what
// else is wrong with it), never loaded.
PluginInfo undescribed_file(const std::string& f) {
  PluginInfo info;
  info.path = f;
  try {
    info.sha256 = file_sha256(f);
  } catch (const Error&) {
  }
  const auto problem = plugin::check_plugin_file(f); // (what is wrong with it, if more than that)
  info.error = problem ? problem->why
                       : "no static descriptor (the .loom_plugin section of LOOM_PLUGIN_DEFINE, SDK 2.0+): a "
                         "pipeline never loads it; rebuild it against this SDK";
  return info;
}

// What a named-only discover opens. A pipeline loads only what it names: a file whose descriptor provides
// none of it is never opened; a pinned file (pins are keyed by file, never by the name a file declares) is
// loaded only with its hash, and an unpinned file that offers what a pinned one provides is not loaded at
// all. A file without a descriptor is listed (in `out`) and never loaded. `provided` hears of every
// object each described file provides.
struct NamedFiles {
  std::vector<std::string> files;
  std::map<std::string, std::string> pins; // file → the sha256 its pin requires
};

NamedFiles named_files(const std::vector<std::string>& files, const std::map<std::string, std::string>& pins,
                       const DiscoverOptions& options, std::vector<PluginInfo>& out,
                       const std::function<void(int32_t, const std::string&, const std::string&)>& provided) {
  const auto wanted = [&](int32_t kind, const std::string& name) {
    return std::find(options.only.begin(), options.only.end(), std::pair{kind, name}) != options.only.end();
  };
  NamedFiles nf;
  std::vector<std::pair<std::string, plugin::PluginDescriptor>> offered;
  std::set<std::pair<int32_t, std::string>> pinned_objects;
  for (const auto& f : files) {
    auto d = plugin::read_plugin_descriptor(f);
    if (!d) {
      out.push_back(undescribed_file(f));
      continue;
    }
    bool use = false;
    for (const auto& [kind, name] : d->provides) {
      provided(kind, name, d->name);
      use = use || wanted(kind, name);
    }
    if (!use) continue;
    if (const auto pin = pin_of(pins, f)) {
      nf.pins[f] = *pin;
      for (const auto& o : d->provides)
        pinned_objects.insert(o);
    }
    offered.emplace_back(f, std::move(*d));
  }
  for (const auto& [f, d] : offered) {
    std::string shadowed;
    if (!nf.pins.count(f))
      for (const auto& o : d.provides)
        if (wanted(o.first, o.second) && pinned_objects.count(o)) shadowed = o.second;
    if (!shadowed.empty()) {
      PluginInfo info;
      info.path = f;
      info.name = d.name;
      info.error = one_line("provides '" + shadowed +
                            "', which a pinned plugin file provides: not loaded (pin it too, or remove it)");
      out.push_back(std::move(info));
      continue;
    }
    nf.files.push_back(f);
  }
  return nf;
}

// A loaded plugin's listing: its name, version, ABI, score, description and factories.
void describe_loaded(const PluginLibrary& lib, PluginInfo& info) {
  const loom_plugin& p = lib.plugin();
  info.name = p.name;
  info.version = p.version;
  info.abi_major = p.abi_major;
  info.abi_minor = p.abi_minor;
  info.score = lib.score();
  info.description = plugin_description(p);
  for (size_t i = 0; i < p.n_factories; ++i) {
    const loom_factory& fa = factory_at(p, i);
    info.factories.push_back(
        {std::string(kind_name(fa.kind)), fa.name ? fa.name : "", std::string(lib.factory_problem(i))});
  }
}

// The same plugin name seen again: keep the higher score (ISA variants of one backend).
void keep_best(std::vector<std::shared_ptr<PluginLibrary>>& libs, const std::shared_ptr<PluginLibrary>& lib) {
  auto same = std::find_if(libs.begin(), libs.end(), [&](const auto& l) {
    return std::string(l->plugin().name) == lib->plugin().name;
  });
  if (same == libs.end()) {
    libs.push_back(lib);
  } else if ((*same)->path() == lib->path()) {
    // loaded twice: the same file, nothing to do
  } else if (lib->score() > (*same)->score()) {
    *same = lib;
  }
}
} // namespace

std::vector<PluginInfo> PluginRegistry::discover(const std::vector<std::string>& dirs,
                                                 const std::map<std::string, std::string>& pins,
                                                 const DiscoverOptions& options) {
  std::vector<PluginInfo> out;
  std::vector<std::string> files = plugin_files(dirs);
  std::map<std::string, std::string> file_pins; // file → the sha256 its pin requires
  if (options.named_only) {
    NamedFiles nf =
        named_files(files, pins, options, out,
                    [this](int32_t kind, const std::string& name, const std::string& plugin_name) {
                      described_.push_back({kind, name, plugin_name});
                    });
    files = std::move(nf.files);
    file_pins = std::move(nf.pins);
  }
  for (const std::string& f : files) {
    PluginInfo info;
    info.path = f;
    try {
      try {
        info.sha256 = file_sha256(f); // regular files only; check_plugin_file() says why not
      } catch (const Error&) {
      }
      if (const auto problem = plugin::check_plugin_file(f))
        fail(problem->code, "plugin", one_line(f + ": " + problem->why));
      if (options.probe_in_child)
        if (const std::string why = plugin::probe_in_child(f, options.probe_timeout); !why.empty())
          fail(Errc::invalid_argument, "plugin", one_line(f + ": " + why));
      // The pin is checked on the bytes load() maps (hashed from the descriptor it loads).
      const auto pin = file_pins.count(f) ? std::optional<std::string>(file_pins[f]) : pin_of(pins, f);
      auto lib = load(f, pin);
      describe_loaded(*lib, info);
      keep_best(libs_, lib);
    } catch (const Error& e) {
      info.error = e.what();
      const std::string prefix = "plugin: " + one_line(f) + ": ";
      if (info.error.rfind(prefix, 0) == 0) info.error = info.error.substr(prefix.size());
      info.error = one_line(info.error);
      info.skipped = e.code() == Errc::unsupported;
    } catch (const std::exception& e) { // a bug or an allocation failure: still only this file
      info.error = one_line(e.what());
    }
    out.push_back(std::move(info));
  }
  last_ = out;
  return out;
}

std::optional<PluginRegistry::Found> PluginRegistry::find(int32_t kind, std::string_view name) const {
  for (const auto& l : libs_) {
    const loom_plugin& p = l->plugin();
    for (size_t i = 0; i < p.n_factories; ++i) {
      if (!l->factory_problem(i).empty()) continue; // unknown kind, bad entry: never used
      const loom_factory& f = factory_at(p, i);
      if (f.kind == kind && name == f.name) return Found{l, &f};
    }
  }
  return std::nullopt;
}

std::string PluginRegistry::available(int32_t kind) const {
  std::string s;
  for (const auto& d : described_) // provided by files a named-only discover did not open
    if (d.kind == kind && !find(kind, d.name) && s.find(one_line(d.name) + " (") == std::string::npos)
      s += (s.empty() ? "" : ", ") + one_line(d.name) + " (" + one_line(d.plugin) + ")";
  for (const auto& l : libs_) {
    const loom_plugin& p = l->plugin();
    for (size_t i = 0; i < p.n_factories; ++i)
      if (l->factory_problem(i).empty() && factory_at(p, i).kind == kind)
        s += (s.empty() ? "" : ", ") + one_line(factory_at(p, i).name) + " (" + one_line(p.name) + ")";
  }
  return s.empty() ? "none" : s;
}

std::string PluginRegistry::failures() const {
  std::string s;
  for (const auto& i : last_)
    if (!i.error.empty() && !i.skipped) s += "\n  " + one_line(i.path) + ": " + i.error;
  return s;
}

} // namespace loom
