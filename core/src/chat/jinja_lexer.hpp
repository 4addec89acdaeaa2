#pragma once
// Jinja segments and tokens: a template cut into text, output and block segments, each tag's tokens.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::chat::jinja {

// ================================================================================================
// Segments and tokens
// ================================================================================================

enum class Tk { name, string, integer, floating, op, end };
struct Tok {
  Tk t = Tk::end;
  std::string s; // name, decoded string, operator
  int64_t i = 0;
  double f = 0.0;
  int line = 1;
};

enum class SegKind { text, output, block };
struct Seg {
  SegKind kind;
  std::string text;      // text segments
  std::vector<Tok> toks; // output and block segments (ending with Tk::end)
  int line;
};

// The number of newlines in s.
int count_lines(std::string_view s);

// The template cut into text, output and block segments, with jinja2's whitespace rules applied:
// '-' strips all whitespace on its side; trim_blocks drops the newline right after a block or comment
// tag; lstrip_blocks drops the spaces and tabs before a block or comment tag that begins its line (the
// text holds a newline before it, or the template or a line consumed by the previous tag began there).
std::vector<Seg> segment(std::string_view src);

} // namespace loom::chat::jinja
