#include "loom/pipeline/pipeline_config.hpp"

#include "loom/error.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <toml++/toml.h>

namespace loom {

namespace {

namespace fs = std::filesystem;

// Validation context: where a node came from, for messages.
class Checker {
public:
  Checker(std::string source, std::set<const toml::node*> overridden, std::vector<std::string> override_keys)
      : source_(std::move(source)), overridden_(std::move(overridden)),
        override_keys_(std::move(override_keys)) {}

  std::string where(const toml::node& n) const {
    if (overridden_.count(&n)) return "--set";
    const auto& s = n.source();
    if (s.begin.line == 0) return source_;
    return source_ + ":" + std::to_string(s.begin.line) + ":" + std::to_string(s.begin.column);
  }
  std::string where_key(const toml::key& k, const toml::node& value) const {
    if (overridden_.count(&value)) return "--set";
    const auto& s = k.source();
    if (s.begin.line == 0) return where(value);
    return source_ + ":" + std::to_string(s.begin.line) + ":" + std::to_string(s.begin.column);
  }

  [[noreturn]] void error(const toml::node& n, const std::string& path, const std::string& expected) const {
    fail(Errc::invalid_argument, "config",
         where(n) + ": " + path + ": expected " + expected + ", found " + describe(n));
  }

  static std::string describe(const toml::node& n) {
    std::ostringstream ss;
    if (n.is_string()) {
      ss << "the string " << user_value(n.as_string()->get());
    } else if (n.is_table()) {
      ss << "a table";
    } else if (n.is_array()) {
      ss << "an array";
    } else if (n.is_integer()) {
      ss << n.as_integer()->get();
    } else if (n.is_floating_point()) {
      ss << n.as_floating_point()->get();
    } else if (n.is_boolean()) {
      ss << (n.as_boolean()->get() ? "true" : "false");
    } else {
      ss << "a " << n.type();
    }
    return ss.str();
  }

  // Every key of `t` must be in `known`.
  void only_keys(const toml::table& t, const std::string& section,
                 std::initializer_list<std::string_view> known) const {
    std::vector<std::string_view> k(known);
    only_keys(t, section, k);
  }
  void only_keys(const toml::table& t, const std::string& section,
                 const std::vector<std::string_view>& known) const {
    for (const auto& [key, val] : t) {
      if (std::find(known.begin(), known.end(), key.str()) != known.end()) continue;
      std::string list;
      for (auto s : known)
        list += (list.empty() ? "" : ", ") + std::string(s);
      fail(Errc::invalid_argument, "config",
           where_key(key, val) + ": unknown key '" + std::string(key.str()) + "' in " + section +
               " (known keys: " + list + ")");
    }
  }

private:
  std::string source_;
  std::set<const toml::node*> overridden_;
  std::vector<std::string> override_keys_;
};

const toml::table* section(const Checker& c, const toml::table& root, const char* name) {
  const toml::node* n = root.get(name);
  if (!n) return nullptr;
  if (!n->is_table()) c.error(*n, std::string("[") + name + "]", "a table");
  return n->as_table();
}

void read_string(const Checker& c, const toml::table& t, const std::string& sec, const char* key,
                 std::string& out, std::initializer_list<std::string_view> allowed = {}) {
  const toml::node* n = t.get(key);
  if (!n) return;
  const std::string path = sec + "." + key;
  std::string expected = "a string";
  if (allowed.size()) {
    expected = "one of";
    for (auto a : allowed)
      expected += " \"" + std::string(a) + "\"";
  }
  if (!n->is_string()) c.error(*n, path, expected);
  out = n->as_string()->get();
  if (out.find('\0') != std::string::npos) // a path would be cut there and open another file
    c.error(*n, path, expected + " without NUL characters (\\u0000)");
  if (allowed.size() && std::find(allowed.begin(), allowed.end(), out) == allowed.end())
    c.error(*n, path, expected);
}

int64_t read_int(const Checker& c, const toml::table& t, const std::string& sec, const char* key, int64_t def,
                 int64_t lo, int64_t hi, const char* help = nullptr) {
  const toml::node* n = t.get(key);
  if (!n) return def;
  const std::string path = sec + "." + key;
  const std::string expected = help ? std::string("an integer ") + help
                                    : "an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
  if (!n->is_integer()) c.error(*n, path, expected);
  const int64_t v = n->as_integer()->get();
  if (v < lo || v > hi) c.error(*n, path, expected);
  return v;
}

bool read_bool(const Checker& c, const toml::table& t, const std::string& sec, const char* key, bool def) {
  const toml::node* n = t.get(key);
  if (!n) return def;
  if (!n->is_boolean()) c.error(*n, sec + "." + key, "true or false");
  return n->as_boolean()->get();
}

std::vector<std::string> read_string_array(const Checker& c, const toml::table& t, const std::string& sec,
                                           const char* key, bool non_empty_items) {
  std::vector<std::string> out;
  const toml::node* n = t.get(key);
  if (!n) return out;
  const std::string path = sec + "." + key;
  const char* expected = non_empty_items ? "an array of non-empty strings" : "an array of strings";
  if (n->is_string()) { // a single string is accepted as a one-element array
    out.push_back(n->as_string()->get());
  } else {
    if (!n->is_array()) c.error(*n, path, expected);
    for (const auto& e : *n->as_array()) {
      if (!e.is_string()) c.error(e, path, expected);
      out.push_back(e.as_string()->get());
    }
  }
  if (non_empty_items)
    for (const auto& s : out)
      if (s.empty()) c.error(*n, path, expected);
  return out;
}

std::vector<int64_t> read_int_array(const Checker& c, const toml::table& t, const std::string& sec,
                                    const char* key, int64_t lo) {
  std::vector<int64_t> out;
  const toml::node* n = t.get(key);
  if (!n) return out;
  const std::string path = sec + "." + key;
  const std::string expected = "an array of integers ≥ " + std::to_string(lo);
  if (!n->is_array()) c.error(*n, path, expected);
  for (const auto& e : *n->as_array()) {
    if (!e.is_integer() || e.as_integer()->get() < lo) c.error(e, path, expected);
    out.push_back(e.as_integer()->get());
  }
  return out;
}

// Keys of a plugin's table, converted without a schema (the plugin validates through the host).
std::vector<std::pair<std::string, ParamValue>> generic_params(const Checker& c, const toml::table& t,
                                                               const std::string& sec, std::string_view skip,
                                                               std::string_view skip2 = {}) {
  std::vector<std::pair<std::string, ParamValue>> out;
  for (const auto& [key, v] : t) {
    if (key.str() == skip || key.str() == skip2) continue;
    const std::string path = sec + "." + std::string(key.str());
    const char* expected = "a boolean, integer, number, string, or an array of integers or of numbers";
    if (v.is_boolean()) {
      out.emplace_back(std::string(key.str()), v.as_boolean()->get());
    } else if (v.is_integer()) {
      out.emplace_back(std::string(key.str()), v.as_integer()->get());
    } else if (v.is_floating_point()) {
      out.emplace_back(std::string(key.str()), v.as_floating_point()->get());
    } else if (v.is_string()) {
      out.emplace_back(std::string(key.str()), v.as_string()->get());
    } else if (v.is_array()) {
      const auto& a = *v.as_array();
      bool all_int = true, all_num = true;
      for (const auto& e : a) {
        all_int = all_int && e.is_integer();
        all_num = all_num && (e.is_integer() || e.is_floating_point());
      }
      if (all_int) {
        std::vector<int64_t> xs;
        for (const auto& e : a)
          xs.push_back(e.as_integer()->get());
        out.emplace_back(std::string(key.str()), std::move(xs));
      } else if (all_num) {
        std::vector<double> xs;
        for (const auto& e : a)
          xs.push_back(e.is_integer() ? static_cast<double>(e.as_integer()->get())
                                      : e.as_floating_point()->get());
        out.emplace_back(std::string(key.str()), std::move(xs));
      } else {
        c.error(v, path, expected);
      }
    } else {
      c.error(v, path, expected);
    }
  }
  return out;
}

SamplerSpec read_plugin_table(const Checker& c, const toml::node& node, const std::string& sec) {
  if (!node.is_table()) c.error(node, sec, "a table with a 'name' key");
  const toml::table& t = *node.as_table();
  const toml::node* name = t.get("name");
  if (!name) c.error(node, sec, "a 'name' key");
  if (!name->is_string()) c.error(*name, sec + ".name", "a string");
  SamplerSpec spec;
  spec.name = name->as_string()->get();
  spec.params = generic_params(c, t, sec + " '" + spec.name + "'", "name");
  spec.where = c.where(node);
  return spec;
}

// A number (an integer is one too) for a schema's `expected`, else the error at the node.
double read_number(const Checker& c, const toml::node& v, const std::string& path, const std::string& exp) {
  if (v.is_integer()) return static_cast<double>(v.as_integer()->get());
  if (v.is_floating_point()) return v.as_floating_point()->get();
  c.error(v, path, exp);
}

// One parameter of a built-in sampler, checked against its schema (bounds apply to each list element).
ParamValue read_param(const Checker& c, const toml::node& v, const std::string& path, const ParamSchema& p) {
  switch (p.kind) {
  case ParamSchema::Kind::boolean:
    if (!v.is_boolean()) c.error(v, path, "true or false");
    return v.as_boolean()->get();
  case ParamSchema::Kind::integer: {
    const std::string exp = describe_param(p);
    if (!v.is_integer()) c.error(v, path, exp);
    const int64_t x = v.as_integer()->get();
    if (!schema_accepts(p, static_cast<double>(x))) c.error(v, path, exp);
    return x;
  }
  case ParamSchema::Kind::number: {
    const std::string exp = describe_param(p);
    const double x = read_number(c, v, path, exp);
    if (!schema_accepts(p, x)) c.error(v, path, exp);
    return x;
  }
  case ParamSchema::Kind::int_list: {
    const std::string exp = describe_param(p);
    if (!v.is_array()) c.error(v, path, exp);
    std::vector<int64_t> xs;
    for (const auto& e : *v.as_array()) {
      if (!e.is_integer() || !schema_accepts(p, static_cast<double>(e.as_integer()->get())))
        c.error(e, path, exp);
      xs.push_back(e.as_integer()->get());
    }
    return xs;
  }
  case ParamSchema::Kind::string:
    if (!v.is_string()) c.error(v, path, describe_param(p));
    return v.as_string()->get();
  case ParamSchema::Kind::number_list: {
    const std::string exp = describe_param(p);
    if (!v.is_array()) c.error(v, path, exp);
    std::vector<double> xs;
    for (const auto& e : *v.as_array()) {
      const double x = read_number(c, e, path, exp);
      if (!schema_accepts(p, x)) c.error(e, path, exp);
      xs.push_back(x);
    }
    return xs;
  }
  }
  c.error(v, path, describe_param(p)); // (every kind is handled above)
}

// The built-in sampler a [[sampler]] table names; null for another name (a plugin's).
const SamplerInfo* builtin_sampler_of(const Checker& c, const toml::node& node, const std::string& sec) {
  const toml::node* name = node.as_table()->get("name");
  const auto& infos = builtin_samplers();
  std::string names;
  for (const auto& i : infos)
    names += (names.empty() ? "" : ", ") + i.name;
  if (!name) c.error(node, sec, "a 'name' key (one of: " + names + ")");
  if (!name->is_string()) c.error(*name, sec + ".name", "a string (one of: " + names + ")");
  const std::string& n = name->as_string()->get();
  auto it = std::find_if(infos.begin(), infos.end(), [&](const SamplerInfo& i) { return i.name == n; });
  return it == infos.end() ? nullptr : &*it;
}

SamplerSpec read_sampler(const Checker& c, const toml::node& node, size_t index) {
  const std::string sec = "[[sampler]] #" + std::to_string(index + 1);
  if (!node.is_table()) c.error(node, sec, "a table with a 'name' key");
  const toml::table& t = *node.as_table();
  const SamplerInfo* info = builtin_sampler_of(c, node, sec);
  if (!info) { // not built in: a plugin sampler, resolved when the pipeline is built
    return read_plugin_table(c, node, sec);
  }
  SamplerSpec spec;
  spec.name = info->name;
  std::vector<std::string_view> known{"name"};
  for (const auto& p : info->params)
    known.push_back(p.key);
  const std::string ssec = "[[sampler]] '" + spec.name + "'";
  c.only_keys(t, ssec, known);
  for (const auto& p : info->params) {
    const toml::node* v = t.get(p.key);
    if (!v) {
      if (p.required) c.error(node, ssec, "the key '" + p.key + "': " + describe_param(p));
      continue;
    }
    spec.params.emplace_back(p.key, read_param(c, *v, ssec + "." + p.key, p));
  }
  // Cross-field checks and anything else the sampler itself rejects, with the location.
  try {
    (void)create_sampler(spec);
  } catch (const Error& e) {
    fail(Errc::invalid_argument, "config", c.where(node) + ": " + ssec + ": " + e.what());
  }
  return spec;
}

// Inserts `value_text` (a TOML literal, else a string) at dotted `key` of `root`.
const toml::node* apply_one(toml::table& root, const ConfigOverride& o) {
  std::vector<std::string> parts;
  std::string cur;
  for (char ch : o.key) {
    if (ch == '.') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  parts.push_back(cur);
  for (const auto& p : parts)
    if (p.empty())
      fail(Errc::invalid_argument, "config",
           "--set " + user_value(o.key + "=" + o.value) + ": expected section.key=value");
  if (parts.size() < 2)
    fail(Errc::invalid_argument, "config",
         "--set " + user_value(o.key + "=" + o.value) +
             ": expected section.key=value (e.g. stop.max_tokens=64)");

  toml::table parsed;
  bool literal = true;
  try {
    parsed = toml::parse("v = " + o.value);
  } catch (const toml::parse_error& e) {
    literal = false;
    // A value that starts like a TOML array, table or quoted string must be one: a typo there is an
    // error, not a literal string (a bare word such as cpu stays a string).
    const size_t first = o.value.find_first_not_of(" \t");
    if (first != std::string::npos &&
        std::string_view("[{\"'").find(o.value[first]) != std::string_view::npos)
      fail(Errc::invalid_argument, "config",
           "--set " + o.key + "=" + user_value(o.value) + ": not a valid TOML value (" +
               std::string(e.description()) + "); write arrays as [\"a\", \"b\"] and strings as \"text\"");
  }
  if (!literal || !parsed.get("v") || parsed.size() != 1) {
    parsed = toml::table{};
    parsed.insert_or_assign("v", o.value);
  }

  toml::table* t = &root;
  for (size_t k = 0; k + 1 < parts.size(); ++k) {
    const std::string& p = parts[k];
    if (p == "sampler" && k + 2 < parts.size()) { // sampler.N.key
      toml::node* arr = t->get(p);
      if (!arr || !arr->is_array())
        fail(Errc::invalid_argument, "config",
             "--set " + o.key + ": the pipeline has no [[sampler]] entries");
      size_t idx = 0;
      try {
        idx = std::stoul(parts[k + 1]);
      } catch (...) {
        fail(Errc::invalid_argument, "config", "--set " + o.key + ": expected sampler.N.key with N a number");
      }
      auto& a = *arr->as_array();
      if (idx >= a.size() || !a[idx].is_table())
        fail(Errc::invalid_argument, "config",
             "--set " + o.key + ": sampler index " + std::to_string(idx) +
                 " out of range (the pipeline has " + std::to_string(a.size()) + ", counting from 0)");
      t = a[idx].as_table();
      ++k;
      continue;
    }
    toml::node* n = t->get(p);
    if (!n) {
      t->insert_or_assign(p, toml::table{});
      n = t->get(p);
    }
    if (!n->is_table())
      fail(Errc::invalid_argument, "config",
           "--set " + o.key + ": '" + p + "' is not a table in the pipeline");
    t = n->as_table();
  }
  const std::string& leaf = parts.back();
  parsed.get("v")->visit([&](auto& v) { t->insert_or_assign(leaf, v); });
  return t->get(leaf);
}

std::set<const toml::node*> collect_nodes(const toml::node& n) {
  std::set<const toml::node*> out{&n};
  if (n.is_table())
    for (const auto& [k, v] : *n.as_table()) {
      auto sub = collect_nodes(v);
      out.insert(sub.begin(), sub.end());
    }
  if (n.is_array())
    for (const auto& v : *n.as_array()) {
      auto sub = collect_nodes(v);
      out.insert(sub.begin(), sub.end());
    }
  return out;
}

// [model]: the model file and the context.
void read_model_section(const Checker& c, const toml::table& t, PipelineConfig& cfg) {
  c.only_keys(t, "[model]", {"path", "n_ctx"});
  read_string(c, t, "model", "path", cfg.model.path);
  cfg.model.n_ctx =
      static_cast<int32_t>(read_int(c, t, "model", "n_ctx", 0, 0, 1 << 24, "≥ 0 (0 = the model's)"));
}

// [backend]: the backend and its threads; a plugin backend's other keys as they are.
void read_backend_section(const Checker& c, const toml::table& t, PipelineConfig& cfg) {
  read_string(c, t, "backend", "name", cfg.backend.name);
  cfg.backend.threads =
      static_cast<int32_t>(read_int(c, t, "backend", "threads", 0, 0, 1024, "in 0..1024 (0 = all cores)"));
  if (cfg.backend.name == "reference") // built in: no other keys
    c.only_keys(t, "[backend] \"reference\"", {"name", "threads"});
  else // a plugin backend reads its own keys through the host (and rejects unknown ones)
    cfg.backend.params = generic_params(c, t, "backend", "name", "threads");
}

// [attention]: the variant, the kernel, the window and sinks, the soft-cap.
void read_attention_section(const Checker& c, const toml::table& t, PipelineConfig& cfg) {
  c.only_keys(t, "[attention]", {"variant", "kernel", "window", "sinks", "softcap"});
  read_string(c, t, "attention", "variant", cfg.attention.variant, {"model", "standard", "sliding_window"});
  read_string(c, t, "attention", "kernel", cfg.attention.kernel, {"auto", "naive", "flash"});
  cfg.attention.window =
      static_cast<int32_t>(read_int(c, t, "attention", "window", 0, 0, 1 << 24, "in 0..16777216"));
  cfg.attention.sinks =
      static_cast<int32_t>(read_int(c, t, "attention", "sinks", 0, 0, 1 << 24, "in 0..16777216"));
  if (cfg.attention.variant == "sliding_window" && cfg.attention.window <= 0) {
    const toml::node* n = t.get("variant");
    c.error(*n, "attention.window", "a window > 0 with variant = \"sliding_window\"");
  }
  if (cfg.attention.variant == "standard" && (cfg.attention.window > 0 || cfg.attention.sinks > 0)) {
    const toml::node* n = t.get(cfg.attention.window > 0 ? "window" : "sinks");
    c.error(*n, n == t.get("window") ? "attention.window" : "attention.sinks",
            "no window or sinks with variant = \"standard\" (full causal); use variant = \"sliding_window\"");
  }
  if (const toml::node* n = t.get("softcap")) {
    const double v = n->is_integer()          ? static_cast<double>(n->as_integer()->get())
                     : n->is_floating_point() ? n->as_floating_point()->get()
                                              : -1.0;
    if (!(v >= 0.0 && v <= 1e6)) c.error(*n, "attention.softcap", "a number in 0..1e6 (0 = off)");
    cfg.attention.softcap = static_cast<float>(v);
  }
}

// [kv_cache]: the store, its blocks, dtype and size, the prefix cache.
void read_kv_cache_section(const Checker& c, const toml::table& t, PipelineConfig& cfg) {
  c.only_keys(t, "[kv_cache]", {"store", "block_size", "dtype", "max_tokens", "prefix_cache", "swa_full"});
  read_string(c, t, "kv_cache", "store", cfg.kv_cache.store, {"contiguous", "paged"});
  cfg.kv_cache.block_size = static_cast<int32_t>(
      read_int(c, t, "kv_cache", "block_size", 16, 1, 4096, "a power of two in 1..4096"));
  if ((cfg.kv_cache.block_size & (cfg.kv_cache.block_size - 1)) != 0)
    c.error(*t.get("block_size"), "kv_cache.block_size", "a power of two in 1..4096");
  read_string(c, t, "kv_cache", "dtype", cfg.kv_cache.dtype, {"f32", "f16", "bf16", "q8_0"});
  cfg.kv_cache.max_tokens =
      static_cast<int32_t>(read_int(c, t, "kv_cache", "max_tokens", 0, 0, 1 << 28, "≥ 0"));
  cfg.kv_cache.prefix_cache = read_bool(c, t, "kv_cache", "prefix_cache", true);
  cfg.kv_cache.swa_full = read_bool(c, t, "kv_cache", "swa_full", false);
}

// [scheduler]: the batch's bounds.
void read_scheduler_section(const Checker& c, const toml::table& t, PipelineConfig& cfg) {
  c.only_keys(t, "[scheduler]", {"max_batch_tokens", "max_sequences"});
  cfg.scheduler.max_batch_tokens = static_cast<int32_t>(
      read_int(c, t, "scheduler", "max_batch_tokens", 2048, 1, 1 << 20, "in 1..1048576"));
  cfg.scheduler.max_sequences =
      static_cast<int32_t>(read_int(c, t, "scheduler", "max_sequences", 64, 1, 4096, "in 1..4096"));
}

// [serve]: the served name, or an A/B split between served pipelines.
void read_serve_section(const Checker& c, const toml::table& t, PipelineConfig& cfg) {
  c.only_keys(t, "[serve]", {"name", "ab"});
  read_string(c, t, "serve", "name", cfg.serve.name);
  if (const toml::node* ab = t.get("ab")) {
    const char* expected = "a table of served pipeline names and weights > 0, like { A = 0.5, B = 0.5 }";
    if (!ab->is_table() || ab->as_table()->empty()) c.error(*ab, "[serve] ab", expected);
    for (const auto& [k, v] : *ab->as_table()) {
      double w = -1;
      if (v.is_integer()) w = static_cast<double>(v.as_integer()->get());
      if (v.is_floating_point()) w = v.as_floating_point()->get();
      if (!(w > 0) || !std::isfinite(w) || k.str().empty())
        c.error(v, "[serve] ab." + std::string(k.str()), expected);
      cfg.serve.ab.emplace_back(std::string(k.str()), w);
    }
  }
  for (const char ch : cfg.serve.name)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == '"' || ch == '\\')
      c.error(*t.get("name"), "[serve] name",
              "a model name without control characters, quotes or backslashes (it is a label in /metrics)");
  if (t.get("name") && cfg.serve.name.empty()) c.error(*t.get("name"), "[serve] name", "a non-empty name");
}

// [verifier]: a verifier plugin and its keys.
void read_verifier_section(const Checker& c, const toml::table& root, const toml::table& t,
                           PipelineConfig& cfg) {
  read_string(c, t, "verifier", "name", cfg.verifier.name);
  if (cfg.verifier.name.empty()) {
    if (const toml::node* n = t.get("name")) c.error(*n, "verifier.name", "the name of a verifier plugin");
    c.error(*root.get("verifier"), "verifier", "the key 'name' (a verifier plugin)");
  }
  cfg.verifier.where = c.where(*root.get("verifier"));
  cfg.verifier.params = generic_params(c, t, "verifier", "name");
}

// [decoder]: sample (built in), or a plugin decoder with its keys and the draft model the host loads.
void read_decoder_section(const Checker& c, const toml::table& root, const toml::table& t,
                          PipelineConfig& cfg) {
  read_string(c, t, "decoder", "name", cfg.decoder.name);
  cfg.decoder.where = c.where(*root.get("decoder"));
  if (cfg.decoder.name == "sample") {
    c.only_keys(t, "[decoder] \"sample\"", {"name"});
  } else { // a plugin decoder reads its own keys through the host …
    cfg.decoder.params = generic_params(c, t, "decoder", "name");
    // … except the draft model, which the host loads once for every request.
    read_string(c, t, "decoder", "draft", cfg.decoder.draft);
    read_string(c, t, "decoder", "draft_backend", cfg.decoder.draft_backend);
    cfg.decoder.draft_threads = static_cast<int32_t>(
        read_int(c, t, "decoder", "draft_threads", 0, 0, 1024, "in 0..1024 (0 = the [backend]'s)"));
    cfg.decoder.draft_layers =
        static_cast<int32_t>(read_int(c, t, "decoder", "draft_layers", 0, 0, 4096,
                                      "in 0..4096 (0 = none; else the target's first N layers)"));
    if (!cfg.decoder.draft.empty() && cfg.decoder.draft_layers > 0)
      c.error(*t.get("draft_layers"), "decoder.draft_layers",
              "either draft = \"x.gguf\" or draft_layers = N (the target's own first layers), not both");
    if (cfg.decoder.draft.empty() && cfg.decoder.draft_layers == 0)
      for (const char* k : {"draft_backend", "draft_threads"})
        if (const toml::node* n = t.get(k))
          c.error(*n, std::string("decoder.") + k,
                  "a [decoder] draft = \"x.gguf\" (or draft_layers = N) for it to apply to");
    std::erase_if(cfg.decoder.params, [](const auto& kv) {
      return kv.first == "draft" || kv.first == "draft_backend" || kv.first == "draft_threads" ||
             kv.first == "draft_layers";
    });
  }
}

// [[sampler]]: the chain, in order.
void read_samplers(const Checker& c, const toml::node& s, PipelineConfig& cfg) {
  if (!s.is_array()) c.error(s, "sampler", "an array of tables ([[sampler]] entries)");
  size_t i = 0;
  for (const auto& e : *s.as_array())
    cfg.samplers.push_back(read_sampler(c, e, i++));
}

// [[stop_criterion]]: plugin stop criteria, in order.
void read_stop_criteria(const Checker& c, const toml::node& s, PipelineConfig& cfg) {
  if (!s.is_array()) c.error(s, "stop_criterion", "an array of tables ([[stop_criterion]] entries)");
  size_t i = 0;
  for (const auto& e : *s.as_array())
    cfg.stop_criteria.push_back(read_plugin_table(c, e, "[[stop_criterion]] #" + std::to_string(++i)));
}

// [stop]: the built-in stop rules.
void read_stop_section(const Checker& c, const toml::table& t, PipelineConfig& cfg) {
  c.only_keys(t, "[stop]", {"max_tokens", "strings", "token_ids", "eos", "timeout_ms"});
  cfg.stop.max_tokens = static_cast<int32_t>(
      read_int(c, t, "stop", "max_tokens", 128, -1, 1 << 24, "≥ -1 (-1 = until the context is full)"));
  cfg.stop.strings = read_string_array(c, t, "stop", "strings", true);
  cfg.stop.token_ids = read_int_array(c, t, "stop", "token_ids", 0);
  cfg.stop.eos = read_bool(c, t, "stop", "eos", true);
  cfg.stop.timeout_ms =
      read_int(c, t, "stop", "timeout_ms", 0, 0, std::numeric_limits<int32_t>::max(), "≥ 0 (0 = none)");
}

// [run]: seed, BOS, special tokens, echo.
void read_run_section(const Checker& c, const toml::table& t, PipelineConfig& cfg) {
  c.only_keys(t, "[run]", {"seed", "add_bos", "parse_special", "echo"});
  if (const toml::node* n = t.get("seed")) {
    if (!n->is_integer() || n->as_integer()->get() < 0) c.error(*n, "run.seed", "an integer ≥ 0");
    cfg.run.seed = static_cast<uint64_t>(n->as_integer()->get());
  }
  if (t.get("add_bos")) cfg.run.add_bos = read_bool(c, t, "run", "add_bos", true);
  cfg.run.parse_special = read_bool(c, t, "run", "parse_special", false);
  cfg.run.echo = read_bool(c, t, "run", "echo", true);
}

// [plugins]: the search paths and the sha256 pins.
void read_plugins_section(const Checker& c, const toml::table& t, PipelineConfig& cfg) {
  c.only_keys(t, "[plugins]", {"paths", "sha256"});
  cfg.plugins.paths = read_string_array(c, t, "plugins", "paths", true);
  if (const toml::node* h = t.get("sha256")) {
    if (!h->is_table())
      c.error(*h, "plugins.sha256",
              "a table of \"libloom-NAME.so\" (a plugin file, or its path) = \"64 hex digits\"");
    for (const auto& [k, v] : *h->as_table()) {
      const std::string key(k.str());
      if (key.size() < 4 || key.compare(key.size() - 3, 3, ".so") != 0)
        c.error(v, "plugins.sha256." + key,
                "a plugin file (\"libloom-NAME.so\" or a path to one) — a pin names the file, not the name a "
                "plugin declares, which any file can claim");
      const std::string hex = v.is_string() ? v.as_string()->get() : "";
      const bool ok = hex.size() == 64 && hex.find_first_not_of("0123456789abcdef") == std::string::npos;
      if (!ok)
        c.error(v, "plugins.sha256." + std::string(k.str()), "64 lowercase hex digits (sha256sum FILE)");
      cfg.plugins.sha256[std::string(k.str())] = hex;
    }
  }
}

PipelineConfig validate(const toml::table& root, const Checker& c, const std::string& source,
                        const std::string& base_dir) {
  PipelineConfig cfg;
  cfg.source = source;
  cfg.base_dir = base_dir;
  c.only_keys(root, "the pipeline",
              {"model", "backend", "attention", "kv_cache", "scheduler", "decoder", "verifier", "sampler",
               "stop_criterion", "stop", "run", "plugins", "serve"});
  if (const auto* t = section(c, root, "model")) read_model_section(c, *t, cfg);
  if (const auto* t = section(c, root, "backend")) read_backend_section(c, *t, cfg);
  if (const auto* t = section(c, root, "attention")) read_attention_section(c, *t, cfg);
  if (const auto* t = section(c, root, "kv_cache")) read_kv_cache_section(c, *t, cfg);
  if (const auto* t = section(c, root, "scheduler")) read_scheduler_section(c, *t, cfg);
  if (const auto* t = section(c, root, "serve")) read_serve_section(c, *t, cfg);
  if (const auto* t = section(c, root, "verifier")) read_verifier_section(c, root, *t, cfg);
  if (const auto* t = section(c, root, "decoder")) read_decoder_section(c, root, *t, cfg);
  if (const toml::node* s = root.get("sampler")) read_samplers(c, *s, cfg);
  if (const toml::node* s = root.get("stop_criterion")) read_stop_criteria(c, *s, cfg);
  if (const auto* t = section(c, root, "stop")) read_stop_section(c, *t, cfg);
  if (const auto* t = section(c, root, "run")) read_run_section(c, *t, cfg);
  if (const auto* t = section(c, root, "plugins")) read_plugins_section(c, *t, cfg);
  return cfg;
}

PipelineConfig parse_impl(const std::string& text, const std::string& source, const std::string& base_dir,
                          const std::vector<ConfigOverride>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& s = e.source();
    fail(Errc::parse_error, "config",
         source + ":" + std::to_string(s.begin.line) + ":" + std::to_string(s.begin.column) + ": " +
             std::string(e.description()) + " (the pipeline file must be valid TOML)");
  }
  std::set<const toml::node*> overridden;
  std::vector<std::string> keys;
  for (const auto& o : overrides) {
    if (o.if_absent && root.at_path(o.key)) continue; // the file's own value stands
    const toml::node* n = apply_one(root, o);
    auto sub = collect_nodes(*n);
    overridden.insert(sub.begin(), sub.end());
    keys.push_back(o.key);
  }
  Checker c(source, std::move(overridden), std::move(keys));
  return validate(root, c, source, base_dir);
}

} // namespace

std::string PipelineConfig::resolved_draft_path() const {
  return resolve_path(decoder.draft);
}

std::string PipelineConfig::resolved_model_path() const {
  return resolve_path(model.path);
}

std::string PipelineConfig::resolve_path(const std::string& path) const {
  if (path.empty()) return path;
  fs::path p(path);
  if (p.is_absolute() || fs::exists(p) || base_dir.empty()) return p.string();
  fs::path alt = fs::path(base_dir) / p;
  if (fs::exists(alt)) return alt.string();
  return p.string();
}

ConfigOverride parse_override(const std::string& arg) {
  const auto eq = arg.find('=');
  if (eq == std::string::npos || eq == 0)
    fail(Errc::invalid_argument, "config",
         "--set " + user_value(arg) + ": expected section.key=value (e.g. --set stop.max_tokens=64)");
  return {arg.substr(0, eq), arg.substr(eq + 1)};
}

PipelineConfig parse_pipeline(const std::string& text, const std::string& source,
                              const std::vector<ConfigOverride>& overrides) {
  return parse_impl(text, source, "", overrides);
}

PipelineConfig load_pipeline(const std::string& path, const std::vector<ConfigOverride>& overrides) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    fail(Errc::invalid_argument, "config",
         "pipeline file " + user_value(path) +
             " is a directory; expected a TOML file (see configs/ for examples)");
  std::ifstream f(path, std::ios::binary);
  if (!f)
    fail(Errc::not_found, "config",
         "cannot read pipeline file " + user_value(path) + ": " + std::strerror(errno) +
             " (see configs/ for examples)");
  std::stringstream ss;
  ss << f.rdbuf();
  fs::path base = fs::path(path).parent_path();
  return parse_impl(ss.str(), path, base.string(), overrides);
}

PipelineConfig apply_overrides(const PipelineConfig& base, const std::vector<ConfigOverride>& overrides) {
  if (overrides.empty()) return base;
  PipelineConfig out = parse_impl(to_toml(base), base.source, base.base_dir, overrides);
  return out;
}

namespace {

// A small emitter for the resolved config: sections in DESIGN §5 order, strings escaped as TOML
// basic strings, floats in their shortest round-trip form (so `config show` output is a fixed point).
std::string toml_string(std::string_view v) {
  std::string out = "\"";
  for (unsigned char ch : v) {
    switch (ch) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\t':
      out += "\\t";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\b':
      out += "\\b";
      break;
    case '\f':
      out += "\\f";
      break;
    default:
      if (ch < 0x20 || ch == 0x7F) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04X", ch);
        out += buf;
      } else {
        out += static_cast<char>(ch);
      }
    }
  }
  return out + "\"";
}

std::string toml_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string toml_value(const ParamValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, bool>) {
          return x ? "true" : "false";
        } else if constexpr (std::is_same_v<X, int64_t>) {
          return std::to_string(x);
        } else if constexpr (std::is_same_v<X, double>) {
          return toml_double(x);
        } else if constexpr (std::is_same_v<X, std::string>) {
          return toml_string(x);
        } else {
          std::string out = "[";
          for (size_t i = 0; i < x.size(); ++i) {
            if (i) out += ", ";
            if constexpr (std::is_same_v<X, std::vector<double>>) {
              out += toml_double(x[i]);
            } else {
              out += std::to_string(x[i]);
            }
          }
          return out + "]";
        }
      },
      v);
}

template <class T> std::string toml_list(const std::vector<T>& xs) {
  std::string out = "[";
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) out += ", ";
    if constexpr (std::is_same_v<T, std::string>) {
      out += toml_string(xs[i]);
    } else {
      out += std::to_string(xs[i]);
    }
  }
  return out + "]";
}

} // namespace

std::string to_toml(const PipelineConfig& cfg) {
  std::ostringstream o;
  auto kv = [&](const char* k, const std::string& v) { o << k << " = " << v << "\n"; };
  auto b = [](bool x) { return std::string(x ? "true" : "false"); };
  o << "[model]\n";
  kv("path", toml_string(cfg.model.path));
  kv("n_ctx", std::to_string(cfg.model.n_ctx));
  o << "\n[backend]\n";
  kv("name", toml_string(cfg.backend.name));
  kv("threads", std::to_string(cfg.backend.threads));
  for (const auto& [k, v] : cfg.backend.params)
    kv(k.c_str(), toml_value(v));
  o << "\n[attention]\n";
  kv("variant", toml_string(cfg.attention.variant));
  kv("kernel", toml_string(cfg.attention.kernel));
  kv("window", std::to_string(cfg.attention.window));
  kv("sinks", std::to_string(cfg.attention.sinks));
  if (cfg.attention.softcap) {
    std::ostringstream sc;
    sc << *cfg.attention.softcap;
    kv("softcap", sc.str().find_first_of(".e") == std::string::npos ? sc.str() + ".0" : sc.str());
  }
  o << "\n[kv_cache]\n";
  kv("store", toml_string(cfg.kv_cache.store));
  kv("block_size", std::to_string(cfg.kv_cache.block_size));
  kv("dtype", toml_string(cfg.kv_cache.dtype));
  kv("max_tokens", std::to_string(cfg.kv_cache.max_tokens));
  kv("prefix_cache", b(cfg.kv_cache.prefix_cache));
  kv("swa_full", b(cfg.kv_cache.swa_full));
  o << "\n[scheduler]\n";
  kv("max_batch_tokens", std::to_string(cfg.scheduler.max_batch_tokens));
  kv("max_sequences", std::to_string(cfg.scheduler.max_sequences));
  if (!cfg.serve.name.empty()) {
    o << "\n[serve]\n";
    kv("name", toml_string(cfg.serve.name));
  }
  if (!cfg.serve.ab.empty()) {
    if (cfg.serve.name.empty()) o << "\n[serve]\n";
    std::string t = "{ ";
    for (size_t i = 0; i < cfg.serve.ab.size(); ++i)
      t += (i ? ", " : "") + toml_string(cfg.serve.ab[i].first) + " = " +
           std::to_string(cfg.serve.ab[i].second);
    kv("ab", t + " }");
  }
  o << "\n[decoder]\n";
  kv("name", toml_string(cfg.decoder.name));
  if (cfg.decoder.draft_layers > 0) kv("draft_layers", std::to_string(cfg.decoder.draft_layers));
  if (!cfg.decoder.draft.empty() || cfg.decoder.draft_layers > 0) {
    if (!cfg.decoder.draft.empty()) kv("draft", toml_string(cfg.decoder.draft));
    if (!cfg.decoder.draft_backend.empty()) kv("draft_backend", toml_string(cfg.decoder.draft_backend));
    if (cfg.decoder.draft_threads > 0) kv("draft_threads", std::to_string(cfg.decoder.draft_threads));
  }
  for (const auto& [k, v] : cfg.decoder.params)
    kv(k.c_str(), toml_value(v));
  if (!cfg.verifier.name.empty()) {
    o << "\n[verifier]\n";
    kv("name", toml_string(cfg.verifier.name));
    for (const auto& [k, v] : cfg.verifier.params)
      kv(k.c_str(), toml_value(v));
  }
  for (const auto& s : cfg.samplers) {
    o << "\n[[sampler]]\n";
    kv("name", toml_string(s.name));
    for (const auto& [k, v] : s.params)
      kv(k.c_str(), toml_value(v));
  }
  for (const auto& s : cfg.stop_criteria) {
    o << "\n[[stop_criterion]]\n";
    kv("name", toml_string(s.name));
    for (const auto& [k, v] : s.params)
      kv(k.c_str(), toml_value(v));
  }
  o << "\n[stop]\n";
  kv("max_tokens", std::to_string(cfg.stop.max_tokens));
  kv("strings", toml_list(cfg.stop.strings));
  kv("token_ids", toml_list(cfg.stop.token_ids));
  kv("eos", b(cfg.stop.eos));
  kv("timeout_ms", std::to_string(cfg.stop.timeout_ms));
  o << "\n[run]\n";
  if (cfg.run.seed) kv("seed", std::to_string(*cfg.run.seed));
  if (cfg.run.add_bos) kv("add_bos", b(*cfg.run.add_bos));
  kv("parse_special", b(cfg.run.parse_special));
  kv("echo", b(cfg.run.echo));
  o << "\n[plugins]\n";
  kv("paths", toml_list(cfg.plugins.paths));
  if (!cfg.plugins.sha256.empty()) {
    o << "\n[plugins.sha256]\n";
    for (const auto& [k, v] : cfg.plugins.sha256)
      o << toml_string(k) << " = " << toml_string(v) << "\n";
  }
  return o.str();
}

} // namespace loom
