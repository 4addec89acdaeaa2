// sample/params.hpp — private to core/src/sample/: the samplers' invalid-argument error, the schema
// builders the built-ins' table is written with, and Params, one spec's parameters validated against
// its sampler's schema.
#pragma once

#include "loom/sample/sampler.hpp"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom::sample {

// Throws loom::Error(invalid_argument) from "sampler": every sampler argument error.
[[noreturn]] void fail_arg(const std::string& msg);

// Schema builders: number("p", help) is a number key; with_min / with_max bound it (open: strictly).
ParamSchema number(std::string key, std::string help);
ParamSchema integer(std::string key, std::string help);
ParamSchema with_min(ParamSchema s, double min, bool open = false);
ParamSchema with_max(ParamSchema s, double max, bool open = false);
ParamSchema required(ParamSchema s);

// Validated parameters of one spec, by key. The constructor checks every key (known, given once, of
// the schema's type and range) in file order, then that the required ones are there; it throws with
// the sampler and the key named. The getters take the default of a key that was left out.
class Params {
public:
  Params(const SamplerInfo& info, const SamplerSpec& spec);

  double num(const std::string& k, double dflt) const;
  int64_t integer(const std::string& k, int64_t dflt) const;
  std::vector<int64_t> int_list(const std::string& k) const;
  std::string str(const std::string& k, std::string dflt) const;
  std::vector<double> number_list(const std::string& k) const;

private:
  std::unordered_map<std::string, ParamValue> values_;
};

} // namespace loom::sample
