// loom/sdk/plugin.hpp — what a plugin library is made of: its factories, the noexcept trampolines that turn
// the interfaces of loom/sdk/ (Sampler, StopCriterion, Verifier, Decoder) into abi.h's C tables, and the
// two exports.
//
// Subclass loom::Sampler, loom::StopCriterion, loom::Verifier or loom::Decoder (they may throw), then
// list them in one LOOM_PLUGIN_DEFINE, which emits the two C exports and trampolines that turn
// exceptions into statuses:
//
//   class BestOfN final : public loom::Decoder { ... };
//   LOOM_PLUGIN_DEFINE("best_of_n", "1.0.0", LOOM_DECODER("best_of_n", BestOfN));
//
// Constructors take a loom::sdk::Config: read every key there (unknown keys are errors for the user).
// Nothing here is exported: build with hidden visibility (loom_add_plugin() does).
#pragma once

#include "loom/sdk/abi.h"
#include "loom/sdk/decoder.hpp"
#include "loom/sdk/error.hpp"
#include "loom/sdk/host.hpp"
#include "loom/sdk/sampler.hpp"
#include "loom/sdk/stop.hpp"
#include "loom/sdk/verifier.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::sdk {

// Converts the exception in flight into a status for the host.
inline loom_status* current_exception_to_status() noexcept {
  try {
    throw;
  } catch (const StatusError& e) {
    if (loom_status* s = e.take()) return s;
    return core_api().status_create(LOOM_STATUS_INTERNAL, "a host status rethrown after release()");
  } catch (const Error& e) {
    return core_api().status_create(status_code(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return core_api().status_create(LOOM_STATUS_OUT_OF_MEMORY, "out of memory in plugin");
  } catch (const std::exception& e) {
    return core_api().status_create(LOOM_STATUS_INTERNAL, e.what());
  } catch (...) {
    return core_api().status_create(LOOM_STATUS_INTERNAL, "unknown exception in plugin");
  }
}

#define LOOM_SDK_TRY try {
#define LOOM_SDK_CATCH                                                                                       \
  }                                                                                                          \
  catch (...) {                                                                                              \
    return ::loom::sdk::current_exception_to_status();                                                       \
  }                                                                                                          \
  return nullptr;

// The plugin's TOML table (valid during the constructor only).
class Config {
public:
  explicit Config(const loom_config* c) : c_(c) {}
  int64_t get_i64(const char* key, int64_t def) const {
    int64_t v = def;
    check(config_api().get_i64(c_, key, def, &v));
    return v;
  }
  double get_f64(const char* key, double def) const {
    double v = def;
    check(config_api().get_f64(c_, key, def, &v));
    return v;
  }
  bool get_bool(const char* key, bool def) const {
    int32_t v = def ? 1 : 0;
    check(config_api().get_bool(c_, key, def ? 1 : 0, &v));
    return v != 0;
  }
  std::string get_str(const char* key, const char* def) const {
    const char* v = def;
    check(config_api().get_str(c_, key, def, &v));
    return v ? v : "";
  }
  bool has(const char* key) const { return config_api().has(c_, key) != 0; }
  // An array of integers (`ban = [1, 2]`), or of numbers (an integer array reads as numbers too); a
  // missing key gives `def`.
  std::vector<int64_t> get_i64_array(const char* key, std::vector<int64_t> def = {}) const {
    if (!has(key)) return def;
    const int64_t* v = nullptr;
    size_t n = 0;
    check(config_api().get_i64_array(c_, key, &v, &n));
    return std::vector<int64_t>(v, v + n);
  }
  std::vector<double> get_f64_array(const char* key, std::vector<double> def = {}) const {
    if (!has(key)) return def;
    const double* v = nullptr;
    size_t n = 0;
    check(config_api().get_f64_array(c_, key, &v, &n));
    return std::vector<double>(v, v + n);
  }
  // The value's type (LOOM_CONFIG_*), for keys that accept several; LOOM_CONFIG_NONE when absent.
  // Reading the value still goes through a typed getter.
  int32_t type(const char* key) const { return config_api().type(c_, key); }

private:
  const loom_config* c_;
};

// ---- trampolines (noexcept; exceptions become statuses) -----------------------------------

namespace detail {

template <class T> struct SamplerTable {
  // The host's loom_candidates as the Candidates view over the same memory; what the sampler did to
  // the view (shrink, reorder, select) is written back.
  static loom_status* apply(void* self, loom_candidates* c, const loom_sampler_ctx* ctx) noexcept {
    LOOM_SDK_TRY
    if (c->data_size != sizeof(TokenData))
      throw Error(Errc::abi_mismatch, "sampler",
                  "the host's candidates are " + std::to_string(c->data_size) +
                      " bytes each, this plugin's " + std::to_string(sizeof(TokenData)) +
                      ": rebuild it against the host's SDK");
    TokenData* const data = reinterpret_cast<TokenData*>(c->data);
    Candidates view{std::span<TokenData>(data, c->size), c->sorted != 0, c->has_probs != 0, c->selected};
    const SamplerContext sc{{ctx->prompt, ctx->n_prompt},
                            {ctx->generated, ctx->n_generated},
                            ctx->rng_state,
                            core_api().rng_uniform,
                            nullptr};
    static_cast<T*>(self)->apply(view, sc);
    if (view.data.data() != data || view.data.size() > c->size)
      throw Error(Errc::internal, "sampler", "apply() pointed the candidates elsewhere or grew them");
    c->size = view.data.size();
    c->sorted = view.sorted ? 1 : 0;
    c->has_probs = view.has_probs ? 1 : 0;
    c->selected = view.selected;
    LOOM_SDK_CATCH
  }
  static void accept(void* self, loom_token t) noexcept {
    try {
      static_cast<T*>(self)->accept(t);
    } catch (...) {
      log(LOOM_LOG_ERROR, "sampler accept() threw; ignored");
    }
  }
  static void reset(void* self) noexcept {
    try {
      static_cast<T*>(self)->reset();
    } catch (...) {
      log(LOOM_LOG_ERROR, "sampler reset() threw; ignored");
    }
  }
  static loom_status* clone(const void* self, void** out) noexcept {
    LOOM_SDK_TRY
    *out = static_cast<const T*>(self)->clone().release();
    LOOM_SDK_CATCH
  }
  static int32_t selects(const void* self) noexcept {
    try {
      return static_cast<const T*>(self)->selects() ? 1 : 0;
    } catch (...) {
      return 0;
    }
  }
  static void destroy(void* self) noexcept { delete static_cast<Sampler*>(static_cast<T*>(self)); }
  static constexpr loom_sampler_i table = {
      sizeof(loom_sampler_i), &apply, &accept, &reset, &clone, &selects, &destroy};
};

template <class T> struct StopTable {
  static loom_status* check_fn(void* self, const loom_stop_input* in, loom_stop_verdict* out) noexcept {
    LOOM_SDK_TRY
    thread_local std::string matched; // the verdict's text lives until this thread's next check
    const StopInput input{
        in->token, std::string_view(in->piece, in->piece_len), {in->generated, in->n_generated}};
    StopVerdict v = static_cast<T*>(self)->check(input);
    matched = std::move(v.matched);
    *out = loom_stop_verdict{static_cast<int32_t>(v.reason), v.drop, matched.data(), matched.size()};
    LOOM_SDK_CATCH
  }
  static size_t holdback(const void* self) noexcept {
    try {
      return static_cast<const T*>(self)->holdback_bytes();
    } catch (...) {
      return 0;
    }
  }
  static loom_status* clone(const void* self, void** out) noexcept {
    LOOM_SDK_TRY
    *out = static_cast<const T*>(self)->clone().release();
    LOOM_SDK_CATCH
  }
  static void destroy(void* self) noexcept { delete static_cast<StopCriterion*>(static_cast<T*>(self)); }
  static constexpr loom_stop_i table = {sizeof(loom_stop_i), &check_fn, &holdback, &clone, &destroy};
};

template <class T> struct DecoderTable {
  static loom_status* start(void* self, loom_session* s) noexcept {
    LOOM_SDK_TRY
    Session ss(s);
    static_cast<T*>(self)->start(ss);
    LOOM_SDK_CATCH
  }
  static loom_status* plan(void* self, loom_session* s) noexcept {
    LOOM_SDK_TRY
    Session ss(s);
    static_cast<T*>(self)->plan(ss);
    LOOM_SDK_CATCH
  }
  static loom_status* update(void* self, loom_session* s) noexcept {
    LOOM_SDK_TRY
    Session ss(s);
    static_cast<T*>(self)->update(ss);
    LOOM_SDK_CATCH
  }
  static int32_t done(void* self, const loom_session* s) noexcept {
    try {
      const Session ss(const_cast<loom_session*>(s));
      return static_cast<T*>(self)->done(ss) ? 1 : 0;
    } catch (...) {
      log(LOOM_LOG_ERROR, "decoder done() threw; treating the request as done");
      return 1;
    }
  }
  static loom_status* results(void* self, loom_session* s) noexcept {
    LOOM_SDK_TRY
    Session ss(s);
    static_cast<T*>(self)->results(ss);
    LOOM_SDK_CATCH
  }
  static void destroy(void* self) noexcept { delete static_cast<Decoder*>(static_cast<T*>(self)); }
  static constexpr loom_decoder_i table = {
      sizeof(loom_decoder_i), &start, &plan, &update, &done, &results, &destroy};
};

template <class T, class Table>
loom_status* create(const loom_config* cfg, void** out_self, const void** out_vtable) noexcept {
  LOOM_SDK_TRY
  Config c(cfg);
  *out_self = new T(c);
  *out_vtable = &Table::table;
  LOOM_SDK_CATCH
}

template <class T> struct VerifierTable {
  static loom_status* score_fn(void* self, const char* prompt, size_t prompt_len, const char* text,
                               size_t len, const char* task, size_t task_len, double* out) noexcept {
    LOOM_SDK_TRY
    *out = static_cast<T*>(self)->score(std::string_view(prompt, prompt_len), std::string_view(text, len),
                                        task ? std::string_view(task, task_len) : std::string_view());
    LOOM_SDK_CATCH
  }
  static void destroy(void* self) noexcept { delete static_cast<Verifier*>(static_cast<T*>(self)); }
  static constexpr loom_verifier_i table = {sizeof(loom_verifier_i), &score_fn, &destroy};
};

} // namespace detail

template <class T> constexpr loom_factory sampler_factory(const char* name) {
  return {sizeof(loom_factory), LOOM_KIND_SAMPLER, name, &detail::create<T, detail::SamplerTable<T>>};
}
template <class T> constexpr loom_factory stop_factory(const char* name) {
  return {sizeof(loom_factory), LOOM_KIND_STOP, name, &detail::create<T, detail::StopTable<T>>};
}
template <class T> constexpr loom_factory decoder_factory(const char* name) {
  return {sizeof(loom_factory), LOOM_KIND_DECODER, name, &detail::create<T, detail::DecoderTable<T>>};
}
template <class T> constexpr loom_factory verifier_factory(const char* name) {
  return {sizeof(loom_factory), LOOM_KIND_VERIFIER, name, &detail::create<T, detail::VerifierTable<T>>};
}

} // namespace loom::sdk

// The plugin's static descriptor: its name and factories as bytes in the ELF section
// ".loom_plugin", so that the host can tell what a file provides — and check a sha256 pin — without
// loading it (no constructor runs). Layout: the magic "loom-plugin-descriptor-2", the plugin name, then
// per factory its kind as one digit, ':' and its name; every string NUL-terminated, an empty one last.
namespace loom::sdk::detail {
inline constexpr char k_descriptor_magic[] = "loom-plugin-descriptor-2";
constexpr size_t descriptor_strlen(const char* s) {
  size_t n = 0;
  while (s[n] != 0)
    ++n;
  return n;
}
template <size_t N> struct PluginDescriptor { char bytes[N]; };
template <size_t F> constexpr size_t descriptor_size(const char* name, const loom_factory (&f)[F]) {
  size_t n = sizeof(k_descriptor_magic) + descriptor_strlen(name) + 1 + 1;
  for (const loom_factory& x : f)
    n += 2 + descriptor_strlen(x.name) + 1;
  return n;
}
template <size_t N, size_t F>
constexpr PluginDescriptor<N> make_descriptor(const char* name, const loom_factory (&f)[F]) {
  PluginDescriptor<N> d{};
  size_t at = 0;
  const auto put = [&](const char* s) {
    while (*s != 0)
      d.bytes[at++] = *s++;
    d.bytes[at++] = 0;
  };
  put(k_descriptor_magic);
  put(name);
  for (const loom_factory& x : f) {
    d.bytes[at++] = static_cast<char>('0' + x.kind);
    d.bytes[at++] = ':';
    put(x.name);
  }
  d.bytes[at++] = 0;
  return d;
}
} // namespace loom::sdk::detail

#define LOOM_SAMPLER(NAME, TYPE) ::loom::sdk::sampler_factory<TYPE>(NAME)
#define LOOM_STOP(NAME, TYPE) ::loom::sdk::stop_factory<TYPE>(NAME)
#define LOOM_DECODER(NAME, TYPE) ::loom::sdk::decoder_factory<TYPE>(NAME)
#define LOOM_VERIFIER(NAME, TYPE) ::loom::sdk::verifier_factory<TYPE>(NAME)

// Defines the two exports. SCORE is an expression evaluated by loom_plugin_score() (0 = cannot run
// here, higher wins among variants of one plugin); SHUTDOWN is a `void(void)` function or nullptr,
// called once when the host is done with the library (join threads, free device memory).
#define LOOM_PLUGIN_DEFINE_FULL(NAME, VERSION, SCORE, SHUTDOWN, ...)                                         \
  LOOM_PLUGIN_DEFINE_DESCRIBED(NAME, VERSION, SCORE, SHUTDOWN, nullptr, __VA_ARGS__)

// DESCRIBE: `const char* f()` (noexcept), one line for `loom plugins`, or nullptr.
#define LOOM_PLUGIN_DEFINE_DESCRIBED(NAME, VERSION, SCORE, SHUTDOWN, DESCRIBE, ...)                          \
  namespace {                                                                                                \
  constexpr loom_factory loom_plugin_factories_[] = {__VA_ARGS__};                                           \
  [[gnu::used, gnu::section(".loom_plugin")]] constexpr auto loom_plugin_descriptor_ =                       \
      ::loom::sdk::detail::make_descriptor<::loom::sdk::detail::descriptor_size(                             \
          NAME, loom_plugin_factories_)>(NAME, loom_plugin_factories_);                                      \
  }                                                                                                          \
  extern "C" LOOM_EXPORT int32_t loom_plugin_score(void) {                                                   \
    return (SCORE);                                                                                          \
  }                                                                                                          \
  extern "C" LOOM_EXPORT const loom_plugin* loom_plugin_init(const loom_host* h, uint32_t abi_major,         \
                                                             uint32_t abi_minor) {                           \
    (void)abi_minor;                                                                                         \
    if (!::loom::sdk::detail::bind_host(h, abi_major, NAME)) return nullptr;                                 \
    ::loom::sdk::detail::plugin_name_ref() = NAME;                                                           \
    static const loom_plugin plugin = {sizeof(loom_plugin),                                                  \
                                       LOOM_ABI_MAJOR,                                                       \
                                       LOOM_ABI_MINOR,                                                       \
                                       NAME,                                                                 \
                                       VERSION,                                                              \
                                       sizeof(loom_plugin_factories_) / sizeof(loom_plugin_factories_[0]),   \
                                       loom_plugin_factories_,                                               \
                                       SHUTDOWN,                                                             \
                                       DESCRIBE};                                                            \
    return &plugin;                                                                                          \
  }

#define LOOM_PLUGIN_DEFINE_SCORED(NAME, VERSION, SCORE, ...)                                                 \
  LOOM_PLUGIN_DEFINE_FULL(NAME, VERSION, SCORE, nullptr, __VA_ARGS__)
#define LOOM_PLUGIN_DEFINE(NAME, VERSION, ...) LOOM_PLUGIN_DEFINE_FULL(NAME, VERSION, 1, nullptr, __VA_ARGS__)
