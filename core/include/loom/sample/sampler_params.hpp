// loom/sample/sampler_params.hpp — a sampler's parameters: their values as they come from TOML (or the CLI),
// a spec (sampler name + key = value pairs) and the schema each key is described and validated by.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace loom {

// Parameter values as they come from TOML (or the CLI).
using ParamValue =
    std::variant<bool, int64_t, double, std::string, std::vector<int64_t>, std::vector<double>>;

struct SamplerSpec {
  std::string name;                                       // "top_k", "temperature", ...
  std::vector<std::pair<std::string, ParamValue>> params; // key = value, in file order
  std::string where{};                                    // "p.toml:12:1" (for plugin errors)
};

// What a parameter accepts — the pipeline validator reads this to name the expected form.
struct ParamSchema {
  std::string key;
  enum class Kind { boolean, integer, number, int_list, number_list, string } kind;
  double min = 0, max = 0; // inclusive bounds unless *_open
  bool min_open = false, max_open = false;
  bool has_min = false, has_max = false;
  bool required = false;
  std::string help; // "k ≥ 0 (0 = keep all)"
};

// The accepted form of a parameter in words, for "expected ..." messages: "an integer ≥ 0",
// "a number in (0, 1]", "a list of integers, each ≥ 0". Bounds of a list apply to each element.
std::string describe_expected(const ParamSchema& s);
// Whether a (finite) value lies in the schema's range. NaN is never accepted.
bool schema_accepts(const ParamSchema& s, double x) noexcept;
// describe_expected with the parameter's help text: "an integer ≥ 0 (0 = off)". The one formatter of
// a parameter's accepted form, for the sampler factory's and the pipeline validator's messages.
std::string describe_param(const ParamSchema& s);

} // namespace loom
