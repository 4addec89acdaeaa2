#pragma once
// Jinja operations on values (jinja_ops.cpp), attribute and item access with the methods of str, dict and
// list values (jinja_methods.cpp), tests, filters and the global functions (jinja_filters.cpp).

#include "chat/jinja_value.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace loom::chat::jinja {

// ---- operations ----

// The most items a list built by the template itself may have (range(), list * n): values are ≈ 100 bytes.
constexpr int64_t k_max_items = 1'000'000;

int64_t as_int(const Value& v);
// `a op b` for op in + - * / // % ** (a str or list times an int repeats it), as Python computes it.
Value arith(const std::string& op, const Value& a, const Value& b, int line);
int compare(const Value& a, const Value& b, int line); // <0, 0, >0 for ordering
// The items `for` walks: a list's elements, a dict's keys, a string's characters; undefined: none.
List iterate(const Value& v, int line);
bool contains(const Value& container, const Value& item, int line);
// len(): a string's code points, a list's items, a dict's keys; undefined: 0.
int64_t length(const Value& v, int line);
Value make_func(std::string name, std::function<Value(Ctx&, Args&, int)> fn);

// ---- string helpers and call arguments (the methods' and the filters') ----

// s without leading (left) and trailing (right) whitespace, or the code points of `chars`.
std::string strip_chars(std::string_view s, const Value* chars, bool left, bool right);
// Python's str.split: on runs of whitespace without sep; at most maxsplit splits when ≥ 0.
List split(std::string_view s, const Value* sep, int64_t maxsplit, int line);
// s with `from` replaced by `to`, the first `count` times (all when count < 0).
std::string replace_all(std::string s, std::string_view from, std::string_view to, int64_t count);
std::string case_map(std::string_view s, int mode); // 0 lower, 1 upper, 2 title, 3 capitalize (ASCII)
// Argument i of a call, else its keyword kw; null when neither was given.
const Value* arg(const Args& a, size_t i, std::string_view kw);
// An integer argument (a boolean counts), `def` when absent or none.
int64_t int_arg(const Args& a, size_t i, std::string_view kw, int64_t def, int line);

// `obj.name` as jinja2's getattr: a method, else a key (a namespace's attribute); missing: undefined.
Value get_attr(const Value& obj, const std::string& name, int line);
// `obj[key]` as jinja2's getitem: an element, a key, else an attribute; missing: undefined.
Value get_item(const Value& obj, const Value& key, int line);

// ---- tests (`x is name`) ----
bool run_test(Ctx& c, const std::string& name, const Value& v, Args& a, int line);

// `v|name(args)`: the filter `name` applied to v.
Value apply_filter(Ctx& c, const std::string& name, const Value& v, Args& a, int line);

// Adds the global functions (raise_exception, strftime_now, namespace, dict, range) to c.globals.
void add_globals(Ctx& c);

} // namespace loom::chat::jinja
