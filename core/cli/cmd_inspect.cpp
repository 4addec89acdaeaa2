// `loom inspect MODEL`: what a model file holds and what it will cost in memory.
#include "cli.hpp"
#include "loom/attention.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/kv/kv_cache.hpp"
#include "loom/model/model_config.hpp"
#include "loom/plugin/plugin_host.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

namespace loom::cli {

namespace {

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

// "512MiB", "2GiB", "1.5G", "1000000": bytes; nullopt for anything else.
std::optional<uint64_t> parse_byte_size(const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::string unit = s.substr(used);
  double mult = 1;
  if (unit == "" || unit == "B")
    mult = 1;
  else if (unit == "K" || unit == "KiB")
    mult = 1024.0;
  else if (unit == "M" || unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB")
    mult = 1e3;
  else if (unit == "MB")
    mult = 1e6;
  else if (unit == "GB")
    mult = 1e9;
  else
    return std::nullopt;
  const double b = v * mult;
  if (!(b >= 1) || b > 1e15) return std::nullopt;
  return static_cast<uint64_t>(b);
}

// What a family adds to the Llama graph, as `loom inspect` names it (docs/models.md).
std::vector<std::string> family_features(const ModelConfig& c) {
  std::vector<std::string> f;
  if (c.rope.neox) f.emplace_back("RoPE NeoX (rotate-half)");
  if (c.rope_freqs) f.emplace_back("RoPE frequency divisors (rope_freqs)");
  if (const auto n = std::count(c.rope_layers.begin(), c.rope_layers.end(), false); n > 0)
    f.emplace_back("no RoPE on " + std::to_string(n) + " of " + std::to_string(c.n_layer) + " layers");
  if (c.qkv_bias) f.emplace_back("q/k/v biases");
  if (c.qk_norm) f.emplace_back("q/k RMS norm per head");
  if (c.attn_out_bias) f.emplace_back("output projection bias");
  if (c.attn_sink_logits) f.emplace_back("learned attention sinks");
  if (c.fused_qkv) f.emplace_back("fused q/k/v");
  if (c.fused_gate_up) f.emplace_back("fused gate/up");
  if (c.post_norms) f.emplace_back("post-attention and post-FFN norms");
  f.emplace_back(c.geglu ? "GeGLU" : "SwiGLU");
  if (c.moe.n_expert > 0) {
    const MoeConfig& m = c.moe;
    f.emplace_back("mixture of experts: " + std::to_string(m.n_used) + " of " + std::to_string(m.n_expert) +
                   " experts of width " + std::to_string(m.n_ff_exp) + " a token (" +
                   (m.gating == MoeGating::softmax   ? "softmax"
                    : m.gating == MoeGating::sigmoid ? "sigmoid"
                                                     : "softmax of the selected") +
                   (m.norm ? ", renormalised" : "") + (m.router_bias ? ", router bias" : "") +
                   (m.expert_biases ? ", experts' biases" : "") + (m.oai_glu ? ", clamped SwiGLU" : "") +
                   ")");
  }
  if (c.embd_scale > 0.0f) f.emplace_back("embeddings × " + std::to_string(c.embd_scale).substr(0, 7));
  if (c.final_softcap > 0.0f)
    f.emplace_back("final logit soft-cap " + std::to_string(c.final_softcap).substr(0, 4));
  return f;
}

// Per storage type: how many tensors, elements and bytes the file holds.
struct TypeStat {
  int64_t n_tensors = 0, n_elements = 0;
  uint64_t bytes = 0;
};

std::map<std::string, TypeStat> tensor_type_stats(const GgufFile& f) {
  std::map<std::string, TypeStat> types;
  for (const auto& t : f.tensors()) {
    auto& s = types[std::string(dtype_name(t.type))];
    ++s.n_tensors;
    s.n_elements += t.n_elements;
    s.bytes += t.n_bytes;
  }
  return types;
}

// --kv-memory free: what --backend's device has free, less the weights and a tenth for activations;
// `device` receives how that was reckoned.
uint64_t device_kv_memory(const po::variables_map& vm, const ModelConfig& c, nlohmann::json& device) {
  if (!vm.count("backend"))
    throw UsageError("--kv-memory free: name the backend whose device to ask (--backend cuda)");
  const std::string be = vm["backend"].as<std::string>();
  std::vector<std::string> dirs;
  if (vm.count("plugin-path")) dirs = vm["plugin-path"].as<std::vector<std::string>>();
  const auto m = backend_memory(be, dirs);
  if (!m)
    throw UsageError("--kv-memory free: backend '" + be +
                     "' does not report its device memory (a host-memory backend): give a size");
  const uint64_t reserve = m->free_bytes / 10, weights = c.weight_bytes;
  device = {{"backend", be},
            {"free_bytes", m->free_bytes},
            {"total_bytes", m->total_bytes},
            {"weight_bytes", weights},
            {"reserve_bytes", reserve}};
  return m->free_bytes > weights + reserve ? m->free_bytes - weights - reserve : 0;
}

// A paged store of this model's KV on a backend that reads only each query's span and layer groups (cpu,
// reference), for sequences of ctx positions in `blocks` blocks' worth of every layer (0: one sequence):
// what its sliding-window layers keep. Null when every layer keeps every position.
nlohmann::json windowed_kv(const ModelConfig& c, int64_t ctx, DType t, int32_t block_size, int64_t blocks) {
  KVShape s;
  s.n_layer = c.n_layer;
  s.n_head_kv = c.n_head_kv;
  s.head_dim = c.head_dim;
  s.n_ctx = static_cast<int32_t>(ctx);
  s.dtype = t;
  s.block_size = block_size;
  s.n_blocks = blocks;
  make_attention_variant(c, {})->set_retention(s, attn_span_only | attn_kv_groups);
  if (!s.retention.bounded() && s.window_layers.empty()) return nullptr;
  const auto kv = make_paged_kv_cache(s);
  const KVRetention& r = s.retention.bounded() ? s.retention : s.window_retention;
  const auto n_window =
      s.window_layers.empty()
          ? c.n_layer
          : static_cast<int32_t>(std::count(s.window_layers.begin(), s.window_layers.end(), true));
  nlohmann::json j{{"window_layers", n_window},
                   {"window", r.window},
                   {"sinks", r.sinks},
                   {"bytes_at_ctx", kv->bytes_for(ctx)},
                   {"full_bytes_at_ctx", c.kv_bytes_per_token(t) * static_cast<uint64_t>(ctx)}};
  if (blocks > 0) j["full_context_sequences"] = kv->n_units() / std::max<int64_t>(kv->units_for(ctx), 1);
  return j;
}

// The KV budget (--kv-memory): whole blocks of --block-size positions in the memory given.
nlohmann::json kv_budget(const po::variables_map& vm, const ModelConfig& c, int64_t ctx) {
  const std::string mem_s = vm["kv-memory"].as<std::string>();
  std::optional<uint64_t> mem;
  nlohmann::json device;
  if (mem_s == "free")
    mem = device_kv_memory(vm, c, device);
  else
    mem = parse_byte_size(mem_s);
  if (!mem)
    throw UsageError("--kv-memory " + mem_s +
                     ": expected a size such as 512MiB, 2GiB or 1000000 (bytes), or free (with --backend)");
  const std::string dt = vm["kv-dtype"].as<std::string>();
  const auto t = dtype_from_name(dt);
  if (!t || (*t != DType::f32 && *t != DType::f16 && *t != DType::bf16 && *t != DType::q8_0))
    throw UsageError("--kv-dtype " + dt + ": expected f32, f16, bf16 or q8_0");
  const int bs = vm["block-size"].as<int>();
  if (bs < 1 || bs > 4096 || (bs & (bs - 1)) != 0)
    throw UsageError("--block-size " + std::to_string(bs) + ": expected a power of two in 1..4096");
  const uint64_t per_token = c.kv_bytes_per_token(*t);
  const uint64_t per_block = per_token * static_cast<uint64_t>(bs);
  const uint64_t blocks = per_block > 0 ? *mem / per_block : 0;
  const uint64_t tokens = blocks * static_cast<uint64_t>(bs);
  nlohmann::json budget{{"memory_bytes", *mem},
                        {"dtype", dt},
                        {"block_size", bs},
                        {"bytes_per_token", per_token},
                        {"blocks", blocks},
                        {"tokens", tokens},
                        {"bytes_used", blocks * per_block},
                        {"full_context_sequences", tokens / static_cast<uint64_t>(ctx)}};
  // A paged store keeps only the window of sliding-window layers: more sequences of ctx fit.
  if (auto w = windowed_kv(c, ctx, *t, bs, static_cast<int64_t>(blocks)); !w.is_null())
    budget["windowed_full_context_sequences"] = w["full_context_sequences"];
  if (!device.is_null()) budget["device"] = device;
  return budget;
}

// Everything `loom inspect` reports, read once and printed as text or JSON.
struct Inspection {
  const GgufFile& f;
  const ModelConfig& c;
  const Tokenizer& tok;
  int64_t ctx;
  std::map<std::string, TypeStat> types;
  uint64_t kv32, kv16; // KV bytes per token, f32 and f16
  std::optional<nlohmann::json> budget;
  bool metadata;
};

nlohmann::json attention_json(const ModelConfig& c) {
  const auto v = make_attention_variant(c, {});
  const KVRetention r = v->retention();
  return {{"variant", std::string(v->name())},
          {"sliding_window", c.sliding_window},
          {"sliding_layers", std::count(c.sliding_layers.begin(), c.sliding_layers.end(), true)},
          {"softcap", c.attn_softcap},
          {"kv_positions_bound", r.bounded() ? r.sinks + r.window : 0}};
}

void print_inspection_json(const Inspection& in) {
  const GgufFile& f = in.f;
  const ModelConfig& c = in.c;
  nlohmann::json j;
  j["path"] = f.path();
  j["format"] = f.version() ? "gguf" : "safetensors"; // safetensors: a Hugging Face checkpoint directory
  j["gguf_version"] = f.version();
  j["file_bytes"] = f.file_size();
  j["architecture"] = c.arch;
  j["name"] = c.name;
  j["n_params"] = c.n_params;
  j["weight_bytes"] = c.weight_bytes;
  j["n_embd"] = c.n_embd;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_head_kv"] = c.n_head_kv;
  j["head_dim"] = c.head_dim;
  j["n_ff"] = c.n_ff;
  j["n_vocab"] = c.n_vocab;
  j["n_ctx_train"] = c.n_ctx_train;
  j["norm_eps"] = c.norm_eps;
  j["rope"] = {{"n_dims", c.rope.n_dims}, {"theta", c.rope.theta}, {"factor", c.rope.factor}};
  j["tied_output"] = c.tied_output;
  j["features"] = family_features(c);
  j["attention"] = attention_json(c);
  j["tokenizer"] = {{"model", std::string(in.tok.model())},
                    {"pre", std::string(in.tok.pre())},
                    {"n_vocab", in.tok.vocab_size()},
                    {"bos", in.tok.bos()},
                    {"eos", in.tok.eos()}};
  nlohmann::json ts = nlohmann::json::object();
  for (const auto& [name, s] : in.types)
    ts[name] = {{"n_tensors", s.n_tensors}, {"n_elements", s.n_elements}, {"bytes", s.bytes}};
  j["tensor_types"] = ts;
  const auto ctx = static_cast<uint64_t>(in.ctx);
  j["kv"] = {{"ctx", in.ctx},
             {"f32_bytes_per_token", in.kv32},
             {"f16_bytes_per_token", in.kv16},
             {"f32_bytes", in.kv32 * ctx},
             {"f16_bytes", in.kv16 * ctx},
             // a paged store (blocks of 16) keeping the sliding-window layers' window only; null: none
             {"windowed_f32", windowed_kv(c, in.ctx, DType::f32, 16, 0)},
             {"windowed_f16", windowed_kv(c, in.ctx, DType::f16, 16, 0)}};
  if (in.budget) j["kv_budget"] = *in.budget;
  if (in.metadata) {
    nlohmann::json md = nlohmann::json::object();
    for (const auto& kv : f.metadata())
      md[kv.key] = kv.value.to_string(8);
    j["metadata"] = md;
  }
  // Names and strings come from the file and need not be UTF-8: bytes that are not become U+FFFD
  // instead of failing the dump.
  std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

// The text report's first lines: the file, the shape, the tokenizer, the family and the attention.
void print_model_summary(const GgufFile& f, const ModelConfig& c, const Tokenizer& tok) {
  const std::string format =
      f.version() ? "GGUF v" + std::to_string(f.version()) : "Hugging Face safetensors";
  std::printf("file:          %s (%s, %s)\n", f.path().c_str(), format.c_str(),
              human_bytes(f.file_size()).c_str());
  std::printf("architecture:  %s%s%s\n", c.arch.c_str(), c.name.empty() ? "" : " — ",
              gguf_printable(c.name).c_str());
  std::printf("parameters:    %lld (%.3f M)\n", static_cast<long long>(c.n_params),
              static_cast<double>(c.n_params) / 1e6);
  std::printf("weights:       %s (%llu bytes)\n", human_bytes(c.weight_bytes).c_str(),
              static_cast<unsigned long long>(c.weight_bytes));
  std::printf("shape:         n_embd %d, n_layer %d, n_head %d, n_head_kv %d (%s), head_dim %d, n_ff %d\n",
              c.n_embd, c.n_layer, c.n_head, c.n_head_kv,
              c.n_head_kv == c.n_head ? "MHA"
              : c.n_head_kv == 1      ? "MQA"
                                      : "GQA",
              c.head_dim, c.n_ff);
  std::printf("vocab:         %d (%s tokenizer, pre '%s', bos %d, eos %d)\n", c.n_vocab,
              std::string(tok.model()).c_str(), std::string(tok.pre()).c_str(), tok.bos(), tok.eos());
  std::printf("context:       %d trained; RoPE dims %d, theta %g, scale %g; norm eps %g; output %s\n",
              c.n_ctx_train, c.rope.n_dims, static_cast<double>(c.rope.theta),
              static_cast<double>(c.rope.factor), static_cast<double>(c.norm_eps),
              c.tied_output ? "tied to the embedding" : "separate");
  std::string feats;
  for (const auto& x : family_features(c))
    feats += (feats.empty() ? "" : ", ") + x;
  std::printf("family:        %s\n", feats.empty() ? "Llama (no additions)" : feats.c_str());
  const auto v = make_attention_variant(c, {});
  std::string line = v->describe();
  line = line.substr(0, line.rfind(", kernel ")); // the kernel is the pipeline's choice
  std::printf("attention:     %s%s\n", line.c_str(),
              v->retention().bounded() ? "; KV per sequence bounded by the window" : "");
}

void print_kv_budget(const nlohmann::json& b, int64_t ctx) {
  std::printf(
      "KV budget:     %s of %s KV in blocks of %d: %llu blocks, %llu tokens (%llu sequences of %lld)\n",
      human_bytes(b["memory_bytes"].get<uint64_t>()).c_str(), b["dtype"].get<std::string>().c_str(),
      b["block_size"].get<int>(), static_cast<unsigned long long>(b["blocks"].get<uint64_t>()),
      static_cast<unsigned long long>(b["tokens"].get<uint64_t>()),
      static_cast<unsigned long long>(b["full_context_sequences"].get<uint64_t>()),
      static_cast<long long>(ctx));
  if (b.contains("windowed_full_context_sequences"))
    std::printf("               %llu sequences of %lld with the sliding-window layers keeping their window\n",
                static_cast<unsigned long long>(b["windowed_full_context_sequences"].get<uint64_t>()),
                static_cast<long long>(ctx));
  if (b.contains("device")) {
    const auto& d = b["device"];
    std::printf("               from %s's device: %s free of %s, less %s of weights and %s for activations\n",
                d["backend"].get<std::string>().c_str(), human_bytes(d["free_bytes"].get<uint64_t>()).c_str(),
                human_bytes(d["total_bytes"].get<uint64_t>()).c_str(),
                human_bytes(d["weight_bytes"].get<uint64_t>()).c_str(),
                human_bytes(d["reserve_bytes"].get<uint64_t>()).c_str());
  }
}

void print_inspection_text(const Inspection& in) {
  print_model_summary(in.f, in.c, in.tok);
  std::printf("tensor types:\n");
  for (const auto& [name, s] : in.types)
    std::printf("  %-6s %4lld tensors  %12lld elements  %s\n", name.c_str(),
                static_cast<long long>(s.n_tensors), static_cast<long long>(s.n_elements),
                human_bytes(s.bytes).c_str());
  std::printf("KV cache:      2·L·H_kv·D·b per token: f32 %s, f16 %s\n", human_bytes(in.kv32).c_str(),
              human_bytes(in.kv16).c_str());
  std::printf("               at %lld tokens: f32 %s, f16 %s\n", static_cast<long long>(in.ctx),
              human_bytes(in.kv32 * static_cast<uint64_t>(in.ctx)).c_str(),
              human_bytes(in.kv16 * static_cast<uint64_t>(in.ctx)).c_str());
  if (const auto w32 = windowed_kv(in.c, in.ctx, DType::f32, 16, 0); !w32.is_null()) {
    const auto w16 = windowed_kv(in.c, in.ctx, DType::f16, 16, 0);
    const auto full = w16["full_bytes_at_ctx"].get<uint64_t>(), kept = w16["bytes_at_ctx"].get<uint64_t>();
    std::printf("               a paged store keeps %d of %d layers for their window (%d): f32 %s, f16 %s "
                "(%.1fx less)\n",
                w16["window_layers"].get<int>(), in.c.n_layer, w16["window"].get<int>(),
                human_bytes(w32["bytes_at_ctx"].get<uint64_t>()).c_str(), human_bytes(kept).c_str(),
                kept > 0 ? static_cast<double>(full) / static_cast<double>(kept) : 0.0);
  }
  if (in.budget) print_kv_budget(*in.budget, in.ctx);
  if (in.metadata) {
    std::printf("metadata:\n");
    for (const auto& kv : in.f.metadata())
      std::printf("  %-44s %s\n", gguf_printable(kv.key).c_str(), kv.value.to_string(8).c_str());
  }
}

} // namespace

int cmd_inspect(const std::vector<std::string>& args) {
  po::options_description desc("loom inspect options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("model", po::value<std::string>(), "model file (GGUF)")
    ("ctx-size", po::value<int>(), "context for the KV total (default: the model's training context)")
    ("kv-memory", po::value<std::string>(), "KV budget: memory for the KV cache (e.g. 512MiB, 2GiB): the "
                                            "tokens that fit; `free`: what --backend's device has free, less "
                                            "the weights and 10% for activations")
    ("backend", po::value<std::string>(), "with --kv-memory free: the backend plugin whose device to ask (e.g. cuda)")
    ("plugin-path", po::value<std::vector<std::string>>()->composing(), "with --backend: a directory to search (repeatable)")
    ("kv-dtype", po::value<std::string>()->default_value("f16"), "KV budget: storage type (f32, f16, bf16, q8_0)")
    ("block-size", po::value<int>()->default_value(16), "KV budget: positions per block (paged store)")
    ("metadata", "list every metadata key")
    ("json", "print one JSON object");
  // clang-format on
  po::positional_options_description pos;
  pos.add("model", 1);
  po::variables_map vm;
  if (!parse_args(
          args, desc, vm,
          "usage: loom inspect MODEL.gguf [--ctx-size N] [--kv-memory SIZE|free [--backend NAME] [--kv-dtype "
          "T]\n"
          "                    [--block-size B]] [--metadata] [--json]\n"
          "Architecture, parameter count, tensor types, weight bytes, KV bytes per token and for the full\n"
          "context (2·L·S·H_kv·D·b, for f32 and f16 KV); with --kv-memory, the KV budget: the tokens (and\n"
          "full-context sequences) that SIZE holds in whole blocks of B positions of type T.",
          &pos))
    return k_exit_ok;
  if (!vm.count("model")) throw UsageError("give a model file: loom inspect MODEL.gguf");

  const GgufFile f = GgufFile::open(vm["model"].as<std::string>());
  const ModelConfig c = ModelConfig::from_gguf(f);
  const auto tok = Tokenizer::from_gguf(f);
  const int64_t ctx = vm.count("ctx-size") ? vm["ctx-size"].as<int>() : c.n_ctx_train;
  if (ctx <= 0) throw UsageError("--ctx-size must be > 0");

  Inspection in{f,
                c,
                *tok,
                ctx,
                tensor_type_stats(f),
                c.kv_bytes_per_token(DType::f32),
                c.kv_bytes_per_token(DType::f16),
                std::nullopt,
                vm.count("metadata") > 0};
  if (vm.count("kv-memory")) in.budget = kv_budget(vm, c, ctx);
  if (vm.count("json"))
    print_inspection_json(in);
  else
    print_inspection_text(in);
  return k_exit_ok;
}

} // namespace loom::cli
