// sample/sampler_params.cpp — how a sampler's TOML keys are described and validated: the schema
// builders, the "expected ..." wording (describe_expected / describe_param), the per-value checks and
// Params, a spec's parameters validated against its sampler's schema.
#include "loom/sample/sampler_params.hpp"

#include "loom/error.hpp"
#include "loom/sample/sampler.hpp"
#include "sample/params.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace loom {

namespace {

using sample::fail_arg;

std::string fmt_num(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

std::string value_type_name(const ParamValue& v) {
  switch (v.index()) {
  case 0:
    return "a boolean";
  case 1:
    return "an integer";
  case 2:
    return "a number";
  case 3:
    return "a string";
  case 4:
    return "a list of integers";
  default:
    return "a list of numbers";
  }
}

std::string value_text(const ParamValue& v) {
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return fmt_num(*d);
  if (const auto* s = std::get_if<std::string>(&v)) return "\"" + *s + "\"";
  return value_type_name(v);
}

[[noreturn]] void fail_value(const SamplerInfo& info, const ParamSchema& s, const std::string& what) {
  fail_arg(info.name + ": " + s.key + " " + what + "; expected " + describe_param(s));
}

// Checks one value against its schema (type, finiteness, range); throws with the sampler and key named.
void check_value(const SamplerInfo& info, const ParamSchema& s, const ParamValue& v) {
  using Kind = ParamSchema::Kind;
  const auto check_scalar = [&](double x, bool allow_inf, const std::string& shown) {
    if (std::isnan(x) || (!allow_inf && std::isinf(x)))
      fail_value(info, s, "= " + shown + " is not a finite number");
    if (!schema_accepts(s, x)) fail_value(info, s, "= " + shown + " is out of range");
  };
  switch (s.kind) {
  case Kind::boolean:
    if (!std::holds_alternative<bool>(v)) fail_value(info, s, "is " + value_type_name(v));
    return;
  case Kind::integer:
    if (!std::holds_alternative<int64_t>(v)) fail_value(info, s, "is " + value_type_name(v));
    check_scalar(static_cast<double>(std::get<int64_t>(v)), false, value_text(v));
    return;
  case Kind::number:
    if (const auto* i = std::get_if<int64_t>(&v))
      check_scalar(static_cast<double>(*i), false, value_text(v));
    else if (const auto* d = std::get_if<double>(&v))
      check_scalar(*d, false, value_text(v));
    else
      fail_value(info, s, "is " + value_type_name(v));
    return;
  case Kind::int_list:
    if (const auto* l = std::get_if<std::vector<int64_t>>(&v)) {
      for (size_t i = 0; i < l->size(); ++i)
        check_scalar(static_cast<double>((*l)[i]), false,
                     "[" + std::to_string(i) + "] " + std::to_string((*l)[i]));
    } else if (const auto* dl = std::get_if<std::vector<double>>(&v); !(dl && dl->empty())) {
      fail_value(info, s, "is " + value_type_name(v)); // an empty list has no element type: accepted
    }
    return;
  case Kind::string:
    if (!std::holds_alternative<std::string>(v)) fail_value(info, s, "is " + value_type_name(v));
    return;
  case Kind::number_list:
    if (const auto* l = std::get_if<std::vector<int64_t>>(&v)) {
      for (size_t i = 0; i < l->size(); ++i)
        check_scalar(static_cast<double>((*l)[i]), true,
                     "[" + std::to_string(i) + "] " + std::to_string((*l)[i]));
    } else if (const auto* dl = std::get_if<std::vector<double>>(&v)) {
      for (size_t i = 0; i < dl->size(); ++i)
        check_scalar((*dl)[i], true, "[" + std::to_string(i) + "] " + fmt_num((*dl)[i]));
    } else {
      fail_value(info, s, "is " + value_type_name(v));
    }
    return;
  }
}

} // namespace

namespace sample {

[[noreturn]] void fail_arg(const std::string& msg) {
  fail(Errc::invalid_argument, "sampler", msg);
}

ParamSchema number(std::string key, std::string help) {
  ParamSchema s;
  s.key = std::move(key);
  s.kind = ParamSchema::Kind::number;
  s.help = std::move(help);
  return s;
}

ParamSchema integer(std::string key, std::string help) {
  ParamSchema s = number(std::move(key), std::move(help));
  s.kind = ParamSchema::Kind::integer;
  return s;
}

ParamSchema with_min(ParamSchema s, double min, bool open) {
  s.has_min = true;
  s.min = min;
  s.min_open = open;
  return s;
}

ParamSchema with_max(ParamSchema s, double max, bool open) {
  s.has_max = true;
  s.max = max;
  s.max_open = open;
  return s;
}

ParamSchema required(ParamSchema s) {
  s.required = true;
  return s;
}

Params::Params(const SamplerInfo& info, const SamplerSpec& spec) {
  for (const auto& kv : spec.params) {
    const std::string& k = kv.first;
    const ParamValue& v = kv.second;
    const auto it = std::find_if(info.params.begin(), info.params.end(),
                                 [&](const ParamSchema& s) { return s.key == k; });
    if (it == info.params.end()) {
      std::string msg = info.name + ": unknown key '" + k + "'; ";
      if (info.params.empty()) {
        msg += info.name + " takes no parameters";
      } else {
        msg += "expected one of:";
        for (size_t i = 0; i < info.params.size(); ++i)
          msg += (i ? ", " : " ") + info.params[i].key;
      }
      fail_arg(msg);
    }
    if (values_.count(k)) fail_arg(info.name + ": key '" + k + "' is given twice");
    check_value(info, *it, v);
    values_.emplace(k, v);
  }
  for (const auto& s : info.params)
    if (s.required && !values_.count(s.key))
      fail_arg(info.name + ": missing key '" + s.key + "'; expected " + describe_expected(s) + " (" + s.help +
               ")");
}

double Params::num(const std::string& k, double dflt) const {
  const auto it = values_.find(k);
  if (it == values_.end()) return dflt;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  return std::get<double>(it->second);
}

int64_t Params::integer(const std::string& k, int64_t dflt) const {
  const auto it = values_.find(k);
  return it == values_.end() ? dflt : std::get<int64_t>(it->second);
}

std::vector<int64_t> Params::int_list(const std::string& k) const {
  const auto it = values_.find(k);
  if (it == values_.end()) return {};
  if (const auto* l = std::get_if<std::vector<int64_t>>(&it->second)) return *l;
  return {}; // an empty list of unknown type
}

std::string Params::str(const std::string& k, std::string dflt) const {
  const auto it = values_.find(k);
  return it == values_.end() ? dflt : std::get<std::string>(it->second);
}

std::vector<double> Params::number_list(const std::string& k) const {
  const auto it = values_.find(k);
  if (it == values_.end()) return {};
  if (const auto* l = std::get_if<std::vector<double>>(&it->second)) return *l;
  const auto& il = std::get<std::vector<int64_t>>(it->second);
  std::vector<double> out;
  out.reserve(il.size());
  for (int64_t x : il)
    out.push_back(static_cast<double>(x));
  return out;
}

} // namespace sample

std::string describe_expected(const ParamSchema& s) {
  using Kind = ParamSchema::Kind;
  std::string out;
  switch (s.kind) {
  case Kind::boolean:
    return "a boolean (true or false)";
  case Kind::integer:
    out = "an integer";
    break;
  case Kind::number:
    out = "a number";
    break;
  case Kind::int_list:
    out = "a list of integers";
    break;
  case Kind::number_list:
    out = "a list of numbers";
    break;
  case Kind::string:
    return "a string";
  }
  const bool list = s.kind == Kind::int_list || s.kind == Kind::number_list;
  if (s.has_min && s.has_max) {
    out += list ? ", each in " : " in ";
    out += (s.min_open ? "(" : "[") + fmt_num(s.min) + ", " + fmt_num(s.max) + (s.max_open ? ")" : "]");
  } else if (s.has_min) {
    out += (list ? ", each " : " ") + std::string(s.min_open ? "> " : "≥ ") + fmt_num(s.min);
  } else if (s.has_max) {
    out += (list ? ", each " : " ") + std::string(s.max_open ? "< " : "≤ ") + fmt_num(s.max);
  }
  return out;
}

bool schema_accepts(const ParamSchema& s, double x) noexcept {
  if (std::isnan(x)) return false;
  if (s.has_min && (s.min_open ? !(x > s.min) : !(x >= s.min))) return false;
  if (s.has_max && (s.max_open ? !(x < s.max) : !(x <= s.max))) return false;
  return true;
}

std::string describe_param(const ParamSchema& s) {
  return s.help.empty() ? describe_expected(s) : describe_expected(s) + " (" + s.help + ")";
}

} // namespace loom
