// `loom serve`: the endpoints — an Ask (serve_ask.cpp) on the engine, its replies as OpenAI's responses
// (whole or streamed as server-sent events, with logprobs and tool calls), and the other routes (models,
// tokenize, detokenize, health, metrics).
#include "loom/error.hpp"
#include "loom/tokenizer/tokenizer.hpp"
#include "serve_ask.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace loom::cli::serve {

namespace {

// The first reply's time to first token in its parts (llama-server's `timings` object, ours): the chat
// template, the tokenizer, the wait for admission, the prompt's forward passes, and the engine's own work
// around them up to the first sampled token (scheduling, graphs, sampling, stop rules).
json ttft_timings(const Ask& a, const GenerationMetrics& m) {
  const double engine_own = std::max(0.0, m.ttft_ms - m.queue_ms - m.ttft_forward_ms);
  return {{"ttft_ms", a.render_ms + a.tokenize_ms + m.ttft_ms},
          {"render_ms", a.render_ms},
          {"tokenize_ms", a.tokenize_ms},
          {"queue_ms", m.queue_ms},
          {"prefill_ms", m.ttft_forward_ms},
          {"first_sample_ms", engine_own},
          {"prompt_n", m.n_prompt},
          {"cached_n", m.cached_prompt_tokens}};
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
    // OpenAI's prompt_tokens_details.cached_tokens: the prompt positions the prefix cache had (first choice)
    const int64_t cached = jobs_.empty() ? 0 : jobs_[0]->result.metrics.cached_prompt_tokens;
    json usage = {{"prompt_tokens", prompt_tokens},
                  {"completion_tokens", completion_tokens},
                  {"total_tokens", prompt_tokens + completion_tokens},
                  {"prompt_tokens_details", {{"cached_tokens", cached}}}};
    const json timings = jobs_.empty() ? json(nullptr) : ttft_timings(a_, jobs_[0]->result.metrics);
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
        last["timings"] = timings;
        send(std::move(last));
      }
      if (client_ok_) (*sink_)("[DONE]");
      return std::nullopt;
    }
    return whole_reply(usage, timings);
  }

  Reply whole_reply(const json& usage, const json& timings) const {
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
    body["timings"] = timings;
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

} // namespace loom::cli::serve
