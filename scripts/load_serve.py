#!/usr/bin/env python3
"""Load test for an OpenAI-compatible server (`loom serve`, `llama-server`, vLLM): N streamed completions at
C concurrent clients (closed loop), greedy, each with its own prompt; reports requests/s, output tokens/s
(from the usage chunk, stream_options.include_usage), and TTFT / TPOT percentiles (time to the first content
chunk; the time from it to the last chunk over the tokens after the first).
Standard library only.

  scripts/load_serve.py --url http://127.0.0.1:8080 --model quickstart --concurrency 1,8,64 --requests 64
  scripts/load_serve.py ... --json          # one JSON object per concurrency level
"""
import argparse
import concurrent.futures
import http.client
import json
import statistics
import sys
import time
import urllib.parse

WORDS = ("the cat sat on a warm mat while the dog ran after a red ball in the park and a bird sang from a "
         "tall tree near the river where children played").split()


def prompt(i, n_words):
    return " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(n_words))


def one(url, model, text, max_tokens, api_key):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    body = {"prompt": text, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers=headers)
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    times, chunks, tokens, timings = [], 0, None, {}
    buf = b""
    while True:
        data = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
        if not data:
            break
        buf += data
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            line = ev.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            j = json.loads(line[6:])
            if j.get("usage") and j["usage"].get("completion_tokens") is not None:
                tokens = j["usage"]["completion_tokens"]
            if isinstance(j.get("timings"), dict):  # the server's own breakdown (loom: TTFT's parts)
                timings = j["timings"]
            if j.get("choices") and j["choices"][0].get("text"):
                times.append(time.perf_counter())
                chunks += 1
    c.close()
    t1 = time.perf_counter()
    ttft = times[0] - t0 if times else t1 - t0
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
    # Tokens from the usage chunk where the server sends one (a chunk may carry several tokens' text).
    n = tokens if tokens is not None else chunks
    tpot = (times[-1] - times[0]) / (n - 1) if len(times) > 1 and n > 1 else tpot
    return ttft, tpot, n, t1 - t0, timings


def pct(v, p):
    if not v:
        return 0.0
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default="")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--concurrency", default="1,8,64", help="comma-separated levels")
    ap.add_argument("--requests", type=int, default=64, help="requests per level")
    ap.add_argument("--prompt-words", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for conc in [int(x) for x in a.concurrency.split(",")]:
        one(a.url, a.model, prompt(0, a.prompt_words), 4, a.api_key)  # warm-up
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(conc) as ex:
            res = list(ex.map(lambda i: one(a.url, a.model, prompt(i, a.prompt_words), a.max_tokens, a.api_key),
                              range(a.requests)))
        wall = time.perf_counter() - t0
        ttft = [r[0] * 1e3 for r in res]
        tpot = [r[1] * 1e3 for r in res if r[1] > 0]
        out = sum(r[2] for r in res)
        row = {"concurrency": conc, "requests": a.requests, "wall_s": wall, "requests_per_s": a.requests / wall,
               "output_tokens_per_s": out / wall, "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99),
               "tpot_ms_p50": pct(tpot, 50), "tpot_ms_p99": pct(tpot, 99),
               "tpot_ms_mean": statistics.mean(tpot) if tpot else 0.0}
        # The server's timings, p50 of each (loom: ttft_ms = render + tokenize + queue + prefill + first
        # sample; llama-server: prompt_ms, predicted_ms, …)
        keys = set.intersection(*[set(r[4]) for r in res]) if res else set()
        row["server_timings_p50"] = {k: pct([float(r[4][k]) for r in res], 50) for k in sorted(keys)
                                     if all(isinstance(r[4][k], (int, float)) for r in res)}
        rows.append(row)
        if a.json:
            print(json.dumps(row), flush=True)
        else:
            print(f"concurrency {conc:3d}: {row['requests_per_s']:7.2f} req/s, {row['output_tokens_per_s']:8.1f} tok/s, "
                  f"TTFT p50 {row['ttft_ms_p50']:7.1f} ms p99 {row['ttft_ms_p99']:7.1f} ms, "
                  f"TPOT p50 {row['tpot_ms_p50']:6.2f} ms p99 {row['tpot_ms_p99']:6.2f} ms", flush=True)
            if row["server_timings_p50"]:
                print("  server timings p50: " + ", ".join(f"{k} {v:.2f}" for k, v in row["server_timings_p50"].items()),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
