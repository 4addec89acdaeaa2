// format/hf_dir.cpp — a Hugging Face checkpoint directory read as a GgufFile (GgufFile::from_hf_dir,
// loom/format/hf_checkpoint.hpp).
//
// config.json → general.* and {arch}.* keys (format/hf_config.cpp); tokenizer.json (+
// tokenizer_config.json, chat_template.jinja) → tokenizer.ggml.* and tokenizer.chat_template
// (format/hf_tokenizer.cpp); safetensors tensors → GGUF tensor names and ne order (shapes reversed),
// their bytes left in the mapped files. What GGUF stores differently is computed into buffers of the
// checkpoint's own: the q/k rows of the Llama family (rotate-half order → interleaved pairs, as
// llama.cpp's convert_hf_to_gguf.py permutes them), Llama 3.1's rope_freqs from config.json's
// rope_scaling, and any tensor whose bytes are not aligned for its type.
#include "format/hf_config.hpp"
#include "format/hf_files.hpp"
#include "format/hf_json.hpp"
#include "format/hf_metadata.hpp"
#include "format/hf_tokenizer.hpp"
#include "loom/format/gguf.hpp"
#include "loom/format/hf_checkpoint.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>

namespace loom {

namespace {

using namespace hf;

constexpr uint64_t k_max_index = 64ull << 20; // model.safetensors.index.json

// Buffers of the checkpoint's own (permuted q/k rows, rope_freqs, realigned tensors), 64-byte aligned.
struct Buffer {
  uint8_t* p = nullptr;
  explicit Buffer(size_t n) {
    p = static_cast<uint8_t*>(std::aligned_alloc(64, (std::max<size_t>(n, 1) + 63) / 64 * 64));
    if (!p) fail(Errc::out_of_memory, "hf", "cannot allocate " + mib(n) + " for a converted tensor");
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(p); }
};

// What a GgufFile from a checkpoint keeps alive: the mapped shards and the converted copies.
struct Storage {
  std::vector<std::unique_ptr<MappedFile>> files;
  std::vector<std::unique_ptr<Buffer>> buffers;
  uint8_t* buffer(size_t n) {
    buffers.push_back(std::make_unique<Buffer>(n));
    return buffers.back()->p;
  }
};

// A safetensors tensor, the shard it is in (as messages show it) and whether a GGUF tensor took it.
struct Source {
  SafetensorsTensor t;
  std::string file;
  bool used = false;
};

// config.json of directory `dir`, parsed.
json read_config_json(const std::string& dir, const std::string& shown) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    bad(shown, "expected a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json)",
        Errc::not_found);
  const auto cfg_text = read_small(join(dir, "config.json"), k_max_config, "config.json");
  if (!cfg_text)
    fail(Errc::invalid_argument, "gguf",
         "'" + shown +
             "' is a directory without config.json: expected a regular GGUF model file, or a Hugging Face "
             "checkpoint directory (config.json, model.safetensors, tokenizer.json); give the path of one");
  return parse_json(*cfg_text, gguf_printable(join(dir, "config.json"), 400));
}

// The shard file names of model.safetensors.index.json, checked: plain names inside the directory.
// Returns the tensors the index places in each shard; `shards` gets the names in order of appearance.
std::map<std::string, std::vector<std::string>> read_index(const std::string& dir, const std::string& text,
                                                           std::vector<std::string>& shards) {
  const std::string shown = gguf_printable(join(dir, "model.safetensors.index.json"), 400);
  const json j = parse_json(text, shown);
  const json* wm = j.is_object() ? member(j, "weight_map") : nullptr;
  if (!wm || !wm->is_object() || wm->empty())
    bad(shown, "'weight_map' should be a non-empty object of tensor name → shard file name");
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [tensor, file] : wm->items()) {
    if (!file.is_string())
      bad(shown,
          "the shard of '" + gguf_printable(tensor) + "' should be a file name, found " + describe(file));
    const auto& f = file.get_ref<const std::string&>();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos ||
        f.find('\\') != std::string::npos || f.find('\0') != std::string::npos)
      bad(shown, "shard '" + gguf_printable(f) + "' of tensor '" + gguf_printable(tensor) +
                     "' is not a plain file name: expected a file inside the checkpoint directory (no '/', "
                     "'\\' or '..')");
    auto& v = by_shard[f];
    if (v.empty()) shards.push_back(f);
    v.push_back(tensor);
  }
  return by_shard;
}

// The weights' files: the shards of the index, or model.safetensors. `listed`: the index's tensors
// by shard (empty without an index).
std::vector<std::string> find_shards(const std::string& dir, const std::string& shown,
                                     std::map<std::string, std::vector<std::string>>& listed) {
  std::vector<std::string> shards;
  if (const auto idx = read_small(join(dir, "model.safetensors.index.json"), k_max_index,
                                  "model.safetensors.index.json")) {
    listed = read_index(dir, *idx, shards);
  } else if (stat_regular(join(dir, "model.safetensors"), "model.safetensors")) {
    shards.push_back("model.safetensors");
  } else {
    bad(shown,
        "no model.safetensors and no model.safetensors.index.json: expected the weights as safetensors "
        "(PyTorch .bin checkpoints are not supported — convert them to safetensors or GGUF)",
        Errc::not_found);
  }
  return shards;
}

// Maps every shard into `storage` and reads its header: each tensor in one shard, and each shard
// holding what the index places there.
std::map<std::string, Source> read_shards(const std::string& dir, const std::vector<std::string>& shards,
                                          const std::map<std::string, std::vector<std::string>>& listed,
                                          Storage& storage) {
  std::map<std::string, Source> src;
  for (const auto& s : shards) {
    const std::string path = join(dir, s);
    const std::string sshown = gguf_printable(path, 400);
    if (!stat_regular(path, "a safetensors shard"))
      bad(sshown, "is missing: model.safetensors.index.json lists it; download every shard of the checkpoint",
          Errc::not_found);
    storage.files.push_back(map_file(path, "a safetensors shard"));
    SafetensorsHeader hdr = parse_safetensors(storage.files.back()->bytes(), path);
    std::set<std::string> here;
    for (auto& t : hdr.tensors) {
      here.insert(t.name);
      if (auto it = src.find(t.name); it != src.end())
        bad(sshown, "tensor '" + gguf_printable(t.name) + "' is also in " + it->second.file +
                        ": expected each tensor in one shard");
      std::string name = t.name;
      src.emplace(std::move(name), Source{std::move(t), sshown});
    }
    if (auto it = listed.find(s); it != listed.end())
      for (const auto& t : it->second)
        if (!here.count(t))
          bad(sshown, "has no tensor '" + gguf_printable(t) +
                          "', which model.safetensors.index.json places there: the shard is incomplete or "
                          "from another checkpoint");
  }
  return src;
}

// Out row h·D + 2i + j = in row h·D + j·D/2 + i (llama.cpp's permute: HF's rotate-half halves → pairs).
void permute_rows(const uint8_t* src, uint8_t* dst, int64_t n_rows, size_t row_bytes, int64_t n_head) {
  const int64_t hd = n_rows / n_head, half = hd / 2;
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(dst + static_cast<size_t>(h * hd + 2 * i + j) * row_bytes,
                    src + static_cast<size_t>(h * hd + j * half + i) * row_bytes, row_bytes);
}

// The GGUF tensors made from the safetensors ones, in GGUF order, each checked for presence, shape
// (against config.json) and dtype.
class TensorMap {
public:
  TensorMap(const HfConfig& h, std::map<std::string, Source>& src, Storage& storage, size_t n_shards,
            const std::string& shown)
      : h_(h), src_(src), storage_(storage), n_shards_(n_shards), shown_(shown) {}

  std::vector<GgufTensor> build() {
    const int64_t E = h_.n_embd, V = h_.n_vocab;
    emit("model.embed_tokens.weight", "token_embd.weight", {V, E}, true);
    for (int64_t l = 0; l < h_.n_layer; ++l)
      emit_layer(l);
    emit("model.norm.weight", "output_norm.weight", {E}, true);
    if (!h_.tied && !src_.count("lm_head.weight"))
      bad(shown_,
          "tensor 'lm_head.weight' is missing and config.json does not set tie_word_embeddings: "
          "the checkpoint is incomplete",
          Errc::not_found);
    emit("lm_head.weight", "output.weight", {V, E}, false);
    if (h_.rope_freqs) add_rope_freqs(*h_.rope_freqs);
    refuse_unused();
    return std::move(out_);
  }

private:
  enum class Conv { none, permute_q, permute_k };

  void emit_layer(int64_t l) {
    const int64_t E = h_.n_embd, D = h_.head_dim, Hq = h_.n_head, Hkv = h_.n_head_kv, F = h_.n_ff;
    const bool permute = h_.arch->permute_qk;
    const std::string p = "model.layers." + std::to_string(l) + ".", g = "blk." + std::to_string(l) + ".";
    emit(p + "input_layernorm.weight", g + "attn_norm.weight", {E}, true);
    emit(p + "self_attn.q_proj.weight", g + "attn_q.weight", {Hq * D, E}, true,
         permute ? Conv::permute_q : Conv::none);
    emit(p + "self_attn.k_proj.weight", g + "attn_k.weight", {Hkv * D, E}, true,
         permute ? Conv::permute_k : Conv::none);
    emit(p + "self_attn.v_proj.weight", g + "attn_v.weight", {Hkv * D, E}, true);
    if (h_.arch->qkv_bias) {
      emit(p + "self_attn.q_proj.bias", g + "attn_q.bias", {Hq * D}, true);
      emit(p + "self_attn.k_proj.bias", g + "attn_k.bias", {Hkv * D}, true);
      emit(p + "self_attn.v_proj.bias", g + "attn_v.bias", {Hkv * D}, true);
    }
    if (h_.arch->qk_norm) {
      emit(p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", {D}, true);
      emit(p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", {D}, true);
    }
    emit(p + "self_attn.o_proj.weight", g + "attn_output.weight", {E, Hq * D}, true);
    emit(p + "post_attention_layernorm.weight", g + "ffn_norm.weight", {E}, true);
    emit(p + "mlp.gate_proj.weight", g + "ffn_gate.weight", {F, E}, true);
    emit(p + "mlp.up_proj.weight", g + "ffn_up.weight", {F, E}, true);
    emit(p + "mlp.down_proj.weight", g + "ffn_down.weight", {E, F}, true);
    if (auto it = src_.find(p + "self_attn.rotary_emb.inv_freq"); it != src_.end())
      it->second.used = true; // a buffer older transformers saved: recomputed from rope_theta
  }

  // Safetensors tensor `hf` as GGUF tensor `gguf` of row-major `shape`.
  void emit(const std::string& hf, const std::string& gguf, std::vector<int64_t> shape, bool required,
            Conv conv = Conv::none) {
    auto it = src_.find(hf);
    if (it == src_.end()) {
      if (required)
        bad(shown_,
            "tensor '" + hf + "' (shape " + shape_str(shape) +
                ") is missing: the checkpoint is incomplete — " +
                (n_shards_ > 1 ? "are all shards downloaded?" : "re-download model.safetensors"),
            Errc::not_found);
      return;
    }
    Source& s = it->second;
    s.used = true;
    check(s, hf, shape);
    GgufTensor t;
    t.name = gguf;
    t.type = *s.t.type;
    t.ne.assign(shape.rbegin(), shape.rend());
    t.n_elements = s.t.n_elements;
    t.n_bytes = s.t.end - s.t.begin;
    t.offset = s.t.begin; // within its shard's data section
    t.data = s.t.data;
    const size_t el = dtype_traits(t.type).block_bytes;
    if (conv != Conv::none) {
      uint8_t* dst = storage_.buffer(t.n_bytes);
      permute_rows(s.t.data, dst, shape[0], static_cast<size_t>(shape[1]) * el,
                   conv == Conv::permute_q ? h_.n_head : h_.n_head_kv);
      t.data = dst;
    } else if (reinterpret_cast<uintptr_t>(t.data) % el != 0) { // unaligned for its type: a copy
      uint8_t* dst = storage_.buffer(t.n_bytes);
      std::memcpy(dst, s.t.data, t.n_bytes);
      t.data = dst;
    }
    out_.push_back(std::move(t));
  }

  // The shape config.json implies and a dtype Loom computes with.
  void check(const Source& s, const std::string& hf, const std::vector<int64_t>& shape) const {
    if (s.t.shape != shape)
      bad(s.file, "tensor '" + hf + "' has shape " + shape_str(s.t.shape) + ", expected " + shape_str(shape) +
                      " from config.json (" + dims() + "): the checkpoint is inconsistent");
    if (!s.t.type)
      bad(s.file,
          "tensor '" + hf + "' is stored as " + s.t.dtype +
              ": Loom reads F32, F16 and BF16 weights (quantize a GGUF conversion instead)",
          Errc::unsupported);
  }

  std::string dims() const {
    return "hidden_size " + std::to_string(h_.n_embd) + ", num_attention_heads " + std::to_string(h_.n_head) +
           ", num_key_value_heads " + std::to_string(h_.n_head_kv) + ", head_dim " +
           std::to_string(h_.head_dim) + ", intermediate_size " + std::to_string(h_.n_ff) + ", vocab_size " +
           std::to_string(h_.n_vocab);
  }

  void add_rope_freqs(const std::vector<float>& freqs) {
    GgufTensor t;
    t.name = "rope_freqs.weight";
    t.type = DType::f32;
    t.ne = {static_cast<int64_t>(freqs.size())};
    t.n_elements = t.ne[0];
    t.n_bytes = freqs.size() * sizeof(float);
    uint8_t* dst = storage_.buffer(t.n_bytes);
    std::memcpy(dst, freqs.data(), t.n_bytes);
    t.data = dst;
    out_.push_back(std::move(t));
  }

  void refuse_unused() const {
    for (const auto& [name, s] : src_)
      if (!s.used)
        bad(s.file,
            "tensor '" + gguf_printable(name) + "' is not part of " + std::string(h_.arch->hf) +
                " as Loom runs it (a layer beyond num_hidden_layers, or a weight of another architecture); "
                "expected only the model's weights",
            Errc::unsupported);
  }

  const HfConfig& h_;
  std::map<std::string, Source>& src_;
  Storage& storage_;
  size_t n_shards_;
  const std::string& shown_;
  std::vector<GgufTensor> out_;
};

// Host memory the metadata and tensor infos take, as GgufLimits::max_metadata_bytes counts it.
uint64_t metadata_size(const std::vector<GgufKV>& kv, size_t n_tensors) {
  uint64_t md = 0;
  for (const auto& e : kv)
    md += sizeof(GgufKV) + e.key.size() + e.value.str.size() + e.value.items.heap_bytes();
  return md + n_tensors * (sizeof(GgufTensor) + 64);
}

} // namespace

GgufFile GgufFile::from_hf_dir(const std::string& dir, const GgufLimits& limits) {
  const std::string shown = gguf_printable(dir, 400);
  // The JSON reads check types before they convert; this is the net under them.
  try {
    const json cfg = read_config_json(dir, shown);
    Meta meta;
    const HfConfig h = read_config(cfg, dir, meta);

    auto storage = std::make_shared<Storage>();
    std::map<std::string, std::vector<std::string>> listed;
    const std::vector<std::string> shards = find_shards(dir, shown, listed);
    std::map<std::string, Source> src = read_shards(dir, shards, listed, *storage);
    uint64_t total_bytes = 0;
    for (const auto& m : storage->files)
      total_bytes += m->size;

    GgufFile f;
    f.path_ = dir;
    f.version_ = 0;
    f.tensors_ = TensorMap(h, src, *storage, shards.size(), shown).build();
    // The tokenizer last: its ids are bounded by vocab_size, which the embedding's bytes have confirmed.
    read_tokenizer(dir, h, cfg, meta);
    f.kv_ = std::move(meta.kv);
    f.metadata_bytes_ = metadata_size(f.kv_, f.tensors_.size());
    if (f.metadata_bytes_ > limits.max_metadata_bytes)
      bad(shown, "the metadata needs " + mib(f.metadata_bytes_) + " of memory, over the limit of " +
                     mib(limits.max_metadata_bytes));
    f.hf_bytes_ = total_bytes;
    f.hf_storage_ = std::move(storage);
    return f;
  } catch (const json::exception& e) {
    bad(shown, "unexpected JSON content (" + gguf_printable(e.what(), 160) +
                   "): expected the files of a Hugging Face checkpoint; re-download it");
  }
}

} // namespace loom
