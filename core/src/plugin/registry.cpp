// Loading plugins: Boost.DLL (RTLD_NOW | RTLD_LOCAL), score, ABI handshake, optional sha256 pin.
#define BOOST_DLL_USE_STD_FS 1
#include "plugin_internal.hpp"

#include <algorithm>
#include <boost/dll/shared_library.hpp>
#include <cstdlib>
#include <dlfcn.h>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <openssl/evp.h>
#include <unistd.h>

namespace loom {

namespace fs = std::filesystem;

struct PluginLibrary::Handle {
  boost::dll::shared_library lib;
};

PluginLibrary::~PluginLibrary() {
  // One PluginLibrary per mapped file (see loaded_libraries()), so this runs when its last user goes.
  if (plugin_ && plugin_->struct_size >= offsetof(loom_plugin, shutdown) + sizeof(plugin_->shutdown) &&
      plugin_->shutdown)
    plugin_->shutdown();
  // No dlclose in production: promote the library to RTLD_NODELETE so unloading the handle keeps
  // it mapped (plugin threads or atexit hooks may still run). Tests set LOOM_TEST_REAL_UNLOAD=1.
  const char* real = std::getenv("LOOM_TEST_REAL_UNLOAD");
  if (!(real && std::string(real) == "1") && !path_.empty()) {
    if (void* h = dlopen(path_.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) dlclose(h);
  }
}

// Entries of the factory array are factories[0].struct_size apart (a newer minor may append fields).
static const loom_factory& factory_at(const loom_plugin& p, size_t i) {
  const auto* base = reinterpret_cast<const char*>(p.factories);
  return *reinterpret_cast<const loom_factory*>(base + i * p.factories[0].struct_size);
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
  default:
    return "unknown";
  }
}

std::string file_sha256(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(Errc::not_found, "plugin", path + ": cannot read the file to hash it");
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx);
    fail(Errc::internal, "plugin", "OpenSSL SHA-256 is unavailable");
  }
  std::vector<char> buf(1 << 16);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (f.gcount() > 0) EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(f.gcount()));
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
} // namespace

std::shared_ptr<PluginLibrary> PluginRegistry::load(const std::string& path,
                                                    const std::optional<std::string>& pin) {
  auto bad = [&](Errc c, const std::string& why) { fail(c, "plugin", path + ": " + why); };
  auto check_pin = [&](const std::string& sha) {
    if (pin && *pin != sha)
      bad(Errc::invalid_argument, "sha256 is " + sha + " but the pipeline pins " + *pin +
                                      " — the file changed; rebuild it or update the pin");
  };
  std::error_code ec;
  if (!fs::exists(path, ec)) bad(Errc::not_found, "no such file");
  const std::string canonical = fs::weakly_canonical(path, ec).string();
  std::lock_guard<std::mutex> lock(libraries_mutex());
  if (auto it = loaded_libraries().find(canonical); it != loaded_libraries().end())
    if (auto existing = it->second.lock()) {
      check_pin(existing->sha256_);
      return existing;
    }
  std::shared_ptr<PluginLibrary> lib(new PluginLibrary());
  lib->path_ = canonical;
  lib->sha256_ = file_sha256(path);
  check_pin(lib->sha256_);
  // dlopen once ourselves for a clean dlerror() message (Boost.DLL's wraps it twice over).
  if (void* probe = dlopen(lib->path_.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    dlclose(probe);
  } else {
    const char* e = dlerror();
    std::string why = e ? e : "unknown dlopen error";
    if (why.rfind(lib->path_ + ": ", 0) == 0) why = why.substr(lib->path_.size() + 2);
    bad(Errc::invalid_argument, "cannot be loaded as a shared library: " + why);
  }
  lib->handle_ = std::make_unique<PluginLibrary::Handle>();
  try {
    lib->handle_->lib.load(lib->path_, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    bad(Errc::invalid_argument, std::string("cannot be loaded as a shared library: ") + e.what());
  }
  auto& dl = lib->handle_->lib;
  if (!dl.has("loom_plugin_init"))
    bad(Errc::invalid_argument,
        "does not export loom_plugin_init (not a Loom plugin, or built without LOOM_PLUGIN_DEFINE)");
  if (dl.has("loom_plugin_score")) {
    lib->score_ = dl.get<int32_t()>("loom_plugin_score")();
    if (lib->score_ <= 0)
      bad(Errc::unsupported, "loom_plugin_score() is 0: the plugin cannot run on this machine");
  }
  const auto init = dl.get<const loom_plugin*(const loom_host_api*, uint32_t, uint32_t)>("loom_plugin_init");
  const loom_plugin* p = init(host_api(), LOOM_ABI_MAJOR, LOOM_ABI_MINOR);
  if (!p)
    bad(Errc::abi_mismatch, "loom_plugin_init refused the host (ABI " + std::to_string(LOOM_ABI_MAJOR) + "." +
                                std::to_string(LOOM_ABI_MINOR) + "); rebuild the plugin against this SDK");
  if (p->struct_size < sizeof(loom_plugin) || p->abi_major != LOOM_ABI_MAJOR)
    bad(Errc::abi_mismatch, "built for ABI " + std::to_string(p->abi_major) + "." +
                                std::to_string(p->abi_minor) + ", the host speaks ABI " +
                                std::to_string(LOOM_ABI_MAJOR) + "." + std::to_string(LOOM_ABI_MINOR) +
                                " (the major must match); rebuild it against this SDK");
  if (!p->name || !p->version || (p->n_factories > 0 && !p->factories))
    bad(Errc::invalid_argument, "its loom_plugin table is incomplete (name, version or factories missing)");
  if (p->n_factories > 0 && p->factories[0].struct_size < sizeof(loom_factory))
    bad(Errc::abi_mismatch, "its loom_factory entries are smaller than ABI 1.0's");
  for (size_t i = 0; i < p->n_factories; ++i) {
    const loom_factory& f = factory_at(*p, i);
    if (!f.name || !f.create)
      bad(Errc::invalid_argument, "factory " + std::to_string(i) + " has no name or create function");
  }
  lib->plugin_ = p;
  loaded_libraries()[canonical] = lib;
  return lib;
}

std::vector<PluginInfo> PluginRegistry::discover(const std::vector<std::string>& dirs,
                                                 const std::map<std::string, std::string>& pins) {
  std::vector<PluginInfo> out;
  std::vector<std::string> files;
  for (const auto& d : dirs) {
    std::error_code ec;
    if (!fs::is_directory(d, ec)) continue;
    std::vector<std::string> here;
    for (const auto& e : fs::directory_iterator(d, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("libloom-", 0) == 0 && e.path().extension() == ".so")
        here.push_back(fs::weakly_canonical(e.path(), ec).string());
    }
    std::sort(here.begin(), here.end());
    for (auto& f : here)
      if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
  }
  for (const auto& f : files) {
    PluginInfo info;
    info.path = f;
    try {
      info.sha256 = file_sha256(f);
      // A pin is matched by plugin name once the plugin is known; load without it first.
      auto lib = load(f);
      const loom_plugin& p = lib->plugin();
      info.name = p.name;
      info.version = p.version;
      info.abi_major = p.abi_major;
      info.abi_minor = p.abi_minor;
      info.score = lib->score();
      for (size_t i = 0; i < p.n_factories; ++i)
        info.factories.push_back({std::string(kind_name(factory_at(p, i).kind)), factory_at(p, i).name});
      if (auto it = pins.find(info.name); it != pins.end() && it->second != info.sha256)
        fail(Errc::invalid_argument, "plugin",
             f + ": sha256 is " + info.sha256 + " but the pipeline pins " + it->second + " for plugin '" +
                 info.name + "' — the file changed; rebuild it or update the pin");
      // The same plugin name seen again: keep the higher score (ISA variants of one backend).
      auto same = std::find_if(libs_.begin(), libs_.end(),
                               [&](const auto& l) { return std::string(l->plugin().name) == info.name; });
      if (same == libs_.end()) {
        libs_.push_back(lib);
      } else if ((*same)->path() == lib->path()) {
        // loaded twice: the same file, nothing to do
      } else if (lib->score() > (*same)->score()) {
        *same = lib;
      }
    } catch (const Error& e) {
      info.error = e.what();
      const std::string prefix = "plugin: " + f + ": ";
      if (info.error.rfind(prefix, 0) == 0) info.error = info.error.substr(prefix.size());
      info.skipped = e.code() == Errc::unsupported;
    }
    out.push_back(std::move(info));
  }
  last_ = out;
  return out;
}

std::optional<PluginRegistry::Found> PluginRegistry::find(int32_t kind, std::string_view name) const {
  for (const auto& l : libs_) {
    const loom_plugin& p = l->plugin();
    for (size_t i = 0; i < p.n_factories; ++i)
      if (factory_at(p, i).kind == kind && name == factory_at(p, i).name) return Found{l, &factory_at(p, i)};
  }
  return std::nullopt;
}

std::string PluginRegistry::available(int32_t kind) const {
  std::string s;
  for (const auto& l : libs_) {
    const loom_plugin& p = l->plugin();
    for (size_t i = 0; i < p.n_factories; ++i)
      if (factory_at(p, i).kind == kind)
        s += (s.empty() ? "" : ", ") + std::string(factory_at(p, i).name) + " (" + p.name + ")";
  }
  return s.empty() ? "none" : s;
}

std::string PluginRegistry::failures() const {
  std::string s;
  for (const auto& i : last_)
    if (!i.error.empty() && !i.skipped) s += "\n  " + i.path + ": " + i.error;
  return s;
}

} // namespace loom
