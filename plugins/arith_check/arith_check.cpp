// "arith_check": a process verifier — a calculator as a checker. Every equation
// `a op b … = c` in the candidate is recomputed exactly (integers and decimals as rationals, + − × ÷
// with the usual precedence and parentheses) and the text scores the share of equations that hold.
//
//   [verifier]
//   name = "arith_check"
//   no_equations = 1.0     # the score of a text without any equation (nothing found wrong), in [0, 1]
//   rounding = true        # a result written with d decimals holds when it is the value rounded to d
//                          # decimals (10 / 3 = 3.33); an integer result must always be exact
//   scope = "all"          # "all": every equation of the text; "last_line": those of its last
//                          # non-empty line only (the newest step of a partial solution)
//   grounded = false       # true: an equation also needs every operand of its left side to be a
//                          # number of the question or a result of an earlier equation (a calculator
//                          # that also checks the numbers were read off the problem)
//   final_answer = ""      # a phrase ("answer is"): the number after its last occurrence must equal the
//                          # latest equation's result, one more check (off when empty)
//   question_marker = "Question:" # grounded: the question is the prompt after its last marker (few-shot
//                          # prompts hold other problems' numbers before it); the whole prompt without one
//
// What counts as an equation: a number or a parenthesised group, then at least one operator and
// operand, then `=` and a number. Numbers may carry a `$`, thousands commas (1,200) and decimals;
// operators are + - * / x X × ÷ · − (x only between operands). `==`, `<=`, `>=`, `!=` are not
// equations; neither is `x = 5` (no operator). A division by zero is a wrong equation. A running total
// ("12 + 3 = 15 + 5 = 20") is read as two equations, 12 + 3 = 15 and 15 + 5 = 20. One word after a
// number is its unit ("5 apples + 3 apples = 8 apples").
#include "loom/sdk/plugin.hpp"

#include <algorithm>
#include <boost/multiprecision/cpp_int.hpp>
#include <cctype>
#include <optional>
#include <string>
#include <vector>

namespace {

using Rational = boost::multiprecision::cpp_rational;
using boost::multiprecision::cpp_int;

struct Num {
  Rational value;
  int decimals = 0; // digits after the point as written
};

// A number at text[i] (an optional '$', digits with optional thousands commas, an optional
// fraction); i moves past it. No sign: the caller handles unary minus.
std::optional<Num> parse_number(std::string_view t, size_t& i) {
  size_t j = i;
  if (j < t.size() && t[j] == '$') ++j;
  if (j >= t.size() || !std::isdigit(static_cast<unsigned char>(t[j]))) return std::nullopt;
  std::string digits;
  size_t run = 0; // digits since the last comma
  bool grouped = false;
  while (j < t.size()) {
    const char c = t[j];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digits += c;
      ++run;
      ++j;
    } else if (c == ',' && j + 3 < t.size() && std::isdigit(static_cast<unsigned char>(t[j + 1])) &&
               std::isdigit(static_cast<unsigned char>(t[j + 2])) &&
               std::isdigit(static_cast<unsigned char>(t[j + 3])) &&
               (j + 4 == t.size() || !std::isdigit(static_cast<unsigned char>(t[j + 4]))) &&
               (grouped ? run == 3 : run <= 3)) {
      grouped = true; // 1,200 / 12,345,678: a comma before exactly three digits
      run = 0;
      ++j;
    } else {
      break;
    }
  }
  if (grouped && run != 3) return std::nullopt;
  int decimals = 0;
  if (j + 1 < t.size() && t[j] == '.' && std::isdigit(static_cast<unsigned char>(t[j + 1]))) {
    ++j;
    while (j < t.size() && std::isdigit(static_cast<unsigned char>(t[j]))) {
      digits += t[j++];
      ++decimals;
    }
  }
  if (digits.size() > 400) return std::nullopt; // not arithmetic anyone writes
  Num n;
  cpp_int den = 1;
  for (int k = 0; k < decimals; ++k)
    den *= 10;
  n.value = Rational(cpp_int(digits), den);
  n.decimals = decimals;
  i = j;
  return n;
}

enum class Tok { num, plus, minus, mul, div, lpar, rpar };
struct Token {
  Tok kind;
  Num num;
};

// The operator at t[i] (ASCII or UTF-8), its byte length in `len`.
std::optional<Tok> parse_op(std::string_view t, size_t i, size_t& len) {
  len = 1;
  switch (t[i]) {
  case '+':
    return Tok::plus;
  case '-':
    return Tok::minus;
  case '*':
    return Tok::mul;
  case '/':
    return Tok::div;
  case '(':
    return Tok::lpar;
  case ')':
    return Tok::rpar;
  case 'x':
  case 'X':
    return Tok::mul; // the caller checks it stands between operands
  default:
    break;
  }
  const auto is = [&](const char* s) { return t.substr(i, std::char_traits<char>::length(s)) == s; };
  len = 2;
  if (is("\xC3\x97")) return Tok::mul; // ×
  if (is("\xC3\xB7")) return Tok::div; // ÷
  if (is("\xC2\xB7")) return Tok::mul; // ·
  len = 3;
  if (is("\xE2\x88\x92")) return Tok::minus; // − (U+2212)
  if (is("\xE2\x8B\x85")) return Tok::mul;   // ⋅ (U+22C5)
  return std::nullopt;
}

// Recursive descent over tokens [pos, end): expr := term (± term)*; term := factor (×÷ factor)*;
// factor := - factor | number | ( expr ). Division by zero sets `bad`.
struct Parser {
  const std::vector<Token>& tk;
  size_t pos, end;
  bool bad = false;
  int ops = 0; // binary operators seen

  std::optional<Rational> expr() {
    auto v = term();
    while (v && pos < end && (tk[pos].kind == Tok::plus || tk[pos].kind == Tok::minus)) {
      const bool plus = tk[pos++].kind == Tok::plus;
      auto r = term();
      if (!r) return std::nullopt;
      ++ops;
      if (plus)
        *v += *r;
      else
        *v -= *r;
    }
    return v;
  }
  std::optional<Rational> term() {
    auto v = factor();
    while (v && pos < end && (tk[pos].kind == Tok::mul || tk[pos].kind == Tok::div)) {
      const bool mul = tk[pos++].kind == Tok::mul;
      auto r = factor();
      if (!r) return std::nullopt;
      ++ops;
      if (!mul && *r == 0) {
        bad = true;
        return Rational(0);
      }
      if (mul)
        *v *= *r;
      else
        *v /= *r;
    }
    return v;
  }
  std::optional<Rational> factor() {
    if (pos >= end) return std::nullopt;
    if (tk[pos].kind == Tok::minus) {
      ++pos;
      auto v = factor();
      if (v) *v = -*v;
      return v;
    }
    if (tk[pos].kind == Tok::num) return tk[pos++].num.value;
    if (tk[pos].kind == Tok::lpar) {
      ++pos;
      auto v = expr();
      if (!v || pos >= end || tk[pos].kind != Tok::rpar) return std::nullopt;
      ++pos;
      return v;
    }
    return std::nullopt;
  }
};

class ArithCheck final : public loom::Verifier {
public:
  explicit ArithCheck(const loom::sdk::Config& cfg) {
    no_equations_ = cfg.get_f64("no_equations", 1.0);
    if (!(no_equations_ >= 0 && no_equations_ <= 1))
      throw loom::sdk::Error("arith_check: no_equations must be a number in [0, 1], got " +
                             std::to_string(no_equations_));
    rounding_ = cfg.get_bool("rounding", true);
    const std::string scope = cfg.get_str("scope", "all");
    if (scope != "all" && scope != "last_line")
      throw loom::sdk::Error("arith_check: scope must be \"all\" or \"last_line\", got \"" + scope + "\"");
    last_line_ = scope == "last_line";
    grounded_ = cfg.get_bool("grounded", false);
    final_ = cfg.get_str("final_answer", "");
    marker_ = cfg.get_str("question_marker", "Question:");
    if (cfg.has("question_marker") && !grounded_)
      throw loom::sdk::Error("arith_check: question_marker applies with grounded = true");
  }

  double score(std::string_view prompt, std::string_view text, std::string_view /*task*/) override {
    std::vector<Rational> known; // grounded: the question's numbers, then each equation's results
    if (grounded_) {
      std::string_view q = prompt;
      if (!marker_.empty())
        if (const size_t at = prompt.rfind(marker_); at != std::string_view::npos) q = prompt.substr(at);
      for (size_t i = 0; i < q.size();) {
        if (std::isdigit(static_cast<unsigned char>(q[i])) || q[i] == '$') {
          size_t k = i;
          if (auto n = parse_number(q, k)) {
            known.push_back(n->value);
            i = k;
            continue;
          }
        }
        ++i;
      }
    }
    if (last_line_) {
      size_t e = text.size();
      while (e > 0 && (text[e - 1] == '\n' || text[e - 1] == '\r' || text[e - 1] == ' '))
        --e;
      const size_t b = text.rfind('\n', e == 0 ? 0 : e - 1);
      text =
          text.substr(b == std::string_view::npos ? 0 : b + 1, e - (b == std::string_view::npos ? 0 : b + 1));
    }
    int total = 0, right = 0;
    std::optional<Rational> last; // the latest equation's result
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] != '=') continue;
      if (i + 1 < text.size() && text[i + 1] == '=') {
        ++i; // ==
        continue;
      }
      if (i > 0 && (text[i - 1] == '<' || text[i - 1] == '>' || text[i - 1] == '!' || text[i - 1] == '='))
        continue;
      const auto ok = check_at(text, i, grounded_ ? &known : nullptr, last);
      if (!ok) continue;
      ++total;
      right += *ok ? 1 : 0;
    }
    // final_answer: the number after the phrase's last occurrence must be the latest result.
    if (!final_.empty() && last)
      if (const size_t at = text.rfind(final_); at != std::string_view::npos) {
        size_t j = at + final_.size();
        while (j < text.size() && (text[j] == ' ' || text[j] == ':'))
          ++j;
        const bool neg = j < text.size() && text[j] == '-';
        if (neg) ++j;
        if (auto n = parse_number(text, j)) {
          ++total;
          right += (neg ? -n->value : n->value) == *last ? 1 : 0;
        }
      }
    return total == 0 ? no_equations_ : static_cast<double>(right) / total;
  }

private:
  // Tokens of an arithmetic expression in t from `from`. Going left (the left side of an equation)
  // anything that is not part of an expression starts it over; going right (the right side) it ends
  // it. One word right after a number is its unit and skipped ("5 apples + 3 apples").
  static std::vector<Token> tokenize(std::string_view t, bool right) {
    std::vector<Token> tk;
    bool unit_ok = false; // the previous token is a number whose unit may follow
    for (size_t i = 0; i < t.size();) {
      const char c = t[i];
      if (c == ' ' || c == '\t') {
        ++i;
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c)) || c == '$') {
        size_t k = i;
        if (auto n = parse_number(t, k)) {
          if (!tk.empty() && tk.back().kind == Tok::num) { // two numbers in a row: not one expression
            if (right) break;
            tk.clear();
          }
          tk.push_back({Tok::num, *n});
          i = k;
          unit_ok = true;
          continue;
        }
      }
      size_t len = 0;
      auto op = parse_op(t, i, len);
      if (op && (c == 'x' || c == 'X')) { // x multiplies only between operands: "3 x 4", not "max"
        const bool after = !tk.empty() && (tk.back().kind == Tok::num || tk.back().kind == Tok::rpar);
        size_t k = i + 1;
        while (k < t.size() && t[k] == ' ')
          ++k;
        const bool before =
            k < t.size() && (std::isdigit(static_cast<unsigned char>(t[k])) || t[k] == '(' || t[k] == '$');
        const bool word = (i > 0 && std::isalpha(static_cast<unsigned char>(t[i - 1]))) ||
                          (i + 1 < t.size() && std::isalpha(static_cast<unsigned char>(t[i + 1])));
        if (!after || !before || word) op.reset();
      }
      if (op) {
        tk.push_back({*op, {}});
        i += len;
        unit_ok = false;
        continue;
      }
      if (unit_ok && std::isalpha(static_cast<unsigned char>(c))) { // a unit: skip the word
        while (i < t.size() && std::isalpha(static_cast<unsigned char>(t[i])))
          ++i;
        unit_ok = false;
        continue;
      }
      if (right) break;
      tk.clear(); // anything else: an expression can only start after it
      unit_ok = false;
      ++i;
    }
    return tk;
  }

  // The equation whose '=' is at text[eq]: nullopt when there is none, else whether it holds.
  // With `known` (grounded = true): every operand of the left side must be in it (a number of the
  // question or an earlier result), else the equation is wrong; its results join it.
  std::optional<bool> check_at(std::string_view text, size_t eq, std::vector<Rational>* known,
                               std::optional<Rational>& last) const {
    // The left side: the text before '=' back to the line's start or the previous '='; its longest
    // tail that parses as an expression.
    size_t b = eq;
    while (b > 0 && text[b - 1] != '\n' && text[b - 1] != '=')
      --b;
    const std::vector<Token> lt = tokenize(text.substr(b, eq - b), false);
    std::optional<Rational> lv;
    int ops = 0;
    bool bad = false;
    size_t lhs_start = 0;
    for (size_t s = 0; s < lt.size() && !lv; ++s) {
      if (lt[s].kind != Tok::num && lt[s].kind != Tok::lpar && lt[s].kind != Tok::minus) continue;
      if (lt[s].kind == Tok::minus && s > 0 && (lt[s - 1].kind == Tok::num || lt[s - 1].kind == Tok::rpar))
        continue; // a binary minus cannot start the expression
      Parser p{lt, s, lt.size()};
      auto v = p.expr();
      if (!v || p.pos != lt.size()) continue;
      lv = v;
      ops = p.ops;
      bad = p.bad;
      lhs_start = s;
    }
    if (!lv) return std::nullopt;
    // The right side: to the line's end or the next '='; its longest head that parses.
    size_t e = eq + 1;
    while (e < text.size() && text[e] != '\n' && text[e] != '=')
      ++e;
    const std::vector<Token> rt = tokenize(text.substr(eq + 1, e - eq - 1), true);
    for (size_t end = rt.size(); end > 0; --end) {
      Parser p{rt, 0, end};
      auto rv = p.expr();
      if (!rv || p.pos != end) continue;
      if (ops + p.ops == 0) return std::nullopt; // "x = 5", "5 = 5": nothing computed
      bool holds = holds_as_written(*lv, *rv, rt, end, p.ops) && !bad && !p.bad;
      if (known) {
        for (size_t k = lhs_start; k < lt.size(); ++k)
          if (lt[k].kind == Tok::num &&
              std::find(known->begin(), known->end(), lt[k].num.value) == known->end())
            holds = false; // an operand from nowhere
        known->push_back(*rv);
        if (rt[0].kind == Tok::num) known->push_back(rt[0].num.value); // a running total's first number
      }
      last = *rv;
      return holds;
    }
    return std::nullopt;
  }

  // Whether lv = (the right side's first `end` tokens, worth rv) holds as written.
  bool holds_as_written(const Rational& lv, const Rational& rv, const std::vector<Token>& rt, size_t end,
                        int rops) const {
    if (lv == rv) return true;
    // A running total, "12 + 3 = 15 + 5 = 20": the left side equals the first number of the right
    // side, which goes on as the next equation's left side.
    if (rops > 0 && rt[0].kind == Tok::num && rt[0].num.value == lv) return true;
    // A single written number: rounded to its decimals, |v − c| ≤ ½·10^−d.
    const bool single = end == 1 || (end == 2 && rt[0].kind == Tok::minus);
    const int d = rt[end - 1].kind == Tok::num ? rt[end - 1].num.decimals : 0;
    if (!rounding_ || !single || d == 0 || rops != 0) return false;
    cpp_int scale = 1;
    for (int k = 0; k < d; ++k)
      scale *= 10;
    Rational diff = lv - rv;
    if (diff < 0) diff = -diff;
    return diff * scale * 2 <= 1;
  }

  double no_equations_ = 1.0;
  bool rounding_ = true;
  bool grounded_ = false;
  std::string final_;
  std::string marker_ = "Question:";
  bool last_line_ = false;
};

} // namespace

LOOM_PLUGIN_DEFINE("arith_check", "1.0.0", LOOM_VERIFIER("arith_check", ArithCheck));
