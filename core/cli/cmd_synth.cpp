// `loom synth`: random-weight models of named shapes, loadable by Loom and llama.cpp alike.
#include "cli.hpp"
#include "loom/chat.hpp"
#include "loom/error.hpp"
#include "loom/synth.hpp"

#include <cstdio>
#include <iostream>

namespace loom::cli {

int cmd_synth(const std::vector<std::string>& args) {
  po::options_description desc("loom synth options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("shape", po::value<std::string>(), "stories15m | stories110m | tinyllama-1.1b | llama-3.2-1b-like | llama-2-7b")
    ("type", po::value<std::string>()->default_value("f32"), "f32 | f16 | bf16 | q8_0 | q4_0 (of the matrices)")
    ("vocab-from", po::value<std::string>(), "copy the vocabulary (tokenizer.* keys) from this GGUF")
    ("seed", po::value<unsigned long long>()->default_value(1), "weights RNG seed")
    ("arch", po::value<std::string>()->default_value("llama"), "llama | llama3 | mistral | qwen2 | qwen3 | gemma2 | phi3")
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
    throw UsageError("unknown --type '" + vm["type"].as<std::string>() + "' (f32, f16, bf16, q8_0, q4_0)");
  o.type = *t;
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
  po::options_description desc("loom quantize options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("input", po::value<std::string>(), "the GGUF model to convert")
    ("type", po::value<std::string>(), "f32 | f16 | bf16 | q8_0 | q4_0 (of the 2-D weights)")
    ("output,o", po::value<std::string>(), "output .gguf");
  // clang-format on
  po::positional_options_description pos;
  pos.add("input", 1);
  po::variables_map vm;
  if (!parse_args(
          args, desc, vm,
          "usage: loom quantize IN.gguf --type T -o OUT.gguf\n"
          "Writes a copy of a model with its 2-D weight matrices in another type (norms stay f32, as\n"
          "llama-quantize does); every metadata key is copied. Use it for a draft model of a speculative\n"
          "decoder (its vocabulary is the original's) or to compare types on the same weights.",
          &pos))
    return k_exit_ok;
  if (!vm.count("input"))
    throw UsageError("give the input model: loom quantize IN.gguf --type T -o OUT.gguf");
  if (!vm.count("type")) throw UsageError("give --type (f32, f16, bf16, q8_0, q4_0)");
  if (!vm.count("output")) throw UsageError("give the output file with -o OUT.gguf");
  QuantizeOptions o;
  o.in = vm["input"].as<std::string>();
  const auto t = dtype_from_name(vm["type"].as<std::string>());
  if (!t)
    throw UsageError("unknown --type '" + vm["type"].as<std::string>() + "' (f32, f16, bf16, q8_0, q4_0)");
  o.type = *t;
  o.out = vm["output"].as<std::string>();
  if (stderr_is_tty())
    o.progress = [last = -1](double f) mutable {
      const int pct = static_cast<int>(f * 100);
      if (pct != last) std::fprintf(stderr, "\rquantize: %3d%%", last = pct);
    };
  quantize_model(o);
  if (stderr_is_tty()) std::fprintf(stderr, "\n");
  std::cout << o.out << "\n";
  return k_exit_ok;
}

} // namespace loom::cli
