// hf_checkpoint.cpp — Hugging Face checkpoint directories read as a GgufFile (loom/hf_checkpoint.hpp).
//
// config.json → general.* and {arch}.* keys; tokenizer.json (+ tokenizer_config.json,
// chat_template.jinja) → tokenizer.ggml.* and tokenizer.chat_template; safetensors tensors → GGUF
// tensor names and ne order (shapes reversed), their bytes left in the mapped files. What GGUF stores
// differently is computed into buffers of the checkpoint's own: the q/k rows of the Llama family
// (rotate-half order → interleaved pairs, as llama.cpp's convert_hf_to_gguf.py permutes them), Llama 3.1's
// rope_freqs from config.json's rope_scaling, and any tensor whose bytes are not aligned for its type.
#include "loom/hf_checkpoint.hpp"

#include "file_type.hpp"
#include "loom/error.hpp"
#include "loom/gguf.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unordered_map>

namespace loom {

namespace {

using json = nlohmann::json;

constexpr int k_max_json_depth = 32;               // real files nest 6 deep at most
constexpr uint64_t k_max_config = 16ull << 20;     // config.json, tokenizer_config.json, chat_template.jinja
constexpr uint64_t k_max_index = 64ull << 20;      // model.safetensors.index.json
constexpr uint64_t k_max_tokenizer = 512ull << 20; // tokenizer.json (large vocabularies: tens of MiB)
constexpr int64_t k_max_vocab = 1 << 22;           // token ids (ModelConfig's bound on n_vocab)
constexpr uint32_t k_max_dims = 4;

[[noreturn]] void bad(const std::string& where, const std::string& msg, Errc code = Errc::parse_error) {
  fail(code, "hf", where + ": " + msg);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t k = 0; k < s.size(); ++k)
    r += (k ? ", " : "") + std::to_string(s[k]);
  return r + "]";
}

// ---- safetensors dtypes ------------------------------------------------------------------------

struct StDtype {
  std::string_view name;
  size_t size;
  std::optional<DType> type; // what Loom computes with
};
constexpr StDtype k_st_dtypes[] = {
    {"F32", 4, DType::f32},      {"F16", 2, DType::f16},       {"BF16", 2, DType::bf16},
    {"F64", 8, std::nullopt},    {"I64", 8, std::nullopt},     {"I32", 4, std::nullopt},
    {"I16", 2, std::nullopt},    {"I8", 1, std::nullopt},      {"U64", 8, std::nullopt},
    {"U32", 4, std::nullopt},    {"U16", 2, std::nullopt},     {"U8", 1, std::nullopt},
    {"BOOL", 1, std::nullopt},   {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
    {"F8_E8M0", 1, std::nullopt}};

const StDtype* find_dtype(std::string_view name) {
  for (const auto& d : k_st_dtypes)
    if (d.name == name) return &d;
  return nullptr;
}

// ---- files ---------------------------------------------------------------------------------------

std::string join(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

// stat() of `path`: nullopt when it does not exist; a loom::Error for other failures and for anything
// that is not a regular file (a FIFO would block the read, a directory cannot be read).
std::optional<struct stat> stat_regular(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT) return std::nullopt;
    bad(gguf_printable(path, 400), std::string("cannot read ") + what + ": " + std::strerror(e),
        Errc::invalid_argument);
  }
  if (!S_ISREG(st.st_mode))
    bad(gguf_printable(path, 400),
        std::string("is ") + file_type_name(st.st_mode) + ": expected " + what + " as a regular file",
        Errc::invalid_argument);
  return st;
}

int open_regular(const std::string& path, const std::string& what) {
  // O_NONBLOCK: should the path be swapped for a FIFO after the stat, open still returns at once.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    bad(gguf_printable(path, 400),
        "cannot open " + what + (fd < 0 ? std::string(": ") + std::strerror(e) : ""), Errc::invalid_argument);
  }
  return fd;
}

// The whole (small) file, or nullopt when it does not exist.
std::optional<std::string> read_small(const std::string& path, uint64_t max, const std::string& what) {
  const auto st = stat_regular(path, what);
  if (!st) return std::nullopt;
  const std::string shown = gguf_printable(path, 400);
  if (static_cast<uint64_t>(st->st_size) > max)
    bad(shown, what + " is " + mib(static_cast<uint64_t>(st->st_size)) + ", over the limit of " + mib(max) +
                   ": expected a JSON file of a Hugging Face checkpoint — the file is corrupt or not what "
                   "its name says");
  const int fd = open_regular(path, what);
  std::string s;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      bad(shown, "cannot read " + what + ": " + std::strerror(e), Errc::invalid_argument);
    }
    if (n == 0) break;
    s.append(buf, static_cast<size_t>(n));
    if (s.size() > max) {
      ::close(fd);
      bad(shown, what + " grew past " + mib(max) + " while being read", Errc::invalid_argument);
    }
  }
  ::close(fd);
  return s;
}

struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr) munmap(addr, size);
  }
  std::span<const uint8_t> bytes() const { return {static_cast<const uint8_t*>(addr), size}; }
};

std::unique_ptr<Mapping> map_file(const std::string& path, const std::string& what) {
  const int fd = open_regular(path, what);
  struct stat st {};
  (void)fstat(fd, &st);
  auto m = std::make_unique<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size > 0) {
    m->addr = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->addr == MAP_FAILED) {
      m->addr = nullptr;
      const int e = errno;
      ::close(fd);
      bad(gguf_printable(path, 400), std::string("cannot map ") + what + ": " + std::strerror(e),
          Errc::out_of_memory);
    }
  }
  ::close(fd);
  return m;
}

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
  std::vector<std::unique_ptr<Mapping>> files;
  std::vector<std::unique_ptr<Buffer>> buffers;
  uint8_t* buffer(size_t n) {
    buffers.push_back(std::make_unique<Buffer>(n));
    return buffers.back()->p;
  }
};

// ---- JSON ----------------------------------------------------------------------------------------

struct JsonTooDeep {};

// Parses `text`; nesting deeper than k_max_json_depth and, with `unique_top_keys`, a key that appears
// twice in the top-level object are errors (a safetensors header naming a tensor twice).
json parse_json(std::string_view text, const std::string& shown, bool unique_top_keys = false) {
  std::set<std::string> seen;
  std::string dup;
  const json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (depth > k_max_json_depth) throw JsonTooDeep{};
    if (unique_top_keys && ev == json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !seen.insert(parsed.get_ref<const std::string&>()).second && dup.empty())
      dup = parsed.get<std::string>();
    return true;
  };
  json j;
  try {
    j = json::parse(text.begin(), text.end(), cb, true);
  } catch (const JsonTooDeep&) {
    bad(shown, "JSON nested deeper than " + std::to_string(k_max_json_depth) +
                   " levels: the file is corrupt or not what its name says");
  } catch (const json::parse_error& e) {
    bad(shown, "invalid JSON at byte " + std::to_string(e.byte) + " (" + gguf_printable(e.what(), 160) +
                   "); the file is truncated or corrupt — re-download it");
  } catch (const json::exception& e) {
    bad(shown, "invalid JSON (" + gguf_printable(e.what(), 160) + "); re-download the file");
  }
  if (!dup.empty())
    bad(shown,
        "key '" + gguf_printable(dup) + "' appears twice: expected each tensor once; the file is corrupt");
  return j;
}

std::string describe(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return gguf_printable(s, 60);
}

const json* member(const json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<int64_t> as_int(const json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

// obj[key] as a string or bool: `def` when obj is not an object or the key is missing or null;
// another type is an error naming the file.
std::string str_or(const json& obj, const char* key, const char* def, const std::string& shown) {
  const json* v = member(obj, key);
  if (!v) return def;
  if (!v->is_string()) bad(shown, std::string("'") + key + "' should be a string, found " + describe(*v));
  return v->get<std::string>();
}
bool bool_or(const json& obj, const char* key, bool def, const std::string& shown) {
  const json* v = member(obj, key);
  if (!v) return def;
  if (!v->is_boolean())
    bad(shown, std::string("'") + key + "' should be true or false, found " + describe(*v));
  return v->get<bool>();
}

// Typed reads of a JSON object's keys (null counts as missing) with messages naming the file and key.
class Keys {
public:
  Keys(const json& obj, std::string shown) : j_(obj), shown_(std::move(shown)) {}

  std::optional<int64_t> int_opt(std::string_view key, int64_t min, int64_t max) const {
    const json* v = member(j_, key);
    if (!v) return std::nullopt;
    const auto i = as_int(*v);
    if (!i || *i < min || *i > max)
      bad(shown_, "'" + std::string(key) + "' should be an integer in " + std::to_string(min) + ".." +
                      std::to_string(max) + ", found " + describe(*v) +
                      "; the checkpoint's config is corrupt");
    return i;
  }
  int64_t int_req(std::string_view key, int64_t min, int64_t max) const {
    const auto i = int_opt(key, min, max);
    if (!i) missing(key);
    return *i;
  }
  std::optional<double> num_opt(std::string_view key) const {
    const json* v = member(j_, key);
    if (!v) return std::nullopt;
    if (!v->is_number()) bad(shown_, "'" + std::string(key) + "' should be a number, found " + describe(*v));
    const double d = v->get<double>();
    if (!std::isfinite(d) || std::abs(d) > static_cast<double>(std::numeric_limits<float>::max()))
      bad(shown_, "'" + std::string(key) + "' should be a finite number, found " + describe(*v));
    return d;
  }
  std::optional<bool> bool_opt(std::string_view key) const {
    const json* v = member(j_, key);
    if (!v) return std::nullopt;
    if (!v->is_boolean())
      bad(shown_, "'" + std::string(key) + "' should be true or false, found " + describe(*v));
    return v->get<bool>();
  }
  std::optional<std::string> str_opt(std::string_view key) const {
    const json* v = member(j_, key);
    if (!v) return std::nullopt;
    if (!v->is_string()) bad(shown_, "'" + std::string(key) + "' should be a string, found " + describe(*v));
    return v->get<std::string>();
  }
  [[noreturn]] void missing(std::string_view key) const {
    bad(shown_, "'" + std::string(key) + "' is missing: expected it in a Llama-family config.json",
        Errc::not_found);
  }
  const std::string& shown() const noexcept { return shown_; }

private:
  const json& j_;
  std::string shown_;
};

// ---- metadata values -----------------------------------------------------------------------------

GgufValue v_str(std::string s) {
  GgufValue v;
  v.type = GgufType::string;
  v.str = std::move(s);
  return v;
}
GgufValue v_u32(int64_t x) {
  GgufValue v;
  v.type = GgufType::u32;
  v.u = static_cast<uint64_t>(x);
  return v;
}
GgufValue v_i32(int64_t x) {
  GgufValue v;
  v.type = GgufType::i32;
  v.i = x;
  return v;
}
GgufValue v_f32(double x) {
  GgufValue v;
  v.type = GgufType::f32;
  v.f = static_cast<double>(static_cast<float>(x));
  return v;
}
GgufValue v_bool(bool b) {
  GgufValue v;
  v.type = GgufType::boolean;
  v.u = b ? 1 : 0;
  return v;
}
template <class T, class Make> GgufValue v_array(GgufType elem, const std::vector<T>& xs, Make make) {
  GgufValue v;
  v.type = GgufType::array;
  v.elem_type = elem;
  for (const auto& x : xs)
    v.items.push_back(make(x));
  return v;
}

struct Meta {
  std::vector<GgufKV> kv;
  void add(std::string key, GgufValue v) { kv.push_back({std::move(key), std::move(v)}); }
};

// ---- architectures -------------------------------------------------------------------------------

struct HfArch {
  std::string_view hf;   // config.json architectures[0]
  std::string_view gguf; // general.architecture
  bool permute_qk;       // q/k rows from rotate-half to interleaved pairs (GGUF llama's RoPE layout)
  bool qkv_bias;         // q/k/v projections have biases
  bool qk_norm;          // per-head RMS norms of q and k
};
constexpr HfArch k_archs[] = {
    {"LlamaForCausalLM", "llama", true, false, false},
    {"MistralForCausalLM", "llama", true, false, false},
    {"Qwen2ForCausalLM", "qwen2", false, true, false},
    {"Qwen3ForCausalLM", "qwen3", false, false, true},
};

std::string supported_archs() {
  std::string s;
  for (const auto& a : k_archs)
    s += (s.empty() ? "" : ", ") + std::string(a.hf);
  return s;
}

struct Hyper {
  const HfArch* arch = nullptr;
  int64_t n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, n_vocab = 0, n_ctx = 0;
  bool head_dim_explicit = false;
  bool tied = false;
  std::string name;
  // Llama 3.1 rope_scaling ("rope_type": "llama3"): divisors of the RoPE frequencies.
  std::optional<std::vector<float>> rope_freqs;
};

Hyper read_config(const json& cfg, const std::string& dir, Meta& meta) {
  const std::string shown = gguf_printable(join(dir, "config.json"), 400);
  if (!cfg.is_object()) bad(shown, "expected a JSON object, found " + describe(cfg));
  const Keys k(cfg, shown);
  Hyper h;

  std::string arch_name;
  if (const json* a = member(cfg, "architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
      bad(shown, "'architectures' should be a list of class names, found " + describe(*a));
    arch_name = (*a)[0].get<std::string>();
  } else {
    bad(shown, "'architectures' is missing: expected the model class (" + supported_archs() + ")",
        Errc::not_found);
  }
  for (const auto& a : k_archs)
    if (a.hf == arch_name) h.arch = &a;
  if (!h.arch)
    bad(shown,
        "architecture '" + gguf_printable(arch_name) +
            "' is not supported from a Hugging Face checkpoint (supported: " + supported_archs() +
            "); convert it with llama.cpp's convert_hf_to_gguf.py and load the .gguf",
        Errc::unsupported);
  const std::string an(h.arch->hf);
  if (const json* q = member(cfg, "quantization_config"))
    bad(shown,
        "quantized checkpoints are not supported (quantization_config: " + describe(*q) +
            "); use an F32, F16 or BF16 checkpoint, or a GGUF file",
        Errc::unsupported);
  if (auto act = k.str_opt("hidden_act"); act && *act != "silu")
    bad(shown, "hidden_act '" + gguf_printable(*act) + "' is not supported for " + an + " (expected silu)",
        Errc::unsupported);
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (k.bool_opt(key).value_or(false) && !(h.arch->qkv_bias && std::string_view(key) == "attention_bias"))
      bad(shown,
          std::string("'") + key + "': true is not supported for " + an +
              " (Loom's graph has no such biases)",
          Errc::unsupported);
  if (h.arch->gguf == "qwen2" && k.bool_opt("use_sliding_window").value_or(false))
    bad(shown, "use_sliding_window: true (sliding-window layers of Qwen2) is not supported",
        Errc::unsupported);

  h.n_embd = k.int_req("hidden_size", 1, 1 << 20);
  h.n_layer = k.int_req("num_hidden_layers", 1, 4096);
  h.n_head = k.int_req("num_attention_heads", 1, 4096);
  h.n_head_kv = k.int_opt("num_key_value_heads", 1, 4096).value_or(h.n_head);
  h.n_ff = k.int_req("intermediate_size", 1, 1 << 22);
  h.n_vocab = k.int_req("vocab_size", 1, k_max_vocab);
  h.n_ctx = k.int_req("max_position_embeddings", 1, 1 << 24);
  if (auto hd = k.int_opt("head_dim", 1, 65536)) {
    h.head_dim = *hd;
    h.head_dim_explicit = true;
  } else {
    if (h.n_embd % h.n_head != 0)
      bad(shown, "hidden_size (" + std::to_string(h.n_embd) + ") is not a multiple of num_attention_heads (" +
                     std::to_string(h.n_head) + ") and there is no head_dim");
    h.head_dim = h.n_embd / h.n_head;
  }
  if (h.head_dim % 2 != 0)
    bad(shown, "the head dimension must be even for RoPE, found " + std::to_string(h.head_dim));
  if (h.n_head % h.n_head_kv != 0)
    bad(shown, "num_attention_heads (" + std::to_string(h.n_head) +
                   ") must be a multiple of num_key_value_heads (" + std::to_string(h.n_head_kv) + ")");
  h.tied = k.bool_opt("tie_word_embeddings").value_or(false);
  const double eps = k.num_opt("rms_norm_eps").value_or(1e-6);
  const double theta = k.num_opt("rope_theta").value_or(10000.0);
  h.name = k.str_opt("_name_or_path").value_or("");
  if (h.name.empty()) {
    std::string d = dir;
    while (d.size() > 1 && d.back() == '/')
      d.pop_back();
    h.name = d.substr(d.rfind('/') == std::string::npos ? 0 : d.rfind('/') + 1);
  }

  const std::string a = std::string(h.arch->gguf) + ".";
  meta.add("general.architecture", v_str(std::string(h.arch->gguf)));
  meta.add("general.name", v_str(h.name));
  meta.add(a + "context_length", v_u32(h.n_ctx));
  meta.add(a + "embedding_length", v_u32(h.n_embd));
  meta.add(a + "block_count", v_u32(h.n_layer));
  meta.add(a + "feed_forward_length", v_u32(h.n_ff));
  meta.add(a + "attention.head_count", v_u32(h.n_head));
  meta.add(a + "attention.head_count_kv", v_u32(h.n_head_kv));
  meta.add(a + "rope.freq_base", v_f32(theta));
  meta.add(a + "attention.layer_norm_rms_epsilon", v_f32(eps));
  meta.add(a + "rope.dimension_count", v_u32(h.head_dim));
  if (h.head_dim_explicit) {
    meta.add(a + "attention.key_length", v_u32(h.head_dim));
    meta.add(a + "attention.value_length", v_u32(h.head_dim));
  }
  meta.add(a + "vocab_size", v_u32(h.n_vocab));

  if (const json* rs = member(cfg, "rope_scaling")) {
    const std::string rshown = shown + " rope_scaling";
    if (!rs->is_object()) bad(shown, "'rope_scaling' should be an object or null, found " + describe(*rs));
    const Keys r(*rs, rshown);
    const std::string type = r.str_opt("rope_type").value_or(r.str_opt("type").value_or("default"));
    if (type == "default") {
    } else if (type == "linear") {
      meta.add(a + "rope.scaling.type", v_str("linear"));
      meta.add(a + "rope.scaling.factor", v_f32(r.num_opt("factor").value_or(1.0)));
    } else if (type == "yarn") {
      if (r.num_opt("beta_fast").value_or(32.0) != 32.0 || r.num_opt("beta_slow").value_or(1.0) != 1.0 ||
          r.num_opt("attention_factor"))
        bad(rshown, "YaRN with beta_fast/beta_slow other than 32/1 or an attention_factor is not supported",
            Errc::unsupported);
      meta.add(a + "rope.scaling.type", v_str("yarn"));
      meta.add(a + "rope.scaling.factor", v_f32(r.num_opt("factor").value_or(1.0)));
      meta.add(a + "rope.scaling.original_context_length",
               v_u32(r.int_opt("original_max_position_embeddings", 1, 1 << 24).value_or(h.n_ctx)));
    } else if (type == "llama3" && h.arch->gguf == "llama") {
      // The frequency divisors llama.cpp's converter writes as rope_freqs.weight.
      const double factor = r.num_opt("factor").value_or(8.0);
      const double lo = r.num_opt("low_freq_factor").value_or(1.0);
      const double hi = r.num_opt("high_freq_factor").value_or(4.0);
      const double old_ctx =
          static_cast<double>(r.int_opt("original_max_position_embeddings", 1, 1 << 24).value_or(8192));
      if (!(factor >= 1.0) || !(lo > 0.0) || !(hi > lo))
        bad(rshown, "expected factor ≥ 1 and 0 < low_freq_factor < high_freq_factor, found " + describe(*rs));
      std::vector<float> f;
      for (int64_t i = 0; i < h.head_dim; i += 2) {
        const double freq = 1.0 / std::pow(theta, static_cast<double>(i) / static_cast<double>(h.head_dim));
        const double wavelen = 2.0 * std::numbers::pi / freq;
        if (wavelen < old_ctx / hi) {
          f.push_back(1.0f);
        } else if (wavelen > old_ctx / lo) {
          f.push_back(static_cast<float>(factor));
        } else {
          const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
          f.push_back(static_cast<float>(1.0 / ((1.0 - smooth) / factor + smooth)));
        }
      }
      h.rope_freqs = std::move(f);
    } else {
      bad(rshown,
          "rope type '" + gguf_printable(type) + "' is not supported for " + an +
              " (supported: default, linear, yarn" + (h.arch->gguf == "llama" ? ", llama3" : "") + ")",
          Errc::unsupported);
    }
  }
  // Mistral's sliding window (v0.1: 4096; null in later versions).
  if (h.arch->hf == "MistralForCausalLM")
    if (auto sw = k.int_opt("sliding_window", 0, 1 << 24); sw && *sw > 0 && *sw < h.n_ctx)
      meta.add(a + "attention.sliding_window", v_u32(*sw));
  return h;
}

// ---- tokenizer -------------------------------------------------------------------------------------

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

void read_tokenizer(const std::string& dir, const Hyper& h, const json& cfg, Meta& meta) {
  const std::string path = join(dir, "tokenizer.json");
  const std::string shown = gguf_printable(path, 400);
  const auto text = read_small(path, k_max_tokenizer, "tokenizer.json");
  if (!text)
    bad(gguf_printable(dir, 400),
        "tokenizer.json is missing: expected the Hugging Face fast tokenizer next to config.json "
        "(checkpoints with only tokenizer.model are not supported — convert them to GGUF)",
        Errc::not_found);
  const json tj = parse_json(*text, shown);
  if (!tj.is_object()) bad(shown, "expected a JSON object, found " + describe(tj));
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

  // Token texts by id: the vocabulary, then the added tokens (which win, as in transformers).
  std::vector<std::string> pieces;
  std::vector<int32_t> types;
  std::vector<bool> present;
  auto put = [&](int64_t id, const std::string& piece, int32_t type, bool replace) {
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
  };
  auto id_of = [&](const json& v, const std::string& what) {
    const auto id = as_int(v);
    if (!id || *id < 0)
      bad(shown, what + " should be a token id (a non-negative integer), found " + describe(v));
    if (*id >= h.n_vocab)
      bad(shown, what + " is " + std::to_string(*id) + ", not below config.json's vocab_size " +
                     std::to_string(h.n_vocab) +
                     ": the embedding has no row for it — the checkpoint is inconsistent");
    return *id;
  };
  for (const auto& [piece, idv] : vocab->items())
    put(id_of(idv, "the id of '" + gguf_printable(piece, 40) + "'"), piece, k_normal, false);
  if (const json* added = member(tj, "added_tokens")) {
    if (!added->is_array()) bad(shown, "'added_tokens' should be a list, found " + describe(*added));
    for (const auto& t : *added) {
      const json* c = member(t, "content");
      const json* idv = member(t, "id");
      if (!c || !c->is_string() || !idv)
        bad(shown, "an entry of 'added_tokens' lacks its id or content: " + describe(t));
      const int64_t id = id_of(*idv, "added token '" + gguf_printable(c->get<std::string>(), 40) + "'");
      const bool special = bool_or(t, "special", false, shown);
      put(id, c->get<std::string>(), special ? k_control : k_user_defined, true);
    }
  }
  // Ids without a token (and the embedding's padding rows): "[PAD<id>]", unused, as llama.cpp writes them.
  for (size_t i = 0; i < static_cast<size_t>(h.n_vocab); ++i) {
    if (i >= pieces.size()) {
      pieces.push_back("");
      types.push_back(k_unused);
      present.push_back(false);
    }
    if (!present[i]) pieces[i] = "[PAD" + std::to_string(i) + "]";
  }
  std::unordered_map<std::string_view, int64_t> ids;
  for (size_t i = 0; i < pieces.size(); ++i)
    if (present[i]) ids.emplace(pieces[i], static_cast<int64_t>(i));

  std::vector<std::string> merges, merged; // "left right", and what the merge makes
  if (const json* m = member(*model, "merges")) {
    if (!m->is_array()) bad(shown, "'model.merges' should be a list, found " + describe(*m));
    merges.reserve(m->size());
    for (const auto& x : *m) {
      if (x.is_string()) {
        const auto& s = x.get_ref<const std::string&>();
        if (s.find(' ') == std::string::npos || s.find(' ') != s.rfind(' '))
          bad(shown, "merge " + describe(x) + " should be two tokens separated by one space");
        merges.push_back(s);
        merged.push_back(s.substr(0, s.find(' ')) + s.substr(s.find(' ') + 1));
      } else if (x.is_array() && x.size() == 2 && x[0].is_string() && x[1].is_string()) {
        merges.push_back(x[0].get<std::string>() + " " + x[1].get<std::string>());
        merged.push_back(x[0].get<std::string>() + x[1].get<std::string>());
      } else {
        bad(shown, "merge " + describe(x) + " should be \"left right\" or [\"left\", \"right\"]");
      }
    }
  }

  const json* pre_tok = member(tj, "pre_tokenizer");
  const json* normalizer = member(tj, "normalizer");
  const json* decoder = member(tj, "decoder");
  const bool byte_fallback = bool_or(*model, "byte_fallback", false, shown);
  bool byte_level = false;
  for (const json* c : components(pre_tok, "pretokenizers", shown))
    byte_level = byte_level || str_or(*c, "type", "", shown) == "ByteLevel";
  for (const json* c : components(decoder, "decoders", shown))
    byte_level = byte_level || str_or(*c, "type", "", shown) == "ByteLevel";

  if (byte_fallback) {
    // SentencePiece-style BPE: Loom's "llama" tokenizer merges by piece score; a piece's score is
    // minus the rank of the first merge that makes it (pieces no merge makes rank below every merge).
    meta.add("tokenizer.ggml.model", v_str("llama"));
    std::vector<float> scores(pieces.size(), -static_cast<float>(merges.size() + 1));
    for (size_t r = merged.size(); r-- > 0;) // the lowest rank last: it wins
      if (auto it = ids.find(merged[r]); it != ids.end())
        scores[static_cast<size_t>(it->second)] = -static_cast<float>(r);
    for (size_t i = 0; i < pieces.size(); ++i) {
      const std::string& p = pieces[i];
      if (types[i] == k_normal && p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' &&
          std::isxdigit(static_cast<unsigned char>(p[3])) && std::isxdigit(static_cast<unsigned char>(p[4])))
        types[i] = k_byte;
    }
    if (auto unk = model->find("unk_token"); unk != model->end() && unk->is_string())
      if (auto it = ids.find(unk->get_ref<const std::string&>()); it != ids.end()) {
        types[static_cast<size_t>(it->second)] = k_unknown;
        meta.add("tokenizer.ggml.unknown_token_id", v_u32(it->second));
      }
    meta.add("tokenizer.ggml.tokens",
             v_array(GgufType::string, pieces, [](const std::string& s) { return v_str(s); }));
    meta.add("tokenizer.ggml.scores",
             v_array(GgufType::f32, scores, [](float x) { return v_f32(static_cast<double>(x)); }));
    // A "▁" prepended to the text: a Prepend normalizer, or a Metaspace pre-tokenizer that prepends.
    bool prefix = false;
    for (const json* c : components(normalizer, "normalizers", shown))
      prefix = prefix || (str_or(*c, "type", "", shown) == "Prepend" &&
                          str_or(*c, "prepend", "", shown) == "\xE2\x96\x81");
    for (const json* c : components(pre_tok, "pretokenizers", shown))
      if (str_or(*c, "type", "", shown) == "Metaspace")
        prefix = prefix || bool_or(*c, "add_prefix_space", false, shown) ||
                 str_or(*c, "prepend_scheme", "never", shown) != "never";
    meta.add("tokenizer.ggml.add_space_prefix", v_bool(prefix));
  } else if (byte_level) {
    // Byte-level BPE: the pre-tokenizer is told apart by its regex.
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
    meta.add("tokenizer.ggml.model", v_str("gpt2"));
    meta.add("tokenizer.ggml.pre", v_str(pre));
    meta.add("tokenizer.ggml.tokens",
             v_array(GgufType::string, pieces, [](const std::string& s) { return v_str(s); }));
    meta.add("tokenizer.ggml.merges",
             v_array(GgufType::string, merges, [](const std::string& s) { return v_str(s); }));
  } else {
    bad(shown,
        "a BPE tokenizer with neither byte_fallback nor a ByteLevel pre-tokenizer is not supported "
        "(expected SentencePiece-style BPE with byte fallback, or byte-level BPE)",
        Errc::unsupported);
  }
  meta.add("tokenizer.ggml.token_type", v_array(GgufType::i32, types, [](int32_t t) { return v_i32(t); }));

  // tokenizer_config.json: BOS/EOS, whether BOS/EOS are added, the chat template.
  const std::string tc_path = join(dir, "tokenizer_config.json");
  const std::string tc_shown = gguf_printable(tc_path, 400);
  json tc = json::object();
  if (const auto t = read_small(tc_path, k_max_config, "tokenizer_config.json")) {
    tc = parse_json(*t, tc_shown);
    if (!tc.is_object()) bad(tc_shown, "expected a JSON object, found " + describe(tc));
  }
  const Keys tk(tc, tc_shown);
  const Keys ck(cfg, gguf_printable(join(dir, "config.json"), 400));
  auto special = [&](const char* tc_key, const char* cfg_key, const char* gguf_key) {
    if (const json* v = member(tc, tc_key)) {
      const auto t = token_text(v);
      if (!t) bad(tc_shown, std::string("'") + tc_key + "' should be a token string, found " + describe(*v));
      const auto it = ids.find(*t);
      if (it == ids.end())
        bad(tc_shown,
            std::string(tc_key) + " '" + gguf_printable(*t, 40) + "' is not a token of tokenizer.json");
      meta.add(gguf_key, v_u32(it->second));
      return;
    }
    if (!cfg_key) return;
    if (const json* v = member(cfg, cfg_key)) { // an id, or a list of ids (the first is the main one)
      const json& x = v->is_array() && !v->empty() ? (*v)[0] : *v;
      const auto id = as_int(x);
      if (!id || *id < 0 || *id >= h.n_vocab)
        bad(ck.shown(), std::string("'") + cfg_key + "' should be a token id in 0.." +
                            std::to_string(h.n_vocab - 1) + ", found " + describe(*v));
      meta.add(gguf_key, v_u32(*id));
    }
  };
  special("bos_token", "bos_token_id", "tokenizer.ggml.bos_token_id");
  special("eos_token", "eos_token_id", "tokenizer.ggml.eos_token_id");
  special("pad_token", nullptr, "tokenizer.ggml.padding_token_id");

  // Whether BOS/EOS are added: tokenizer_config.json's flags, else the post-processor's template.
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

  // The chat template: chat_template.jinja (transformers ≥ 4.43 saves it there), else tokenizer_config's
  // chat_template (a string, or named templates: "default" or the first).
  std::optional<std::string> tmpl =
      read_small(join(dir, "chat_template.jinja"), k_max_config, "chat_template.jinja");
  if (!tmpl)
    if (const json* ct = member(tc, "chat_template")) {
      if (ct->is_string()) {
        tmpl = ct->get<std::string>();
      } else if (ct->is_array()) {
        for (const auto& e : *ct) {
          const json* n = member(e, "name");
          const json* t = member(e, "template");
          if (!t || !t->is_string())
            bad(tc_shown, "a named chat_template lacks its 'template' string: " + describe(e));
          if (!tmpl || (n && n->is_string() && n->get<std::string>() == "default"))
            tmpl = t->get<std::string>();
        }
      } else {
        bad(tc_shown,
            "'chat_template' should be a string or a list of named templates, found " + describe(*ct));
      }
    }
  if (tmpl) meta.add("tokenizer.chat_template", v_str(std::move(*tmpl)));
}

// ---- tensors -------------------------------------------------------------------------------------

struct Source {
  SafetensorsTensor t;
  std::string file; // shown
  bool used = false;
};

// The shard file names of model.safetensors.index.json, checked: plain names inside the directory.
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

// Out row h·D + 2i + j = in row h·D + j·D/2 + i (llama.cpp's permute: HF's rotate-half halves → pairs).
void permute_rows(const uint8_t* src, uint8_t* dst, int64_t n_rows, size_t row_bytes, int64_t n_head) {
  const int64_t hd = n_rows / n_head, half = hd / 2;
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(dst + static_cast<size_t>(h * hd + 2 * i + j) * row_bytes,
                    src + static_cast<size_t>(h * hd + j * half + i) * row_bytes, row_bytes);
}

} // namespace

// ---------------------------------------------------------------------------------------------
// safetensors

namespace {
SafetensorsHeader parse_safetensors_impl(std::span<const uint8_t> file, const std::string& name) {
  const std::string shown = gguf_printable(name, 400);
  auto err = [&](const std::string& msg) { bad(shown, msg); };
  if (file.size() < 8)
    err("the file has " + std::to_string(file.size()) +
        " bytes, fewer than the 8-byte header length of a safetensors file; it is truncated — re-download "
        "it");
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k)
    n = n << 8 | file[static_cast<size_t>(k)];
  if (n > k_safetensors_max_header)
    err("header length " + std::to_string(n) + " is over the limit of " + mib(k_safetensors_max_header) +
        ": not a safetensors file, or a corrupt one");
  if (n > file.size() - 8)
    err("header length " + std::to_string(n) + " runs past the end of the file (" +
        std::to_string(file.size()) + " bytes): the file is truncated — re-download it");
  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), static_cast<size_t>(n));
  const json j = parse_json(text, shown + " (header)", true);
  if (!j.is_object()) err("the header should be a JSON object of tensors, found " + describe(j));
  const uint64_t data_size = file.size() - h.data_offset;
  const uint8_t* data = file.data() + h.data_offset;
  for (const auto& [key, v] : j.items()) {
    if (key == "__metadata__") {
      if (!v.is_object()) err("'__metadata__' should be an object of strings, found " + describe(v));
      continue;
    }
    const std::string tn = "tensor '" + gguf_printable(key) + "'";
    if (!v.is_object())
      err(tn + " should be an object with dtype, shape and data_offsets, found " + describe(v));
    SafetensorsTensor t;
    t.name = key;
    const json* dt = member(v, "dtype");
    if (!dt || !dt->is_string())
      err(tn + ": 'dtype' should be a string such as \"F32\", found " + (dt ? describe(*dt) : "nothing"));
    t.dtype = dt->get<std::string>();
    const StDtype* d = find_dtype(t.dtype);
    if (!d)
      err(tn + ": unknown dtype '" + gguf_printable(t.dtype) +
          "' (expected F32, F16, BF16, F64, I64, I32, I16, I8, U64, U32, U16, U8, BOOL or F8_*)");
    t.type = d->type;
    const json* sh = member(v, "shape");
    if (!sh || !sh->is_array())
      err(tn + ": 'shape' should be a list of dimensions, found " + (sh ? describe(*sh) : "nothing"));
    if (sh->size() > k_max_dims)
      err(tn + ": " + std::to_string(sh->size()) + " dimensions, more than the " +
          std::to_string(k_max_dims) + " Loom supports");
    int64_t n_el = 1;
    for (const auto& e : *sh) {
      const auto x = as_int(e);
      if (!x || *x < 0) err(tn + ": dimension " + describe(e) + " should be a non-negative integer");
      if (*x > 0 && n_el > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(d->size) / *x)
        err(tn + ": shape " + describe(*sh) + " makes the byte size overflow");
      t.shape.push_back(*x);
      n_el *= *x;
    }
    t.n_elements = n_el;
    const json* off = member(v, "data_offsets");
    if (!off || !off->is_array() || off->size() != 2 || !as_int((*off)[0]) || !as_int((*off)[1]))
      err(tn + ": 'data_offsets' should be [begin, end], found " + (off ? describe(*off) : "nothing"));
    const auto b = *as_int((*off)[0]), e = *as_int((*off)[1]);
    if (b < 0 || e < b || static_cast<uint64_t>(e) > data_size)
      err(tn + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
          "] are not a range within the " + std::to_string(data_size) +
          " data bytes: the file is truncated or corrupt — re-download it");
    t.begin = static_cast<uint64_t>(b);
    t.end = static_cast<uint64_t>(e);
    const uint64_t want = static_cast<uint64_t>(n_el) * d->size;
    if (t.end - t.begin != want)
      err(tn + ": shape " + shape_str(t.shape) + " of " + t.dtype + " needs " + std::to_string(want) +
          " bytes but data_offsets span " + std::to_string(t.end - t.begin) + ": the header is corrupt");
    t.data = data + t.begin;
    h.tensors.push_back(std::move(t));
  }
  // No two tensors may share bytes.
  std::vector<const SafetensorsTensor*> by_off;
  for (const auto& t : h.tensors)
    if (t.end > t.begin) by_off.push_back(&t);
  std::sort(by_off.begin(), by_off.end(),
            [](const SafetensorsTensor* x, const SafetensorsTensor* y) { return x->begin < y->begin; });
  for (size_t k = 1; k < by_off.size(); ++k)
    if (by_off[k]->begin < by_off[k - 1]->end)
      err("tensors '" + gguf_printable(by_off[k - 1]->name) + "' (data bytes " +
          std::to_string(by_off[k - 1]->begin) + ".." + std::to_string(by_off[k - 1]->end) + ") and '" +
          gguf_printable(by_off[k]->name) + "' (" + std::to_string(by_off[k]->begin) + ".." +
          std::to_string(by_off[k]->end) +
          ") overlap: expected each tensor in bytes of its own; the file is corrupt");
  return h;
}
} // namespace

SafetensorsHeader parse_safetensors(std::span<const uint8_t> file, const std::string& name) {
  try {
    return parse_safetensors_impl(file, name);
  } catch (const json::exception& e) { // the reads check types before they convert: a net under them
    bad(gguf_printable(name, 400), "unexpected header content (" + gguf_printable(e.what(), 160) + ")");
  }
}

// ---------------------------------------------------------------------------------------------
// The checkpoint

GgufFile GgufFile::from_hf_dir(const std::string& dir, const GgufLimits& limits) {
  const std::string shown = gguf_printable(dir, 400);
  // The JSON reads check types before they convert; this is the net under them.
  try {
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
    const json cfg = parse_json(*cfg_text, gguf_printable(join(dir, "config.json"), 400));

    Meta meta;
    const Hyper h = read_config(cfg, dir, meta);

    // Weights: the shards of the index, or model.safetensors.
    auto storage = std::make_shared<Storage>();
    std::vector<std::string> shards;
    std::map<std::string, std::vector<std::string>> listed;
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
    std::map<std::string, Source> src;
    uint64_t total_bytes = 0;
    for (const auto& s : shards) {
      const std::string path = join(dir, s);
      const std::string sshown = gguf_printable(path, 400);
      if (!stat_regular(path, "a safetensors shard"))
        bad(sshown,
            "is missing: model.safetensors.index.json lists it; download every shard of the checkpoint",
            Errc::not_found);
      storage->files.push_back(map_file(path, "a safetensors shard"));
      total_bytes += storage->files.back()->size;
      SafetensorsHeader hdr = parse_safetensors(storage->files.back()->bytes(), path);
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

    // The GGUF tensors, in GGUF order, each checked for presence, shape and dtype.
    GgufFile f;
    f.path_ = dir;
    f.version_ = 0;
    const int64_t E = h.n_embd, D = h.head_dim, Hq = h.n_head, Hkv = h.n_head_kv, F = h.n_ff, V = h.n_vocab;
    const std::string dims = "hidden_size " + std::to_string(E) + ", num_attention_heads " +
                             std::to_string(Hq) + ", num_key_value_heads " + std::to_string(Hkv) +
                             ", head_dim " + std::to_string(D) + ", intermediate_size " + std::to_string(F) +
                             ", vocab_size " + std::to_string(V);
    enum class Conv { none, permute_q, permute_k };
    auto emit = [&](const std::string& hf, const std::string& gguf, std::vector<int64_t> shape, bool required,
                    Conv conv = Conv::none) {
      auto it = src.find(hf);
      if (it == src.end()) {
        if (required)
          bad(shown,
              "tensor '" + hf + "' (shape " + shape_str(shape) +
                  ") is missing: the checkpoint is incomplete — " +
                  (shards.size() > 1 ? "are all shards downloaded?" : "re-download model.safetensors"),
              Errc::not_found);
        return;
      }
      Source& s = it->second;
      s.used = true;
      if (s.t.shape != shape)
        bad(s.file, "tensor '" + hf + "' has shape " + shape_str(s.t.shape) + ", expected " +
                        shape_str(shape) + " from config.json (" + dims +
                        "): the checkpoint is inconsistent");
      if (!s.t.type)
        bad(s.file,
            "tensor '" + hf + "' is stored as " + s.t.dtype +
                ": Loom reads F32, F16 and BF16 weights (quantize a GGUF conversion instead)",
            Errc::unsupported);
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
        uint8_t* dst = storage->buffer(t.n_bytes);
        permute_rows(s.t.data, dst, shape[0], static_cast<size_t>(shape[1]) * el,
                     conv == Conv::permute_q ? Hq : Hkv);
        t.data = dst;
      } else if (reinterpret_cast<uintptr_t>(t.data) % el != 0) { // unaligned for its type: a copy
        uint8_t* dst = storage->buffer(t.n_bytes);
        std::memcpy(dst, s.t.data, t.n_bytes);
        t.data = dst;
      }
      f.tensors_.push_back(std::move(t));
    };
    const bool permute = h.arch->permute_qk;
    emit("model.embed_tokens.weight", "token_embd.weight", {V, E}, true);
    for (int64_t l = 0; l < h.n_layer; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".", g = "blk." + std::to_string(l) + ".";
      emit(p + "input_layernorm.weight", g + "attn_norm.weight", {E}, true);
      emit(p + "self_attn.q_proj.weight", g + "attn_q.weight", {Hq * D, E}, true,
           permute ? Conv::permute_q : Conv::none);
      emit(p + "self_attn.k_proj.weight", g + "attn_k.weight", {Hkv * D, E}, true,
           permute ? Conv::permute_k : Conv::none);
      emit(p + "self_attn.v_proj.weight", g + "attn_v.weight", {Hkv * D, E}, true);
      if (h.arch->qkv_bias) {
        emit(p + "self_attn.q_proj.bias", g + "attn_q.bias", {Hq * D}, true);
        emit(p + "self_attn.k_proj.bias", g + "attn_k.bias", {Hkv * D}, true);
        emit(p + "self_attn.v_proj.bias", g + "attn_v.bias", {Hkv * D}, true);
      }
      if (h.arch->qk_norm) {
        emit(p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", {D}, true);
        emit(p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", {D}, true);
      }
      emit(p + "self_attn.o_proj.weight", g + "attn_output.weight", {E, Hq * D}, true);
      emit(p + "post_attention_layernorm.weight", g + "ffn_norm.weight", {E}, true);
      emit(p + "mlp.gate_proj.weight", g + "ffn_gate.weight", {F, E}, true);
      emit(p + "mlp.up_proj.weight", g + "ffn_up.weight", {F, E}, true);
      emit(p + "mlp.down_proj.weight", g + "ffn_down.weight", {E, F}, true);
      if (auto it = src.find(p + "self_attn.rotary_emb.inv_freq"); it != src.end())
        it->second.used = true; // a buffer older transformers saved: recomputed from rope_theta
    }
    emit("model.norm.weight", "output_norm.weight", {E}, true);
    if (!h.tied && !src.count("lm_head.weight"))
      bad(shown,
          "tensor 'lm_head.weight' is missing and config.json does not set tie_word_embeddings: "
          "the checkpoint is incomplete",
          Errc::not_found);
    emit("lm_head.weight", "output.weight", {V, E}, false);
    if (h.rope_freqs) {
      GgufTensor t;
      t.name = "rope_freqs.weight";
      t.type = DType::f32;
      t.ne = {static_cast<int64_t>(h.rope_freqs->size())};
      t.n_elements = t.ne[0];
      t.n_bytes = h.rope_freqs->size() * sizeof(float);
      uint8_t* dst = storage->buffer(t.n_bytes);
      std::memcpy(dst, h.rope_freqs->data(), t.n_bytes);
      t.data = dst;
      f.tensors_.push_back(std::move(t));
    }
    for (const auto& [name, s] : src)
      if (!s.used)
        bad(s.file,
            "tensor '" + gguf_printable(name) + "' is not part of " + std::string(h.arch->hf) +
                " as Loom runs it (a layer beyond num_hidden_layers, or a weight of another architecture); "
                "expected only the model's weights",
            Errc::unsupported);

    // The tokenizer last: its ids are bounded by vocab_size, which the embedding's bytes have confirmed.
    read_tokenizer(dir, h, cfg, meta);
    f.kv_ = std::move(meta.kv);
    uint64_t md = 0;
    for (const auto& kv : f.kv_)
      md += sizeof(GgufKV) + kv.key.size() + kv.value.str.size() + kv.value.items.heap_bytes();
    f.metadata_bytes_ = md + f.tensors_.size() * (sizeof(GgufTensor) + 64);
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
