// `loom synth`: random-weight models of named shapes, loadable by Loom and llama.cpp alike.
#include "cli.hpp"
#include "loom/chat/chat.hpp"
#include "loom/error.hpp"
#include "loom/model/synth.hpp"

#include <cstdio>
#include <iostream>
#include <map>

namespace loom::cli {

int cmd_synth(const std::vector<std::string>& args) {
  po::options_description desc("loom synth options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("shape", po::value<std::string>(), "stories15m | stories110m | tinyllama-1.1b | llama-3.2-1b-like | llama-2-7b | llama-3-8b | qwen3-30b-a3b | gpt-oss-20b | tiny-gqa | tiny-d64 | tiny-d64x4 | tiny-moe | tiny-oss")
    ("type", po::value<std::string>()->default_value("f32"), "f32 | f16 | bf16 | q8_0 | q4_0 | mxfp4 (of the matrices)")
    ("expert-type", po::value<std::string>(), "the experts' stacked matrices in this type (default: --type)")
    ("layers", po::value<int>(), "only the shape's first N layers (a large shape cut to fit memory)")
    ("vocab-from", po::value<std::string>(), "copy the vocabulary (tokenizer.* keys) from this GGUF")
    ("seed", po::value<unsigned long long>()->default_value(1), "weights RNG seed")
    ("arch", po::value<std::string>()->default_value("llama"), "llama | llama3 | mistral | qwen2 | qwen3 | gemma2 | phi3 | smollm3 | qwen3moe | gpt-oss (the last two: a shape with experts)")
    ("chat-template", po::value<std::string>(), "write tokenizer.chat_template: a built-in template (chatml, llama3, …) or a Jinja file")
    ("output,o", po::value<std::string>(), "output .gguf");
  // clang-format on
  po::variables_map vm;
  if (!parse_args(args, desc, vm,
                  "usage: loom synth --shape NAME --type T [--vocab-from GGUF] [--chat-template NAME|FILE] "
                  "-o OUT.gguf\n"
                  "Writes a random-weight model of a named shape and family (weights uniform with std 0.02) "
                  "with\n"
                  "full metadata and a vocabulary, so llama.cpp runs the very same file."))
    return k_exit_ok;
  if (!vm.count("shape")) throw UsageError("give --shape (see --help for the names)");
  if (!vm.count("output")) throw UsageError("give the output file with -o OUT.gguf");
  SynthOptions o;
  o.shape = vm["shape"].as<std::string>();
  const auto t = dtype_from_name(vm["type"].as<std::string>());
  if (!t)
    throw UsageError("unknown --type '" + vm["type"].as<std::string>() +
                     "' (f32, f16, bf16, q8_0, q4_0, mxfp4)");
  o.type = *t;
  if (vm.count("expert-type")) {
    const auto et = dtype_from_name(vm["expert-type"].as<std::string>());
    if (!et)
      throw UsageError("unknown --expert-type '" + vm["expert-type"].as<std::string>() +
                       "' (f32, f16, bf16, q8_0, q4_0, mxfp4)");
    o.expert_type = *et;
  }
  if (vm.count("layers")) {
    o.layers = vm["layers"].as<int>();
    if (o.layers < 1) throw UsageError("--layers must be at least 1, found " + std::to_string(o.layers));
  }
  if (vm.count("vocab-from")) o.vocab_from = vm["vocab-from"].as<std::string>();
  o.out = vm["output"].as<std::string>();
  o.seed = vm["seed"].as<unsigned long long>();
  o.arch = vm["arch"].as<std::string>();
  if (vm.count("chat-template")) {
    const std::string spec = vm["chat-template"].as<std::string>();
    if (const auto b = chat::builtin_template(spec))
      o.chat_template = std::string(*b);
    else
      o.chat_template = read_input_file(spec, "--chat-template");
    (void)chat::Template(o.chat_template, spec); // a template that does not parse is refused here
  }
  if (stderr_is_tty())
    o.progress = [last = -1](double f) mutable {
      const int pct = static_cast<int>(f * 100);
      if (pct != last) std::fprintf(stderr, "\rsynth: %3d%%", last = pct);
    };
  synth_model(o);
  if (stderr_is_tty()) std::fprintf(stderr, "\n");
  std::cout << o.out << "\n";
  return k_exit_ok;
}

int cmd_quantize(const std::vector<std::string>& args) {
  const std::string types = dtype_names(true);
  const std::string type_help = "the type of the 2-D weights: " + types;
  po::options_description desc("loom quantize options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("input", po::value<std::string>(), "the GGUF model to convert")
    ("type", po::value<std::string>(), type_help.c_str())
    ("output,o", po::value<std::string>(), "output .gguf");
  // clang-format on
  po::positional_options_description pos;
  pos.add("input", 1);
  po::variables_map vm;
  const std::string usage =
      "usage: loom quantize IN.gguf --type T -o OUT.gguf\n"
      "Writes a copy of a model with its 2-D weight matrices in another type (1-D tensors such as\n"
      "norms stay as they are, as llama-quantize does); every metadata key is copied. Use it for a\n"
      "draft model of a speculative decoder (its vocabulary is the original's) or to compare types on\n"
      "the same weights. Types: " +
      types +
      ".\n"
      "A matrix whose rows are not a multiple of 256 values cannot hold q2_k, q3_k, q4_k, q5_k, q6_k or\n"
      "iq4_xs; it falls back as with llama-quantize: q2_k, q3_k, iq4_xs → iq4_nl; q4_k → q5_0;\n"
      "q5_k → q5_1; q6_k → q8_0 (f16 when its rows are not a multiple of 32 either). For the other\n"
      "types such a matrix keeps its type. A line on stderr counts the matrices not in type T.";
  if (!parse_args(args, desc, vm, usage, &pos)) return k_exit_ok;
  if (!vm.count("input"))
    throw UsageError("give the input model: loom quantize IN.gguf --type T -o OUT.gguf");
  if (!vm.count("type")) throw UsageError("give --type (" + types + ")");
  if (!vm.count("output")) throw UsageError("give the output file with -o OUT.gguf");
  QuantizeOptions o;
  o.in = vm["input"].as<std::string>();
  const auto t = dtype_from_name(vm["type"].as<std::string>());
  if (!t || !dtype_traits(*t).can_quantize)
    throw UsageError("unknown --type '" + vm["type"].as<std::string>() + "' (" + types + ")");
  o.type = *t;
  o.out = vm["output"].as<std::string>();
  std::map<std::string, int> fallbacks; // type written → matrices
  o.on_fallback = [&](const std::string&, DType used) { ++fallbacks[std::string(dtype_name(used))]; };
  if (stderr_is_tty())
    o.progress = [last = -1](double f) mutable {
      const int pct = static_cast<int>(f * 100);
      if (pct != last) std::fprintf(stderr, "\rquantize: %3d%%", last = pct);
    };
  quantize_model(o);
  if (stderr_is_tty()) std::fprintf(stderr, "\n");
  if (!fallbacks.empty()) {
    std::string s;
    int n = 0;
    for (const auto& [name, count] : fallbacks) {
      s += (s.empty() ? "" : ", ") + std::to_string(count) + " " + name;
      n += count;
    }
    std::fprintf(stderr, "quantize: %d matri%s not in %s (rows not a multiple of its block): %s\n", n,
                 n == 1 ? "x" : "ces", std::string(dtype_name(o.type)).c_str(), s.c_str());
  }
  std::cout << o.out << "\n";
  return k_exit_ok;
}

} // namespace loom::cli
