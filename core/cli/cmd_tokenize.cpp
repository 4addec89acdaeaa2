// `loom tokenize`: the ids a model's tokenizer gives a text.
#include "cli.hpp"
#include "loom/error.hpp"
#include "loom/format/gguf.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace loom::cli {

int cmd_tokenize(const std::vector<std::string>& args) {
  po::options_description desc("loom tokenize options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("model,m", po::value<std::string>(), "model or vocab file (GGUF)")
    ("text", po::value<std::string>(), "text to tokenize")
    ("file,f", po::value<std::string>(), "read the text from a file")
    ("no-bos", "do not add BOS even if the model asks for it")
    ("special", "parse special-token text such as <s> or <|eot_id|>")
    ("pieces", "print id and piece per line instead of the ids")
    ("json", "print a JSON array of ids");
  // clang-format on
  po::variables_map vm;
  if (!parse_args(
          args, desc, vm,
          "usage: loom tokenize -m MODEL.gguf (--text T | --file F) [--no-bos] [--special] [--json]\n"
          "Prints the token ids, space-separated (--json: a JSON array). Special-token text is parsed only\n"
          "with --special."))
    return k_exit_ok;
  if (!vm.count("model")) throw UsageError("give a model with -m MODEL.gguf");
  if (vm.count("text") == vm.count("file")) throw UsageError("give exactly one of --text T or --file F");
  std::string text;
  if (vm.count("text")) {
    text = vm["text"].as<std::string>();
  } else {
    text = read_input_file(vm["file"].as<std::string>(), "--file");
  }
  const GgufFile f = GgufFile::open(vm["model"].as<std::string>());
  const auto tok = Tokenizer::from_gguf(f);
  EncodeOptions o;
  if (vm.count("no-bos")) o.add_bos = false;
  o.parse_special = vm.count("special") != 0;
  const auto ids = tok->encode(text, o);
  if (vm.count("json")) {
    std::cout << nlohmann::json(ids).dump() << "\n";
  } else if (vm.count("pieces")) {
    for (TokenId id : ids)
      std::cout << id << "\t" << nlohmann::json(tok->piece(id)).dump() << "\n";
  } else {
    for (size_t i = 0; i < ids.size(); ++i)
      std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
  }
  return k_exit_ok;
}

} // namespace loom::cli
