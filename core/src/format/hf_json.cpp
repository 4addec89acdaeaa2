// format/hf_json.cpp — the JSON of a Hugging Face checkpoint (format/hf_json.hpp).
#include "format/hf_json.hpp"

#include "loom/format/gguf.hpp"

#include <cmath>
#include <limits>
#include <set>

namespace loom::hf {

namespace {

constexpr int k_max_json_depth = 32; // real files nest 6 deep at most

struct JsonTooDeep {};

} // namespace

json parse_json(std::string_view text, const std::string& shown, bool unique_top_keys) {
  std::set<std::string> seen;
  std::string dup;
  const json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth > k_max_json_depth) throw JsonTooDeep{};
    if (unique_top_keys && ev == json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !seen.insert(parsed.get_ref<const std::string&>()).second && dup.empty())
      dup = parsed.get<std::string>();
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), cb, true);
  } catch (const JsonTooDeep&) {
    bad(shown, "JSON nested deeper than " + std::to_string(k_max_json_depth) +
                   " levels: the file is corrupt or not what its name says");
  } catch (const json::parse_error& e) {
    bad(shown, "invalid JSON at byte " + std::to_string(e.byte) + " (" + gguf_printable(e.what(), 160) +
                   "); the file is truncated or corrupt — re-download it");
  } catch (const json::exception& e) {
    bad(shown, "invalid JSON (" + gguf_printable(e.what(), 160) + "); re-download the file");
  }
  if (!dup.empty())
    bad(shown,
        "key '" + gguf_printable(dup) + "' appears twice: expected each tensor once; the file is corrupt");
  return j;
}

std::string describe(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return gguf_printable(s, 60);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t k = 0; k < s.size(); ++k)
    r += (k ? ", " : "") + std::to_string(s[k]);
  return r + "]";
}

const json* member(const json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<int64_t> as_int(const json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

std::string str_or(const json& obj, const char* key, const char* def, const std::string& shown) {
  const json* v = member(obj, key);
  if (!v) return def;
  if (!v->is_string()) bad(shown, std::string("'") + key + "' should be a string, found " + describe(*v));
  return v->get<std::string>();
}

bool bool_or(const json& obj, const char* key, bool def, const std::string& shown) {
  const json* v = member(obj, key);
  if (!v) return def;
  if (!v->is_boolean())
    bad(shown, std::string("'") + key + "' should be true or false, found " + describe(*v));
  return v->get<bool>();
}

// ---- Keys ----------------------------------------------------------------------------------------

std::optional<int64_t> Keys::int_opt(std::string_view key, int64_t min, int64_t max) const {
  const json* v = member(j_, key);
  if (!v) return std::nullopt;
  const auto i = as_int(*v);
  if (!i || *i < min || *i > max)
    bad(shown_, "'" + std::string(key) + "' should be an integer in " + std::to_string(min) + ".." +
                    std::to_string(max) + ", found " + describe(*v) + "; the checkpoint's config is corrupt");
  return i;
}

int64_t Keys::int_req(std::string_view key, int64_t min, int64_t max) const {
  const auto i = int_opt(key, min, max);
  if (!i) missing(key);
  return *i;
}

std::optional<double> Keys::num_opt(std::string_view key) const {
  const json* v = member(j_, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(shown_, "'" + std::string(key) + "' should be a number, found " + describe(*v));
  const double d = v->get<double>();
  if (!std::isfinite(d) || std::abs(d) > static_cast<double>(std::numeric_limits<float>::max()))
    bad(shown_, "'" + std::string(key) + "' should be a finite number, found " + describe(*v));
  return d;
}

std::optional<bool> Keys::bool_opt(std::string_view key) const {
  const json* v = member(j_, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean())
    bad(shown_, "'" + std::string(key) + "' should be true or false, found " + describe(*v));
  return v->get<bool>();
}

std::optional<std::string> Keys::str_opt(std::string_view key) const {
  const json* v = member(j_, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) bad(shown_, "'" + std::string(key) + "' should be a string, found " + describe(*v));
  return v->get<std::string>();
}

void Keys::missing(std::string_view key) const {
  bad(shown_, "'" + std::string(key) + "' is missing: expected it in a Llama-family config.json",
      Errc::not_found);
}

} // namespace loom::hf
