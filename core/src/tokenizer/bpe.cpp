// tokenizer/bpe.cpp — byte-level BPE ("gpt2"): regex pre-tokenization, GPT-2's byte↔unicode map,
// merges by rank from tokenizer.ggml.merges.
//
// Each pre-tokenized piece is mapped byte by byte to GPT-2's printable code points, then the
// adjacent pair with the lowest merge rank (ties: leftmost) is merged until none is left, using a
// priority queue with lazy invalidation: O(n log n) per piece.
#include "loom/error.hpp"
#include "tokenizer/pretokenizer.hpp"
#include "tokenizer/utf8.hpp"
#include "tokenizer/vocab.hpp"

#include <queue>

namespace loom::tok {

namespace {

// GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order. cp_to_byte inverts it (-1: not a byte code point).
struct ByteMap {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int16_t, 324> cp_to_byte{};

  ByteMap() {
    cp_to_byte.fill(-1);
    uint32_t extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      byte_to_cp[b] = printable ? b : extra++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Bytes of a normal byte-level piece: each code point of the GPT-2 map becomes its byte; anything
// else (not produced by the map) is kept as it is.
std::string unmap_bytes(const std::string& p) {
  const ByteMap& m = byte_map();
  std::string out;
  out.reserve(p.size());
  const std::string_view s = p;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_valid_len(s.substr(i));
    if (n == 0) {
      out.push_back(s[i++]);
      continue;
    }
    const uint32_t cp = utf8_decode(s.substr(i), n);
    if (cp < m.cp_to_byte.size() && m.cp_to_byte[cp] >= 0)
      out.push_back(static_cast<char>(m.cp_to_byte[cp]));
    else
      out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

class BpeTokenizer final : public TokenizerBase {
public:
  BpeTokenizer(Vocab v, const Settings& s, std::unique_ptr<PreTokenizer> pre)
      : TokenizerBase(std::move(v), s), pre_(std::move(pre)) {
    build_texts(unmap_bytes);
    ranks_.reserve(vocab_.merges.size());
    for (size_t i = 0; i < vocab_.merges.size(); ++i)
      ranks_.emplace(vocab_.merges[i], static_cast<int32_t>(i)); // a repeated merge keeps its first rank
    const ByteMap& m = byte_map();
    const std::array<TokenId, 256> hex_bytes = find_byte_tokens();
    for (size_t b = 0; b < 256; ++b) {
      byte_str_[b].clear();
      utf8_append(byte_str_[b], m.byte_to_cp[b]);
      byte_tok_[b] = find(byte_str_[b]);
      if (byte_tok_[b] < 0) byte_tok_[b] = hex_bytes[b]; // <0xNN> fallback, if the vocabulary has it
    }
  }

  std::string_view model() const noexcept override { return "gpt2"; }

protected:
  void encode_text(std::string_view text, bool after_special, std::vector<TokenId>& out) const override;

private:
  struct Symbol {
    size_t off = 0, len = 0; // bytes of the mapped word; len 0: merged into its left neighbour
    size_t src = 0, n = 0;   // the original bytes it covers (one per initial symbol)
    ptrdiff_t prev = -1, next = -1;
  };
  struct Bigram {
    ptrdiff_t left = 0, right = 0;
    int32_t rank = 0;
    size_t left_len = 0, right_len = 0; // lengths when queued; a mismatch later means stale
  };
  struct Lower { // priority: lowest rank first, then the leftmost pair
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };

  void encode_word(std::string_view bytes, std::vector<TokenId>& out) const;

  std::unique_ptr<PreTokenizer> pre_;
  std::unordered_map<std::string_view, int32_t> ranks_; // "left right" → rank; views into vocab_.merges
  std::array<std::string, 256> byte_str_;               // byte → UTF-8 of its GPT-2 code point
  std::array<TokenId, 256> byte_tok_{};                 // token of a lone byte (-1: none)
};

void BpeTokenizer::encode_text(std::string_view text, bool /*after_special*/,
                               std::vector<TokenId>& out) const {
  std::vector<Span> words;
  pre_->split(text, words);
  for (const Span& w : words)
    encode_word(text.substr(w.begin, w.end - w.begin), out);
}

void BpeTokenizer::encode_word(std::string_view bytes, std::vector<TokenId>& out) const {
  std::string word;
  word.reserve(bytes.size() * 2);
  std::vector<Symbol> sym;
  sym.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    const std::string& c = byte_str_[static_cast<uint8_t>(bytes[i])];
    const auto k = static_cast<ptrdiff_t>(i);
    sym.push_back({word.size(), c.size(), i, 1, k - 1, i + 1 < bytes.size() ? k + 1 : -1});
    word += c;
  }
  const std::string_view wv = word;

  if (pre_->traits().ignore_merges) {
    if (const TokenId id = find(wv); id >= 0) {
      out.push_back(id);
      return;
    }
  }

  std::priority_queue<Bigram, std::vector<Bigram>, Lower> queue;
  std::string key;
  auto try_add = [&](ptrdiff_t l, ptrdiff_t r) {
    if (l < 0 || r < 0) return;
    const Symbol& a = sym[static_cast<size_t>(l)];
    const Symbol& b = sym[static_cast<size_t>(r)];
    key.assign(wv.substr(a.off, a.len));
    key.push_back(' ');
    key.append(wv.substr(b.off, b.len));
    const auto it = ranks_.find(key);
    if (it == ranks_.end()) return;
    queue.push({l, r, it->second, a.len, b.len});
  };
  for (size_t i = 1; i < sym.size(); ++i)
    try_add(static_cast<ptrdiff_t>(i - 1), static_cast<ptrdiff_t>(i));

  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Symbol& l = sym[static_cast<size_t>(bg.left)];
    Symbol& r = sym[static_cast<size_t>(bg.right)];
    if (l.len != bg.left_len || r.len != bg.right_len || l.next != bg.right) continue; // stale
    l.len += r.len;
    l.n += r.n;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = bg.left;
    try_add(l.prev, bg.left);
    try_add(bg.left, l.next);
  }

  for (ptrdiff_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& x = sym[static_cast<size_t>(i)];
    if (const TokenId id = find(wv.substr(x.off, x.len)); id >= 0) {
      out.push_back(id);
      continue;
    }
    // A merge result that is not a token: its bytes one by one (dropped where the vocabulary has
    // no token for a byte and no unknown token, as llama.cpp does).
    for (size_t k = 0; k < x.n; ++k) {
      const TokenId id = byte_tok_[static_cast<uint8_t>(bytes[x.src + k])];
      if (id >= 0)
        out.push_back(id);
      else if (s_.unk >= 0)
        out.push_back(s_.unk);
    }
  }
}

} // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(Vocab v) {
  std::unique_ptr<PreTokenizer> pre = PreTokenizer::create(v.pre);
  if (!pre)
    fail(Errc::unsupported, "tokenizer",
         v.source + ": unknown pre-tokenizer tokenizer.ggml.pre = '" + v.pre +
             "'; known: " + PreTokenizer::known_names());
  if (v.merges.empty())
    fail(
        Errc::parse_error, "tokenizer",
        v.source +
            ": tokenizer.ggml.merges is missing or empty: a 'gpt2' (byte-level BPE) vocabulary needs merges");
  const PreTokenizerTraits& tr = pre->traits();
  Settings s;
  auto pick = [](const std::optional<TokenId>& x) { return x ? *x : -1; };
  s.bos = pick(v.bos);
  s.eos = pick(v.eos);
  s.unk = pick(v.unk);
  s.eot = pick(v.eot);
  s.eom = pick(v.eom);
  s.pad = pick(v.pad);
  s.add_bos = v.add_bos.value_or(tr.add_bos);
  s.add_eos = v.add_eos.value_or(false);
  s.add_space_prefix = v.add_space_prefix.value_or(false);
  return std::make_unique<BpeTokenizer>(std::move(v), s, std::move(pre));
}

} // namespace loom::tok
