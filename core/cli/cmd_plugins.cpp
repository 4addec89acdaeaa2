// `loom plugins`: what plugin files are found, what they provide, and why a broken one is unusable.
#include "cli.hpp"
#include "loom/error.hpp"
#include "loom/plugin/plugin_host.hpp"

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
  if (!parse_args(
          args, desc, vm,
          "usage: loom plugins [--plugin-path DIR]... [--json]\n"
          "Lists the plugins found (libloom-*.so): name, kind, version, ABI, path, sha256, score, and what a "
          "plugin says it\nwill use here (a backend: its CPU level or device). "
          "Files that\n"
          "cannot be used are listed with the reason; they do not make the command fail. Each file "
          "is first\n"
          "loaded in a child process, so one that crashes or hangs while loading is reported, not "
          "fatal."))
    return k_exit_ok;
  std::vector<std::string> dirs;
  if (vm.count("plugin-path")) dirs = vm["plugin-path"].as<std::vector<std::string>>();
  PluginRegistry reg;
  DiscoverOptions options;
  options.probe_in_child = true; // a plugin that crashes while loading is listed, not fatal
  const auto infos = reg.discover(plugin_search_dirs(dirs), {}, options);
  if (vm.count("json")) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& i : infos) {
      nlohmann::json kinds = nlohmann::json::array();
      for (const auto& f : i.factories) {
        nlohmann::json k = {{"kind", f.kind}, {"name", f.name}};
        if (!f.error.empty()) k["error"] = f.error; // unknown kind, bad entry: never used
        kinds.push_back(std::move(k));
      }
      std::string kind;
      for (const auto& f : i.factories)
        if (f.error.empty() && kind.find(f.kind) == std::string::npos)
          kind += (kind.empty() ? "" : ",") + f.kind;
      nlohmann::json o = {
          {"name", i.name},       {"kind", kind},
          {"version", i.version}, {"abi", std::to_string(i.abi_major) + "." + std::to_string(i.abi_minor)},
          {"path", i.path},       {"sha256", i.sha256},
          {"score", i.score},     {"provides", kinds}};
      if (!i.description.empty()) o["description"] = i.description;
      if (!i.error.empty()) {
        o["error"] = i.error;
        o["abi"] = nullptr;
      }
      out.push_back(o);
    }
    // Plugin strings and file names are bytes, not necessarily UTF-8: replace invalid sequences with
    // U+FFFD rather than fail.
    std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return k_exit_ok;
  }
  if (infos.empty()) {
    std::cout << "no plugins found (searched:";
    for (const auto& d : plugin_search_dirs(dirs))
      std::cout << " " << d;
    std::cout << ")\n";
    return k_exit_ok;
  }
  // Every value a plugin or a file name supplies is printed with control characters escaped, so
  // each stays on its line.
  auto esc = [](const std::string& s) { return one_line(s); };
  for (const auto& i : infos) {
    if (!i.error.empty()) {
      std::printf("%-16s %s\n  %s: %s\n", i.skipped ? "(skipped)" : "(broken)", esc(i.path).c_str(),
                  i.skipped ? "not for this machine" : "error", esc(i.error).c_str());
      continue;
    }
    std::printf("%-16s %-8s ABI %u.%u  score %d  %s\n", esc(i.name).c_str(), esc(i.version).c_str(),
                i.abi_major, i.abi_minor, i.score, esc(i.path).c_str());
    for (const auto& f : i.factories) {
      if (f.error.empty())
        std::printf("  %-8s %s\n", f.kind.c_str(), esc(f.name).c_str());
      else
        std::printf("  %-8s %s  (unusable: %s)\n", f.kind.c_str(), esc(f.name).c_str(), esc(f.error).c_str());
    }
    if (!i.description.empty()) std::printf("  uses     %s\n", esc(i.description).c_str());
    std::printf("  sha256 %s\n", i.sha256.c_str());
  }
  return k_exit_ok;
}

} // namespace loom::cli
