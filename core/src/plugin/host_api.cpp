// The host's services (loom_host and the tables it hands out by version): statuses, logging,
// configuration, RNG and the decoder session API. Every entry point is noexcept; host errors become statuses.
#include "loom/engine/engine.hpp"
#include "plugin_internal.hpp"

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <variant>

namespace loom {

namespace {

int32_t level_from_env() {
  const char* e = std::getenv("LOOM_LOG_LEVEL");
  if (!e) return LOOM_LOG_WARN;
  const std::string s(e);
  if (s == "debug") return LOOM_LOG_DEBUG;
  if (s == "info") return LOOM_LOG_INFO;
  if (s == "error") return LOOM_LOG_ERROR;
  return LOOM_LOG_WARN;
}

std::mutex& log_mutex() {
  static std::mutex m;
  return m;
}
LogSink& log_sink() {
  static LogSink s;
  return s;
}

thread_local std::string* t_init_log = nullptr; // plugin::InitLogCapture

void host_log(int32_t level, const char* plugin, const char* message) noexcept {
  try {
    const std::string_view p = plugin ? plugin : "plugin";
    const std::string_view m = message ? message : "";
    if (t_init_log && level >= LOOM_LOG_WARN) { // a refusal's reason becomes part of the load error
      if (!t_init_log->empty()) *t_init_log += "; ";
      *t_init_log += m;
      return;
    }
    std::lock_guard<std::mutex> lock(log_mutex());
    if (log_sink()) {
      log_sink()(level, p, m);
      return;
    }
    static const int32_t min_level = level_from_env();
    if (level < min_level) return;
    const char* names[] = {"debug", "info", "warn", "error"};
    std::fprintf(stderr, "loom: [%.*s] %s: %.*s\n", static_cast<int>(p.size()), p.data(),
                 names[std::clamp(level, 0, 3)], static_cast<int>(m.size()), m.data());
  } catch (...) {
  }
}

loom_status k_oom_status{LOOM_STATUS_OUT_OF_MEMORY, "out of memory"}; // returned when allocation fails

loom_status* status_create(int32_t code, const char* message) noexcept {
  try {
    return new loom_status{code, message ? message : ""};
  } catch (...) {
    return &k_oom_status; // never freed (see throw_if)
  }
}

loom_status* err(int32_t code, const std::string& msg) noexcept {
  return status_create(code, msg.c_str());
}

template <class F> loom_status* guarded(F&& f) noexcept {
  try {
    f();
    return nullptr;
  } catch (const Error& e) {
    const int32_t code = status_code(e.code());
    return err(code, e.what());
  } catch (const std::exception& e) {
    return err(LOOM_STATUS_INTERNAL, e.what());
  } catch (...) {
    return err(LOOM_STATUS_INTERNAL, "unknown host error");
  }
}

// ---- configuration ----

const ParamValue* lookup(const loom_config* cfg, const char* key) {
  if (!cfg || !key || !cfg->params) return nullptr;
  auto* c = const_cast<loom_config*>(cfg); // reads are recorded (unknown-key check)
  c->read.insert(key);
  for (const auto& [k, v] : *cfg->params)
    if (k == key) return &v;
  return nullptr;
}

loom_status* type_error(const loom_config* cfg, const char* key, const char* expected) {
  return err(LOOM_STATUS_INVALID_ARGUMENT,
             (cfg ? cfg->where : std::string("config")) + ": key '" + key + "': expected " + expected);
}

loom_status* config_get_i64(const loom_config* cfg, const char* key, int64_t def, int64_t* out) noexcept {
  const ParamValue* v = lookup(cfg, key);
  if (!v) {
    *out = def;
    return nullptr;
  }
  if (const auto* i = std::get_if<int64_t>(v)) {
    *out = *i;
    return nullptr;
  }
  return type_error(cfg, key, "an integer");
}

loom_status* config_get_f64(const loom_config* cfg, const char* key, double def, double* out) noexcept {
  const ParamValue* v = lookup(cfg, key);
  if (!v) {
    *out = def;
    return nullptr;
  }
  if (const auto* d = std::get_if<double>(v)) {
    *out = *d;
    return nullptr;
  }
  if (const auto* i = std::get_if<int64_t>(v)) {
    *out = static_cast<double>(*i);
    return nullptr;
  }
  return type_error(cfg, key, "a number");
}

loom_status* config_get_bool(const loom_config* cfg, const char* key, int32_t def, int32_t* out) noexcept {
  const ParamValue* v = lookup(cfg, key);
  if (!v) {
    *out = def;
    return nullptr;
  }
  if (const auto* b = std::get_if<bool>(v)) {
    *out = *b ? 1 : 0;
    return nullptr;
  }
  return type_error(cfg, key, "true or false");
}

loom_status* config_get_str(const loom_config* cfg, const char* key, const char* def,
                            const char** out) noexcept {
  const ParamValue* v = lookup(cfg, key);
  if (!v) {
    *out = def;
    return nullptr;
  }
  if (const auto* s = std::get_if<std::string>(v)) {
    *out = s->c_str();
    return nullptr;
  }
  return type_error(cfg, key, "a string");
}

int32_t config_has(const loom_config* cfg, const char* key) noexcept {
  if (!cfg || !key || !cfg->params) return 0;
  for (const auto& [k, v] : *cfg->params)
    if (k == key) return 1;
  return 0;
}

int32_t config_type(const loom_config* cfg, const char* key) noexcept {
  if (!cfg || !key || !cfg->params) return LOOM_CONFIG_NONE;
  for (const auto& [k, v] : *cfg->params)
    if (k == key) {
      static_assert(std::variant_size_v<ParamValue> == 6, "one LOOM_CONFIG_* per ParamValue alternative");
      constexpr int32_t types[] = {LOOM_CONFIG_BOOL,   LOOM_CONFIG_INT,       LOOM_CONFIG_FLOAT,
                                   LOOM_CONFIG_STRING, LOOM_CONFIG_INT_ARRAY, LOOM_CONFIG_FLOAT_ARRAY};
      return types[v.index()];
    }
  return LOOM_CONFIG_NONE;
}

loom_status* config_get_i64_array(const loom_config* cfg, const char* key, const int64_t** out,
                                  size_t* n) noexcept {
  *out = nullptr;
  *n = 0;
  const ParamValue* v = lookup(cfg, key);
  if (!v) return nullptr;
  if (const auto* a = std::get_if<std::vector<int64_t>>(v)) {
    *out = a->data();
    *n = a->size();
    return nullptr;
  }
  return type_error(cfg, key, "an array of integers");
}

loom_status* config_get_f64_array(const loom_config* cfg, const char* key, const double** out,
                                  size_t* n) noexcept {
  *out = nullptr;
  *n = 0;
  const ParamValue* v = lookup(cfg, key);
  if (!v) return nullptr;
  if (const auto* a = std::get_if<std::vector<double>>(v)) {
    *out = a->data();
    *n = a->size();
    return nullptr;
  }
  if (const auto* a = std::get_if<std::vector<int64_t>>(v)) {
    try {
      auto& conv = const_cast<loom_config*>(cfg)->as_f64[key];
      conv.assign(a->begin(), a->end());
      *out = conv.data();
      *n = conv.size();
      return nullptr;
    } catch (...) {
      return &k_oom_status;
    }
  }
  return type_error(cfg, key, "an array of numbers");
}

int32_t status_code(const loom_status* st) noexcept {
  return st ? st->code : 0;
}
const char* status_message(const loom_status* st) noexcept {
  return st ? st->message.c_str() : "";
}
void status_free(loom_status* st) noexcept {
  if (st && st != &k_oom_status) delete st;
}

double core_rng_uniform(void* state) noexcept {
  return state ? loom::rng_uniform(state) : 0.0;
}

// ---- session ----

DecodeSession& S(loom_session* s) {
  return *reinterpret_cast<DecodeSession*>(s);
}
const DecodeSession& S(const loom_session* s) {
  return *reinterpret_cast<const DecodeSession*>(s);
}

// The fields that lie inside the caller's struct_size (a later minor may append some).
void session_info(const loom_session* s, loom_session_info* out) noexcept {
  if (!out) return;
  const auto fits = [&](size_t offset, size_t size) { return out->struct_size >= offset + size; };
  if (fits(offsetof(loom_session_info, n_vocab), sizeof out->n_vocab)) out->n_vocab = S(s).n_vocab();
  if (fits(offsetof(loom_session_info, max_new_tokens), sizeof out->max_new_tokens))
    out->max_new_tokens = S(s).max_new_tokens();
  if (fits(offsetof(loom_session_info, n_prompt), sizeof out->n_prompt)) out->n_prompt = S(s).n_prompt();
}

loom_status* seq_fork(loom_session* s, loom_seq parent, loom_seq* child) noexcept {
  return guarded([&] { *child = S(s).fork(parent); });
}
void seq_free(loom_session* s, loom_seq seq) noexcept {
  try {
    S(s).free(seq);
  } catch (...) {
  }
}
loom_status* seq_truncate(loom_session* s, loom_seq seq, size_t n) noexcept {
  return guarded([&] { S(s).truncate(seq, n); });
}
loom_status* seq_append(loom_session* s, loom_seq seq, loom_token t, int32_t* reason) noexcept {
  return guarded([&] {
    const StopReason r = S(s).append(seq, t);
    if (reason) *reason = static_cast<int32_t>(r);
  });
}
size_t seq_tokens(const loom_session* s, loom_seq seq, const loom_token** out) noexcept {
  try {
    const auto& t = S(s).tokens(seq);
    *out = t.data();
    return t.size();
  } catch (...) {
    *out = nullptr;
    return 0;
  }
}
int32_t seq_finished(const loom_session* s, loom_seq seq) noexcept {
  try {
    return static_cast<int32_t>(S(s).finished(seq));
  } catch (...) {
    return LOOM_STOP_CANCELLED;
  }
}
loom_status* session_plan(loom_session* s, loom_seq seq) noexcept {
  return guarded([&] { S(s).plan(seq); });
}
const float* seq_logits(const loom_session* s, loom_seq seq) noexcept {
  try {
    return S(s).logits(seq);
  } catch (...) {
    return nullptr;
  }
}
loom_status* seq_sample(loom_session* s, loom_seq seq, loom_token* out) noexcept {
  return guarded([&] { *out = S(s).sample(seq); });
}
float seq_logprob(const loom_session* s, loom_seq seq, loom_token t) noexcept {
  try {
    return S(s).logprob(seq, t);
  } catch (...) {
    return -INFINITY;
  }
}
loom_status* seq_finish(loom_session* s, loom_seq seq, int32_t reason, double score) noexcept {
  return guarded([&] {
    if (reason < 0 || reason > static_cast<int32_t>(StopReason::error))
      fail(Errc::invalid_argument, "decoder",
           "stop reason " + std::to_string(reason) + " is not a loom_stop_reason");
    S(s).finish(seq, static_cast<StopReason>(reason), score);
  });
}
double seq_score(const loom_session* s, loom_seq seq) noexcept {
  try {
    return S(s).score(seq);
  } catch (...) {
    return -std::numeric_limits<double>::infinity();
  }
}
void session_set_stream(loom_session* s, loom_seq seq) noexcept {
  S(s).set_stream(seq);
}
size_t detokenize(const loom_session* s, const loom_token* tokens, size_t n, char* buf, size_t cap) noexcept {
  try {
    const std::string text = S(s).detokenize(std::span<const TokenId>(tokens, n));
    if (buf && cap) std::memcpy(buf, text.data(), std::min(cap, text.size()));
    return text.size();
  } catch (...) {
    return 0;
  }
}
loom_status* session_set_output(loom_session* s, const char* key, const char* json) noexcept {
  return guarded([&] {
    if (!key || !json) fail(Errc::invalid_argument, "decoder", "set_output: key and json must not be NULL");
    S(s).set_output(key, json);
  });
}
loom_status* session_verify(loom_session* s, const char* text, size_t len, double* score) noexcept {
  return guarded([&] {
    if (!text) { // only asks whether there is one
      if (score) *score = S(s).has_verifier() ? 1.0 : 0.0;
      return;
    }
    const double v = S(s).verify(std::string_view(text, len)); // NOT_FOUND without a verifier
    if (score) *score = v;
  });
}
loom_status* session_verify_many(loom_session* s, const char* const* texts, const size_t* lens, size_t n,
                                 double* scores, loom_status** statuses) noexcept {
  return guarded([&] {
    if (n && (!texts || !lens || !scores || !statuses))
      fail(Errc::invalid_argument, "decoder",
           "verify_many: texts, lens, scores and statuses must not be NULL");
    std::vector<std::string_view> v(n);
    for (size_t i = 0; i < n; ++i) {
      if (!texts[i] && lens[i]) fail(Errc::invalid_argument, "decoder", "verify_many: a NULL text");
      v[i] = std::string_view(texts[i] ? texts[i] : "", lens[i]);
    }
    const std::vector<VerifyOutcome> r = S(s).verify_many(v); // NOT_FOUND without a verifier
    // Nothing below throws (status_create is noexcept): `statuses` is written whole or, on an error
    // above, left alone.
    for (size_t i = 0; i < n; ++i) {
      scores[i] = r[i].error.empty() ? r[i].score : 0.0;
      statuses[i] =
          r[i].error.empty() ? nullptr : status_create(LOOM_STATUS_INVALID_ARGUMENT, r[i].error.c_str());
    }
  });
}
loom_status* session_add_result(loom_session* s, loom_seq seq, double score) noexcept {
  return guarded([&] { S(s).add_result(seq, score); });
}
loom_status* seq_set_draft(loom_session* s, loom_seq seq, const loom_token* tokens, size_t n,
                           size_t* n_kept) noexcept {
  return guarded([&] {
    if (!tokens && n) fail(Errc::invalid_argument, "decoder", "set_draft: tokens is NULL");
    const size_t k = S(s).set_draft(seq, std::span<const TokenId>(tokens, n));
    if (n_kept) *n_kept = k;
  });
}
loom_status* seq_commit(loom_session* s, loom_seq seq, size_t n, int32_t* reason) noexcept {
  return guarded([&] {
    const StopReason r = S(s).commit(seq, n);
    if (reason) *reason = static_cast<int32_t>(r);
  });
}
size_t seq_n_draft(const loom_session* s, loom_seq seq) noexcept {
  try {
    return S(s).n_draft(seq);
  } catch (...) {
    return 0;
  }
}
const float* seq_logits_at(const loom_session* s, loom_seq seq, size_t row) noexcept {
  try {
    return S(s).logits_at(seq, row);
  } catch (...) {
    return nullptr;
  }
}
loom_status* seq_probs(loom_session* s, loom_seq seq, float* out, size_t n) noexcept {
  return guarded([&] {
    if (!out) fail(Errc::invalid_argument, "decoder", "probs: out is NULL");
    S(s).probs(seq, std::span<float>(out, n));
  });
}
int32_t session_has_draft(const loom_session* s) noexcept {
  return S(s).has_draft_model() ? 1 : 0;
}
loom_status* seq_fork_draft(loom_session* s, loom_seq parent, loom_seq* child) noexcept {
  return guarded([&] { *child = S(s).fork_draft(parent); });
}
loom_status* seq_set_draft_tree(loom_session* s, loom_seq seq, const loom_token* tokens,
                                const int32_t* parents, size_t n, size_t* n_kept) noexcept {
  return guarded([&] {
    if ((!tokens || !parents) && n)
      fail(Errc::invalid_argument, "decoder", "set_draft_tree: tokens or parents is NULL");
    const size_t k =
        S(s).set_draft_tree(seq, std::span<const TokenId>(tokens, n), std::span<const int32_t>(parents, n));
    if (n_kept) *n_kept = k;
  });
}
loom_status* seq_commit_node(loom_session* s, loom_seq seq, int32_t node, int32_t* reason) noexcept {
  return guarded([&] {
    const StopReason r = S(s).commit_node(seq, node);
    if (reason) *reason = static_cast<int32_t>(r);
  });
}
int32_t seq_max_tree_nodes(const loom_session* s, loom_seq seq) noexcept {
  try {
    return S(s).max_tree_nodes(seq);
  } catch (...) {
    return 0;
  }
}
int32_t seq_max_tree_depth(const loom_session* s, loom_seq seq) noexcept {
  try {
    return S(s).max_tree_depth(seq);
  } catch (...) {
    return 0;
  }
}
loom_status* session_set_metric(loom_session* s, const char* key, double value) noexcept {
  return guarded([&] {
    if (!key) fail(Errc::invalid_argument, "decoder", "set_metric: key is NULL");
    S(s).set_metric(key, value);
  });
}
double session_uniform(loom_session* s) noexcept {
  return S(s).uniform();
}
size_t tokenize(const loom_session* s, const char* text, size_t len, int32_t add_special,
                int32_t parse_special, loom_token* out, size_t cap) noexcept {
  try {
    if (!text && len > 0) return 0;
    const std::vector<TokenId> ids =
        S(s).tokenize(std::string_view(text ? text : "", len), add_special != 0, parse_special != 0);
    if (out)
      for (size_t i = 0; i < std::min(cap, ids.size()); ++i)
        out[i] = ids[i];
    return ids.size();
  } catch (...) {
    return 0;
  }
}

// The tables of this major (a later minor appends entries).
const loom_core_api k_core = {&status_create, &status_code, &status_message, &status_free, &core_rng_uniform};
const loom_config_api k_config = {&config_get_i64,       &config_get_f64,      &config_get_bool,
                                  &config_get_str,       &config_has,          &config_type,
                                  &config_get_i64_array, &config_get_f64_array};
const loom_session_api k_session = {&session_info, &seq_fork,           &seq_free,          &seq_truncate,
                                    &seq_append,   &seq_tokens,         &seq_finished,      &session_plan,
                                    &seq_logits,   &seq_sample,         &seq_logprob,       &seq_finish,
                                    &seq_score,    &session_set_stream, &session_add_result};
const loom_request_api k_request = {&tokenize,           &detokenize,         &seq_probs,
                                    &session_set_output, &session_set_metric, &session_uniform};
const loom_draft_api k_draft = {
    &seq_set_draft,  &seq_commit,         &seq_n_draft,     &seq_logits_at,      &session_has_draft,
    &seq_fork_draft, &seq_set_draft_tree, &seq_commit_node, &seq_max_tree_nodes, &seq_max_tree_depth};
const loom_verify_api k_verify = {&session_verify, &session_verify_many};

// Each table as of `minor`; a minor this host does not have yet gives NULL.
const void* get_api(uint32_t table, uint32_t minor) noexcept {
  if (minor > LOOM_ABI_MINOR) return nullptr;
  switch (table) {
  case LOOM_API_CORE:
    return &k_core;
  case LOOM_API_CONFIG:
    return &k_config;
  case LOOM_API_SESSION:
    return &k_session;
  case LOOM_API_REQUEST:
    return &k_request;
  case LOOM_API_DRAFT:
    return &k_draft;
  case LOOM_API_VERIFY:
    return &k_verify;
  default:
    return nullptr;
  }
}

const char* host_version() noexcept {
  return LOOM_HOST_VERSION;
}

const loom_host k_host = {sizeof(loom_host), LOOM_ABI_MAJOR, LOOM_ABI_MINOR,
                          &host_log,         &get_api,       &host_version};

// The host's own decoders (`sample`, `loom explain`'s) drive a request through the same tables as a
// plugin's: the SDK's bindings, set for the host as loom_plugin_init sets them for a plugin.
[[maybe_unused]] const bool k_host_bound = sdk::detail::bind_host(&k_host, LOOM_ABI_MAJOR, "loom");

} // namespace

const loom_host* host_api() noexcept {
  return &k_host;
}

void set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(log_mutex());
  log_sink() = std::move(sink);
}

namespace plugin {

InitLogCapture::InitLogCapture() : prev_(t_init_log) {
  t_init_log = &text;
}
InitLogCapture::~InitLogCapture() {
  t_init_log = prev_;
}

void throw_if(loom_status* s, const std::string& context) {
  if (!s) return;
  const int32_t code = s->code;
  std::string msg = s->message;
  if (s != &k_oom_status) delete s;
  fail(errc_of(code), "plugin", context + ": " + msg);
}

void check_all_read(const loom_config& cfg, std::string_view object) {
  if (!cfg.params) return;
  for (const auto& [k, v] : *cfg.params)
    if (!cfg.read.count(k))
      fail(Errc::invalid_argument, "config",
           cfg.where + ": unknown key '" + k + "' for " + std::string(object) +
               " (the plugin does not read it)");
}

} // namespace plugin
} // namespace loom
