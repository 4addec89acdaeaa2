// format/hf_json.hpp — the JSON of a Hugging Face checkpoint, read as untrusted input (private
// header): parsing with bounded nesting, typed reads whose errors name the file and the key, and
// values shown in messages.
#pragma once

#include "format/hf_files.hpp"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::hf {

using json = nlohmann::json;

// Parses `text`; nesting deeper than 32 levels and, with `unique_top_keys`, a key that appears twice
// in the top-level object are errors (a safetensors header naming a tensor twice). `shown` names the
// file in messages.
json parse_json(std::string_view text, const std::string& shown, bool unique_top_keys = false);

// A value as a message shows it: compact JSON, cut after 60 bytes.
std::string describe(const json& v);
// A shape as a message shows it: "[4096, 32000]".
std::string shape_str(const std::vector<int64_t>& s);

// obj[key]: nullptr when obj is not an object or the key is missing or null.
const json* member(const json& obj, std::string_view key);
// An integer that fits int64_t, else nullopt (floats, strings, a u64 above INT64_MAX).
std::optional<int64_t> as_int(const json& v);

// obj[key] as a string or bool: `def` when obj is not an object or the key is missing or null;
// another type is an error naming the file.
std::string str_or(const json& obj, const char* key, const char* def, const std::string& shown);
bool bool_or(const json& obj, const char* key, bool def, const std::string& shown);

// Typed reads of a JSON object's keys (null counts as missing) with messages naming the file and key.
class Keys {
public:
  Keys(const json& obj, std::string shown) : j_(obj), shown_(std::move(shown)) {}

  std::optional<int64_t> int_opt(std::string_view key, int64_t min, int64_t max) const;
  int64_t int_req(std::string_view key, int64_t min, int64_t max) const;
  // A finite number that fits a float.
  std::optional<double> num_opt(std::string_view key) const;
  std::optional<bool> bool_opt(std::string_view key) const;
  std::optional<std::string> str_opt(std::string_view key) const;
  [[noreturn]] void missing(std::string_view key) const;
  const std::string& shown() const noexcept { return shown_; }

private:
  const json& j_;
  std::string shown_;
};

} // namespace loom::hf
