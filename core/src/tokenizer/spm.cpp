// tokenizer/spm.cpp — SentencePiece-style BPE ("llama"): greedy merges by piece score.
//
// Text: spaces → "▁" (U+2581), an optional "▁" prefix, then UTF-8 characters as initial symbols.
// Repeatedly merge the adjacent pair whose concatenation is a vocabulary piece with the highest
// score (ties: leftmost), using a priority queue with lazy invalidation: O(n log n).
// Symbols that are not pieces fall back to <0xNN> byte tokens, or to the unknown token.
#include "loom/error.hpp"
#include "tokenizer/utf8.hpp"
#include "tokenizer/vocab.hpp"

#include <queue>

namespace loom::tok {

namespace {

constexpr std::string_view k_space = "\xE2\x96\x81"; // "▁" U+2581

// "▁" → " " everywhere in a normal piece.
std::string unescape_spaces(const std::string& p) {
  std::string out;
  out.reserve(p.size());
  for (size_t i = 0; i < p.size();) {
    if (p.compare(i, k_space.size(), k_space) == 0) {
      out.push_back(' ');
      i += k_space.size();
    } else {
      out.push_back(p[i++]);
    }
  }
  return out;
}

class SpmTokenizer final : public TokenizerBase {
public:
  SpmTokenizer(Vocab v, const Settings& s) : TokenizerBase(std::move(v), s) {
    build_texts(unescape_spaces);
    byte_tokens_ = find_byte_tokens();
  }

  std::string_view model() const noexcept override { return "llama"; }

protected:
  void encode_text(std::string_view text, bool after_special, std::vector<TokenId>& out) const override;

private:
  struct Symbol {
    size_t off = 0, len = 0; // bytes of the escaped text; len 0: merged into its left neighbour
    ptrdiff_t prev = -1, next = -1;
  };
  struct Bigram {
    ptrdiff_t left = 0, right = 0;
    float score = 0.0f;
    size_t size = 0; // left.len + right.len when queued; a mismatch later means it is stale
  };
  struct Lower { // priority: higher score first, then the leftmost pair
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };

  std::array<TokenId, 256> byte_tokens_{}; // <0xNN> ids, -1 where missing
};

void SpmTokenizer::encode_text(std::string_view text, bool after_special, std::vector<TokenId>& out) const {
  // SentencePiece's remove_extra_whitespaces: trim and collapse runs of spaces.
  std::string collapsed;
  if (vocab_.remove_extra_whitespaces) {
    for (char c : text) {
      if (c == ' ' && (collapsed.empty() || collapsed.back() == ' ')) continue;
      collapsed.push_back(c);
    }
    while (!collapsed.empty() && collapsed.back() == ' ')
      collapsed.pop_back();
    if (collapsed.empty()) return;
    text = collapsed;
  }

  std::string s;
  s.reserve(text.size() + text.size() / 2 + 3);
  if (s_.add_space_prefix && after_special) s.append(k_space);
  for (char c : text) {
    if (c == ' ')
      s.append(k_space);
    else
      s.push_back(c);
  }
  const std::string_view sv = s;

  std::vector<Symbol> sym;
  sym.reserve(sv.size());
  for (size_t off = 0; off < sv.size();) {
    const size_t n = utf8_char_len(sv.substr(off));
    const auto i = static_cast<ptrdiff_t>(sym.size());
    sym.push_back({off, n, i - 1, off + n < sv.size() ? i + 1 : -1});
    off += n;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, Lower> queue;
  auto try_add = [&](ptrdiff_t l, ptrdiff_t r) {
    if (l < 0 || r < 0) return;
    const Symbol& a = sym[static_cast<size_t>(l)];
    const Symbol& b = sym[static_cast<size_t>(r)];
    const TokenId id = find(sv.substr(a.off, a.len + b.len));
    if (id < 0) return;
    queue.push({l, r, vocab_.scores[static_cast<size_t>(id)], a.len + b.len});
  };
  for (size_t i = 1; i < sym.size(); ++i)
    try_add(static_cast<ptrdiff_t>(i - 1), static_cast<ptrdiff_t>(i));

  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Symbol& l = sym[static_cast<size_t>(bg.left)];
    Symbol& r = sym[static_cast<size_t>(bg.right)];
    if (l.len == 0 || r.len == 0 || l.len + r.len != bg.size) continue; // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = bg.left;
    try_add(l.prev, bg.left);
    try_add(bg.left, l.next);
  }

  for (ptrdiff_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& x = sym[static_cast<size_t>(i)];
    const std::string_view piece = sv.substr(x.off, x.len);
    if (const TokenId id = find(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    // Not a piece (only single characters get here): its bytes as <0xNN>, else one <unk>.
    bool all_bytes = true;
    for (char c : piece)
      all_bytes = all_bytes && byte_tokens_[static_cast<uint8_t>(c)] >= 0;
    if (all_bytes) {
      for (char c : piece)
        out.push_back(byte_tokens_[static_cast<uint8_t>(c)]);
    } else if (s_.unk >= 0) {
      out.push_back(s_.unk);
    }
  }
}

} // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(Vocab v) {
  const auto n = static_cast<TokenId>(v.pieces.size());
  auto pick = [&](const std::optional<TokenId>& x, TokenId def) { return x ? *x : (def < n ? def : -1); };
  Settings s;
  // SentencePiece conventions when the metadata is silent: <unk> 0, <s> 1, </s> 2.
  s.bos = pick(v.bos, 1);
  s.eos = pick(v.eos, 2);
  s.unk = pick(v.unk, 0);
  s.eot = pick(v.eot, -1);
  s.eom = pick(v.eom, -1);
  s.pad = pick(v.pad, -1);
  s.add_bos = v.add_bos.value_or(true);
  s.add_eos = v.add_eos.value_or(false);
  s.add_space_prefix = v.add_space_prefix.value_or(true);
  return std::make_unique<SpmTokenizer>(std::move(v), s);
}

} // namespace loom::tok
