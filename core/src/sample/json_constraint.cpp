// JSON-schema constrained decoding: the schema compiler, the byte-level pushdown matcher, the
// vocabulary trie the token mask is computed over, and the `json_schema` sampler stage.
//
// The matcher keeps a set of parse stacks ("threads"; several only where anyOf leaves a choice
// open). A stack is a vector of small frames: the root, then one frame per open object, array,
// string, number or literal. A byte either advances a frame, completes it (its parent is told), or
// kills the thread. Numbers and literals end when a byte cannot continue them: they complete and the
// byte goes on to the parent. The token mask walks a trie of the vocabulary's byte strings, feeding
// one byte per trie edge, so a prefix shared by many tokens is matched once.
#include "loom/sample/json_constraint.hpp"

#include "loom/error.hpp"
#include "loom/sample/sampler.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace loom {

namespace {

// Objects keep the schema text's key order: properties are asked for in that order.
using Json = nlohmann::ordered_json;

[[noreturn]] void fail_schema(const std::string& msg) {
  fail(Errc::invalid_argument, "json_schema", msg);
}

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
constexpr uint8_t kMaxIndent = 20;  // spaces or tabs after a newline between two JSON tokens
constexpr uint8_t kWsClosed = 0xFF; // Frame::ws after a single space: no more whitespace
constexpr uint32_t kMaxDigits = 20; // in a number's integer part, and in its fraction
constexpr uint64_t kMaxExpDigits = 4;
constexpr size_t kMaxDepth = 64;   // frames in one stack
constexpr size_t kMaxThreads = 64; // parse stacks alive at once
constexpr size_t kMaxChoices = 64; // properties of one object, values of one enum
// A schema's compiled size: its nodes, and the alternatives one anyOf expands to when a byte is fed
// (anyOf of $refs to anyOfs multiply: 9 refs 7 levels deep would be 9^7 stacks per byte).
constexpr size_t kMaxNodes = 4096;
constexpr size_t kMaxAlternatives = 256;
// Parse-stack advances one token mask may take (a normal schema over a 50k vocabulary needs well under a
// tenth of it); past it the request fails alone instead of holding up the step of every other one.
constexpr size_t kMaxMaskWork = size_t{8} << 20;

enum class NT : uint8_t { any, object, array, string, number, integer, literals, any_of };

} // namespace

struct JsonGrammar::Node {
  NT type = NT::any;
  // object: properties in the schema's order (names JSON-escaped, without quotes)
  std::vector<std::string> keys;
  std::vector<uint32_t> key_nodes;
  std::vector<bool> required;
  uint32_t additional = kNone; // object without properties: the values' schema (kNone: no keys at all)
  // array
  uint32_t items = 0;
  uint32_t min_items = 0, max_items = kNone;
  // string
  uint32_t min_len = 0, max_len = kNone;
  // literals (enum, const, true/false/null): their compact JSON texts
  std::vector<std::string> lits;
  // any_of
  std::vector<uint32_t> alts;
};

namespace {

// The nodes every grammar has: any value and its parts.
enum : uint32_t { kAny = 0, kAnyObject = 1, kAnyArray = 2, kAnyString = 3, kAnyNumber = 4, kAnyLiteral = 5 };

} // namespace

JsonGrammar::JsonGrammar() = default;
JsonGrammar::~JsonGrammar() = default;
const JsonGrammar::Node& JsonGrammar::node(uint32_t i) const {
  return nodes_[i];
}

class JsonSchemaCompiler {
public:
  explicit JsonSchemaCompiler(JsonGrammar& g) : g_(g) {
    auto& n = g_.nodes_;
    n.resize(6);
    n[kAny].type = NT::any;
    n[kAnyObject].type = NT::object;
    n[kAnyObject].additional = kAny;
    n[kAnyArray].type = NT::array;
    n[kAnyArray].items = kAny;
    n[kAnyString].type = NT::string;
    n[kAnyNumber].type = NT::number;
    n[kAnyLiteral].type = NT::literals;
    n[kAnyLiteral].lits = {"true", "false", "null"};
  }

  uint32_t compile_root(const Json& schema) {
    root_ = &schema;
    const uint32_t root = compile(schema, "#", 0);
    check_alternatives();
    return root;
  }

private:
  uint32_t add(JsonGrammar::Node n) {
    if (g_.nodes_.size() >= kMaxNodes)
      fail_schema(at_ + ": the schema compiles to more than " + std::to_string(kMaxNodes) +
                  " states; simplify it");
    g_.nodes_.push_back(std::move(n));
    return static_cast<uint32_t>(g_.nodes_.size() - 1);
  }

  static uint32_t count(const Json& s, const char* key, const std::string& at) {
    const auto it = s.find(key);
    if (it == s.end()) return kNone;
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      fail_schema(at + "/" + key + " must be a non-negative integer");
    return static_cast<uint32_t>(std::min<int64_t>(it->get<int64_t>(), kNone - 1));
  }

  uint32_t literals(const std::vector<Json>& values, const std::string& at) {
    if (values.empty()) fail_schema(at + ": an empty enum allows no value");
    if (values.size() > kMaxChoices)
      fail_schema(at + ": an enum of " + std::to_string(values.size()) + " values; at most " +
                  std::to_string(kMaxChoices) + " are supported");
    JsonGrammar::Node n;
    n.type = NT::literals;
    for (const auto& v : values) {
      std::string text = v.dump();
      if (std::find(n.lits.begin(), n.lits.end(), text) == n.lits.end()) n.lits.push_back(std::move(text));
    }
    return add(std::move(n));
  }

  uint32_t any_of(std::vector<uint32_t> alts, const std::string& at) {
    if (alts.size() == 1) return alts[0];
    JsonGrammar::Node n;
    n.type = NT::any_of;
    n.alts = std::move(alts);
    const uint32_t i = add(std::move(n));
    where_[i] = at;
    return i;
  }

  // The stacks one byte fed at node i can split into (its anyOf's leaves, through nested anyOfs and
  // $refs), capped just past the budget. An anyOf that reaches itself through anyOfs and $refs alone
  // (consuming nothing) is over it: the matcher would unfold it to its depth guard, fan-out^16 stacks.
  size_t alternatives(uint32_t i, std::vector<size_t>& memo, std::vector<uint8_t>& busy) const {
    const JsonGrammar::Node& n = g_.nodes_[i];
    if (n.type != NT::any_of) return 1;
    if (busy[i]) return kMaxAlternatives + 1;
    if (memo[i]) return memo[i];
    busy[i] = 1;
    size_t sum = 0;
    for (const uint32_t a : n.alts)
      if ((sum += alternatives(a, memo, busy)) > kMaxAlternatives) break;
    busy[i] = 0;
    return memo[i] = std::min(sum, kMaxAlternatives + 1);
  }
  void check_alternatives() const {
    std::vector<size_t> memo(g_.nodes_.size(), 0);
    std::vector<uint8_t> busy(g_.nodes_.size(), 0);
    // Named: the anyOf where the budget is crossed (over it, though none of its alternatives is), else
    // the first one over it (a cycle of anyOfs).
    const std::string* over = nullptr;
    for (const auto& [i, at] : where_) {
      if (alternatives(i, memo, busy) <= kMaxAlternatives) continue;
      const auto& alts = g_.nodes_[i].alts;
      const bool crossed = std::none_of(alts.begin(), alts.end(), [&](uint32_t a) {
        return alternatives(a, memo, busy) > kMaxAlternatives;
      });
      if (!over || crossed) over = &at;
      if (crossed) break;
    }
    if (over)
      fail_schema(*over + ": its anyOf / oneOf expands to more than " + std::to_string(kMaxAlternatives) +
                  " alternatives (nested anyOfs and $refs multiply, or lead back to it without a value "
                  "between); flatten or simplify it");
  }

  const Json& resolve(const std::string& ref, const std::string& at) {
    if (ref == "#") return *root_;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (ref.compare(0, p.size(), p) != 0) continue;
      const std::string section = p.substr(2, p.size() - 3);
      const std::string name = ref.substr(p.size());
      const auto sec = root_->find(section);
      if (sec == root_->end() || !sec->is_object() || !sec->contains(name))
        fail_schema(at + ": $ref " + user_value(ref) + " names no schema in " + section);
      return (*sec)[name];
    }
    fail_schema(at + ": $ref " + user_value(ref) +
                " is not supported (expected \"#\", \"#/$defs/NAME\" or \"#/definitions/NAME\")");
  }

  uint32_t compile(const Json& s, const std::string& at, int depth) {
    at_ = at;
    if (depth > 64) fail_schema(at + ": the schema nests more than 64 levels deep");
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail_schema(at + ": the schema false allows no value");
      return kAny;
    }
    if (!s.is_object())
      fail_schema(at + ": expected a schema (a JSON object), found " + s.dump().substr(0, 60));
    if (const auto it = s.find("$ref"); it != s.end()) {
      if (!it->is_string()) fail_schema(at + "/$ref must be a string");
      const std::string ref = it->get<std::string>();
      if (const auto f = refs_.find(ref); f != refs_.end()) return f->second;
      // A placeholder first, so a recursive schema refers to itself.
      const uint32_t slot = add({});
      g_.nodes_[slot].type = NT::any_of;
      where_[slot] = at;
      refs_[ref] = slot;
      const uint32_t target = compile(resolve(ref, at), ref, depth + 1);
      g_.nodes_[slot].alts = {target};
      return slot;
    }
    if (const auto it = s.find("const"); it != s.end()) return literals({*it}, at);
    if (const auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array()) fail_schema(at + "/enum must be an array");
      return literals(it->get<std::vector<Json>>(), at);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (const auto it = s.find(key); it != s.end()) {
        if (!it->is_array() || it->empty()) fail_schema(at + "/" + key + " must be a non-empty array");
        std::vector<uint32_t> alts;
        for (size_t i = 0; i < it->size(); ++i)
          alts.push_back(compile((*it)[i], at + "/" + key + "/" + std::to_string(i), depth + 1));
        return any_of(std::move(alts), at + "/" + key);
      }
    }
    if (const auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->size() != 1)
        fail_schema(at + "/allOf: only an allOf of exactly one schema is supported");
      return compile((*it)[0], at + "/allOf/0", depth + 1);
    }
    std::vector<std::string> types;
    if (const auto it = s.find("type"); it != s.end()) {
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array() && !it->empty()) {
        for (const auto& t : *it) {
          if (!t.is_string()) fail_schema(at + "/type must be a type name or a list of them");
          types.push_back(t.get<std::string>());
        }
      } else {
        fail_schema(at + "/type must be a type name or a list of them");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern")) {
      types.push_back("string");
    } else {
      return kAny;
    }
    std::vector<uint32_t> alts;
    for (const auto& t : types)
      alts.push_back(typed(s, t, at, depth));
    return any_of(std::move(alts), at + "/type");
  }

  uint32_t typed(const Json& s, const std::string& type, const std::string& at, int depth) {
    JsonGrammar::Node n;
    if (type == "object") {
      n.type = NT::object;
      std::vector<std::string> required;
      if (const auto it = s.find("required"); it != s.end()) {
        if (!it->is_array()) fail_schema(at + "/required must be an array of names");
        for (const auto& r : *it) {
          if (!r.is_string()) fail_schema(at + "/required must be an array of names");
          required.push_back(r.get<std::string>());
        }
      }
      const auto props = s.find("properties");
      if (props != s.end() && !props->is_object()) fail_schema(at + "/properties must be an object");
      if (props != s.end() && !props->empty()) {
        if (props->size() > kMaxChoices)
          fail_schema(at + ": an object of " + std::to_string(props->size()) + " properties; at most " +
                      std::to_string(kMaxChoices) + " are supported");
        // Json orders object keys; the schema text's order is the one a model is asked for.
        for (const auto& [name, sub] : ordered_properties(*props)) {
          n.keys.push_back(Json(name).dump().substr(1));
          n.keys.back().pop_back(); // the escaped name without its quotes
          n.required.push_back(std::find(required.begin(), required.end(), name) != required.end());
          n.key_nodes.push_back(0); // filled below (the node vector may grow meanwhile)
        }
        for (const auto& r : required)
          if (!props->contains(r))
            fail_schema(at + "/required names " + user_value(r) + ", which is not a property");
        size_t i = 0;
        for (const auto& [name, sub] : ordered_properties(*props)) {
          const uint32_t k = compile(*sub, at + "/properties/" + name, depth + 1);
          n.key_nodes[i++] = k;
        }
      } else {
        const auto add_it = s.find("additionalProperties");
        if (add_it == s.end() || (add_it->is_boolean() && add_it->get<bool>()))
          n.additional = kAny;
        else if (add_it->is_boolean())
          n.additional = kNone;
        else
          n.additional = compile(*add_it, at + "/additionalProperties", depth + 1);
        if (!required.empty())
          fail_schema(at + "/required names properties the object does not list under 'properties'");
      }
    } else if (type == "array") {
      n.type = NT::array;
      if (const auto it = s.find("items"); it != s.end())
        n.items = compile(*it, at + "/items", depth + 1);
      else
        n.items = kAny;
      if (s.contains("prefixItems")) fail_schema(at + "/prefixItems is not supported");
      const uint32_t mn = count(s, "minItems", at), mx = count(s, "maxItems", at);
      n.min_items = mn == kNone ? 0 : mn;
      n.max_items = mx;
      if (n.max_items != kNone && n.max_items < n.min_items)
        fail_schema(at + ": maxItems < minItems allows no array");
    } else if (type == "string") {
      n.type = NT::string;
      const uint32_t mn = count(s, "minLength", at), mx = count(s, "maxLength", at);
      n.min_len = mn == kNone ? 0 : mn;
      n.max_len = mx;
      if (n.max_len != kNone && n.max_len < n.min_len)
        fail_schema(at + ": maxLength < minLength allows no string");
    } else if (type == "number") {
      n.type = NT::number;
    } else if (type == "integer") {
      n.type = NT::integer;
    } else if (type == "boolean") {
      n.type = NT::literals;
      n.lits = {"true", "false"};
    } else if (type == "null") {
      n.type = NT::literals;
      n.lits = {"null"};
    } else {
      fail_schema(at + "/type: unknown type " + user_value(type) +
                  " (expected object, array, string, number, integer, boolean or null)");
    }
    return add(std::move(n));
  }

  std::vector<std::pair<std::string, const Json*>> ordered_properties(const Json& props) {
    std::vector<std::pair<std::string, const Json*>> v;
    for (auto it = props.begin(); it != props.end(); ++it)
      v.emplace_back(it.key(), &it.value());
    return v;
  }

private:
  JsonGrammar& g_;
  const Json* root_ = nullptr;
  std::map<std::string, uint32_t> refs_;
  std::map<uint32_t, std::string> where_; // the anyOf nodes, and where in the schema each is
  std::string at_ = "#";                  // the schema path being compiled (for the size errors)
};

std::shared_ptr<const JsonGrammar> JsonGrammar::compile(std::string_view schema) {
  auto g = std::shared_ptr<JsonGrammar>(new JsonGrammar());
  JsonSchemaCompiler c(*g);
  size_t first = schema.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) { // json_object: any object
    g->root_ = kAnyObject;
    return g;
  }
  Json j = Json::parse(schema, nullptr, false);
  if (j.is_discarded()) fail_schema("the schema is not valid JSON: " + user_value(schema, 80));
  g->root_ = c.compile_root(j);
  return g;
}

// ---------------------------------------------------------------------------------------------
// The matcher

namespace {

enum FK : uint8_t { F_ROOT, F_VALUE, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };
// Sub-states.
enum : uint8_t { R_BEFORE, R_IN, R_AFTER };
enum : uint8_t { O_OPEN, O_KEY, O_KEYSTR, O_COLON, O_BEFORE_VALUE, O_IN, O_AFTER, O_COMMA };
enum : uint8_t { A_OPEN, A_IN, A_AFTER, A_COMMA };
enum : uint8_t { S_NORMAL, S_ESC, S_U };
enum : uint8_t { N_START, N_SIGN, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

// 24 bytes, no padding: stacks compare with memcmp.
struct Frame {
  uint32_t node = 0;
  uint8_t kind = F_ROOT, st = 0, ws = 0, utf8 = 0; // utf8: continuation bytes a string still expects
  uint32_t a = 0, b = 0;
  uint64_t m = 0;
};
static_assert(sizeof(Frame) == 24);

using Stack = std::vector<Frame>;

bool is_ws(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool is_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}
bool is_hex(uint8_t c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

uint64_t bit(uint32_t i) {
  return uint64_t{1} << i;
}

// The keys that may come next in an ordered object whose next property is `from`: every property up
// to and including the first required one.
uint64_t allowed_keys(const JsonGrammar::Node& n, uint32_t from) {
  uint64_t m = 0;
  for (uint32_t i = from; i < n.keys.size(); ++i) {
    m |= bit(i);
    if (n.required[i]) break;
  }
  return m;
}

bool can_close(const JsonGrammar::Node& n, uint32_t from) {
  for (uint32_t i = from; i < n.keys.size(); ++i)
    if (n.required[i]) return false;
  return true;
}

bool num_accepting(const Frame& f) {
  return f.st == N_ZERO || f.st == N_INT || f.st == N_FRAC || f.st == N_EXP;
}

bool lit_accepting(const JsonGrammar::Node& n, const Frame& f) {
  for (uint32_t i = 0; i < n.lits.size(); ++i)
    if ((f.m & bit(i)) && n.lits[i].size() == f.a) return true;
  return false;
}

// Can the number frame take c? (Advances it when it can.)
bool num_step(Frame& f, uint8_t c, bool integer) {
  switch (f.st) {
  case N_START:
    if (c == '-') return f.st = N_SIGN, true;
    [[fallthrough]];
  case N_SIGN:
    if (c == '0') return f.st = N_ZERO, true;
    if (is_digit(c)) return f.st = N_INT, f.a = 1, true;
    return false;
  case N_ZERO:
  case N_INT:
    if (is_digit(c) && f.st == N_INT && f.a < kMaxDigits) return ++f.a, true;
    if (integer) return false;
    if (c == '.') return f.st = N_DOT, true;
    if (c == 'e' || c == 'E') return f.st = N_E, true;
    return false;
  case N_DOT:
    if (is_digit(c)) return f.st = N_FRAC, f.b = 1, true;
    return false;
  case N_FRAC:
    if (is_digit(c) && f.b < kMaxDigits) return ++f.b, true;
    if (c == 'e' || c == 'E') return f.st = N_E, true;
    return false;
  case N_E:
    if (c == '+' || c == '-') return f.st = N_ESIGN, true;
    [[fallthrough]];
  case N_ESIGN:
    if (is_digit(c)) return f.st = N_EXP, f.m = 1, true;
    return false;
  case N_EXP:
    if (is_digit(c) && f.m < kMaxExpDigits) return ++f.m, true;
    return false;
  default:
    return false;
  }
}

// A string frame takes c: false when c cannot come here.
enum class StrStep { more, done, dead };
StrStep str_step(const JsonGrammar::Node& n, Frame& f, uint8_t c) {
  switch (f.st) {
  case S_NORMAL:
    if (f.utf8 > 0) { // inside a multi-byte character
      if ((c & 0xC0) != 0x80) return StrStep::dead;
      --f.utf8;
      return StrStep::more;
    }
    if (c == '"') return f.a >= n.min_len ? StrStep::done : StrStep::dead;
    if (c < 0x20) return StrStep::dead;
    if (f.a >= n.max_len) return StrStep::dead;
    if (c == '\\') return f.st = S_ESC, StrStep::more;
    if (c < 0x80) return ++f.a, StrStep::more;
    if (c >= 0xC2 && c <= 0xDF) return f.utf8 = 1, ++f.a, StrStep::more;
    if (c >= 0xE0 && c <= 0xEF) return f.utf8 = 2, ++f.a, StrStep::more;
    if (c >= 0xF0 && c <= 0xF4) return f.utf8 = 3, ++f.a, StrStep::more;
    return StrStep::dead; // a stray continuation byte, or one that is never valid UTF-8
  case S_ESC:
    if (std::strchr("\"\\/bfnrt", c) && c != 0) return f.st = S_NORMAL, ++f.a, StrStep::more;
    if (c == 'u') return f.st = S_U, f.b = 0, StrStep::more;
    return StrStep::dead;
  case S_U:
    if (!is_hex(c)) return StrStep::dead;
    if (++f.b == 4) f.st = S_NORMAL, ++f.a;
    return StrStep::more;
  default:
    return StrStep::dead;
  }
}

// The frame on top completed: pop it and tell its parent.
void complete_top(const JsonGrammar& g, Stack& t) {
  t.pop_back();
  Frame& p = t.back();
  switch (p.kind) {
  case F_ROOT:
    p.st = R_AFTER;
    return;
  case F_OBJ:
    if (p.st == O_KEYSTR) {
      p.st = O_COLON;
    } else {
      p.st = O_AFTER;
      if (!g.node(p.node).keys.empty()) p.a = p.b + 1;
    }
    p.ws = 0;
    return;
  case F_ARR:
    ++p.a;
    p.st = A_AFTER;
    p.ws = 0;
    return;
  default:
    return;
  }
}

// Whitespace where a frame allows it (llama.cpp's JSON grammar's rule): nothing, one space, or a
// newline and at most kMaxIndent spaces or tabs. True when c was whitespace (alive: allowed here).
bool take_ws(Frame& f, uint8_t c, bool& alive) {
  if (!is_ws(c)) {
    f.ws = 0;
    return false;
  }
  if (f.ws == 0) {
    alive = c == ' ' || c == '\n';
    f.ws = c == ' ' ? kWsClosed : 1;
  } else {
    alive = f.ws != kWsClosed && (c == ' ' || c == '\t') && f.ws <= kMaxIndent;
    ++f.ws;
  }
  return true;
}

// What a frame did with the byte: took it (the thread, still alive, is in `out`, or it died), or handed it
// on to the frame now on top (a value's first frame, or the parent of a number or literal it ended).
enum class Fed { taken, again };

void advance(const JsonGrammar& g, Stack t, uint8_t c, std::vector<Stack>& out, int guard = 0);

Fed root_step(Stack& t, uint8_t c, std::vector<Stack>& out) {
  Frame& f = t.back();
  bool alive = true;
  if (f.st == R_AFTER) return Fed::taken;
  if (take_ws(f, c, alive)) {
    if (alive) out.push_back(std::move(t));
    return Fed::taken;
  }
  f.st = R_IN;
  t.push_back(Frame{f.node, F_VALUE});
  return Fed::again;
}

// A value not begun: the frame becomes the one its node's type (or, for `any`, the byte) opens; anyOf
// tries every alternative.
Fed value_step(const JsonGrammar& g, Stack& t, uint8_t c, std::vector<Stack>& out, int guard) {
  Frame& f = t.back();
  const JsonGrammar::Node& n = g.node(f.node);
  switch (n.type) {
  case NT::any_of:
    for (const uint32_t alt : n.alts) {
      Stack t2 = t;
      t2.back().node = alt;
      advance(g, std::move(t2), c, out, guard + 1);
    }
    return Fed::taken;
  case NT::any:
    if (c == '{') {
      f = Frame{kAnyObject, F_OBJ, O_OPEN};
    } else if (c == '[') {
      f = Frame{kAnyArray, F_ARR, A_OPEN};
    } else if (c == '"') {
      f = Frame{kAnyString, F_STR, S_NORMAL};
    } else if (c == '-' || is_digit(c)) {
      f = Frame{kAnyNumber, F_NUM, N_START};
      return Fed::again;
    } else if (c == 't' || c == 'f' || c == 'n') {
      f = Frame{kAnyLiteral, F_LIT, 0};
      f.m = bit(0) | bit(1) | bit(2);
      return Fed::again;
    } else {
      return Fed::taken;
    }
    out.push_back(std::move(t));
    return Fed::taken;
  case NT::object:
    if (c != '{') return Fed::taken;
    f.kind = F_OBJ, f.st = O_OPEN;
    out.push_back(std::move(t));
    return Fed::taken;
  case NT::array:
    if (c != '[') return Fed::taken;
    f.kind = F_ARR, f.st = A_OPEN;
    out.push_back(std::move(t));
    return Fed::taken;
  case NT::string:
    if (c != '"') return Fed::taken;
    f.kind = F_STR, f.st = S_NORMAL;
    out.push_back(std::move(t));
    return Fed::taken;
  case NT::number:
  case NT::integer:
    f.kind = F_NUM, f.st = N_START;
    return Fed::again;
  case NT::literals:
    f.kind = F_LIT, f.a = 0;
    f.m = n.lits.size() >= 64 ? ~uint64_t{0} : bit(static_cast<uint32_t>(n.lits.size())) - 1;
    return Fed::again;
  }
  return Fed::taken;
}

// A key's opening quote: a keyed object matches the key's bytes against the properties still allowed;
// an open one (additionalProperties) reads it as a string. False when no key may come here.
bool open_key(const JsonGrammar::Node& n, Stack& t) {
  Frame& f = t.back();
  if (!n.keys.empty()) {
    f.m = allowed_keys(n, f.a);
    if (!f.m) return false;
    f.st = O_KEY, f.b = 0;
    return true;
  }
  if (n.additional == kNone || t.size() >= kMaxDepth) return false;
  f.st = O_KEYSTR;
  t.push_back(Frame{kAnyString, F_STR, S_NORMAL});
  return true;
}

// A byte of a keyed object's key: narrows the properties it may be; its closing quote picks the one.
bool key_byte(const JsonGrammar::Node& n, Frame& f, uint8_t c) {
  if (c == '"') {
    for (uint32_t i = 0; i < n.keys.size(); ++i)
      if ((f.m & bit(i)) && n.keys[i].size() == f.b) {
        f.st = O_COLON, f.b = i, f.ws = 0;
        return true;
      }
    return false;
  }
  uint64_t nm = 0;
  for (uint32_t i = 0; i < n.keys.size(); ++i)
    if ((f.m & bit(i)) && f.b < n.keys[i].size() && static_cast<uint8_t>(n.keys[i][f.b]) == c) nm |= bit(i);
  f.m = nm, ++f.b;
  return nm != 0;
}

Fed object_step(const JsonGrammar& g, Stack& t, uint8_t c, std::vector<Stack>& out) {
  Frame& f = t.back();
  const JsonGrammar::Node& n = g.node(f.node);
  const bool keyed = !n.keys.empty();
  bool alive = true;
  switch (f.st) {
  case O_OPEN:
  case O_COMMA:
    if (take_ws(f, c, alive)) break;
    if (c == '"') {
      alive = open_key(n, t);
    } else if (c == '}' && f.st == O_OPEN && (!keyed || can_close(n, f.a))) {
      complete_top(g, t);
    } else {
      return Fed::taken;
    }
    break;
  case O_KEY:
    alive = key_byte(n, f, c);
    break;
  case O_COLON:
    if (take_ws(f, c, alive)) break;
    if (c != ':') return Fed::taken;
    f.st = O_BEFORE_VALUE;
    break;
  case O_BEFORE_VALUE:
    if (take_ws(f, c, alive)) break;
    if (t.size() >= kMaxDepth) return Fed::taken;
    f.st = O_IN;
    t.push_back(Frame{keyed ? n.key_nodes[f.b] : n.additional, F_VALUE});
    return Fed::again;
  case O_AFTER:
    if (take_ws(f, c, alive)) break;
    if (c == ',' && (keyed ? allowed_keys(n, f.a) != 0 : n.additional != kNone)) {
      f.st = O_COMMA;
    } else if (c == '}' && (!keyed || can_close(n, f.a))) {
      complete_top(g, t);
    } else {
      return Fed::taken;
    }
    break;
  default:
    return Fed::taken;
  }
  if (alive) out.push_back(std::move(t));
  return Fed::taken;
}

Fed array_step(const JsonGrammar& g, Stack& t, uint8_t c, std::vector<Stack>& out) {
  Frame& f = t.back();
  const JsonGrammar::Node& n = g.node(f.node);
  bool alive = true;
  switch (f.st) {
  case A_OPEN:
  case A_COMMA:
    if (take_ws(f, c, alive)) break;
    if (c == ']' && f.st == A_OPEN) {
      if (n.min_items > 0) return Fed::taken;
      complete_top(g, t);
      break;
    }
    if (f.a >= n.max_items || t.size() >= kMaxDepth) return Fed::taken;
    f.st = A_IN;
    t.push_back(Frame{n.items, F_VALUE});
    return Fed::again;
  case A_AFTER:
    if (take_ws(f, c, alive)) break;
    if (c == ',' && f.a < n.max_items) {
      f.st = A_COMMA;
    } else if (c == ']' && f.a >= n.min_items) {
      complete_top(g, t);
    } else {
      return Fed::taken;
    }
    break;
  default:
    return Fed::taken;
  }
  if (alive) out.push_back(std::move(t));
  return Fed::taken;
}

Fed string_step(const JsonGrammar& g, Stack& t, uint8_t c, std::vector<Stack>& out) {
  switch (str_step(g.node(t.back().node), t.back(), c)) {
  case StrStep::more:
    out.push_back(std::move(t));
    return Fed::taken;
  case StrStep::done:
    complete_top(g, t);
    out.push_back(std::move(t));
    return Fed::taken;
  case StrStep::dead:
    return Fed::taken;
  }
  return Fed::taken;
}

// A number or literal takes c, or ends where c cannot continue it (if it may end there): c goes to the
// parent.
Fed number_step(const JsonGrammar& g, Stack& t, uint8_t c, std::vector<Stack>& out) {
  Frame& f = t.back();
  if (num_step(f, c, g.node(f.node).type == NT::integer)) {
    out.push_back(std::move(t));
    return Fed::taken;
  }
  if (!num_accepting(f)) return Fed::taken;
  complete_top(g, t);
  return Fed::again;
}

Fed literal_step(const JsonGrammar& g, Stack& t, uint8_t c, std::vector<Stack>& out) {
  Frame& f = t.back();
  const JsonGrammar::Node& n = g.node(f.node);
  uint64_t nm = 0;
  for (uint32_t i = 0; i < n.lits.size(); ++i)
    if ((f.m & bit(i)) && f.a < n.lits[i].size() && static_cast<uint8_t>(n.lits[i][f.a]) == c) nm |= bit(i);
  if (nm) {
    f.m = nm, ++f.a;
    out.push_back(std::move(t));
    return Fed::taken;
  }
  if (!lit_accepting(n, f)) return Fed::taken;
  complete_top(g, t);
  return Fed::again;
}

// Feeds byte c to the thread t: every thread it becomes goes to `out` (none: c kills it).
void advance(const JsonGrammar& g, Stack t, uint8_t c, std::vector<Stack>& out, int guard) {
  if (guard > 16) return; // anyOf nested in anyOf without an end: no further choices
  for (;;) {
    Fed fed = Fed::taken;
    switch (t.back().kind) {
    case F_ROOT:
      fed = root_step(t, c, out);
      break;
    case F_VALUE:
      fed = value_step(g, t, c, out, guard);
      break;
    case F_OBJ:
      fed = object_step(g, t, c, out);
      break;
    case F_ARR:
      fed = array_step(g, t, c, out);
      break;
    case F_STR:
      fed = string_step(g, t, c, out);
      break;
    case F_NUM:
      fed = number_step(g, t, c, out);
      break;
    case F_LIT:
      fed = literal_step(g, t, c, out);
      break;
    default:
      return;
    }
    if (fed == Fed::taken) return;
  }
}

bool stack_less(const Stack& x, const Stack& y) {
  if (x.size() != y.size()) return x.size() < y.size();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(Frame)) < 0;
}
bool stack_equal(const Stack& x, const Stack& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(Frame)) == 0;
}

// What one token mask may cost: stacks advanced, counted down from kMaxMaskWork.
struct MaskWork {
  size_t left = kMaxMaskWork;
  void spend(size_t n) {
    if (n > left)
      fail(Errc::invalid_argument, "json_schema",
           "the token mask of this step needs more than " + std::to_string(kMaxMaskWork) +
               " parse steps (a schema with too many open alternatives): the request ends here; simplify "
               "the schema");
    left -= n;
  }
};

// Feeds one byte to every stack; false when none survives (`set` is then unchanged).
bool feed_byte(const JsonGrammar& g, std::vector<Stack>& set, uint8_t c, MaskWork* work = nullptr) {
  std::vector<Stack> next;
  for (const Stack& t : set)
    advance(g, t, c, next);
  if (work) work->spend(set.size() + next.size());
  if (next.empty()) return false;
  if (next.size() > 1) {
    std::sort(next.begin(), next.end(), stack_less);
    next.erase(std::unique(next.begin(), next.end(), stack_equal), next.end());
    if (next.size() > kMaxThreads) next.resize(kMaxThreads);
  }
  set = std::move(next);
  return true;
}

bool set_can_end(const JsonGrammar& g, const std::vector<Stack>& set) {
  for (const Stack& t : set) {
    if (t.size() == 1 && t[0].st == R_AFTER) return true;
    if (t.size() == 2) {
      const Frame& f = t[1];
      if (f.kind == F_NUM && num_accepting(f)) return true;
      if (f.kind == F_LIT && lit_accepting(g.node(f.node), f)) return true;
    }
  }
  return false;
}

// The vocabulary as bytes: each token's text, and a trie over them.
struct VocabTrie {
  struct Node {
    uint32_t child_begin = 0, child_end = 0;
    uint32_t tok_begin = 0, tok_end = 0;
    uint8_t byte = 0;
  };
  std::vector<Node> nodes; // 0 = the root (the empty string)
  std::vector<TokenId> toks;
  std::vector<std::string> bytes; // per token id ("" for control tokens)
  std::vector<TokenId> eog;
  std::vector<uint8_t> is_eog;
  uint64_t fingerprint = 0;
};

uint64_t fnv(uint64_t h, std::string_view s) {
  for (const char ch : s) {
    h ^= static_cast<uint8_t>(ch);
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t vocab_fingerprint(const Tokenizer& tok) {
  uint64_t h = 1469598103934665603ull;
  const int32_t V = tok.vocab_size();
  for (TokenId i = 0; i < V; ++i) {
    h = fnv(h, tok.piece(i));
    h = fnv(h, std::string_view("\x1f", 1));
    h ^= static_cast<uint64_t>(tok.token_type(i)) + (tok.is_eog(i) ? 0x100 : 0);
  }
  return h ^ static_cast<uint64_t>(V);
}

std::shared_ptr<const VocabTrie> build_trie(const Tokenizer& tok, uint64_t fingerprint) {
  auto v = std::make_shared<VocabTrie>();
  v->fingerprint = fingerprint;
  const int32_t V = tok.vocab_size();
  v->bytes.resize(static_cast<size_t>(V));
  v->is_eog.assign(static_cast<size_t>(V), 0);
  std::vector<TokenId> order;
  for (TokenId i = 0; i < V; ++i) {
    if (tok.is_eog(i)) {
      v->eog.push_back(i);
      v->is_eog[static_cast<size_t>(i)] = 1;
      continue;
    }
    DecodeState st;
    st.at_start = false; // a token's own bytes: no prefix space stripped
    std::string out;
    tok.decode_step(st, i, out, false);
    out += st.pending;
    if (out.empty()) continue;
    v->bytes[static_cast<size_t>(i)] = std::move(out);
    order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
    return v->bytes[static_cast<size_t>(a)] < v->bytes[static_cast<size_t>(b)];
  });
  struct Item {
    uint32_t node;
    size_t lo, hi, depth;
  };
  std::vector<Item> queue{{0, 0, order.size(), 0}};
  v->nodes.emplace_back();
  for (size_t q = 0; q < queue.size(); ++q) {
    const Item it = queue[q];
    size_t i = it.lo;
    v->nodes[it.node].tok_begin = static_cast<uint32_t>(v->toks.size());
    while (i < it.hi && v->bytes[static_cast<size_t>(order[i])].size() == it.depth)
      v->toks.push_back(order[i++]);
    v->nodes[it.node].tok_end = static_cast<uint32_t>(v->toks.size());
    v->nodes[it.node].child_begin = static_cast<uint32_t>(v->nodes.size());
    while (i < it.hi) {
      const uint8_t b = static_cast<uint8_t>(v->bytes[static_cast<size_t>(order[i])][it.depth]);
      size_t j = i;
      while (j < it.hi && static_cast<uint8_t>(v->bytes[static_cast<size_t>(order[j])][it.depth]) == b)
        ++j;
      VocabTrie::Node child;
      child.byte = b;
      v->nodes.push_back(child);
      queue.push_back({static_cast<uint32_t>(v->nodes.size() - 1), i, j, it.depth + 1});
      i = j;
    }
    v->nodes[it.node].child_end = static_cast<uint32_t>(v->nodes.size());
  }
  return v;
}

// Tries are shared by every request on one vocabulary (a few are kept; they key on the content).
std::shared_ptr<const VocabTrie> vocab_trie(const Tokenizer& tok) {
  static std::mutex mu;
  static std::vector<std::shared_ptr<const VocabTrie>> cache;
  const uint64_t fp = vocab_fingerprint(tok);
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < cache.size(); ++i)
    if (cache[i]->fingerprint == fp && cache[i]->bytes.size() == static_cast<size_t>(tok.vocab_size())) {
      auto hit = cache[i];
      cache.erase(cache.begin() + static_cast<std::ptrdiff_t>(i));
      cache.push_back(hit);
      return hit;
    }
  auto t = build_trie(tok, fp);
  cache.push_back(t);
  if (cache.size() > 4) cache.erase(cache.begin());
  return t;
}

void mask_dfs(const JsonGrammar& g, const VocabTrie& v, uint32_t ni, const std::vector<Stack>& set,
              std::vector<uint8_t>& allowed, MaskWork& work) {
  const VocabTrie::Node& node = v.nodes[ni];
  for (uint32_t ci = node.child_begin; ci < node.child_end; ++ci) {
    std::vector<Stack> next = set;
    if (!feed_byte(g, next, v.nodes[ci].byte, &work)) continue;
    const VocabTrie::Node& child = v.nodes[ci];
    for (uint32_t k = child.tok_begin; k < child.tok_end; ++k)
      allowed[static_cast<size_t>(v.toks[k])] = 1;
    mask_dfs(g, v, ci, next, allowed, work);
  }
}

} // namespace

struct JsonMatcher::State {
  std::vector<Stack> set;
};

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonGrammar> g)
    : g_(std::move(g)), s_(std::make_unique<State>()) {
  s_->set.push_back(Stack{Frame{g_->root(), F_ROOT, R_BEFORE}});
}
JsonMatcher::JsonMatcher(const JsonMatcher& o) : g_(o.g_), s_(std::make_unique<State>(*o.s_)) {}
JsonMatcher& JsonMatcher::operator=(const JsonMatcher& o) {
  if (this != &o) {
    g_ = o.g_;
    s_ = std::make_unique<State>(*o.s_);
  }
  return *this;
}
JsonMatcher::JsonMatcher(JsonMatcher&&) noexcept = default;
JsonMatcher& JsonMatcher::operator=(JsonMatcher&&) noexcept = default;
JsonMatcher::~JsonMatcher() = default;

bool JsonMatcher::feed(std::string_view bytes) {
  std::vector<Stack> set = s_->set;
  for (const char ch : bytes)
    if (!feed_byte(*g_, set, static_cast<uint8_t>(ch))) return false;
  s_->set = std::move(set);
  return true;
}

bool JsonMatcher::accepts(std::string_view bytes) const {
  std::vector<Stack> set = s_->set;
  for (const char ch : bytes)
    if (!feed_byte(*g_, set, static_cast<uint8_t>(ch))) return false;
  return true;
}

bool JsonMatcher::can_end() const {
  return set_can_end(*g_, s_->set);
}

namespace {
void fill_allowed(const JsonGrammar& g, const std::vector<Stack>& set, const VocabTrie& v,
                  std::vector<uint8_t>& allowed) {
  allowed.assign(v.bytes.size(), 0);
  MaskWork work;
  mask_dfs(g, v, 0, set, allowed, work);
  if (set_can_end(g, set))
    for (const TokenId e : v.eog)
      allowed[static_cast<size_t>(e)] = 1;
}
} // namespace

void JsonMatcher::allowed_tokens(const Tokenizer& tok, std::vector<uint8_t>& allowed) const {
  fill_allowed(*g_, s_->set, *vocab_trie(tok), allowed);
}

// ---------------------------------------------------------------------------------------------
// The sampler stage

namespace {

class JsonSchemaSampler final : public Sampler {
public:
  explicit JsonSchemaSampler(std::shared_ptr<const JsonGrammar> g) : g_(std::move(g)) { reset(); }

  std::string_view name() const noexcept override { return "json_schema"; }

  void apply(Candidates& c, const SamplerContext& ctx) override {
    if (lost_ || c.data.empty()) return;
    if (!ctx.tokenizer)
      fail(Errc::internal, "sampler", "json_schema needs the vocabulary (SamplerContext::tokenizer)");
    if (!trie_) trie_ = vocab_trie(*ctx.tokenizer);
    const VocabTrie& v = *trie_;
    std::vector<TokenData> kept;
    kept.reserve(c.data.size());
    if (c.data.size() <= 256) { // a chain that already narrowed the candidates: test each
      const bool end = set_can_end(*g_, set_);
      MaskWork work;
      for (const TokenData& d : c.data) {
        const auto i = static_cast<size_t>(d.id);
        if (d.id < 0 || i >= v.bytes.size()) continue;
        bool ok = v.is_eog[i] ? end : !v.bytes[i].empty();
        if (ok && !v.is_eog[i]) {
          std::vector<Stack> trial = set_;
          for (const char ch : v.bytes[i])
            if (!(ok = feed_byte(*g_, trial, static_cast<uint8_t>(ch), &work))) break;
        }
        if (ok) kept.push_back(d);
      }
    } else {
      fill_allowed(*g_, set_, v, allowed_);
      for (const TokenData& d : c.data)
        if (d.id >= 0 && static_cast<size_t>(d.id) < allowed_.size() && allowed_[static_cast<size_t>(d.id)])
          kept.push_back(d);
    }
    if (kept.empty()) {
      // No candidate continues the text (the chain before this stage removed them, or the vocabulary
      // cannot spell what the schema needs): end the sequence rather than emit bytes that break it.
      if (v.eog.empty()) return;
      kept.push_back(TokenData{v.eog[0], 0.0f, 0.0f});
    }
    std::copy(kept.begin(), kept.end(), c.data.begin()); // kept ⊆ data, or one end token: it fits
    c.data = c.data.first(kept.size());                  // the order is kept: a sorted list stays sorted
    c.has_probs = false;
    c.selected = -1;
  }

  void accept(TokenId token) override {
    if (lost_) return;
    if (!trie_ || token < 0 || static_cast<size_t>(token) >= trie_->bytes.size()) {
      lost_ = true; // a token this stage never saw the vocabulary for: stop constraining
      return;
    }
    const auto i = static_cast<size_t>(token);
    if (trie_->is_eog[i] || trie_->bytes[i].empty()) return;
    std::vector<Stack> next = set_;
    for (const char ch : trie_->bytes[i])
      if (!feed_byte(*g_, next, static_cast<uint8_t>(ch))) {
        lost_ = true; // chosen against the mask (by a stage before this one)
        return;
      }
    set_ = std::move(next);
  }

  void reset() override {
    set_.assign(1, Stack{Frame{g_->root(), F_ROOT, R_BEFORE}});
    lost_ = false;
  }

  std::unique_ptr<Sampler> clone() const override { return std::make_unique<JsonSchemaSampler>(*this); }

private:
  std::shared_ptr<const JsonGrammar> g_;
  std::vector<Stack> set_;
  std::shared_ptr<const VocabTrie> trie_;
  std::vector<uint8_t> allowed_;
  bool lost_ = false;
};

} // namespace

std::unique_ptr<Sampler> make_json_schema_sampler(std::string_view schema) {
  return std::make_unique<JsonSchemaSampler>(JsonGrammar::compile(schema));
}

} // namespace loom
