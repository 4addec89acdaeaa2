// format/hf_tokenizer.cpp — a checkpoint's tokenizer read into GGUF keys (format/hf_tokenizer.hpp).
//
// tokenizer.json's BPE model becomes one of Loom's two BPE tokenizers: SentencePiece-style with byte
// fallback ("llama": merges by piece score) or byte-level ("gpt2": merges by rank, the pre-tokenizer
// told apart by its regex). tokenizer_config.json adds BOS/EOS/PAD, whether BOS/EOS are added, and the
// chat template (chat_template.jinja wins).
#include "format/hf_tokenizer.hpp"

#include "loom/format/gguf.hpp"

#include <cctype>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom::hf {

namespace {

constexpr uint64_t k_max_tokenizer = 512ull << 20; // tokenizer.json (large vocabularies: tens of MiB)

constexpr int32_t k_normal = 1, k_unknown = 2, k_control = 3, k_user_defined = 4, k_unused = 5, k_byte = 6;

// HF's pre-tokenizer regexes that Loom's byte-level BPE knows by their llama.cpp names.
constexpr std::pair<std::string_view, std::string_view> k_pre_regexes[] = {
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "llama-bpe"},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "qwen2"},
};

// The components of a Sequence (or the component itself) of a tokenizer.json normalizer,
// pre_tokenizer or post_processor.
std::vector<const json*> components(const json* c, const char* list_key, const std::string& shown) {
  std::vector<const json*> out;
  if (!c || !c->is_object()) return out;
  if (str_or(*c, "type", "", shown) == "Sequence") {
    if (const json* l = member(*c, list_key); l && l->is_array())
      for (const auto& x : *l)
        if (x.is_object()) out.push_back(&x);
  } else {
    out.push_back(c);
  }
  return out;
}

// A token named in tokenizer_config.json: a string, or an AddedToken object {"content": …}.
std::optional<std::string> token_text(const json* v) {
  if (!v) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object())
    if (const json* c = member(*v, "content"); c && c->is_string()) return c->get<std::string>();
  return std::nullopt;
}

// tokenizer.json, parsed: an object.
json read_tokenizer_json(const std::string& dir, const std::string& shown) {
  const auto text = read_small(join(dir, "tokenizer.json"), k_max_tokenizer, "tokenizer.json");
  if (!text)
    bad(gguf_printable(dir, 400),
        "tokenizer.json is missing: expected the Hugging Face fast tokenizer next to config.json "
        "(checkpoints with only tokenizer.model are not supported — convert them to GGUF)",
        Errc::not_found);
  json tj = parse_json(*text, shown);
  if (!tj.is_object()) bad(shown, "expected a JSON object, found " + describe(tj));
  return tj;
}

// tokenizer.json's "model": a BPE model with a vocabulary.
const json& bpe_model(const json& tj, const std::string& shown) {
  const json* model = member(tj, "model");
  if (!model || !model->is_object()) bad(shown, "'model' is missing: expected the tokenizer model object");
  const std::string mtype = str_or(*model, "type", "BPE", shown);
  if (mtype != "BPE")
    bad(shown,
        "tokenizer model type '" + gguf_printable(mtype) +
            "' is not supported (expected BPE: SentencePiece-style with byte fallback, or byte-level)",
        Errc::unsupported);
  const json* vocab = member(*model, "vocab");
  if (!vocab || !vocab->is_object() || vocab->empty())
    bad(shown, "'model.vocab' should be a non-empty object of token → id");
  return *model;
}

// Token texts and types by id, and the ids by text (views of `pieces`: a Vocab stays where it is built).
struct Vocab {
  std::vector<std::string> pieces;
  std::vector<int32_t> types;
  std::vector<bool> present;
  std::unordered_map<std::string_view, int64_t> ids;

  Vocab() = default;
  Vocab(const Vocab&) = delete;
  Vocab& operator=(const Vocab&) = delete;

  void put(int64_t id, const std::string& piece, int32_t type, bool replace, const std::string& shown) {
    if (static_cast<size_t>(id) >= pieces.size()) {
      pieces.resize(static_cast<size_t>(id) + 1);
      types.resize(static_cast<size_t>(id) + 1, k_unused);
      present.resize(static_cast<size_t>(id) + 1, false);
    }
    const auto i = static_cast<size_t>(id);
    if (present[i] && !replace)
      bad(shown, "token id " + std::to_string(id) + " is used by both '" + gguf_printable(pieces[i], 40) +
                     "' and '" + gguf_printable(piece, 40) + "': expected each id once");
    pieces[i] = piece;
    types[i] = type;
    present[i] = true;
  }
};

// A token id of tokenizer.json: non-negative and below config.json's vocab_size.
int64_t token_id(const json& v, const std::string& what, int64_t n_vocab, const std::string& shown) {
  const auto id = as_int(v);
  if (!id || *id < 0)
    bad(shown, what + " should be a token id (a non-negative integer), found " + describe(v));
  if (*id >= n_vocab)
    bad(shown, what + " is " + std::to_string(*id) + ", not below config.json's vocab_size " +
                   std::to_string(n_vocab) +
                   ": the embedding has no row for it — the checkpoint is inconsistent");
  return *id;
}

// The vocabulary, then the added tokens (which win, as in transformers), then a placeholder for
// every id without a token.
void read_vocab(const json& tj, const json& model, int64_t n_vocab, const std::string& shown, Vocab& v) {
  for (const auto& [piece, idv] : member(model, "vocab")->items())
    v.put(token_id(idv, "the id of '" + gguf_printable(piece, 40) + "'", n_vocab, shown), piece, k_normal,
          false, shown);
  if (const json* added = member(tj, "added_tokens")) {
    if (!added->is_array()) bad(shown, "'added_tokens' should be a list, found " + describe(*added));
    for (const auto& t : *added) {
      const json* c = member(t, "content");
      const json* idv = member(t, "id");
      if (!c || !c->is_string() || !idv)
        bad(shown, "an entry of 'added_tokens' lacks its id or content: " + describe(t));
      const int64_t id =
          token_id(*idv, "added token '" + gguf_printable(c->get<std::string>(), 40) + "'", n_vocab, shown);
      const bool special = bool_or(t, "special", false, shown);
      v.put(id, c->get<std::string>(), special ? k_control : k_user_defined, true, shown);
    }
  }
  // Ids without a token (and the embedding's padding rows): "[PAD<id>]", unused, as llama.cpp writes them.
  for (size_t i = 0; i < static_cast<size_t>(n_vocab); ++i) {
    if (i >= v.pieces.size()) {
      v.pieces.push_back("");
      v.types.push_back(k_unused);
      v.present.push_back(false);
    }
    if (!v.present[i]) v.pieces[i] = "[PAD" + std::to_string(i) + "]";
  }
  for (size_t i = 0; i < v.pieces.size(); ++i)
    if (v.present[i]) v.ids.emplace(v.pieces[i], static_cast<int64_t>(i));
}

struct Merges {
  std::vector<std::string> merges; // "left right"
  std::vector<std::string> merged; // what each merge makes
};

Merges read_merges(const json& model, const std::string& shown) {
  Merges r;
  const json* m = member(model, "merges");
  if (!m) return r;
  if (!m->is_array()) bad(shown, "'model.merges' should be a list, found " + describe(*m));
  r.merges.reserve(m->size());
  for (const auto& x : *m) {
    if (x.is_string()) {
      const auto& s = x.get_ref<const std::string&>();
      if (s.find(' ') == std::string::npos || s.find(' ') != s.rfind(' '))
        bad(shown, "merge " + describe(x) + " should be two tokens separated by one space");
      r.merges.push_back(s);
      r.merged.push_back(s.substr(0, s.find(' ')) + s.substr(s.find(' ') + 1));
    } else if (x.is_array() && x.size() == 2 && x[0].is_string() && x[1].is_string()) {
      r.merges.push_back(x[0].get<std::string>() + " " + x[1].get<std::string>());
      r.merged.push_back(x[0].get<std::string>() + x[1].get<std::string>());
    } else {
      bad(shown, "merge " + describe(x) + " should be \"left right\" or [\"left\", \"right\"]");
    }
  }
  return r;
}

bool has_byte_level(const json* pre_tok, const json* decoder, const std::string& shown) {
  bool byte_level = false;
  for (const json* c : components(pre_tok, "pretokenizers", shown))
    byte_level = byte_level || str_or(*c, "type", "", shown) == "ByteLevel";
  for (const json* c : components(decoder, "decoders", shown))
    byte_level = byte_level || str_or(*c, "type", "", shown) == "ByteLevel";
  return byte_level;
}

// A "▁" prepended to the text: a Prepend normalizer, or a Metaspace pre-tokenizer that prepends.
bool adds_space_prefix(const json* normalizer, const json* pre_tok, const std::string& shown) {
  bool prefix = false;
  for (const json* c : components(normalizer, "normalizers", shown))
    prefix = prefix || (str_or(*c, "type", "", shown) == "Prepend" &&
                        str_or(*c, "prepend", "", shown) == "\xE2\x96\x81");
  for (const json* c : components(pre_tok, "pretokenizers", shown))
    if (str_or(*c, "type", "", shown) == "Metaspace")
      prefix = prefix || bool_or(*c, "add_prefix_space", false, shown) ||
               str_or(*c, "prepend_scheme", "never", shown) != "never";
  return prefix;
}

// SentencePiece-style BPE: Loom's "llama" tokenizer merges by piece score; a piece's score is minus
// the rank of the first merge that makes it (pieces no merge makes rank below every merge).
void add_llama_vocab(Meta& meta, Vocab& v, const Merges& m, const json& model, const json* normalizer,
                     const json* pre_tok, const std::string& shown) {
  meta.add("tokenizer.ggml.model", v_str("llama"));
  std::vector<float> scores(v.pieces.size(), -static_cast<float>(m.merges.size() + 1));
  for (size_t r = m.merged.size(); r-- > 0;) // the lowest rank last: it wins
    if (auto it = v.ids.find(m.merged[r]); it != v.ids.end())
      scores[static_cast<size_t>(it->second)] = -static_cast<float>(r);
  for (size_t i = 0; i < v.pieces.size(); ++i) {
    const std::string& p = v.pieces[i];
    if (v.types[i] == k_normal && p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' &&
        std::isxdigit(static_cast<unsigned char>(p[3])) && std::isxdigit(static_cast<unsigned char>(p[4])))
      v.types[i] = k_byte;
  }
  if (auto unk = model.find("unk_token"); unk != model.end() && unk->is_string())
    if (auto it = v.ids.find(unk->get_ref<const std::string&>()); it != v.ids.end()) {
      v.types[static_cast<size_t>(it->second)] = k_unknown;
      meta.add("tokenizer.ggml.unknown_token_id", v_u32(it->second));
    }
  meta.add("tokenizer.ggml.tokens",
           v_array(GgufType::string, v.pieces, [](const std::string& s) { return v_str(s); }));
  meta.add("tokenizer.ggml.scores",
           v_array(GgufType::f32, scores, [](float x) { return v_f32(static_cast<double>(x)); }));
  meta.add("tokenizer.ggml.add_space_prefix", v_bool(adds_space_prefix(normalizer, pre_tok, shown)));
}

// The llama.cpp name of a byte-level pre-tokenizer, told apart by its regex.
std::string byte_level_pre(const json* pre_tok, const std::string& shown) {
  std::vector<std::string> regexes;
  bool bytelevel_regex = false;
  for (const json* c : components(pre_tok, "pretokenizers", shown)) {
    const std::string t = str_or(*c, "type", "", shown);
    if (t == "Split") {
      const json* p = member(*c, "pattern");
      const json* re = p ? member(*p, "Regex") : nullptr;
      if (!re || !re->is_string())
        bad(shown, "a Split pre-tokenizer without a regex pattern is not supported", Errc::unsupported);
      regexes.push_back(re->get<std::string>());
    } else if (t == "ByteLevel") {
      bytelevel_regex = bytelevel_regex || bool_or(*c, "use_regex", true, shown);
    } else {
      bad(shown,
          "pre-tokenizer '" + gguf_printable(t) +
              "' is not supported with byte-level BPE; convert the model to GGUF",
          Errc::unsupported);
    }
  }
  std::string pre;
  if (regexes.empty() && bytelevel_regex) {
    pre = "gpt-2";
  } else if (regexes.size() == 1 && !bytelevel_regex) {
    for (const auto& [re, name] : k_pre_regexes)
      if (regexes[0] == re) pre = name;
  }
  if (pre.empty())
    bad(shown,
        "the byte-level pre-tokenizer (" + describe(*pre_tok) +
            ") is not one Loom recognizes (GPT-2's, Llama 3's or Qwen2's); convert the model to GGUF with "
            "llama.cpp",
        Errc::unsupported);
  return pre;
}

// Byte-level BPE: Loom's "gpt2" tokenizer merges by rank.
void add_gpt2_vocab(Meta& meta, const Vocab& v, const Merges& m, const json* pre_tok,
                    const std::string& shown) {
  const std::string pre = byte_level_pre(pre_tok, shown);
  meta.add("tokenizer.ggml.model", v_str("gpt2"));
  meta.add("tokenizer.ggml.pre", v_str(pre));
  meta.add("tokenizer.ggml.tokens",
           v_array(GgufType::string, v.pieces, [](const std::string& s) { return v_str(s); }));
  meta.add("tokenizer.ggml.merges",
           v_array(GgufType::string, m.merges, [](const std::string& s) { return v_str(s); }));
}

// tokenizer_config.json, parsed (an empty object when there is none).
json read_tokenizer_config(const std::string& dir, const std::string& tc_shown) {
  json tc = json::object();
  if (const auto t = read_small(join(dir, "tokenizer_config.json"), k_max_config, "tokenizer_config.json")) {
    tc = parse_json(*t, tc_shown);
    if (!tc.is_object()) bad(tc_shown, "expected a JSON object, found " + describe(tc));
  }
  return tc;
}

// BOS/EOS/PAD ids: the token tokenizer_config.json names, else config.json's id.
struct SpecialTokens {
  const json& tc;
  const std::string& tc_shown;
  const json& cfg;
  std::string cfg_shown;
  const Vocab& vocab;
  int64_t n_vocab;
  Meta& meta;

  void add(const char* tc_key, const char* cfg_key, const char* gguf_key) const {
    if (const json* v = member(tc, tc_key)) {
      const auto t = token_text(v);
      if (!t) bad(tc_shown, std::string("'") + tc_key + "' should be a token string, found " + describe(*v));
      const auto it = vocab.ids.find(*t);
      if (it == vocab.ids.end())
        bad(tc_shown,
            std::string(tc_key) + " '" + gguf_printable(*t, 40) + "' is not a token of tokenizer.json");
      meta.add(gguf_key, v_u32(it->second));
      return;
    }
    if (!cfg_key) return;
    if (const json* v = member(cfg, cfg_key)) { // an id, or a list of ids (the first is the main one)
      const json& x = v->is_array() && !v->empty() ? (*v)[0] : *v;
      const auto id = as_int(x);
      if (!id || *id < 0 || *id >= n_vocab)
        bad(cfg_shown, std::string("'") + cfg_key + "' should be a token id in 0.." +
                           std::to_string(n_vocab - 1) + ", found " + describe(*v));
      meta.add(gguf_key, v_u32(*id));
    }
  }
};

// Whether BOS/EOS are added: tokenizer_config.json's flags, else the post-processor's template.
void add_bos_eos_flags(Meta& meta, const Keys& tk, const json& tj, const std::string& shown) {
  std::optional<bool> add_bos = tk.bool_opt("add_bos_token"), add_eos = tk.bool_opt("add_eos_token");
  bool tmpl_bos = false, tmpl_eos = false;
  for (const json* c : components(member(tj, "post_processor"), "processors", shown))
    if (str_or(*c, "type", "", shown) == "TemplateProcessing")
      if (const json* single = member(*c, "single"); single && single->is_array() && !single->empty()) {
        tmpl_bos = single->front().is_object() && single->front().contains("SpecialToken");
        tmpl_eos = single->back().is_object() && single->back().contains("SpecialToken");
      }
  meta.add("tokenizer.ggml.add_bos_token", v_bool(add_bos.value_or(tmpl_bos)));
  meta.add("tokenizer.ggml.add_eos_token", v_bool(add_eos.value_or(tmpl_eos)));
}

// The chat template: chat_template.jinja (transformers ≥ 4.43 saves it there), else tokenizer_config's
// chat_template (a string, or named templates: "default" or the first).
std::optional<std::string> chat_template(const std::string& dir, const json& tc,
                                         const std::string& tc_shown) {
  std::optional<std::string> tmpl =
      read_small(join(dir, "chat_template.jinja"), k_max_config, "chat_template.jinja");
  if (tmpl) return tmpl;
  const json* ct = member(tc, "chat_template");
  if (!ct) return tmpl;
  if (ct->is_string()) {
    tmpl = ct->get<std::string>();
  } else if (ct->is_array()) {
    for (const auto& e : *ct) {
      const json* n = member(e, "name");
      const json* t = member(e, "template");
      if (!t || !t->is_string())
        bad(tc_shown, "a named chat_template lacks its 'template' string: " + describe(e));
      if (!tmpl || (n && n->is_string() && n->get<std::string>() == "default")) tmpl = t->get<std::string>();
    }
  } else {
    bad(tc_shown, "'chat_template' should be a string or a list of named templates, found " + describe(*ct));
  }
  return tmpl;
}

// tokenizer_config.json (and chat_template.jinja): special tokens, whether BOS/EOS are added, the template.
void add_tokenizer_config(const std::string& dir, const HfConfig& h, const json& cfg, const json& tj,
                          const Vocab& vocab, const std::string& shown, Meta& meta) {
  const std::string tc_shown = gguf_printable(join(dir, "tokenizer_config.json"), 400);
  const json tc = read_tokenizer_config(dir, tc_shown);
  const Keys tk(tc, tc_shown);
  const SpecialTokens special{tc,    tc_shown,  cfg, gguf_printable(join(dir, "config.json"), 400),
                              vocab, h.n_vocab, meta};
  special.add("bos_token", "bos_token_id", "tokenizer.ggml.bos_token_id");
  special.add("eos_token", "eos_token_id", "tokenizer.ggml.eos_token_id");
  special.add("pad_token", nullptr, "tokenizer.ggml.padding_token_id");
  add_bos_eos_flags(meta, tk, tj, shown);
  if (auto tmpl = chat_template(dir, tc, tc_shown))
    meta.add("tokenizer.chat_template", v_str(std::move(*tmpl)));
}

} // namespace

void read_tokenizer(const std::string& dir, const HfConfig& h, const json& cfg, Meta& meta) {
  const std::string shown = gguf_printable(join(dir, "tokenizer.json"), 400);
  const json tj = read_tokenizer_json(dir, shown);
  const json& model = bpe_model(tj, shown);
  Vocab vocab;
  read_vocab(tj, model, h.n_vocab, shown, vocab);
  const Merges merges = read_merges(model, shown);

  const json* pre_tok = member(tj, "pre_tokenizer");
  const json* normalizer = member(tj, "normalizer");
  const bool byte_fallback = bool_or(model, "byte_fallback", false, shown);
  const bool byte_level = has_byte_level(pre_tok, member(tj, "decoder"), shown);
  if (byte_fallback) {
    add_llama_vocab(meta, vocab, merges, model, normalizer, pre_tok, shown);
  } else if (byte_level) {
    add_gpt2_vocab(meta, vocab, merges, pre_tok, shown);
  } else {
    bad(shown,
        "a BPE tokenizer with neither byte_fallback nor a ByteLevel pre-tokenizer is not supported "
        "(expected SentencePiece-style BPE with byte fallback, or byte-level BPE)",
        Errc::unsupported);
  }
  meta.add("tokenizer.ggml.token_type",
           v_array(GgufType::i32, vocab.types, [](int32_t t) { return v_i32(t); }));
  add_tokenizer_config(dir, h, cfg, tj, vocab, shown, meta);
}

} // namespace loom::hf
