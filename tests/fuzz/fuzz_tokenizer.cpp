// libFuzzer target: encode arbitrary bytes with each shipped tokenizer kind, then decode.
// Vocabularies come from $LOOM_TEST_MODELS (stories260K: SentencePiece; ggml-vocab-gpt-2: byte-level
// BPE; ggml-vocab-falcon / deepseek-coder: other pre-tokenizers).
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct Vocab {
  std::unique_ptr<loom::GgufFile> file;
  std::unique_ptr<loom::Tokenizer> tok;
};

std::vector<Vocab>& vocabs() {
  static std::vector<Vocab> v = [] {
    std::vector<Vocab> out;
    const char* env = std::getenv("LOOM_TEST_MODELS");
    const std::filesystem::path dir = env && *env ? env : "../shared/models";
    for (const char* rel : {"stories260K.gguf", "vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-falcon.gguf",
                            "vocab/ggml-vocab-deepseek-coder.gguf", "vocab/ggml-vocab-llama-spm.gguf"}) {
      const auto p = dir / rel;
      if (!std::filesystem::exists(p)) continue;
      Vocab vb;
      vb.file = std::make_unique<loom::GgufFile>(loom::GgufFile::open(p.string()));
      vb.tok = loom::Tokenizer::from_gguf(*vb.file);
      out.push_back(std::move(vb));
    }
    if (out.empty()) {
      std::fprintf(stderr, "fuzz_tokenizer: no vocabulary under %s (set LOOM_TEST_MODELS)\n", dir.c_str());
      std::abort();
    }
    return out;
  }();
  return v;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  auto& vs = vocabs();
  const auto& v = vs[data[0] % vs.size()];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  loom::EncodeOptions o;
  o.parse_special = (data[0] & 0x80) != 0;
  o.add_bos = (data[0] & 0x40) != 0;
  const auto ids = v.tok->encode(text, o);
  for (auto id : ids)
    if (id < 0 || id >= v.tok->vocab_size()) std::abort();
  const std::string whole = v.tok->decode(ids);
  loom::DecodeState st;
  std::string inc;
  for (auto id : ids)
    v.tok->decode_step(st, id, inc);
  v.tok->decode_flush(st, inc);
  (void)whole;
  return 0;
}
