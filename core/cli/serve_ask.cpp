// `loom serve`: an OpenAI request's body → the Ask the engine runs (serve_ask.hpp).
#include "serve_ask.hpp"

#include "loom/error.hpp"
#include "loom/sample/sampler.hpp"
#include "loom/sample/stop.hpp"
#include "loom/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <cmath>

namespace loom::cli::serve {

namespace {

// A field of the request, checked for its type; unset (or null) gives nullopt. Unknown fields are ignored,
// as OpenAI does.
std::optional<double> number(const json& j, const char* key, double lo, double hi) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) bad(key, std::string("'") + key + "' must be a number");
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi) || !std::isfinite(v))
    bad(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                 "], got " + std::to_string(v));
  return v;
}
std::optional<int64_t> integer(const json& j, const char* key, int64_t lo, int64_t hi) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer() && !it->is_number_unsigned())
    bad(key, std::string("'") + key + "' must be an integer");
  const auto v = it->is_number_unsigned()
                     ? static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), INT64_MAX))
                     : it->get<int64_t>();
  if (v < lo || v > hi)
    bad(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                 "], got " + std::to_string(v));
  return v;
}
std::optional<bool> boolean(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) bad(key, std::string("'") + key + "' must be a boolean");
  return it->get<bool>();
}

// Puts the json_schema stage for `schema` in front of t's chain (the request's or the pipeline's); a schema
// the stage does not take is the client's error, naming `param`.
void constrain(SequenceTemplate& t, const std::string& schema, const char* param) {
  std::shared_ptr<const Sampler> stage;
  try {
    stage = create_sampler({"json_schema", {{"schema", schema}}});
  } catch (const Error& e) {
    bad(param, e.what());
  }
  t.make_chain = [stage, base = t.make_chain] {
    auto c = std::make_unique<SamplerChain>();
    c->add(stage->clone());
    c->add(base());
    return c;
  };
}

// response_format's schema: "" for json_object (any JSON), the given one for json_schema; nullopt for text
// or none.
std::optional<std::string> response_format_schema(const json& j) {
  const auto it = j.find("response_format");
  if (it == j.end() || it->is_null()) return std::nullopt;
  const char* expected = "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}";
  if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
    bad("response_format", expected);
  const std::string type = (*it)["type"].get<std::string>();
  if (type == "json_object") return "";
  if (type == "json_schema") {
    const auto js = it->find("json_schema");
    if (js == it->end() || !js->is_object())
      bad("response_format", "'response_format.json_schema' must be an object {name, schema, strict}");
    const auto sc = js->find("schema");
    if (sc != js->end() && !sc->is_null() && !sc->is_object() && !sc->is_boolean())
      bad("response_format", "'response_format.json_schema.schema' must be a JSON schema object");
    return (sc == js->end() || sc->is_null()) ? std::string() : sc->dump();
  }
  if (type != "text") bad("response_format", expected);
  return std::nullopt;
}

// stop: a string or an array of at most 4 strings.
std::vector<std::string> stop_strings(const json& j) {
  std::vector<std::string> stops;
  const auto it = j.find("stop");
  if (it == j.end() || it->is_null()) return stops;
  if (it->is_string()) {
    stops.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (const auto& e : *it) {
      if (!e.is_string()) bad("stop", "'stop' must be a string or an array of strings");
      stops.push_back(e.get<std::string>());
    }
  } else {
    bad("stop", "'stop' must be a string or an array of strings");
  }
  if (stops.size() > 4) bad("stop", "'stop' takes at most 4 sequences");
  return stops;
}

// Sampling and stop rules from the request, on top of the pipeline's (its end-of-generation tokens): the
// order llama.cpp's server uses — penalties, top-k, top-p, min-p, temperature, then a draw.
std::shared_ptr<SequenceTemplate> sequence_of(const json& j, Service& s) {
  auto t = std::make_shared<SequenceTemplate>(s.pipeline().engine().request_template());
  const auto temperature = number(j, "temperature", 0.0, 2.0);
  const auto top_p = number(j, "top_p", 0.0, 1.0);
  const auto top_k = integer(j, "top_k", -1, 1 << 20);
  const auto min_p = number(j, "min_p", 0.0, 1.0);
  const auto presence = number(j, "presence_penalty", -2.0, 2.0);
  const auto frequency = number(j, "frequency_penalty", -2.0, 2.0);
  const auto repetition = number(j, "repetition_penalty", 0.01, 10.0);
  const bool any = temperature || top_p || top_k || min_p || presence || frequency || repetition;
  if (any) { // a chain of the request's own (otherwise the pipeline's)
    std::vector<SamplerSpec> specs;
    if (presence || frequency || repetition)
      specs.push_back({"penalties",
                       {{"repeat", repetition.value_or(1.0)},
                        {"frequency", frequency.value_or(0.0)},
                        {"presence", presence.value_or(0.0)}}});
    if (top_k && *top_k > 0) specs.push_back({"top_k", {{"k", *top_k}}});
    if (top_p && *top_p < 1.0) specs.push_back({"top_p", {{"p", *top_p}}});
    if (min_p && *min_p > 0.0) specs.push_back({"min_p", {{"p", *min_p}}});
    specs.push_back({"temperature", {{"value", temperature.value_or(1.0)}}}); // OpenAI's default: 1
    t->make_chain = [specs] {
      auto c = std::make_unique<SamplerChain>();
      for (const auto& sp : specs)
        c->add(create_sampler(sp));
      return c;
    };
    (void)t->make_chain(); // a bad parameter is the client's error now, not the engine's later
  }
  // response_format: the json_schema stage in front of the chain (the request's or the pipeline's), so
  // the reply always parses.
  if (const auto schema = response_format_schema(j)) constrain(*t, *schema, "response_format");
  for (auto& x : stop_strings(j))
    if (!x.empty()) t->stop.strings.push_back(std::move(x));
  return t;
}

// tool_choice: "none", "auto" (the default), "required", or a named function (required, of that one);
// the choice, and the function's name when one is named.
std::pair<std::string, std::string> tool_choice_of(const json& j) {
  const char* expected = "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                         "\"function\": {\"name\": …}}";
  std::string choice = "auto", named;
  if (const auto c = j.find("tool_choice"); c != j.end() && !c->is_null()) {
    if (c->is_string()) {
      choice = c->get<std::string>();
    } else if (c->is_object() && c->contains("function") && (*c)["function"].is_object() &&
               (*c)["function"].contains("name") && (*c)["function"]["name"].is_string()) {
      choice = "required";
      named = (*c)["function"]["name"].get<std::string>();
    } else {
      bad("tool_choice", expected);
    }
  }
  if (choice != "none" && choice != "auto" && choice != "required") bad("tool_choice", expected);
  return {choice, named};
}

// tool_choice "required": the schema of one call of an allowed function (all of `tools`, or the one
// named): {"name": …, "arguments": {…}}.
std::string forced_call_schema(const json& tools, const std::string& named) {
  json alts = json::array();
  for (const auto& tool : tools) {
    const auto f = tool.find("function");
    if (f == tool.end() || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string())
      bad("tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\", \"parameters\"}}");
    const std::string name = (*f)["name"].get<std::string>();
    if (!named.empty() && name != named) continue;
    const auto params = f->find("parameters");
    alts.push_back(
        {{"type", "object"},
         {"properties",
          {{"name", {{"const", name}}},
           {"arguments", params != f->end() && params->is_object() ? *params : json{{"type", "object"}}}}},
         {"required", json::array({"name", "arguments"})}});
  }
  if (alts.empty())
    bad("tool_choice", named.empty() ? std::string("'tool_choice' is \"required\" but 'tools' is empty")
                                     : "'tool_choice' names '" + named + "', which is not among 'tools'");
  return (alts.size() == 1 ? alts[0] : json{{"anyOf", alts}}).dump();
}

// A chat request's prompt: its messages (and tools) through the chat template; sets a.tools and
// a.forced_call_schema from tools / tool_choice.
void chat_prompt_of(const json& j, Service& s, Ask& a) {
  Pipeline& p = s.pipeline();
  const auto it = j.find("messages"); // (its shape checked by check_shape)
  if (!s.chat_template())
    bad("messages", "this model has no chat template (tokenizer.chat_template): use /v1/completions");
  chat::RenderInput in;
  in.messages = *it;
  if (const auto t = j.find("tools"); t != j.end() && !t->is_null()) {
    if (!t->is_array()) bad("tools", "'tools' must be an array of {type: \"function\", function: {...}}");
    const auto [choice, named] = tool_choice_of(j);
    if (choice != "none" && !t->empty()) {
      in.tools = *t;
      a.tools = true;
    }
    if (choice == "required") a.forced_call_schema = forced_call_schema(*t, named);
  }
  try {
    chat::ChatPrompt cp =
        chat::chat_prompt(*s.chat_template(), in, p.tokenizer(), p.config().run.parse_special);
    a.prompt = std::move(cp.tokens);
    a.render_ms = cp.render_ms;
    a.tokenize_ms = cp.tokenize_ms;
  } catch (const Error& e) {
    bad("messages", e.what());
  }
}

// A completion request's prompt: a string, an array of token ids, or an array of one string.
std::vector<TokenId> completion_prompt_of(const json& j, Pipeline& p) {
  const auto it = j.find("prompt");
  if (it == j.end()) bad("prompt", "'prompt' is required");
  if (it->is_string()) return p.tokenize(it->get<std::string>());
  if (it->is_array() && !it->empty() &&
      std::all_of(it->begin(), it->end(), [](const json& e) { return e.is_number_integer(); })) {
    std::vector<TokenId> prompt;
    for (const auto& e : *it) {
      const auto v = e.get<int64_t>();
      if (v < 0 || v >= p.tokenizer().vocab_size())
        bad("prompt", "token id " + std::to_string(v) + " is out of range");
      prompt.push_back(static_cast<TokenId>(v));
    }
    return prompt;
  }
  if (it->is_array() && it->size() == 1 && (*it)[0].is_string())
    return p.tokenize((*it)[0].get<std::string>());
  bad("prompt", "'prompt' must be a string or an array of token ids (one prompt per request)");
}

// n and max_tokens (max_completion_tokens first): the reply fits the context, n × max_tokens the server's
// bound.
void lengths_of(const json& j, Service& s, bool chat, Ask& a) {
  const Pipeline& p = s.pipeline();
  if (a.prompt.empty()) bad(chat ? "messages" : "prompt", "the prompt is empty");
  if (static_cast<int64_t>(a.prompt.size()) >= p.n_ctx())
    bad(chat ? "messages" : "prompt", "the prompt is " + std::to_string(a.prompt.size()) +
                                          " tokens; this model's context is " + std::to_string(p.n_ctx()) +
                                          " tokens: shorten it");
  a.n = integer(j, "n", 1, 128).value_or(1);
  auto mt = integer(j, "max_completion_tokens", 0, INT32_MAX);
  if (!mt) mt = integer(j, "max_tokens", 0, INT32_MAX);
  const int64_t room = p.n_ctx() - static_cast<int64_t>(a.prompt.size());
  a.max_tokens = static_cast<int32_t>(std::min<int64_t>(mt.value_or(chat ? room : 16), room));
  if (a.n * std::max<int64_t>(a.max_tokens, 1) > s.options().max_n_tokens)
    bad("n", "n × max_tokens is " + std::to_string(a.n * a.max_tokens) + "; this server allows " +
                 std::to_string(s.options().max_n_tokens));
}

// Chat: logprobs a boolean, top_logprobs 0 … 20 alternatives (with logprobs); completions: logprobs a
// boolean or 0 … 20.
void logprobs_of(const json& j, bool chat, Ask& a) {
  if (chat) {
    a.logprobs = boolean(j, "logprobs").value_or(false);
    a.top_logprobs = static_cast<int32_t>(integer(j, "top_logprobs", 0, 20).value_or(0));
    if (a.top_logprobs > 0 && !a.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  } else if (const auto it = j.find("logprobs"); it != j.end() && !it->is_null()) {
    if (it->is_boolean()) {
      a.logprobs = it->get<bool>();
    } else {
      a.top_logprobs = static_cast<int32_t>(integer(j, "logprobs", 0, 20).value_or(0));
      a.logprobs = true;
    }
  }
}

} // namespace

Ask ask_of(const json& j, Service& s, bool chat) {
  Ask a;
  if (chat) {
    chat_prompt_of(j, s, a);
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    a.prompt = completion_prompt_of(j, s.pipeline());
    a.tokenize_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  lengths_of(j, s, chat, a);
  if (const auto seed = integer(j, "seed", INT64_MIN, INT64_MAX)) a.seed = static_cast<uint64_t>(*seed);
  a.stream = boolean(j, "stream").value_or(false);
  if (const auto it = j.find("stream_options"); it != j.end() && it->is_object())
    a.include_usage = boolean(*it, "include_usage").value_or(false);
  logprobs_of(j, chat, a);
  a.sequence = sequence_of(j, s);
  if (!a.forced_call_schema.empty()) constrain(*a.sequence, a.forced_call_schema, "tools");
  return a;
}

} // namespace loom::cli::serve
