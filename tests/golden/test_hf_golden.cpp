// Golden: the Hugging Face checkpoint of stories260K (../shared/models/stories260K-hf: config.json,
// model.safetensors with q/k in HF's rotate-half row order and tied embeddings, tokenizer.json) is the
// GGUF's model: the same token ids, the same logits at every position, the same `loom run` text.
// Missing models are SKIPPED with the reason, never passed.
#include "loom/format/gguf.hpp"
#include "loom/kv/kv_cache.hpp"
#include "loom/model/model.hpp"
#include "loom/model/reference_backend.hpp"
#include "loom/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <gtest/gtest.h>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <unistd.h>

namespace {

using namespace loom;

#define REQUIRE_BOTH(gguf, hf)                                                                               \
  LOOM_REQUIRE_MODEL(gguf, "stories260K.gguf");                                                              \
  LOOM_REQUIRE_MODEL(hf, "stories260K-hf/config.json");                                                      \
  const std::string hf##_dir = hf.parent_path().string()

TEST(GoldenHf, TokenIdsEqualTheGguf) {
  REQUIRE_BOTH(gguf, hf);
  const GgufFile gf = GgufFile::open(gguf.string()), hff = GgufFile::open(hf_dir);
  const auto a = Tokenizer::from_gguf(gf), b = Tokenizer::from_gguf(hff);
  ASSERT_EQ(a->vocab_size(), b->vocab_size());
  for (TokenId i = 0; i < a->vocab_size(); ++i)
    ASSERT_EQ(a->piece(i), b->piece(i)) << "token " << i;
  for (TokenId i = 0; i < a->vocab_size(); ++i)
    EXPECT_EQ(a->token_type(i), b->token_type(i)) << "token " << i;
  EXPECT_EQ(a->eog_tokens(), b->eog_tokens());
  EXPECT_EQ(a->bos(), b->bos());
  EXPECT_EQ(a->eos(), b->eos());
  EXPECT_EQ(b->add_bos_default(), true);

  std::vector<std::string> prompts = {"Once upon a time",
                                      "The little dog",
                                      "",
                                      " leading space",
                                      "Lily  and   Tom.\nThey played!",
                                      "<s>hello</s>",
                                      "ied 4 ½ months",
                                      "Führer 🦙 \t tabs"};
  const auto cases = test::models_dir() / "reference" / "tokenizer" / "cases.json";
  if (std::filesystem::exists(cases))
    for (const auto& s : nlohmann::json::parse(test::read_file(cases)))
      prompts.push_back(s.get<std::string>());
  ASSERT_GT(prompts.size(), 50u) << "reference/tokenizer/cases.json should hold 51 strings";
  for (const auto& p : prompts) {
    SCOPED_TRACE(p);
    for (const bool special : {false, true}) {
      const EncodeOptions o{.add_bos = std::nullopt, .add_eos = std::nullopt, .parse_special = special};
      const auto ia = a->encode(p, o), ib = b->encode(p, o);
      EXPECT_EQ(ib, ia);
      EXPECT_EQ(b->decode(ib), a->decode(ia));
    }
  }
  // And SentencePiece's own ids (tok512.jsonl: no BOS).
  const auto ref = test::models_dir() / "reference" / "tokenizer" / "tok512.jsonl";
  if (!std::filesystem::exists(ref)) return;
  std::istringstream in(test::read_file(ref));
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(b->encode(j["text"].get<std::string>(), {.add_bos = false, .add_eos = false}),
              j["ids"].get<std::vector<TokenId>>())
        << j["text"];
    ++n;
  }
  EXPECT_GT(n, 50u);
}

// A checkpoint directory around a tokenizer.json: a one-layer Llama of width 8 (zero weights) with
// n_vocab embedding rows.
std::filesystem::path checkpoint_around(const std::string& tag, const nlohmann::json& tj, int64_t n_vocab) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("loom-hf-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const int64_t V = n_vocab, E = 8, F = 16;
  const nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                              {"hidden_size", E},
                              {"intermediate_size", F},
                              {"num_hidden_layers", 1},
                              {"num_attention_heads", 2},
                              {"vocab_size", V},
                              {"max_position_embeddings", 64},
                              {"tie_word_embeddings", true}};
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"model.embed_tokens.weight", {V, E}},
      {"model.norm.weight", {E}},
      {"model.layers.0.input_layernorm.weight", {E}},
      {"model.layers.0.post_attention_layernorm.weight", {E}},
      {"model.layers.0.self_attn.q_proj.weight", {E, E}},
      {"model.layers.0.self_attn.k_proj.weight", {E, E}},
      {"model.layers.0.self_attn.v_proj.weight", {E, E}},
      {"model.layers.0.self_attn.o_proj.weight", {E, E}},
      {"model.layers.0.mlp.gate_proj.weight", {F, E}},
      {"model.layers.0.mlp.up_proj.weight", {F, E}},
      {"model.layers.0.mlp.down_proj.weight", {E, F}}};
  nlohmann::json header = nlohmann::json::object();
  uint64_t off = 0;
  for (const auto& [name, shape] : shapes) {
    const uint64_t bytes = 4 * static_cast<uint64_t>(std::accumulate(shape.begin(), shape.end(), int64_t{1},
                                                                     std::multiplies<int64_t>()));
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string h = header.dump();
  h.resize((h.size() + 7) / 8 * 8, ' ');
  {
    std::ofstream st(dir / "model.safetensors", std::ios::binary);
    for (int k = 0; k < 8; ++k)
      st.put(static_cast<char>(static_cast<uint64_t>(h.size()) >> (8 * k)));
    st << h << std::string(off, '\0');
    std::ofstream(dir / "config.json") << cfg.dump();
    std::ofstream(dir / "tokenizer.json") << tj.dump();
  }
  return dir;
}

// The Llama-2 vocabulary (32000 SentencePiece pieces, 16 whitespace pieces scored −1e9 out of id order)
// written as transformers' converter writes tokenizer.json — every split of a piece into two pieces
// is a merge, merges ordered by the piece's score — tokenizes as SentencePiece does: merge ranks
// become scores that keep SentencePiece's order.
TEST(GoldenHf, Llama2VocabularyFromTokenizerJsonMatchesSentencePiece) {
  LOOM_REQUIRE_MODEL(vocab_path, "vocab/ggml-vocab-llama-spm.gguf");
  LOOM_REQUIRE_MODEL(ref, "reference/tokenizer/llama2.jsonl");
  const GgufFile v = GgufFile::open(vocab_path.string());
  const GgufValue* toks = v.get_array("tokenizer.ggml.tokens", GgufType::string);
  const GgufValue* scores = v.get_array("tokenizer.ggml.scores", GgufType::f32);
  const GgufValue* types = v.get_array("tokenizer.ggml.token_type", GgufType::i32);
  ASSERT_TRUE(toks && scores && types);
  const size_t n = toks->items.size();
  nlohmann::json vocab = nlohmann::json::object();
  std::map<std::string, size_t> id;
  for (size_t i = 0; i < n; ++i) {
    vocab[std::string(toks->items.str(i))] = i;
    id.emplace(toks->items.str(i), i);
  }
  struct Merge {
    std::string l, r;
    double score;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < n; ++i) {
    if (types->items.as_int(i) != 1) continue;
    const std::string p(toks->items.str(i));
    std::vector<Merge> local;
    for (size_t k = 1; k < p.size(); ++k) // splits between UTF-8 characters
      if ((static_cast<unsigned char>(p[k]) & 0xC0) != 0x80 && id.count(p.substr(0, k)) &&
          id.count(p.substr(k)))
        local.push_back({p.substr(0, k), p.substr(k), *scores->items.as_number(i)});
    std::sort(local.begin(), local.end(), [&](const Merge& a, const Merge& b) {
      return std::pair(id[a.l], id[a.r]) < std::pair(id[b.l], id[b.r]);
    });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [](const Merge& a, const Merge& b) { return a.score > b.score; });
  nlohmann::json mj = nlohmann::json::array();
  for (const auto& m : merges)
    mj.push_back(m.l + " " + m.r);
  const nlohmann::json tj = {
      {"added_tokens",
       {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
        {{"id", 1}, {"content", "<s>"}, {"special", true}},
        {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
      {"model",
       {{"type", "BPE"}, {"unk_token", "<unk>"}, {"byte_fallback", true}, {"vocab", vocab}, {"merges", mj}}}};
  const auto dir = checkpoint_around("llama2", tj, static_cast<int64_t>(n));
  const auto tok = Tokenizer::from_gguf(GgufFile::open(dir.string()));
  std::istringstream in(test::read_file(ref));
  std::string line;
  size_t cases = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(tok->encode(j["text"].get<std::string>(), {.add_bos = false, .add_eos = false}),
              j["ids"].get<std::vector<TokenId>>())
        << j["text"];
    ++cases;
  }
  EXPECT_GT(cases, 50u);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// GPT-2's vocabulary and merges as a byte-level tokenizer.json (ByteLevel pre-tokenizer with its
// regex) give the ids Hugging Face's tokenizer gives for llama.cpp's test strings.
TEST(GoldenHf, Gpt2ByteLevelTokenizerJsonMatchesHuggingFace) {
  LOOM_REQUIRE_MODEL(vocab_path, "vocab/ggml-vocab-gpt-2.gguf");
  LOOM_REQUIRE_MODEL(inp, "vocab/ggml-vocab-gpt-2.gguf.inp");
  const GgufFile v = GgufFile::open(vocab_path.string());
  const GgufValue* toks = v.get_array("tokenizer.ggml.tokens", GgufType::string);
  const GgufValue* merges = v.get_array("tokenizer.ggml.merges", GgufType::string);
  ASSERT_TRUE(toks && merges);
  nlohmann::json vocab = nlohmann::json::object(), mj = nlohmann::json::array();
  for (size_t i = 0; i < toks->items.size(); ++i)
    vocab[std::string(toks->items.str(i))] = i;
  for (size_t i = 0; i < merges->items.size(); ++i) // the newer [left, right] form
    mj.push_back(nlohmann::json::array(
        {std::string(merges->items.str(i).substr(0, merges->items.str(i).find(' '))),
         std::string(merges->items.str(i).substr(merges->items.str(i).find(' ') + 1))}));
  const nlohmann::json tj = {
      {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", mj}}}};
  const auto dir = checkpoint_around("gpt2", tj, static_cast<int64_t>(toks->items.size()));
  const GgufFile f = GgufFile::open(dir.string());
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "gpt-2");
  const auto tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok->token_type(50256), TokenType::control);
  const std::string raw = test::read_file(inp), sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    texts.push_back(raw.substr(pos, next == std::string::npos ? std::string::npos : next - pos));
    if (next == std::string::npos) break;
    pos = next + sep.size();
  }
  std::istringstream out(test::read_file(vocab_path.string() + ".out"));
  std::string line;
  size_t cases = 0;
  for (; std::getline(out, line) && cases < texts.size(); ++cases) {
    std::vector<TokenId> want;
    std::istringstream ids(line);
    for (TokenId id; ids >> id;)
      want.push_back(id);
    EXPECT_EQ(tok->encode(texts[cases], {.add_bos = false, .add_eos = false}), want) << texts[cases];
  }
  EXPECT_GT(cases, 20u);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// Logits of `ids`: all positions in one prefill, then again one position at a time through the KV cache.
std::vector<std::vector<float>> logits_of(const std::string& path, const std::vector<TokenId>& ids,
                                          bool decode) {
  auto m = Model::load(path);
  auto be = make_reference_backend();
  auto kv = make_contiguous_kv_cache(m->kv_shape(64, 1));
  const auto V = static_cast<size_t>(m->config().n_vocab);
  std::vector<std::vector<float>> out;
  if (!decode) {
    const auto n = static_cast<int32_t>(ids.size());
    std::vector<Pos> pos(ids.size());
    std::vector<SeqId> seq(ids.size(), 0);
    std::vector<int32_t> rows(ids.size());
    for (int32_t i = 0; i < n; ++i)
      pos[static_cast<size_t>(i)] = rows[static_cast<size_t>(i)] = i;
    EXPECT_TRUE(kv->allocate(0, n));
    std::vector<float> l(ids.size() * V);
    m->forward(*be, {ids, pos, seq, rows}, *kv, l);
    for (size_t p = 0; p < ids.size(); ++p)
      out.emplace_back(l.begin() + static_cast<ptrdiff_t>(p * V),
                       l.begin() + static_cast<ptrdiff_t>((p + 1) * V));
    return out;
  }
  for (int32_t p = 0; p < static_cast<int32_t>(ids.size()); ++p) {
    EXPECT_TRUE(kv->allocate(0, 1));
    const SeqId s = 0;
    const int32_t row = 0;
    std::vector<float> l(V);
    m->forward(
        *be,
        {std::span(&ids[static_cast<size_t>(p)], 1), std::span(&p, 1), std::span(&s, 1), std::span(&row, 1)},
        *kv, l);
    out.push_back(std::move(l));
  }
  return out;
}

TEST(GoldenHf, LogitsEqualTheGgufAtEveryPosition) {
  REQUIRE_BOTH(gguf, hf);
  const auto tok = Tokenizer::from_gguf(GgufFile::open(gguf.string()));
  for (const char* prompt : {"Once upon a time, there was a little girl named Lily.", "The little dog"}) {
    SCOPED_TRACE(prompt);
    const std::vector<TokenId> ids = tok->encode(prompt);
    ASSERT_GT(ids.size(), 4u);
    for (const bool decode : {false, true}) {
      const auto want = logits_of(gguf.string(), ids, decode), got = logits_of(hf_dir, ids, decode);
      ASSERT_EQ(got.size(), want.size());
      for (size_t p = 0; p < want.size(); ++p) {
        float worst = 0.0f;
        for (size_t v = 0; v < want[p].size(); ++v)
          worst = std::max(worst, std::abs(got[p][v] - want[p][v]) / std::max(1.0f, std::abs(want[p][v])));
        EXPECT_LE(worst, 1e-5f) << (decode ? "decode" : "prefill") << " position " << p;
      }
    }
  }
}

// `loom run -m DIR` prints what `loom run -m FILE.gguf` prints (and run.c's text); `loom inspect DIR`
// and `loom tokenize -m DIR` work.
TEST(GoldenHf, CliRunInspectTokenize) {
  REQUIRE_BOTH(gguf, hf);
  LOOM_REQUIRE_BIN();
  auto run = [](const std::string& args) { return test::run_loom(args, false, 120); };
  const std::string q = "'";
  const auto a = run("run -m " + q + gguf.string() + q + " -p 'Once upon a time' -n 64 --temp 0");
  const auto b = run("run -m " + q + hf_dir + q + " -p 'Once upon a time' -n 64 --temp 0");
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_GT(a.out.size(), 100u);
  EXPECT_EQ(b.out, a.out);
  const auto c = run("run -m " + q + hf_dir + q + " -p 'Once upon a time' -n 60 --temp 0");
  EXPECT_EQ(c.out, test::read_file(test::models_dir() / "reference" / "once_upon_a_time.n64.txt"));

  const auto i = run("inspect " + q + hf_dir + q);
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("Hugging Face safetensors"), std::string::npos) << i.out;
  EXPECT_NE(i.out.find("n_embd 64, n_layer 5, n_head 8, n_head_kv 4 (GQA), head_dim 8, n_ff 172"),
            std::string::npos)
      << i.out;
  EXPECT_NE(i.out.find("tied to the embedding"), std::string::npos) << i.out;
  const auto ij = run("inspect --json " + q + hf_dir + q);
  ASSERT_EQ(ij.code, 0) << ij.err;
  const auto j = nlohmann::json::parse(ij.out);
  EXPECT_EQ(j["format"], "safetensors");
  EXPECT_EQ(j["architecture"], "llama");
  EXPECT_EQ(j["n_vocab"], 512);
  EXPECT_EQ(j["tokenizer"]["model"], "llama");

  const auto ta = run("tokenize -m " + q + gguf.string() + q + " --text 'Hello world, Lily!' --json");
  const auto tb = run("tokenize -m " + q + hf_dir + q + " --text 'Hello world, Lily!' --json");
  ASSERT_EQ(tb.code, 0) << tb.err;
  EXPECT_EQ(tb.out, ta.out);
}

} // namespace
