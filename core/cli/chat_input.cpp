// Chat input shared by `loom template`, `loom run --messages` and `loom chat`.
#include "cli.hpp"
#include "loom/chat/chat.hpp"
#include "loom/error.hpp"

#include <nlohmann/json.hpp>

namespace loom::cli {

// OpenAI-style input: an array of messages, or an object with "messages" (and maybe "tools").
void read_chat_messages(const std::string& path, chat::RenderInput& in) {
  const std::string text = read_input_file(path, "--messages");
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(Errc::parse_error, "chat", "--messages " + path + ": not JSON (" + e.what() + ")");
  }
  if (j.is_object() && j.contains("messages")) {
    if (j.contains("tools")) in.tools = j["tools"];
    j = j["messages"];
  }
  if (const auto problem = chat::messages_problem(j))
    fail(Errc::invalid_argument, "chat",
         "--messages " + path + ": " + *problem +
             " (expected an array of {\"role\": …, \"content\": …} objects, or an object with \"messages\")");
  in.messages = std::move(j);
}

} // namespace loom::cli
