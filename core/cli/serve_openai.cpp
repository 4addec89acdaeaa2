// `loom serve`: OpenAI requests → engine requests → OpenAI responses (whole or streamed as server-sent
// events), the step loop, and the Prometheus metrics.
#include "loom/error.hpp"
#include "loom/gguf.hpp"
#include "loom/sampler.hpp"
#include "loom/stop.hpp"
#include "loom/tokenizer.hpp"
#include "serve.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <malloc.h>

namespace loom::cli::serve {

namespace {

using Clock = std::chrono::steady_clock;

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

// What one OpenAI request asks of the engine.
struct Ask {
  std::vector<TokenId> prompt;
  int64_t n = 1;
  int32_t max_tokens = -1;
  std::optional<uint64_t> seed;
  bool stream = false, include_usage = false;
  bool logprobs = false;
  int32_t top_logprobs = 0; // alternatives per token (chat: top_logprobs; completions: logprobs = N)
  json ab; // the A/B split that chose this pipeline ({split, variant}), reported in every reply
  // tool_choice "required" or a named function: the reply is constrained to one call's JSON
  // ({"name", "arguments"} of the allowed functions), so a call always comes, whatever the model.
  std::string forced_call_schema;
  bool tools = false; // the request gave tools (and tool_choice is not "none"): replies are parsed for calls
  std::shared_ptr<SequenceTemplate> sequence;
};

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
  if (const auto it = j.find("response_format"); it != j.end() && !it->is_null()) {
    const char* expected =
        "'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}";
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
      bad("response_format", expected);
    const std::string type = (*it)["type"].get<std::string>();
    std::optional<std::string> schema;
    if (type == "json_object") {
      schema = "";
    } else if (type == "json_schema") {
      const auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object())
        bad("response_format", "'response_format.json_schema' must be an object {name, schema, strict}");
      const auto sc = js->find("schema");
      if (sc != js->end() && !sc->is_null() && !sc->is_object() && !sc->is_boolean())
        bad("response_format", "'response_format.json_schema.schema' must be a JSON schema object");
      schema = (sc == js->end() || sc->is_null()) ? std::string() : sc->dump();
    } else if (type != "text") {
      bad("response_format", expected);
    }
    if (schema) constrain(*t, *schema, "response_format");
  }
  if (const auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    std::vector<std::string> stops;
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
    for (auto& x : stops)
      if (!x.empty()) t->stop.strings.push_back(std::move(x));
  }
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
    a.prompt = chat::chat_prompt(*s.chat_template(), in, p.tokenizer(), p.config().run.parse_special).tokens;
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

Ask ask_of(const json& j, Service& s, bool chat) {
  Ask a;
  if (chat)
    chat_prompt_of(j, s, a);
  else
    a.prompt = completion_prompt_of(j, s.pipeline());
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

std::string finish_reason(StopReason r) {
  switch (r) {
  case StopReason::eos:
  case StopReason::stop_string:
  case StopReason::stop_token:
    return "stop";
  case StopReason::max_tokens:
  case StopReason::max_context:
    return "length";
  default:
    return "stop";
  }
}

std::string new_id(const char* prefix) {
  static std::atomic<uint64_t> n{0};
  char b[64];
  std::snprintf(b, sizeof b, "%s-%llx%06llx", prefix,
                static_cast<unsigned long long>(std::chrono::system_clock::now().time_since_epoch().count() &
                                                0xffffffffffULL),
                static_cast<unsigned long long>(++n));
  return b;
}

int64_t unix_now() {
  return static_cast<int64_t>(std::time(nullptr));
}

// A token's own bytes (no prefix space stripped, a partial UTF-8 character kept): what OpenAI's
// logprobs report as its text and bytes.
std::string token_bytes(const Tokenizer& tok, TokenId id) {
  DecodeState st;
  st.at_start = false;
  std::string out;
  tok.decode_step(st, id, out, false);
  return out + st.pending;
}

json bytes_json(const std::string& b) {
  json a = json::array();
  for (const char c : b)
    a.push_back(static_cast<uint8_t>(c));
  return a;
}

// OpenAI's logprobs object: chat's content list (token, logprob, bytes, top_logprobs), or completions'
// tokens / token_logprobs / top_logprobs / text_offset.
json logprobs_json(const Tokenizer& tok, const GenerationResult& r, bool chat) {
  const size_t n = std::min(r.tokens.size(), r.logprobs.size());
  json content = json::array(), tokens = json::array(), lps = json::array(), tops = json::array(),
       offsets = json::array();
  size_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::string text = token_bytes(tok, r.tokens[i]);
    const TokenAlternatives* alt = i < r.top_logprobs.size() ? &r.top_logprobs[i] : nullptr;
    if (chat) {
      json top = json::array();
      if (alt)
        for (const auto& [id, lp] : *alt) {
          const std::string t = token_bytes(tok, id);
          top.push_back({{"token", t}, {"logprob", lp}, {"bytes", bytes_json(t)}});
        }
      content.push_back(
          {{"token", text}, {"logprob", r.logprobs[i]}, {"bytes", bytes_json(text)}, {"top_logprobs", top}});
    } else {
      tokens.push_back(text);
      lps.push_back(r.logprobs[i]);
      offsets.push_back(offset);
      offset += text.size();
      if (alt) {
        json top = json::object();
        for (const auto& [id, lp] : *alt)
          top[token_bytes(tok, id)] = lp;
        tops.push_back(top);
      } else {
        tops.push_back(nullptr);
      }
    }
  }
  if (chat) return {{"content", content}};
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// A chat choice: the reply, or its tool calls (OpenAI's tool_calls; finish_reason "tool_calls").
json tool_calls_json(const tools::Parsed& p, size_t choice) {
  json calls = json::array();
  for (size_t k = 0; k < p.calls.size(); ++k)
    calls.push_back({{"index", k},
                     {"id", "call_" + std::to_string(choice) + "_" + std::to_string(k) + new_id("")},
                     {"type", "function"},
                     {"function", {{"name", p.calls[k].name}, {"arguments", p.calls[k].arguments}}}});
  return calls;
}
// A reply's tool calls: a forced call's JSON as it is (the constraint made it {"name", "arguments"}), else
// the template's format.
tools::Parsed reply_calls(Service& s, const Ask& a, const std::string& text) {
  if (!a.forced_call_schema.empty()) {
    try {
      const json j = parse_body(text, RequestLimits{}); // the model's text: bounded like a client's
      if (j.contains("name") && j["name"].is_string() && j.contains("arguments"))
        return tools::Parsed{"", {{j["name"].get<std::string>(), j["arguments"].dump()}}};
    } catch (const BadRequest&) {
    }
    return tools::Parsed{text, {}}; // cut short (max_tokens): the text as content
  }
  return tools::parse(s.tool_format(), text);
}

json chat_choice(Service& s, const Ask& a, const GenerationResult& r, size_t i) {
  if (a.tools) {
    const tools::Parsed p = reply_calls(s, a, r.text);
    if (!p.calls.empty())
      return {{"index", i},
              {"message",
               {{"role", "assistant"},
                {"content", p.content.empty() ? json(nullptr) : json(p.content)},
                {"tool_calls", tool_calls_json(p, i)}}},
              {"finish_reason", "tool_calls"}};
  }
  return {{"index", i},
          {"message", {{"role", "assistant"}, {"content", r.text}}},
          {"finish_reason", finish_reason(r.stop_reason)}};
}

// One Ask on the engine: its n jobs, waited for together; whole, or streamed as server-sent events.
class AskRun {
public:
  AskRun(Service& s, const Ask& a, bool chat, const EventSink* sink)
      : s_(s), a_(a), chat_(chat), sink_(sink), id_(new_id(chat ? "chatcmpl" : "cmpl")), created_(unix_now()),
        model_(s.options().model_name), object_(chat ? "chat.completion" : "text_completion"),
        chunk_object_(chat ? "chat.completion.chunk" : "text_completion") {}

  // The reply (nullopt: streamed, or the client went away).
  std::optional<Reply> operator()(const ClientGone& gone) {
    submit_all();
    streaming_ = a_.stream && sink_;
    if (streaming_ && chat_) // the role first, as OpenAI streams it
      for (int64_t i = 0; i < a_.n; ++i)
        send(chunk(json::array({{{"index", i},
                                 {"delta", {{"role", "assistant"}, {"content", ""}}},
                                 {"finish_reason", nullptr}}})));
    if (!wait_all(gone)) return std::nullopt;
    return end();
  }

private:
  // n engine requests, seeded from the request's seed (or at random); a refused one cancels the others.
  void submit_all() {
    for (int64_t i = 0; i < a_.n; ++i) {
      EngineRequest r;
      r.prompt = a_.prompt;
      r.max_new_tokens = a_.max_tokens;
      r.seed = a_.seed ? *a_.seed + static_cast<uint64_t>(i)
                       : std::random_device{}() * 2654435761ULL + static_cast<uint64_t>(i);
      r.sequence = a_.sequence;
      r.top_logprobs = a_.top_logprobs;
      auto job = std::make_shared<Job>();
      try {
        job->id = s_.submit(std::move(r), job);
      } catch (const Error& e) {
        for (const auto& j : jobs_)
          s_.cancel(j->id);
        if (e.code() == Errc::out_of_memory) bad("", e.what(), 503);
        bad("", e.what());
      }
      jobs_.push_back(job);
    }
    finished_.assign(jobs_.size(), false);
    replies_.assign(jobs_.size(), std::string());
    sent_.assign(jobs_.size(), 0);
    call_began_.assign(jobs_.size(), !a_.forced_call_schema.empty());
  }

  void send(json j) {
    if (!a_.ab.is_null()) j["loom_ab"] = a_.ab;
    if (client_ok_ && !(*sink_)(j.dump(-1, ' ', false, json::error_handler_t::replace))) client_ok_ = false;
  }
  // A streamed event: the envelope around its choices.
  json chunk(json choices) const {
    return {{"id", id_},
            {"object", chunk_object_},
            {"created", created_},
            {"model", model_},
            {"choices", choices}};
  }

  // Waits for every job; streams text as it comes; a client that goes away cancels them all (false).
  bool wait_all(const ClientGone& gone) {
    size_t done = 0;
    while (done < jobs_.size()) {
      for (size_t i = 0; i < jobs_.size(); ++i) {
        if (finished_[i]) continue;
        if (poll(i)) ++done;
      }
      if ((streaming_ && !client_ok_) || gone()) { // the client went away: free its KV in the next step
        cancel_all();
        return false;
      }
    }
    return true;
  }

  // Takes job i's new text (streaming what may go now) and its end; true when it has just ended.
  bool poll(size_t i) {
    Job& jb = *jobs_[i];
    std::string piece;
    bool now_done = false;
    {
      std::unique_lock lk(jb.mu);
      jb.cv.wait_for(lk, std::chrono::milliseconds(jobs_.size() == 1 ? 50 : 5),
                     [&] { return jb.done || !jb.text.empty(); });
      piece.swap(jb.text);
      now_done = jb.done;
    }
    if (held() && !piece.empty()) piece = hold(i, std::move(piece));
    if (streaming_ && !piece.empty()) {
      json choice = chat_ ? json{{"index", i}, {"delta", {{"content", piece}}}, {"finish_reason", nullptr}}
                          : json{{"index", i}, {"text", piece}, {"finish_reason", nullptr}};
      send(chunk(json::array({choice})));
    }
    if (!now_done) return false;
    finished_[i] = true;
    if (streaming_ && held())
      stream_held_end(i, jb.result);
    else if (streaming_)
      stream_end(i, jb.result);
    return true;
  }

  // A reply that may hold tool calls streams its content up to where a call could begin; the rest waits
  // for the end, when it is parsed whole.
  bool held() const { return chat_ && a_.tools; }
  std::string hold(size_t i, std::string piece) {
    replies_[i] += piece;
    piece.clear();
    if (!call_began_[i]) {
      const tools::Streamable st = tools::streamable(s_.tool_format(), replies_[i]);
      call_began_[i] = st.call_began;
      if (st.content > sent_[i]) piece = replies_[i].substr(sent_[i], st.content - sent_[i]);
      sent_[i] = std::max(sent_[i], st.content);
    }
    return piece;
  }

  // A held reply's end: the rest of the content, or the tool calls (arguments whole, never null).
  void stream_held_end(size_t i, const GenerationResult& r) {
    const tools::Parsed p = reply_calls(s_, a_, r.text);
    const std::string rest = sent_[i] < r.text.size() ? r.text.substr(sent_[i]) : "";
    json delta = p.calls.empty() ? json{{"content", rest}}
                                 : json{{"content", nullptr}, {"tool_calls", tool_calls_json(p, i)}};
    send(chunk(json::array({{{"index", i}, {"delta", delta}, {"finish_reason", nullptr}}})));
    json last = {{"index", i},
                 {"delta", json::object()},
                 {"finish_reason", p.calls.empty() ? finish_reason(r.stop_reason) : "tool_calls"}};
    if (a_.logprobs) last["logprobs"] = logprobs_json(s_.pipeline().tokenizer(), r, chat_);
    send(chunk(json::array({last})));
  }

  void stream_end(size_t i, const GenerationResult& r) {
    json choice =
        chat_ ? json{{"index", i}, {"delta", json::object()}, {"finish_reason", finish_reason(r.stop_reason)}}
              : json{{"index", i}, {"text", ""}, {"finish_reason", finish_reason(r.stop_reason)}};
    if (a_.logprobs) // every token's, with the last chunk (clients concatenate them across chunks)
      choice["logprobs"] = logprobs_json(s_.pipeline().tokenizer(), r, chat_);
    send(chunk(json::array({choice})));
  }

  void cancel_all() {
    for (size_t i = 0; i < jobs_.size(); ++i)
      if (!finished_[i]) s_.cancel(jobs_[i]->id);
    for (size_t i = 0; i < jobs_.size(); ++i) { // (the engine ends them at its next step)
      std::unique_lock lk(jobs_[i]->mu);
      jobs_[i]->cv.wait_for(lk, std::chrono::seconds(30), [&] { return jobs_[i]->done; });
    }
  }

  // Every job has ended: an engine error, the usage (streamed) and [DONE], or the whole reply.
  std::optional<Reply> end() {
    int64_t prompt_tokens = static_cast<int64_t>(a_.prompt.size()), completion_tokens = 0;
    for (const auto& j : jobs_)
      completion_tokens += static_cast<int64_t>(j->result.tokens.size());
    const json usage = {{"prompt_tokens", prompt_tokens},
                        {"completion_tokens", completion_tokens},
                        {"total_tokens", prompt_tokens + completion_tokens}};
    for (const auto& j : jobs_)
      if (!j->result.message.empty()) { // the engine failed the request (a backend error, …)
        if (streaming_) {
          send({{"error", {{"message", j->result.message}, {"type", "server_error"}}}});
          return std::nullopt;
        }
        return error_reply(500, j->result.message, "server_error");
      }
    if (streaming_) {
      if (a_.include_usage) {
        json last = chunk(json::array());
        last["usage"] = usage;
        send(std::move(last));
      }
      if (client_ok_) (*sink_)("[DONE]");
      return std::nullopt;
    }
    return whole_reply(usage);
  }

  Reply whole_reply(const json& usage) const {
    json choices = json::array();
    for (size_t i = 0; i < jobs_.size(); ++i) {
      const GenerationResult& r = jobs_[i]->result;
      json c = chat_ ? chat_choice(s_, a_, r, i)
                     : json{{"index", i}, {"text", r.text}, {"finish_reason", finish_reason(r.stop_reason)}};
      c["logprobs"] = a_.logprobs ? logprobs_json(s_.pipeline().tokenizer(), r, chat_) : json(nullptr);
      choices.push_back(std::move(c));
    }
    json body = {{"id", id_},       {"object", object_},  {"created", created_},
                 {"model", model_}, {"choices", choices}, {"usage", usage}};
    if (!a_.ab.is_null()) body["loom_ab"] = a_.ab;
    return Reply{200, body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json"};
  }

  Service& s_;
  const Ask& a_;
  const bool chat_;
  const EventSink* sink_;
  const std::string id_;
  const int64_t created_;
  const std::string& model_;
  const std::string object_, chunk_object_;
  bool streaming_ = false, client_ok_ = true;
  std::vector<std::shared_ptr<Job>> jobs_;
  std::vector<bool> finished_;
  std::vector<std::string> replies_; // with tools: each reply so far
  std::vector<size_t> sent_;         // ... of which streamed as content
  std::vector<bool> call_began_;     // a forced call: held whole
};

// Runs an Ask: n engine requests; whole or streamed. Returns the reply (nullopt: streamed).
std::optional<Reply> run(Service& s, const Ask& a, bool chat, const EventSink* sink, const ClientGone& gone) {
  return AskRun(s, a, chat, sink)(gone);
}

} // namespace

Reply error_reply(unsigned status, const std::string& message, const std::string& type,
                  const std::string& param) {
  const json j = {{"error",
                   {{"message", message},
                    {"type", type},
                    {"param", param.empty() ? json(nullptr) : json(param)},
                    {"code", nullptr}}}};
  return Reply{status, j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json"};
}

// ---- the endpoints ----

namespace {

// GET /v1/models: every served pipeline, then every A/B split with its variants' weights.
Reply models_reply(const Services& ss) {
  json data = json::array();
  for (const auto& s : ss.all())
    data.push_back({{"id", s->options().model_name},
                    {"object", "model"},
                    {"created", unix_now()},
                    {"owned_by", "loom"},
                    {"max_model_len", s->pipeline().n_ctx()}});
  for (const auto& sp : ss.splits()) {
    json variants = json::object();
    for (const auto& v : sp->variants())
      variants[v.service->options().model_name] = v.weight;
    data.push_back({{"id", sp->name()},
                    {"object", "model"},
                    {"created", unix_now()},
                    {"owned_by", "loom"},
                    {"loom_ab", {{"variants", variants}}}});
  }
  return Reply{200, json{{"object", "list"}, {"data", data}}.dump(), "application/json"};
}

// The pipeline a request's `model` names: a served one, or a variant of an A/B split by weight (a
// request's `user` always to the same one; `ab` says which). Null for a name served nowhere.
Service* service_of(Services& ss, const json& j, json& ab) {
  const auto m = j.find("model");
  if (m == j.end() || m->is_null()) return &ss.first();
  if (Service* s = ss.find(m->get<std::string>())) return s;
  Split* split = ss.find_split(m->get<std::string>());
  if (!split) return nullptr;
  const auto user = j.find("user");
  Service* s = &split->pick(user != j.end() && user->is_string() ? user->get<std::string>() : std::string());
  ab = {{"split", split->name()}, {"variant", s->options().model_name}};
  return s;
}

Reply no_such_model(const Services& ss, const std::string& name) {
  std::string names;
  for (const auto& s : ss.all())
    names += (names.empty() ? "'" : ", '") + s->options().model_name + "'";
  for (const auto& sp : ss.splits())
    names += ", '" + sp->name() + "' (a split)";
  return error_reply(404, "the model '" + name + "' does not exist; this server has " + names,
                     "not_found_error", "model");
}

Reply tokenize_reply(Service& s, const json& j) {
  Pipeline& p = s.pipeline();
  const std::vector<TokenId> ids = j.contains("messages") && !j["messages"].is_null()
                                       ? ask_of(json{{"messages", j["messages"]}}, s, true).prompt
                                       : p.tokenize(j["prompt"].get<std::string>());
  return Reply{200, json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", p.n_ctx()}}.dump(),
               "application/json"};
}

Reply detokenize_reply(Service& s, const json& j) {
  Pipeline& p = s.pipeline();
  std::vector<TokenId> ids;
  for (const auto& e : j["tokens"]) {
    const auto v = e.get<int64_t>();
    if (v < 0 || v >= p.tokenizer().vocab_size())
      bad("tokens", "token id " + std::to_string(v) + " is out of range");
    ids.push_back(static_cast<TokenId>(v));
  }
  return Reply{
      200, json{{"prompt", p.tokenizer().decode(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace),
      "application/json"};
}

} // namespace

std::optional<Reply> handle(Services& ss, const std::string& method, const std::string& target,
                            const std::string& body, const EventSink* stream, const ClientGone& gone,
                            bool& wants_stream) {
  wants_stream = false;
  const Route route = route_of(target);
  Service* sp = &ss.first(); // the request's model (errors before it is known count on the first)
  try {
    if (route == Route::none)
      return error_reply(404, "no route " + target.substr(0, target.find('?')), "not_found_error");
    if (method != (is_post(route) ? "POST" : "GET"))
      return error_reply(405, is_post(route) ? "use POST" : "use GET");
    if (route == Route::health) return Reply{200, R"({"status":"ok"})", "application/json"};
    if (route == Route::models) return models_reply(ss);
    if (route == Route::metrics) return Reply{200, render_metrics(ss), "text/plain; version=0.0.4"};
    // Every body passes the bounded parser and its route's shape check before anything else reads it.
    RequestLimits limits;
    limits.max_body = ss.first().options().max_body;
    const json j = parse_body(body, limits);
    check_shape(route, j);
    json ab; // set when the model named an A/B split
    sp = service_of(ss, j, ab);
    if (!sp) {
      sp = &ss.first();
      sp->metrics().http_error();
      return no_such_model(ss, j["model"].get<std::string>());
    }
    if (route == Route::tokenize) return tokenize_reply(*sp, j);
    if (route == Route::detokenize) return detokenize_reply(*sp, j);
    Ask a = ask_of(j, *sp, route == Route::chat);
    a.ab = ab;
    wants_stream = a.stream;
    return run(*sp, a, route == Route::chat, a.stream ? stream : nullptr, gone);
  } catch (const BadRequest& e) {
    sp->metrics().http_error();
    return error_reply(e.status, e.message, e.type, e.param);
  } catch (const Error& e) {
    sp->metrics().http_error();
    return error_reply(400, e.what());
  } catch (
      const std::exception& e) { // a bug or an allocation failure: this request's 500, not the server's end
    sp->metrics().http_error();
    return error_reply(500, std::string("internal error: ") + e.what(), "server_error");
  } catch (...) {
    sp->metrics().http_error();
    return error_reply(500, "internal error", "server_error");
  }
}

// ---- the service: one engine's step loop ----

Service::Service(std::unique_ptr<Pipeline> p, ServeOptions o) : p_(std::move(p)), o_(std::move(o)) {
  // The chat template: --template, else the model's, else the built-in one whose turn tokens the vocabulary
  // holds, else ChatML (as llama-server does), said on stderr.
  try {
    tmpl_.emplace(chat::load_template(o_.chat_template, &p_->model().file()));
  } catch (const Error& e) {
    if (!o_.chat_template.empty()) throw;
    const auto b = chat::builtin_for_vocabulary(p_->model().file());
    const std::string name(b ? *b : "chatml");
    tmpl_.emplace(chat::load_template(name, &p_->model().file()));
    std::fprintf(stderr,
                 "loom serve: the model has no chat template: chat completions use the built-in '%s'\n",
                 name.c_str());
  }
  tool_format_ = tools::format_of_template(
      !o_.chat_template.empty()
          ? std::string_view(o_.chat_template)
          : std::string_view(
                p_->model().file().get_string_opt("tokenizer.chat_template").value_or(tmpl_->name())));
  thread_ = std::thread([this] { loop(); });
}

Service::~Service() {
  stop();
}

void Service::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

RequestId Service::submit(EngineRequest req, const std::shared_ptr<Job>& job) {
  if (snapshot().waiting >= o_.max_queue)
    throw Error(Errc::out_of_memory, "serve",
                "the queue is full (" + std::to_string(o_.max_queue) + " requests waiting): retry later");
  std::weak_ptr<Job> w = job;
  req.on_text = [w](std::string_view t) {
    if (auto j = w.lock()) {
      {
        std::lock_guard lk(j->mu);
        j->text.append(t);
      }
      j->cv.notify_all();
    }
  };
  req.on_finish = [this, w](RequestId, const GenerationResult& r) {
    metrics_.finished(r, r.message.empty());
    --in_flight_;
    if (auto j = w.lock()) {
      {
        std::lock_guard lk(j->mu);
        j->result = r;
        j->done = true;
      }
      j->cv.notify_all();
    }
  };
  ++in_flight_;
  try {
    return p_->engine().submit(std::move(req));
  } catch (...) {
    --in_flight_;
    throw;
  }
}

Service::Snapshot Service::snapshot() const {
  std::lock_guard lk(snap_mu_);
  return snap_;
}

void Service::loop() {
  Engine& e = p_->engine();
  const KVCacheStore& kv = p_->kv_store();
  // Runs until stop() and no request is left (a drain lets the requests in flight finish).
  bool stepped = false; // since the engine was last idle
  while (!stop_ || in_flight_ > 0) {
    if (e.idle() &&
        !e.wait_for_work(std::chrono::milliseconds(50))) { // nothing to step: sleep until a submit
      if (stepped) {    // the load is gone: the allocator's free pages go back to the system (RSS follows
        malloc_trim(0); // the heap instead of its high-water mark; measured by scripts/soak_serve.py)
        stepped = false;
      }
      if (stop_ && in_flight_ == 0) break;
      continue;
    }
    stepped = true;
    (void)e.step(); // (results reach their jobs through on_finish)
    Snapshot sn;
    sn.running = e.n_running();
    sn.waiting = e.n_waiting();
    sn.preemptions = e.stats().preemptions;
    sn.kv_usage =
        kv.n_units() > 0 ? static_cast<double>(kv.units_in_use()) / static_cast<double>(kv.n_units()) : 0.0;
    std::lock_guard lk(snap_mu_);
    snap_ = sn;
  }
}

// ---- metrics ----

void Metrics::Histogram::add(double v) {
  if (counts.empty()) counts.assign(bounds.size() + 1, 0);
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i])
    ++i;
  ++counts[i];
  sum += v;
  ++n;
}

void Metrics::finished(const GenerationResult& r, bool ok) {
  std::lock_guard lk(mu_);
  if (r.stop_reason == StopReason::cancelled)
    ++v_.cancelled;
  else
    (ok ? v_.success : v_.failed) += 1;
  v_.prompt_tokens += static_cast<uint64_t>(r.metrics.n_prompt);
  v_.generation_tokens += static_cast<uint64_t>(r.metrics.n_generated);
  if (r.metrics.n_generated > 0) v_.ttft.add(r.metrics.ttft_ms / 1e3);
  if (r.metrics.n_generated > 1) v_.tpot.add(r.metrics.tpot_ms / 1e3);
  v_.e2e.add(r.metrics.total_ms / 1e3);
  v_.queue.add(r.metrics.queue_ms / 1e3);
}

Metrics::Values Metrics::values() const {
  std::lock_guard lk(mu_);
  Values v = v_;
  v.http_errors = http_errors_.load();
  return v;
}

std::string render_metrics(const Services& ss) {
  struct One {
    std::string label;
    Service::Snapshot snap;
    Metrics::Values v;
  };
  std::vector<One> all;
  for (const auto& s : ss.all())
    all.push_back({"model_name=\"" + s->options().model_name + "\"", s->snapshot(), s->metrics().values()});
  std::string out;
  const auto num = [](double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.17g", v);
    return std::string(b);
  };
  // One family: HELP and TYPE once per namespace, then a sample per model.
  const auto line = [&](const std::string& name, const std::string& type, const std::string& help,
                        const std::function<double(const One&)>& value) {
    for (const char* ns : {"vllm:", "loom:"}) {
      out += "# HELP " + std::string(ns) + name + " " + help + "\n# TYPE " + ns + name + " " + type + "\n";
      for (const One& o : all)
        out += std::string(ns) + name + "{" + o.label + "} " + num(value(o)) + "\n";
    }
  };
  const auto hist = [&](const std::string& name, const std::string& help,
                        const std::function<const Metrics::Histogram&(const One&)>& h) {
    for (const char* ns : {"vllm:", "loom:"}) {
      out += "# HELP " + std::string(ns) + name + " " + help + "\n# TYPE " + ns + name + " histogram\n";
      for (const One& o : all) {
        const Metrics::Histogram& x = h(o);
        uint64_t cum = 0;
        for (size_t i = 0; i <= x.bounds.size(); ++i) {
          cum += x.counts.empty() ? 0 : x.counts[i];
          char le[32];
          if (i < x.bounds.size())
            std::snprintf(le, sizeof le, "%g", x.bounds[i]);
          else
            std::snprintf(le, sizeof le, "+Inf");
          out += std::string(ns) + name + "_bucket{" + o.label + ",le=\"" + le + "\"} " +
                 std::to_string(cum) + "\n";
        }
        out += std::string(ns) + name + "_sum{" + o.label + "} " + num(x.sum) + "\n";
        out += std::string(ns) + name + "_count{" + o.label + "} " + std::to_string(x.n) + "\n";
      }
    }
  };
  const auto d = [](auto v) { return static_cast<double>(v); };
  line("num_requests_running", "gauge", "Requests in the engine's running batch.",
       [&](const One& o) { return d(o.snap.running); });
  line("num_requests_waiting", "gauge", "Requests waiting to start.",
       [&](const One& o) { return d(o.snap.waiting); });
  line("kv_cache_usage_perc", "gauge", "Fraction of the KV cache's blocks in use (1 = full).",
       [&](const One& o) { return o.snap.kv_usage; });
  line("prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
       [&](const One& o) { return d(o.v.prompt_tokens); });
  line("generation_tokens_total", "counter", "Generated tokens of finished requests.",
       [&](const One& o) { return d(o.v.generation_tokens); });
  line("num_preemptions_total", "counter", "Requests preempted (KV taken back, recomputed later).",
       [&](const One& o) { return d(o.snap.preemptions); });
  line("request_success_total", "counter", "Requests that finished without an error.",
       [&](const One& o) { return d(o.v.success); });
  line("request_failure_total", "counter", "Requests that ended with an engine error.",
       [&](const One& o) { return d(o.v.failed); });
  line("request_cancelled_total", "counter", "Requests cancelled (their client went away).",
       [&](const One& o) { return d(o.v.cancelled); });
  line("http_request_errors_total", "counter", "Requests refused with a 4xx/5xx before reaching the engine.",
       [&](const One& o) { return d(o.v.http_errors); });
  hist("time_to_first_token_seconds", "Time to first token.",
       [](const One& o) -> const Metrics::Histogram& { return o.v.ttft; });
  hist("time_per_output_token_seconds", "Time per output token after the first.",
       [](const One& o) -> const Metrics::Histogram& { return o.v.tpot; });
  hist("e2e_request_latency_seconds", "Request latency, submit to end.",
       [](const One& o) -> const Metrics::Histogram& { return o.v.e2e; });
  hist("request_queue_time_seconds", "Time waiting before the first admission.",
       [](const One& o) -> const Metrics::Histogram& { return o.v.queue; });
  { // the process's heap (glibc's count of allocated bytes): what the soak test tells a leak from RSS by
    const struct mallinfo2 mi = mallinfo2();
    out += "# HELP loom:heap_in_use_bytes Heap bytes allocated and not freed (malloc's count).\n"
           "# TYPE loom:heap_in_use_bytes gauge\nloom:heap_in_use_bytes " +
           num(static_cast<double>(mi.uordblks + mi.hblkhd)) + "\n";
  }
  if (!ss.splits().empty()) { // which variant each split chose, for reading production traffic as an A/B
    out += "# HELP loom:ab_requests_total Requests an A/B split ([serve] ab) sent to each variant.\n"
           "# TYPE loom:ab_requests_total counter\n";
    for (const auto& sp : ss.splits())
      for (const auto& v : sp->variants())
        out += "loom:ab_requests_total{split=\"" + sp->name() + "\",variant=\"" +
               v.service->options().model_name + "\"} " + num(static_cast<double>(v.chosen)) + "\n";
  }
  return out;
}

Split::Split(std::string name, std::vector<std::pair<Service*, double>> variants)
    : name_(std::move(name)), rng_(std::random_device{}()) {
  double sum = 0;
  for (const auto& [s, w] : variants)
    sum += w;
  for (const auto& [s, w] : variants)
    v_.push_back({s, w / sum, 0});
}

Service& Split::pick(const std::string& user) {
  std::lock_guard lock(mu_);
  double u;
  if (!user.empty()) { // the same user, the same variant: FNV-1a of the name, as a fraction
    uint64_t h = 1469598103934665603ull;
    for (const char c : user)
      h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
    u = static_cast<double>(h >> 11) * 0x1.0p-53;
  } else {
    u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  }
  size_t i = 0;
  for (double acc = v_[0].weight; i + 1 < v_.size() && u >= acc; acc += v_[++i].weight) {
  }
  ++v_[i].chosen;
  return *v_[i].service;
}

std::vector<Split::Variant> Split::variants() const {
  std::lock_guard lock(mu_);
  return v_;
}

} // namespace loom::cli::serve
