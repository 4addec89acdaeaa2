// tokenizer/pretokenizer.cpp — PCRE2 pre-tokenizers keyed by `tokenizer.ggml.pre`.
//
// The regex lists are the tokenizer definitions of the respective models (Hugging Face
// tokenizer.json pre_tokenizer), in the per-name grouping llama.cpp uses. Where llama.cpp rewrote
// a pattern for std::regex (no \p{Lu}, no (?i:...)), the original is used: PCRE2 has both.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.hpp"

#include "loom/error.hpp"
#include "tokenizer/utf8.hpp"

#include <pcre2.h>

namespace loom::tok {

namespace {

// ---- patterns --------------------------------------------------------------------------------

// GPT-2 (also MPT, OLMo, Jais, …).
constexpr std::string_view k_gpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3 (tiktoken cl100k style); (?i:'s|…) spelled out in ASCII so that no Unicode case folding
// ('ſ' → 's') applies.
constexpr std::string_view k_llama3 = R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))"
                                      R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
                                      R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2: as Llama 3 but digits one by one.
constexpr std::string_view k_qwen2 = R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))"
                                     R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*)"
                                     R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-4o (o200k): case-aware words with attached contractions.
constexpr std::string_view k_gpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Tekken (Mistral Nemo): as GPT-4o without contractions, digits one by one.
constexpr std::string_view k_tekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Bailing MoE (original possessive quantifiers: PCRE2 has them).
constexpr std::string_view k_bailing = R"('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE]))"
                                       R"(|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*)"
                                       R"(|\s*[\r\n]|\s+(?!\S)|\s+)";

// Seed-Coder.
constexpr std::string_view k_seed_coder = R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))"
                                          R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+)"
                                          R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";

// CJK ranges of the DeepSeek tokenizers: U+4E00–U+9FA5, U+0800–U+4E00, U+AC00–U+D7FF.
constexpr std::string_view k_deepseek_cjk = R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

// DeepSeek LLM letters: the cased letters (Lu, Ll, Lt) of the Unicode version it was built with.
constexpr std::string_view k_deepseek_llm_letters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF})"
    R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
    R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})"
    R"(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77})"
    R"(\x{1D79}-\x{1D9A})"
    R"(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})"
    R"(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})"
    R"(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})"
    R"(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})"
    R"(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})"
    R"(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";

// DeepSeek LLM punctuation: ASCII and full-width punctuation, quotes, CJK punctuation.
constexpr std::string_view k_deepseek_llm_punct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";

// DeepSeek V3 words: ASCII punctuation + letters, letter runs, punctuation/symbol runs.
constexpr std::string_view k_deepseek_v3_words =
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)re"
    R"re(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

// Poro / BLOOM / GPT-3 Finnish: everything up to whitespace or a sentence mark.
constexpr std::string_view k_poro =
    R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)";

struct Preset {
  std::vector<std::string_view> names;
  std::vector<std::string_view> regexes; // applied in this order
  PreTokenizerTraits traits;
};

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = {
      // No pre-tokenizer recorded (older conversions): llama.cpp's default sequence.
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", k_gpt2, R"(\p{N}+)", R"([0-9][0-9][0-9])"}, {}},
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "jina-v1-en", "jina-v2-es",
        "jina-v2-de", "jina-v2-code", "roberta-bpe", "gigachat", "trillion", "granite-docling", "exaone4",
        "a.x-4.0", "mellum", "modern-bert"},
       {k_gpt2},
       {}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
       {k_llama3},
       {.ignore_merges = true, .add_bos = true}},
      {{"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"}, {k_llama3}, {}},
      {{"deepseek-llm"},
       {R"([\r\n])", k_deepseek_llm_letters, k_deepseek_llm_punct, R"(\s+$)", k_deepseek_cjk, R"(\p{N}+)"},
       {}},
      {{"deepseek-coder"}, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", k_deepseek_cjk, R"(\p{N})"}, {}},
      {{"deepseek-v3"},
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)", k_deepseek_v3_words},
       {}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", k_gpt2, R"([0-9][0-9][0-9])"}, {}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})", k_gpt2},
       {}},
      {{"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan", "grok-2"}, {k_qwen2}, {}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {k_poro}, {}},
      {{"viking"}, {k_poro, R"(\p{N})"}, {}},
      {{"tekken"}, {k_tekken}, {.ignore_merges = true, .add_bos = true}},
      {{"gpt-4o", "llama4"}, {k_gpt4o}, {}},
      {{"bailingmoe", "bailingmoe2", "llada-moe"}, {k_bailing}, {}},
      {{"seed-coder"}, {k_seed_coder}, {}},
  };
  return table;
}

// Per-thread matching scratch: match data (only the overall match is needed), a match context
// and a JIT stack larger than PCRE2's 32 KiB default.
struct MatchScratch {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* stack = nullptr;

  MatchScratch() {
    md = pcre2_match_data_create(1, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (ctx && stack) pcre2_jit_stack_assign(ctx, nullptr, stack);
    if (!md || !ctx) fail(Errc::out_of_memory, "tokenizer", "cannot allocate PCRE2 match data");
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
    pcre2_match_data_free(md);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

} // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  bool jit = false;

  explicit Regex(std::string_view pattern) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    // UCP: \s, \p{..}, \d use Unicode properties. MATCH_INVALID_UTF: invalid UTF-8 in the subject
    // is allowed and never matches. DOLLAR_ENDONLY: `$` only at the very end (as in ECMAScript).
    const uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &err_off,
                         nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail(Errc::internal, "tokenizer",
           "pre-tokenizer regex does not compile at offset " + std::to_string(err_off) + ": " +
               reinterpret_cast<const char*>(msg));
    }
    jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // One match in subject[0, len) starting the search at `start`: true and [b, e) on a match.
  // Matching errors (resource limits) count as "no match".
  bool match(std::string_view subject, size_t start, uint32_t opts, size_t& b, size_t& e) const {
    MatchScratch& s = scratch();
    const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
    int rc = pcre2_match(code, subj, subject.size(), start, opts, s.md, s.ctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_NOMEMORY)
      rc = pcre2_match(code, subj, subject.size(), start, opts | PCRE2_NO_JIT, s.md, s.ctx);
    if (rc < 0) return false; // no match, or still an error: the rest stays one piece
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
    b = ov[0];
    e = ov[1];
    return b <= e && e <= subject.size();
  }

  // Splits subject[0, len) into matches and the gaps between them (offsets relative to subject).
  void split(std::string_view subject, size_t base, std::vector<Span>& out) const {
    size_t last = 0; // end of what has been emitted
    size_t pos = 0;  // where the next search starts
    uint32_t opts = 0;
    while (pos <= subject.size()) {
      size_t b = 0, e = 0;
      if (!match(subject, pos, opts, b, e)) {
        if (opts == 0) break;
        // No non-empty match at an empty match's position: move on by one character.
        opts = 0;
        if (pos >= subject.size()) break;
        pos += utf8_char_len(subject.substr(pos));
        continue;
      }
      if (b > last) out.push_back({base + last, base + b});
      if (e > b) {
        out.push_back({base + b, base + e});
        last = pos = e;
        opts = 0;
      } else {
        // Empty match: a split point. Next, look for a non-empty match at the same place.
        last = b;
        pos = b;
        opts = PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED;
      }
    }
    if (last < subject.size()) out.push_back({base + last, base + subject.size()});
  }
};

PreTokenizer::~PreTokenizer() = default;

std::unique_ptr<PreTokenizer> PreTokenizer::create(std::string_view name) {
  for (const Preset& p : presets()) {
    for (std::string_view n : p.names) {
      if (n != name) continue;
      std::unique_ptr<PreTokenizer> pt(new PreTokenizer());
      pt->traits_ = p.traits;
      for (std::string_view re : p.regexes)
        pt->regexes_.push_back(std::make_unique<Regex>(re));
      return pt;
    }
  }
  return nullptr;
}

std::string PreTokenizer::known_names() {
  std::string s;
  for (const Preset& p : presets())
    for (std::string_view n : p.names) {
      if (!s.empty()) s += ", ";
      s += n;
    }
  return s;
}

void PreTokenizer::split(std::string_view text, std::vector<Span>& out) const {
  if (text.empty()) return;
  std::vector<Span> cur{{0, text.size()}}, next;
  for (const auto& re : regexes_) {
    next.clear();
    for (const Span& s : cur)
      re->split(text.substr(s.begin, s.end - s.begin), s.begin, next);
    cur.swap(next);
  }
  out.insert(out.end(), cur.begin(), cur.end());
}

} // namespace loom::tok
