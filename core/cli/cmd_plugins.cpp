// `loom plugins`: what plugin files are found, what they provide, and why a broken one is unusable.
#include "cli.hpp"
#include "loom/plugin_host.hpp"

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

namespace loom::cli {

int cmd_plugins(const std::vector<std::string>& args) {
  po::options_description desc("loom plugins options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("plugin-path", po::value<std::vector<std::string>>()->composing(), "a directory to search (repeatable), before the one next to loom")
    ("json", "print a JSON array of objects");
  // clang-format on
  po::variables_map vm;
  if (!parse_args(args, desc, vm,
                  "usage: loom plugins [--plugin-path DIR]... [--json]\n"
                  "Lists the plugins found (libloom-*.so): name, kind, version, ABI, path, sha256, score. "
                  "Files that\n"
                  "cannot be used are listed with the reason; they do not make the command fail."))
    return k_exit_ok;
  std::vector<std::string> dirs;
  if (vm.count("plugin-path")) dirs = vm["plugin-path"].as<std::vector<std::string>>();
  PluginRegistry reg;
  const auto infos = reg.discover(plugin_search_dirs(dirs));
  if (vm.count("json")) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& i : infos) {
      nlohmann::json kinds = nlohmann::json::array();
      for (const auto& f : i.factories)
        kinds.push_back({{"kind", f.kind}, {"name", f.name}});
      std::string kind;
      for (const auto& f : i.factories)
        if (kind.find(f.kind) == std::string::npos) kind += (kind.empty() ? "" : ",") + f.kind;
      nlohmann::json o = {
          {"name", i.name},       {"kind", kind},
          {"version", i.version}, {"abi", std::to_string(i.abi_major) + "." + std::to_string(i.abi_minor)},
          {"path", i.path},       {"sha256", i.sha256},
          {"score", i.score},     {"provides", kinds}};
      if (!i.error.empty()) {
        o["error"] = i.error;
        o["abi"] = nullptr;
      }
      out.push_back(o);
    }
    std::cout << out.dump(2) << "\n";
    return k_exit_ok;
  }
  if (infos.empty()) {
    std::cout << "no plugins found (searched:";
    for (const auto& d : plugin_search_dirs(dirs))
      std::cout << " " << d;
    std::cout << ")\n";
    return k_exit_ok;
  }
  for (const auto& i : infos) {
    if (!i.error.empty()) {
      std::printf("%-16s %s\n  %s: %s\n", i.skipped ? "(skipped)" : "(broken)", i.path.c_str(),
                  i.skipped ? "not for this machine" : "error", i.error.c_str());
      continue;
    }
    std::printf("%-16s %-8s ABI %u.%u  score %d  %s\n", i.name.c_str(), i.version.c_str(), i.abi_major,
                i.abi_minor, i.score, i.path.c_str());
    for (const auto& f : i.factories)
      std::printf("  %-8s %s\n", f.kind.c_str(), f.name.c_str());
    std::printf("  sha256 %s\n", i.sha256.c_str());
  }
  return k_exit_ok;
}

} // namespace loom::cli
