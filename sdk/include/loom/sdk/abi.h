/* loom/sdk/abi.h — the C ABI between the Loom host and its plugins (C99, no C++ types).
 *
 * A plugin is a shared library that exports exactly two symbols:
 *   const loom_plugin* loom_plugin_init(const loom_host* host, uint32_t abi_major, uint32_t abi_minor);
 *   int32_t            loom_plugin_score(void);   (optional: 0 = cannot run on this machine)
 *
 * Rules (docs/plugins.md has the long form):
 * - Versioning: LOOM_ABI_MAJOR must match exactly; LOOM_ABI_MINOR is additive. The host's services
 *   are tables asked for by version (loom_host.get_api). Tables a plugin hands the host start with
 *   `struct_size` and only ever grow at their end; the host uses the fields that lie inside
 *   min(struct_size, sizeof(its own view)). A NULL optional function means the documented default.
 *   Arrays of structs carry their element size (loom_graph.node_size, loom_candidates.data_size).
 *   The history of each major and minor is in sdk/CHANGELOG.md.
 * - No exception crosses the boundary: fallible calls return loom_status* (NULL = success), made
 *   with the core table's status_create and owned by the host from then on.
 * - Memory is freed by the module that allocated it: every plugin object has destroy(self).
 * - Pointers passed into a call are valid for that call only, unless documented otherwise.
 *   Strings a plugin returns (names, versions) have static storage duration.
 * - Plugins log through host->log and read their TOML table through the LOOM_API_CONFIG table; a
 *   key the plugin never reads is reported to the user as an error (typo protection).
 * Layouts are frozen by static_asserts in tests/plugin/abi_layout_test.cpp.
 */
#ifndef LOOM_SDK_ABI_H
#define LOOM_SDK_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_ABI_MAJOR 3u /* bump only for a breaking change; host and plugin must match exactly */
#define LOOM_ABI_MINOR 2u /* bump for additive changes: new trailing fields, new kinds */

#if defined(_WIN32)
#define LOOM_EXPORT __declspec(dllexport)
#else
#define LOOM_EXPORT __attribute__((visibility("default")))
#endif

typedef int32_t loom_token;
typedef int32_t loom_seq;

typedef struct loom_status loom_status;   /* opaque, host-owned; NULL == success */
typedef struct loom_config loom_config;   /* opaque: the plugin's TOML table */
typedef struct loom_session loom_session; /* opaque: one request, as its decoder sees it */

typedef enum loom_kind {
  LOOM_KIND_BACKEND = 1,
  LOOM_KIND_DECODER = 2,
  LOOM_KIND_SAMPLER = 3,
  LOOM_KIND_STOP = 4,
  LOOM_KIND_VERIFIER = 5 /* scores a candidate text in [0, 1] (loom_verifier_i) */
} loom_kind;

typedef enum loom_log_level {
  LOOM_LOG_DEBUG = 0,
  LOOM_LOG_INFO = 1,
  LOOM_LOG_WARN = 2,
  LOOM_LOG_ERROR = 3
} loom_log_level;

typedef enum loom_status_code {
  LOOM_STATUS_INVALID_ARGUMENT = 1,
  LOOM_STATUS_NOT_FOUND = 2,
  LOOM_STATUS_UNSUPPORTED = 3,
  LOOM_STATUS_ABI_MISMATCH = 4,
  LOOM_STATUS_OUT_OF_MEMORY = 5,
  LOOM_STATUS_DEVICE_ERROR = 6,
  LOOM_STATUS_INTERNAL = 7
} loom_status_code;

/* Why a sequence ended (values match the host's StopReason). */
typedef enum loom_stop_reason {
  LOOM_STOP_NONE = 0,
  LOOM_STOP_EOS = 1,
  LOOM_STOP_STOP_TOKEN = 2,
  LOOM_STOP_STOP_STRING = 3,
  LOOM_STOP_MAX_TOKENS = 4,
  LOOM_STOP_MAX_CONTEXT = 5,
  LOOM_STOP_TIMEOUT = 6,
  LOOM_STOP_CANCELLED = 7,
  LOOM_STOP_CUSTOM = 8,
  LOOM_STOP_ERROR = 9 /* the request failed (a decoder, backend or engine error) */
} loom_stop_reason;

/* ---- samplers ------------------------------------------------------------------------------ */

typedef struct loom_token_data {
  loom_token id;
  float logit;
  float p; /* valid when has_probs */
} loom_token_data;

/* The candidate list of one sampling step. A sampler may reorder data, shrink `size`, change
 * logits/probabilities, or select (set `selected` to an index into data); it never moves `data` or
 * grows `size`. data_size is the host's sizeof(loom_token_data): a plugin that knows another size
 * fails the call (the SDK does, in one line) rather than misread the array. */
typedef struct loom_candidates {
  uint32_t struct_size;
  uint32_t data_size; /* bytes per element of data; ≥ 12 (id, logit, p) */
  loom_token_data* data;
  size_t size;
  int32_t sorted;    /* 1: sorted by logit, descending */
  int32_t has_probs; /* 1: p = softmax(logit) over data[0..size) */
  int64_t selected;  /* -1 until a selecting sampler ran */
} loom_candidates;

/* What a sampler may read about the sequence it samples for. Valid for one apply() call. */
typedef struct loom_sampler_ctx {
  uint32_t struct_size;
  const loom_token* prompt;
  size_t n_prompt;
  const loom_token* generated;
  size_t n_generated;
  void* rng_state; /* pass to the core table's rng_uniform: the request's seeded RNG */
} loom_sampler_ctx;

typedef struct loom_sampler_i {
  uint32_t struct_size;
  loom_status* (*apply)(void* self, loom_candidates* c, const loom_sampler_ctx* ctx); /* required */
  void (*accept)(void* self, loom_token token);                                       /* optional */
  void (*reset)(void* self);                                                          /* optional */
  loom_status* (*clone)(const void* self, void** out_self);                           /* required */
  int32_t (*selects)(const void* self); /* optional: 1 if apply always selects (default 0) */
  void (*destroy)(void* self);          /* required */
} loom_sampler_i;

/* ---- stop criteria ------------------------------------------------------------------------- */

/* What a stop criterion sees after one generated token. */
typedef struct loom_stop_input {
  uint32_t struct_size;
  loom_token token;  /* the token just generated */
  const char* piece; /* the text it added (may be empty: an incomplete UTF-8 character) */
  size_t piece_len;
  const loom_token* generated; /* every generated token, `token` last */
  size_t n_generated;
} loom_stop_input;

/* A criterion's answer (the host zeroes it before each call). */
typedef struct loom_stop_verdict {
  int32_t reason; /* LOOM_STOP_NONE to go on, or a reason (usually LOOM_STOP_CUSTOM) */
  /* Bytes at the end of the sequence's text (this piece included) that are not part of the output
   * (a matched stop text and what followed it); 0 keeps all of it. */
  size_t drop;
  const char* matched; /* optional: the text that matched; plugin-owned, valid until its next call */
  size_t matched_len;
} loom_stop_verdict;

typedef struct loom_stop_i {
  uint32_t struct_size;
  /* Called after each generated token. */
  loom_status* (*check)(void* self, const loom_stop_input* in, loom_stop_verdict* out); /* required */
  /* Optional: bytes at the end of the text so far that must not be streamed yet. */
  size_t (*holdback_bytes)(const void* self);
  loom_status* (*clone)(const void* self, void** out_self); /* required */
  void (*destroy)(void* self);                              /* required */
} loom_stop_i;

/* ---- verifiers -------------------------------------------------------------------------- */

/* Scores a candidate answer: *score in [0, 1] (1 = certainly right). Decoders reach the pipeline's
 * verifier through the session table's verify; a verifier must be safe to call for any text. */
typedef struct loom_verifier_i {
  uint32_t struct_size;
  /* task: the request's task, a JSON object (e.g. {"tests": [...]}) the caller gave with the request
   * (`loom verify`'s task line, `loom ab`'s JSONL line); NULL when it has none. */
  loom_status* (*score)(void* self, const char* prompt, size_t prompt_len, const char* text, size_t text_len,
                        const char* task, size_t task_len, double* score); /* required */
  void (*destroy)(void* self);                                             /* required */
} loom_verifier_i;

/* ---- decoders ------------------------------------------------------------------------------ */

/* A decoder (search strategy) is driven by the engine. Each step the engine calls plan() on every
 * live request, evaluates every planned sequence in one batched forward pass, then calls update()
 * with the logits in place. Sequence 0 exists at start and holds the prompt (not yet evaluated).
 * Progress rule: each step, a decoder that is not done() must plan a sequence with tokens to evaluate or
 * change the session (append, fork, finish); a request whose decoder does neither for several steps in a
 * row is ended by the host with LOOM_STOP_ERROR ("the decoder made no progress"). The host may end a sequence
 * itself — LOOM_STOP_MAX_CONTEXT when its next position does not fit the context, LOOM_STOP_TIMEOUT,
 * LOOM_STOP_CANCELLED: seq_finished says so at the next update(), and planning it is an error; a
 * decoder reads seq_finished before planning a sequence it did not end itself. */
typedef struct loom_decoder_i {
  uint32_t struct_size;
  loom_status* (*start)(void* self, loom_session* s);   /* optional: set up sequences */
  loom_status* (*plan)(void* self, loom_session* s);    /* required: session table's plan(...) */
  loom_status* (*update)(void* self, loom_session* s);  /* required: read logits, sample, append */
  int32_t (*done)(void* self, const loom_session* s);   /* required: 1 when finished */
  loom_status* (*results)(void* self, loom_session* s); /* required: add_result(...) */
  void (*destroy)(void* self);                          /* required */
} loom_decoder_i;

/* ---- backends (graph execution; see docs/plugins.md) ------------------------------------- */

typedef struct loom_backend_i loom_backend_i; /* defined in loom/sdk/backend.h */

/* ---- registration -------------------------------------------------------------------------- */

typedef struct loom_factory {
  uint32_t struct_size;
  int32_t kind;     /* loom_kind */
  const char* name; /* referenced from TOML: [decoder] name = "best_of_n" */
  /* Creates an object; *out_vtable points at the kind's table (loom_decoder_i, …), which must
   * outlive the object. cfg may be read only during create. */
  loom_status* (*create)(const loom_config* cfg, void** out_self, const void** out_vtable);
} loom_factory;

typedef struct loom_plugin {
  uint32_t struct_size;
  uint32_t abi_major, abi_minor; /* what the plugin was compiled with */
  const char* name;              /* static storage */
  const char* version;           /* the plugin's own semver, static storage */
  size_t n_factories;
  const loom_factory* factories; /* entries are factories[0].struct_size bytes apart */
  void (*shutdown)(void);        /* optional: join threads, free device memory; called once at exit */
  /* Optional: one line on what the plugin will use on this machine (a backend: its CPU level
   * or device, threads), shown by `loom plugins`; static or plugin-owned storage valid until unload. */
  const char* (*describe)(void);
} loom_plugin;

/* The least loom_plugin a host reads (up to shutdown); the fields after it are read when present. */
#define LOOM_PLUGIN_SIZE_MIN (offsetof(loom_plugin, shutdown) + sizeof(void (*)(void)))

/* ---- the host's services: tables asked for by version ------------------------------------- */

/* The host hands loom_plugin_init a small loom_host; the services live in tables that a plugin
 * asks for with get_api(table, minor), as ONNX Runtime's GetApi(version):
 *   LOOM_API_CORE    statuses and the RNG            (loom_core_api)
 *   LOOM_API_CONFIG  the plugin's TOML table          (loom_config_api)
 *   LOOM_API_SESSION a request's core, as its decoder sees it (loom_session_api)
 *   LOOM_API_REQUEST its tokenizer, RNG and chain, outputs (loom_request_api)
 *   LOOM_API_DRAFT   speculative decoding (loom_draft_api)
 *   LOOM_API_VERIFY  the pipeline's verifier (loom_verify_api)
 * get_api returns the table as it is in ABI <major>.`minor`: every entry of that version present and
 * non-NULL, for the life of the process; NULL when the host is older than that minor (or does not know
 * the table). Tables are never reordered: a later minor only appends entries, so a plugin built for
 * minor m keeps working on every later host of its major and is refused in one line by an older one —
 * no struct_size checks and no NULL entries in plugin code. The SDK asks for every table at
 * LOOM_SDK_TARGET_MINOR (default: the SDK's LOOM_ABI_MINOR) inside loom_plugin_init. */
#define LOOM_API_CORE 1u
#define LOOM_API_CONFIG 2u
#define LOOM_API_SESSION 3u
#define LOOM_API_REQUEST 4u
#define LOOM_API_DRAFT 5u
#define LOOM_API_VERIFY 6u

typedef struct loom_host {
  uint32_t struct_size;
  uint32_t abi_major, abi_minor; /* the host's */
  /* Logging (usable before get_api, and at the same offset in every major, so that a plugin that
   * refuses the host can say why). */
  void (*log)(int32_t level, const char* plugin, const char* message);
  const void* (*get_api)(uint32_t table, uint32_t minor);
  const char* (*version)(void); /* the host's version string, e.g. "0.24.0" */
} loom_host;

/* LOOM_API_CORE: statuses and random numbers. */
typedef struct loom_core_api {
  loom_status* (*status_create)(int32_t code, const char* message); /* code: loom_status_code */
  /* A status the plugin got from a host call: its code and message (valid until released), and its
   * release — a plugin that handles a status instead of returning it must free it. */
  int32_t (*status_code)(const loom_status* st);
  const char* (*status_message)(const loom_status* st);
  void (*status_free)(loom_status* st);
  /* uniform in [0, 1) from the request's seeded RNG (loom_sampler_ctx.rng_state) */
  double (*rng_uniform)(void* rng_state);
} loom_core_api;

/* LOOM_API_CONFIG: typed getters on the plugin's TOML table. A missing key gives `def` and status
 * NULL; a present key of another type (or out of int64/double range) gives an error status naming the
 * key and the file position. Returned strings and arrays live as long as cfg. A key the plugin never
 * reads is reported to the user as an error. */
typedef struct loom_config_api {
  loom_status* (*get_i64)(const loom_config* cfg, const char* key, int64_t def, int64_t* out);
  loom_status* (*get_f64)(const loom_config* cfg, const char* key, double def, double* out);
  loom_status* (*get_bool)(const loom_config* cfg, const char* key, int32_t def, int32_t* out);
  loom_status* (*get_str)(const loom_config* cfg, const char* key, const char* def, const char** out);
  int32_t (*has)(const loom_config* cfg, const char* key);
  /* The type of a key's value (LOOM_CONFIG_*; LOOM_CONFIG_NONE when absent), so a key may take more
   * than one type (e.g. true / false / "never") without a failing typed getter. */
  int32_t (*type)(const loom_config* cfg, const char* key);
  /* Array values (LOOM_CONFIG_INT_ARRAY; for f64 also LOOM_CONFIG_FLOAT_ARRAY, an int array read as
   * numbers): *out points at *n values. A missing key: *n = 0, *out NULL, status NULL; a value of
   * another type: an error status naming the key. */
  loom_status* (*get_i64_array)(const loom_config* cfg, const char* key, const int64_t** out, size_t* n);
  loom_status* (*get_f64_array)(const loom_config* cfg, const char* key, const double** out, size_t* n);
} loom_config_api;

/* A request as its decoder sees it, in four tables asked for separately (a plain decoder needs only
 * the first). Sequences are request-local ids; 0 is the prompt sequence. */

/* What a request is (loom_session_api.info fills the fields inside out->struct_size). */
typedef struct loom_session_info {
  uint32_t struct_size;
  int32_t n_vocab;
  int32_t max_new_tokens; /* -1: until the context is full */
  size_t n_prompt;        /* tokens of sequence 0's prompt */
} loom_session_info;

/* LOOM_API_SESSION: the core — sequences, their tokens and logits, sampling, stopping, results. */
typedef struct loom_session_api {
  void (*info)(const loom_session* s, loom_session_info* out);
  /* Copies tokens, the used KV positions, logits, sampler / stop / detokenizer state and text.
   * *child = -1 (status NULL) when the KV cache has no free sequence: recoverable — go on with fewer
   * sequences. An error status only for a parent that does not exist. */
  loom_status* (*seq_fork)(loom_session* s, loom_seq parent, loom_seq* child);
  /* Releases everything the sequence holds (KV, logits, state) at once; its id no longer exists. */
  void (*seq_free)(loom_session* s, loom_seq seq);
  /* Rolls back to n_tokens (n_prompt ≤ n ≤ length): tokens, KV, log-probs, text, stop / sampler /
   * detokenizer state as they were at that length; a finished sequence is live again. Its logits are
   * those of the new last token once it is planned again. Streamed text is never taken back: stream
   * (set_stream) only a sequence whose tokens are committed. */
  loom_status* (*seq_truncate)(loom_session* s, loom_seq seq, size_t n_tokens);
  /* Appends a token: records it, runs the stop criteria (max tokens, EOS, stop strings …) and, for
   * the streamed sequence, streams its text. *reason receives the stop reason (NONE = go on); a
   * stopped sequence is finished. */
  loom_status* (*seq_append)(loom_session* s, loom_seq seq, loom_token token, int32_t* reason);
  size_t (*seq_tokens)(const loom_session* s, loom_seq seq,
                       const loom_token** tokens);              /* prompt + generated */
  int32_t (*seq_finished)(const loom_session* s, loom_seq seq); /* its loom_stop_reason, 0 if live */
  /* Plans `seq` for the next forward pass: its tokens not yet in the KV cache are evaluated and the
   * logits of its last token become available to update(). */
  loom_status* (*plan)(loom_session* s, loom_seq seq);
  /* Logits [n_vocab] of seq's last evaluated token (NULL if none); valid until the next step. */
  const float* (*seq_logits)(const loom_session* s, loom_seq seq);
  /* Samples from seq's logits with the request's sampler chain (seq's own state) and RNG. */
  loom_status* (*seq_sample)(loom_session* s, loom_seq seq, loom_token* token);
  float (*seq_logprob)(const loom_session* s, loom_seq seq,
                       loom_token token); /* log-softmax of the raw logits */
  /* Ends seq with a reason and a score (e.g. its mean log-prob); its KV is released at once. */
  loom_status* (*seq_finish)(loom_session* s, loom_seq seq, int32_t reason, double score);
  double (*seq_score)(const loom_session* s, loom_seq seq); /* sum of the log-probs of its generated tokens */
  /* Which sequence's text is streamed to the caller (default 0; -1: none). */
  void (*set_stream)(loom_session* s, loom_seq seq);
  /* Reports a hypothesis from results(), best first. */
  loom_status* (*add_result)(loom_session* s, loom_seq seq, double score);
} loom_session_api;

/* LOOM_API_REQUEST: the request beyond its sequences — its tokenizer, its RNG and sampler chain, what
 * it reports besides results. */
typedef struct loom_request_api {
  /* Tokens of a text with the request's tokenizer: add_special adds what the model adds at the start
   * (BOS) when its metadata says so; parse_special matches special-token texts ("<|eot_id|>"). Writes
   * up to cap tokens to out (may be NULL when cap is 0) and returns the full count. */
  size_t (*tokenize)(const loom_session* s, const char* text, size_t len, int32_t add_special,
                     int32_t parse_special, loom_token* out, size_t cap);
  /* Text of tokens; writes up to cap bytes (not NUL-terminated), returns the full length. */
  size_t (*detokenize)(const loom_session* s, const loom_token* tokens, size_t n, char* buf, size_t cap);
  /* The distribution the request's sampler chain draws seq's next token from, at row 0 and with seq's
   * sampler state: out[0..n_vocab) (n ≥ n_vocab), 0 for tokens the chain removes, one-hot for a
   * deterministic selector (greedy, temperature 0) and at the draw of a selecting plugin sampler.
   * Samplers that use the RNG (dist excepted) draw from the request's RNG as they would when sampling. */
  loom_status* (*seq_probs)(loom_session* s, loom_seq seq, float* out, size_t n);
  /* A field the decoder adds to the request's result (`loom run --json` prints it at the top level):
   * `json` is one JSON value; `key` must not be one of the result's own fields (tokens, text,
   * hypotheses, metrics, …). Setting a key again replaces it. */
  loom_status* (*set_output)(loom_session* s, const char* key, const char* json);
  /* A number in the request's metrics (`loom run --json` → metrics.KEY); setting it again replaces it. */
  loom_status* (*set_metric)(loom_session* s, const char* key, double value);
  /* Uniform in [0, 1) from the request's seeded RNG. */
  double (*uniform)(loom_session* s);

} loom_request_api;

/* LOOM_API_DRAFT: speculative decoding — uncommitted tokens, rows of logits, trees, a second model. */
typedef struct loom_draft_api {
  /* Sets seq's uncommitted (draft) tokens after its committed ones, replacing earlier drafts. The next
   * plan evaluates them in the same forward pass and yields a logits row after the committed tokens
   * (row 0) and after each draft token (rows 1..n). Drafts are not streamed and not seen by stop rules
   * or the sampler chain until committed. *n_kept (may be NULL): how many the context had room for.
   * n = 0 drops the draft (its K/V rolled back). */
  loom_status* (*seq_set_draft)(loom_session* s, loom_seq seq, const loom_token* tokens, size_t n,
                                size_t* n_kept);
  /* Commits the first n draft tokens in order, each exactly as seq_append would (log-prob under its
   * row, stop rules, streaming, sampler accept); row 1 becomes row 0, and so on. Stops at a token that
   * ends the sequence (*reason, may be NULL) and drops the rest. seq_append, seq_truncate and
   * seq_set_draft drop the drafts still uncommitted (tokens, K/V, rows). */
  loom_status* (*seq_commit)(loom_session* s, loom_seq seq, size_t n, int32_t* reason);
  size_t (*seq_n_draft)(const loom_session* s, loom_seq seq);
  /* Logits row `row` [n_vocab] (0: after the committed tokens, the same as seq_logits; i: after i
   * draft tokens); NULL unless evaluated. Valid until the sequence changes. */
  const float* (*seq_logits_at)(const loom_session* s, loom_seq seq, size_t row);
  /* 1 when the pipeline names a draft model ([decoder] draft = "x.gguf"). */
  int32_t (*has_draft)(const loom_session* s);
  /* A sequence on the draft model with parent's committed tokens (none evaluated there yet) and a copy
   * of its sampler / stop / detokenizer state. Driven with the same calls (plan, logits, append,
   * truncate, free); all requests' draft sequences are evaluated in one draft forward pass per step.
   * *child = -1 (status NULL) when the draft model's KV cache has no free sequence. */
  loom_status* (*seq_fork_draft)(loom_session* s, loom_seq parent, loom_seq* child);

  /* Token trees. A draft tree: node i is tokens[i], a child of node parents[i] < i (-1: of the last
   * committed token). The next plan evaluates all nodes in one forward (each sees the committed tokens
   * and its ancestors) with row 1 + i after node i and row 0 after the committed tokens. Replaces an
   * earlier draft; *n_kept (may be NULL): the first nodes the context had room for. At most
   * seq_max_tree_nodes nodes and seq_max_tree_depth deep; a chain (parents[i] = i - 1) is always
   * accepted (it is seq_set_draft). */
  loom_status* (*seq_set_draft_tree)(loom_session* s, loom_seq seq, const loom_token* tokens,
                                     const int32_t* parents, size_t n, size_t* n_kept);
  /* Commits node `node` of the evaluated tree, a child of the last committed node (-1 at first: the
   * root), exactly as seq_append would; the row after it becomes row 0 (seq_probs, seq_logits). The
   * other nodes are dropped with the tree (the next append, truncate or draft). */
  loom_status* (*seq_commit_node)(loom_session* s, loom_seq seq, int32_t node, int32_t* reason);
  /* The most nodes a tree may have on seq's model (0: its backend runs no tree rows; chains only) and
   * the deepest tree (below the model's narrowest sliding window). */
  int32_t (*seq_max_tree_nodes)(const loom_session* s, loom_seq seq);
  int32_t (*seq_max_tree_depth)(const loom_session* s, loom_seq seq);

} loom_draft_api;

/* LOOM_API_VERIFY: the pipeline's verifier ([verifier]) on texts of this request. */
typedef struct loom_verify_api {
  /* The pipeline's verifier ([verifier]) on a text of this request (its prompt is passed along):
   * *score in [0, 1]. A LOOM_STATUS_NOT_FOUND status when the pipeline names no verifier. text NULL
   * only asks: *score = 1 when there is a verifier, 0 when not (status NULL either way). */
  loom_status* (*verify)(loom_session* s, const char* text, size_t len, double* score);
  /* The verifier on n texts of this request at once (a judge model scores them in one batched
   * forward; other verifiers one by one): scores[i] in [0, 1] when statuses[i] is NULL, else statuses[i]
   * says why text i failed (the caller frees it; the other texts are still scored). The call's own
   * status: NOT_FOUND when the pipeline names no verifier, INVALID_ARGUMENT on NULL arrays (then
   * statuses are left alone). */
  loom_status* (*verify_many)(loom_session* s, const char* const* texts, const size_t* lens, size_t n,
                              double* scores, loom_status** statuses);
} loom_verify_api;

typedef enum loom_config_type {
  LOOM_CONFIG_NONE = 0,
  LOOM_CONFIG_BOOL = 1,
  LOOM_CONFIG_INT = 2,
  LOOM_CONFIG_FLOAT = 3,
  LOOM_CONFIG_STRING = 4,
  LOOM_CONFIG_INT_ARRAY = 5,
  LOOM_CONFIG_FLOAT_ARRAY = 6
} loom_config_type;

/* The exports. */
typedef const loom_plugin* (*loom_plugin_init_fn)(const loom_host* host, uint32_t abi_major,
                                                  uint32_t abi_minor);
typedef int32_t (*loom_plugin_score_fn)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* LOOM_SDK_ABI_H */
