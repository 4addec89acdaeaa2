// `loom config show`: the pipeline as Loom will run it — defaults filled in, overrides applied.
#include "cli.hpp"
#include "loom/pipeline/pipeline_config.hpp"

#include <iostream>

namespace loom::cli {

int cmd_config(const std::vector<std::string>& args) {
  po::options_description desc("loom config options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("action", po::value<std::string>(), "show")
    ("config,c", po::value<std::string>(), "pipeline TOML file")
    ("set", po::value<std::vector<std::string>>()->composing(), "override a key: section.key=value");
  // clang-format on
  po::positional_options_description pos;
  pos.add("action", 1);
  po::variables_map vm;
  const char* usage =
      "usage: loom config show -c PIPELINE.toml [--set section.key=value]...\n"
      "Validates the pipeline and prints it resolved: every key, defaults filled in, overrides applied.";
  if (!parse_args(args, desc, vm, usage, &pos)) return k_exit_ok;
  if (!vm.count("action") || vm["action"].as<std::string>() != "show")
    throw UsageError(std::string("expected the action 'show'\n") + usage);
  if (!vm.count("config")) throw UsageError("give a pipeline with -c FILE.toml");
  std::vector<ConfigOverride> overrides;
  if (vm.count("set"))
    for (const auto& s : vm["set"].as<std::vector<std::string>>())
      overrides.push_back(parse_override(s));
  const PipelineConfig cfg = load_pipeline(vm["config"].as<std::string>(), overrides);
  std::cout << "# resolved pipeline: " << cfg.source << "\n" << to_toml(cfg);
  return k_exit_ok;
}

} // namespace loom::cli
