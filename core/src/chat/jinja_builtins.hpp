#pragma once
// Jinja operations on values, attribute and item access, tests, filters and the global functions.

#include "chat/jinja_value.hpp"

#include <cstdint>
#include <functional>
#include <string>

namespace loom::chat::jinja {

// ---- operations ----

int64_t as_int(const Value& v);
// `a op b` for op in + - * / // % ** (a str or list times an int repeats it), as Python computes it.
Value arith(const std::string& op, const Value& a, const Value& b, int line);
int compare(const Value& a, const Value& b, int line); // <0, 0, >0 for ordering
// The items `for` walks: a list's elements, a dict's keys, a string's characters; undefined: none.
List iterate(const Value& v, int line);
bool contains(const Value& container, const Value& item, int line);
Value make_func(std::string name, std::function<Value(Ctx&, Args&, int)> fn);

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
