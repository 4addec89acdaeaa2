// One loaded Model per file (and attention variant) in the process: pipelines that name the same
// file — `loom ab`'s variants, a draft that is the target, the pipelines of one `loom serve` — share its
// mapping, graphs and repacks (Model is safe to share between threads: its graph cache has a lock).
#include "pipeline/builder.hpp"

#include <filesystem>
#include <map>
#include <mutex>

namespace loom {

std::shared_ptr<Model> shared_model(const std::string& path, const AttentionChoice& choice) {
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, std::weak_ptr<Model>> cache;
  std::error_code ec;
  const std::string key = std::filesystem::weakly_canonical(path, ec).string();
  const std::string ckey = choice.variant + "|" + choice.kernel + "|" + std::to_string(choice.window) + "|" +
                           std::to_string(choice.sinks) + "|" +
                           (choice.softcap ? std::to_string(*choice.softcap) : std::string("-"));
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[{ec ? path : key, ckey}];
  if (auto m = slot.lock()) return m;
  std::shared_ptr<Model> m = Model::load(path);
  m->set_attention(make_attention_variant(m->config(), choice));
  slot = m;
  return m;
}

} // namespace loom
