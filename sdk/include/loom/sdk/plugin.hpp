// loom/sdk/plugin.hpp — header-only C++ wrapper over abi.h for plugin authors.
//
// Subclass loom::Sampler (loom/sdk/sampler.hpp), loom::sdk::Decoder / StopCriterion / Verifier (they may
// throw), then list them in one
// LOOM_PLUGIN_DEFINE, which emits the two C exports and noexcept trampolines that turn exceptions
// into statuses:
//
//   class BestOfN final : public loom::sdk::Decoder { ... };
//   LOOM_PLUGIN_DEFINE("best_of_n", "1.0.0", LOOM_DECODER("best_of_n", BestOfN));
//
// Constructors take a loom::sdk::Config: read every key there (unknown keys are errors for the user).
// Nothing here is exported: build with hidden visibility (loom_add_plugin() does).
#pragma once

#include "loom/sdk/abi.h"
#include "loom/sdk/error.hpp"
#include "loom/sdk/sampler.hpp"
#include "loom/sdk/stop.hpp"
#include "loom/sdk/verifier.hpp"

#include <cstdarg>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace loom::sdk {

// The host minor whose tables the plugin asks for (abi.h: loom_host.get_api). Define it lower before
// including this header to run on older 2.x hosts, using only what that minor has.
#ifndef LOOM_SDK_TARGET_MINOR
#define LOOM_SDK_TARGET_MINOR LOOM_ABI_MINOR
#endif

namespace detail {
struct HostTables {
  const loom_host* host = nullptr;
  const loom_core_api* core = nullptr;
  const loom_config_api* config = nullptr;
  const loom_session_api* session = nullptr;
};
inline HostTables& tables() noexcept {
  static HostTables t; // set by loom_plugin_init; one per plugin (hidden)
  return t;
}
inline const char*& plugin_name_ref() noexcept {
  static const char* n = "plugin";
  return n;
}
// Asks the host for every table at LOOM_SDK_TARGET_MINOR; false (after one log line) when the host is
// older than that minor or speaks another major.
inline bool bind_host(const loom_host* h, uint32_t abi_major, const char* name) noexcept {
  if (!h) return false;
  char line[200];
  if (abi_major != LOOM_ABI_MAJOR) {
    std::snprintf(line, sizeof line,
                  "the host speaks ABI %u.x, this plugin ABI %u.x: rebuild it against the host's SDK",
                  abi_major, LOOM_ABI_MAJOR);
    if (h->log) h->log(LOOM_LOG_ERROR, name, line);
    return false;
  }
  HostTables t;
  t.host = h;
  if (h->struct_size >= offsetof(loom_host, get_api) + sizeof(h->get_api) && h->get_api) {
    t.core = static_cast<const loom_core_api*>(h->get_api(LOOM_API_CORE, LOOM_SDK_TARGET_MINOR));
    t.config = static_cast<const loom_config_api*>(h->get_api(LOOM_API_CONFIG, LOOM_SDK_TARGET_MINOR));
    t.session = static_cast<const loom_session_api*>(h->get_api(LOOM_API_SESSION, LOOM_SDK_TARGET_MINOR));
  }
  if (!t.core || !t.config || !t.session) {
    std::snprintf(
        line, sizeof line,
        "the host (ABI %u.%u) is older than this plugin's ABI %u.%u: upgrade Loom, or build the plugin "
        "with LOOM_SDK_TARGET_MINOR=%u",
        h->abi_major, h->abi_minor, LOOM_ABI_MAJOR, static_cast<unsigned>(LOOM_SDK_TARGET_MINOR),
        h->abi_minor);
    if (h->log) h->log(LOOM_LOG_ERROR, name, line);
    return false;
  }
  tables() = t;
  return true;
}
} // namespace detail

// The host and its tables (valid from loom_plugin_init on).
inline const loom_host& host() {
  return *detail::tables().host;
}
inline const loom_core_api& core_api() {
  return *detail::tables().core;
}
inline const loom_config_api& config_api() {
  return *detail::tables().config;
}
inline const loom_session_api& session_api() {
  return *detail::tables().session;
}

// Thrown by plugin code (loom/sdk/error.hpp's, the host's too); a status with its code at the boundary.
using Error = loom::Error;

// A status from the host becomes an exception inside plugin code. Left alone it reaches the boundary
// and the host reports it with its full text; plugin code that handles it instead reads code() and
// message() and calls release() (status_code, status_message, status_free).
struct StatusError : std::exception {
  loom_status* status;
  explicit StatusError(loom_status* s) : status(s) {}
  const char* what() const noexcept override {
    return status ? core_api().status_message(status) : "host call failed";
  }
  int32_t code() const noexcept { return status ? core_api().status_code(status) : 0; }
  std::string message() const { return what(); }
  void release() noexcept {
    if (status) core_api().status_free(status);
    status = nullptr;
  }
};
inline void check(loom_status* s) {
  if (s) throw StatusError(s);
}

inline void log(loom_log_level level, const std::string& msg) {
  if (detail::tables().host) host().log(level, detail::plugin_name_ref(), msg.c_str());
}

// Converts the exception in flight into a status for the host.
inline loom_status* current_exception_to_status() noexcept {
  try {
    throw;
  } catch (const StatusError& e) {
    if (e.status) return e.status;
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

// ---- decoders -----------------------------------------------------------------------------

// One request as its decoder sees it. Sequence 0 holds the prompt.
class Session {
public:
  explicit Session(loom_session* s) : s_(s) {}
  int32_t n_vocab() const { return session_api().n_vocab(s_); }
  size_t n_prompt() const { return session_api().n_prompt(s_); }
  int32_t max_new_tokens() const { return session_api().max_new_tokens(s_); }
  // -1 when the KV cache has no free sequence (recoverable: go on with fewer sequences).
  loom_seq fork(loom_seq parent) {
    loom_seq child = -1;
    check(session_api().seq_fork(s_, parent, &child));
    return child;
  }
  void free(loom_seq seq) { session_api().seq_free(s_, seq); }
  void truncate(loom_seq seq, size_t n) { check(session_api().seq_truncate(s_, seq, n)); }
  // Returns the stop reason the token caused (LOOM_STOP_NONE = go on).
  int32_t append(loom_seq seq, loom_token t) {
    int32_t reason = 0;
    check(session_api().seq_append(s_, seq, t, &reason));
    return reason;
  }
  std::span<const loom_token> tokens(loom_seq seq) const {
    const loom_token* p = nullptr;
    const size_t n = session_api().seq_tokens(s_, seq, &p);
    return {p, n};
  }
  size_t n_generated(loom_seq seq) const { return session_api().seq_n_generated(s_, seq); }
  int32_t finished(loom_seq seq) const { return session_api().seq_finished(s_, seq); }
  void plan(loom_seq seq) { check(session_api().plan(s_, seq)); }
  std::span<const float> logits(loom_seq seq) const {
    const float* p = session_api().seq_logits(s_, seq);
    return p ? std::span<const float>(p, static_cast<size_t>(n_vocab())) : std::span<const float>();
  }
  loom_token sample(loom_seq seq) {
    loom_token t = -1;
    check(session_api().seq_sample(s_, seq, &t));
    return t;
  }
  float logprob(loom_seq seq, loom_token t) const { return session_api().seq_logprob(s_, seq, t); }
  void finish(loom_seq seq, int32_t reason, double score) {
    check(session_api().seq_finish(s_, seq, reason, score));
  }
  double score(loom_seq seq) const { return session_api().seq_score(s_, seq); }
  void set_stream(loom_seq seq) { session_api().set_stream(s_, seq); }
  // Tokens of a text with the request's tokenizer (add_special: BOS as the model adds it;
  // parse_special: special-token texts are tokens).
  std::vector<loom_token> tokenize(std::string_view text, bool add_special = false,
                                   bool parse_special = false) const {
    std::vector<loom_token> out(text.size() + 2);
    size_t n = session_api().tokenize(s_, text.data(), text.size(), add_special ? 1 : 0,
                                      parse_special ? 1 : 0, out.data(), out.size());
    if (n > out.size()) {
      out.resize(n);
      n = session_api().tokenize(s_, text.data(), text.size(), add_special ? 1 : 0, parse_special ? 1 : 0,
                                 out.data(), out.size());
    }
    out.resize(n);
    return out;
  }
  std::string detokenize(std::span<const loom_token> toks) const {
    std::string out(64, '\0');
    size_t n = session_api().detokenize(s_, toks.data(), toks.size(), out.data(), out.size());
    if (n > out.size()) {
      out.resize(n);
      n = session_api().detokenize(s_, toks.data(), toks.size(), out.data(), out.size());
    }
    out.resize(n);
    return out;
  }
  void add_result(loom_seq seq, double score) { check(session_api().add_result(s_, seq, score)); }
  // The pipeline's verifier ([verifier]) on a text: a score in [0, 1]. Throws (LOOM_STATUS_NOT_FOUND)
  // when the pipeline names none: a decoder that needs one says so at start (has_verifier()).
  double verify(std::string_view text) {
    double v = 0;
    check(session_api().verify(s_, text.data(), text.size(), &v));
    return v;
  }
  // The verifier on several texts at once (a judge model scores them in one batched forward): one
  // outcome each — a score, or why that text failed (the others are still scored). Throws only when the
  // pipeline names no verifier.
  std::vector<VerifyOutcome> verify_many(std::span<const std::string> texts) {
    std::vector<VerifyOutcome> r(texts.size());
    std::vector<const char*> ptr(texts.size());
    std::vector<size_t> len(texts.size());
    std::vector<double> score(texts.size());
    std::vector<loom_status*> st(texts.size(), nullptr);
    for (size_t i = 0; i < texts.size(); ++i) {
      ptr[i] = texts[i].data();
      len[i] = texts[i].size();
    }
    check(session_api().verify_many(s_, ptr.data(), len.data(), texts.size(), score.data(), st.data()));
    for (size_t i = 0; i < texts.size(); ++i) {
      if (st[i]) {
        r[i].error = core_api().status_message(st[i]);
        core_api().status_free(st[i]);
      } else {
        r[i].score = score[i];
      }
    }
    return r;
  }
  bool has_verifier() {
    double v = 0;
    check(session_api().verify(s_, nullptr, 0, &v)); // a NULL text only asks
    return v == 1.0;
  }
  // A field of the result (`--json` top level): `json` is one JSON value.
  void set_output(const std::string& key, const std::string& json) {
    check(session_api().set_output(s_, key.c_str(), json.c_str()));
  }
  // ---- speculative decoding ----
  // Uncommitted tokens after the committed ones, evaluated by the next plan with a logits row after
  // each (logits_at). Returns how many the context had room for.
  size_t set_draft(loom_seq seq, std::span<const loom_token> toks) {
    size_t kept = 0;
    check(session_api().seq_set_draft(s_, seq, toks.data(), toks.size(), &kept));
    return kept;
  }
  // Commits the first n draft tokens (as append would); returns the stop reason they caused.
  int32_t commit(loom_seq seq, size_t n) {
    int32_t reason = 0;
    check(session_api().seq_commit(s_, seq, n, &reason));
    return reason;
  }
  size_t n_draft(loom_seq seq) const { return session_api().seq_n_draft(s_, seq); }
  std::span<const float> logits_at(loom_seq seq, size_t row) const {
    const float* p = session_api().seq_logits_at(s_, seq, row);
    return p ? std::span<const float>(p, static_cast<size_t>(n_vocab())) : std::span<const float>();
  }
  // The sampler chain's distribution of seq's next token (row 0): out.size() ≥ n_vocab.
  void probs(loom_seq seq, std::span<float> out) {
    check(session_api().seq_probs(s_, seq, out.data(), out.size()));
  }
  bool has_draft_model() const { return session_api().has_draft(s_) == 1; }
  // Token trees: node i is tokens[i], a child of node parents[i] < i (-1: of the last committed
  // token); evaluated in one forward with row 1 + i after node i. Returns the nodes kept (context room).
  size_t set_draft_tree(loom_seq seq, std::span<const loom_token> tokens, std::span<const int32_t> parents) {
    if (tokens.size() != parents.size()) throw Error("set_draft_tree: one parent per token");
    size_t kept = 0;
    check(session_api().seq_set_draft_tree(s_, seq, tokens.data(), parents.data(), tokens.size(), &kept));
    return kept;
  }
  // Commits node `node` (a child of the last committed node, or of the root at first); returns the stop
  // reason it caused. Its row becomes row 0.
  int32_t commit_node(loom_seq seq, int32_t node) {
    int32_t reason = LOOM_STOP_NONE;
    check(session_api().seq_commit_node(s_, seq, node, &reason));
    return reason;
  }
  int32_t max_tree_nodes(loom_seq seq) const { return session_api().seq_max_tree_nodes(s_, seq); }
  int32_t max_tree_depth(loom_seq seq) const { return session_api().seq_max_tree_depth(s_, seq); }
  // A sequence on the pipeline's draft model with parent's committed tokens; -1 when its KV is full.
  loom_seq fork_draft(loom_seq parent) {
    loom_seq child = -1;
    check(session_api().seq_fork_draft(s_, parent, &child));
    return child;
  }
  void set_metric(const std::string& key, double value) {
    check(session_api().set_metric(s_, key.c_str(), value));
  }
  double uniform() { return session_api().uniform(s_); } // [0, 1), the request's RNG
  loom_session* raw() const { return s_; }

private:
  loom_session* s_;
};

class Decoder {
public:
  virtual ~Decoder() = default;
  virtual void start(Session&) {}
  virtual void plan(Session& s) = 0;
  virtual void update(Session& s) = 0;
  virtual bool done(const Session& s) const = 0;
  virtual void results(Session& s) = 0;
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
