#!/usr/bin/env python3
"""Soak test for `loom serve`: one server on 127.0.0.1 (port 0) with a tight KV budget, and for --seconds a mix of
well-behaved and hostile clients in --clients threads. At the end, once the server is quiet, it must hold:

  - no request running or waiting (vllm:num_requests_running, vllm:num_requests_waiting = 0)
  - no KV in use (vllm:kv_cache_usage_perc = 0)
  - RSS within 10 % of its value after the warm-up (a warm-up of every client kind at the same concurrency),
    both read with no request running and no connection open (past the idle timeout)
  - no 5xx except 503 ("server full"), no well-behaved client left without a reply, no stream cut short
  - the process alive all along, /health and a completion still answered, a SIGTERM exit within the drain

Client kinds (each operation bounded in time): normal completions and chats; streamed; disconnect midway
(a stream closed after its first event); malformed JSON; slow senders (a header byte per 0.5 s); non-reading
streamed clients (SO_RCVBUF 4096, held a few seconds, then closed); and 10 % nested-JSON bombs (a message
content 100000 deep: must be a 400).

  scripts/soak_serve.py build/bin/loom --model ../shared/models/stories260K.gguf --seconds 60 --clients 16 \
      --json soak.json

Prints counts per kind and status, RSS before / after, requests/s; writes --json; exits 1 on any violation
(2 when the server does not start). Standard library only. The whole run takes at most --warmup + --seconds + 52 s.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict

MB = 1 << 20
WORDS = ("once upon a time there was a little girl named lily she liked to play in the park with her dog "
         "and her friend tom one day they found a big red ball under a tree").split()


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("loom", help="the loom binary")
    ap.add_argument("--model", required=True, help="GGUF model")
    ap.add_argument("--config", help="a pipeline TOML (-c); default: the model alone (-m)")
    ap.add_argument("--seconds", type=float, default=60, help="soak duration (default 60)")
    ap.add_argument("--clients", type=int, default=16, help="client threads (default 16)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=float, default=15,
                    help="seconds of every client kind before the RSS baseline (default 15: the allocator's "
                         "arenas and the worker pool reach their size)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="an extra argument for `loom serve` (repeatable; e.g. --serve-arg=--set "
                         "--serve-arg=backend.name=reference)")
    return ap.parse_args()


A = parse_args()
if not os.path.exists(A.model):
    print(f"SKIPPED: {A.model} is missing (set LOOM_TEST_MODELS)")
    sys.exit(0)
T0 = time.time()
HARD_END = T0 + A.warmup + A.seconds + 52  # every phase is cut to stay inside this
WARM_SECONDS = A.warmup
OP_TIMEOUT = 12.0  # one client operation's socket timeout, and the most a stream is read for
violations = []
lock = threading.Lock()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def violation(what):
    with lock:
        if what not in violations:
            violations.append(what)
    log("VIOLATION:", what)


def left(reserve=0.0):
    return HARD_END - reserve - time.time()


# ---- the server ----
HELP = subprocess.run([A.loom, "serve", "--help"], capture_output=True, text=True, timeout=30)
HELP = HELP.stdout + HELP.stderr


def if_supported(name, value):
    if re.search(re.escape(name) + r"\b", HELP):
        return [name, str(value)]
    log(f"note: this binary's `loom serve` has no {name}")
    return []


HEADER_TIMEOUT, WRITE_TIMEOUT, DRAIN_TIMEOUT, IDLE_TIMEOUT = 2, 3, 3, 5
cmd = [A.loom, "serve", *(["-c", A.config] if A.config else []), "-m", A.model, "--port", "0",
       "--parallel", "4", "--ctx-size", "256",
       "--set", "kv_cache.store=paged", "--set", "kv_cache.max_tokens=512",  # 32 blocks: less than 4 x 256
       "--timeout", str(HEADER_TIMEOUT),
       *if_supported("--write-timeout", WRITE_TIMEOUT), *if_supported("--idle-timeout", IDLE_TIMEOUT),
       *if_supported("--drain-timeout", DRAIN_TIMEOUT), *A.serve_arg]
# The server shares two cores with 16 client threads (and, under `ctest -j2`, with another test): OpenMP's
# default spin-wait then makes every forward wait out time slices at its barriers (normal completions
# 1.9 s instead of 0.13 s with two CPU hogs beside it); docs/serving.md says to run it passive there.
env = dict(os.environ)
env.setdefault("OMP_WAIT_POLICY", "passive")
log("start:", " ".join(cmd[1:]), f"(OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']})")
proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
server_log = []
PORT = None
t_start = time.time()
while time.time() - t_start < 20:
    line = proc.stderr.readline()
    if not line:
        break
    server_log.append(line)
    m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    if m:
        PORT = int(m.group(1))
        break
if PORT is None:
    proc.kill()
    proc.wait()
    print("the server did not start:\n" + "".join(server_log)[-3000:], file=sys.stderr)
    sys.exit(2)
threading.Thread(target=lambda: [server_log.append(x) for x in proc.stderr], daemon=True).start()
log(f"server: pid {proc.pid}, port {PORT}")
died_at = []


def alive():
    if proc.poll() is None:
        return True
    if not died_at:
        died_at.append(time.time() - T0)
        violation(f"the server exited with {proc.returncode} at {died_at[0]:.1f} s: "
                  + "".join(server_log)[-300:].replace("\n", " | "))
    return False


def rss():
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def request(method, path, body=None, timeout=OP_TIMEOUT):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    try:
        c.request(method, path, body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def metrics():
    try:
        st, raw = request("GET", "/metrics", timeout=3)
    except (OSError, http.client.HTTPException):
        return {}
    out = {}
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "num_preemptions_total",
                 "request_cancelled_total", "request_success_total", "http_request_errors_total"):
        m = re.search(r"^vllm:" + name + r"\{[^}]*\} (\S+)$", raw.decode(), re.M)
        if m:
            out[name] = float(m.group(1))
    m = re.search(r"^loom:heap_in_use_bytes (\S+)$", raw.decode(), re.M)  # malloc's count, beside the RSS
    if m:
        out["heap_in_use_mb"] = round(float(m.group(1)) / MB, 1)
    return out


# ---- the client kinds: each returns a status label ----
def prompt(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24)))


def status_label(st):
    return str(st)


def k_normal(rng):
    if rng.random() < 0.5:
        body = {"prompt": prompt(rng), "max_tokens": rng.randint(1, 48)}
        path = "/v1/completions"
    else:
        body = {"messages": [{"role": "user", "content": prompt(rng)}], "max_tokens": rng.randint(1, 48)}
        path = "/v1/chat/completions"
    if rng.random() < 0.3:
        body["temperature"] = 0.8
        body["seed"] = rng.randint(0, 1 << 30)
    st, raw = request("POST", path, json.dumps(body).encode())
    return status_label(st)


def read_events(c, r, stop_after_first=False):
    """Reads a stream's events for at most OP_TIMEOUT (socket.timeout past it); returns (events, saw [DONE])."""
    buf, events = b"", 0
    deadline = time.time() + OP_TIMEOUT
    while True:
        remaining = deadline - time.time()
        if remaining <= 0:
            raise socket.timeout("the stream ran past the operation's timeout")
        c.sock.settimeout(remaining)
        data = r.read1(65536)
        if not data:
            return events, False
        buf += data
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            line = ev.strip()
            if line == b"data: [DONE]":
                return events, True
            if line.startswith(b"data: "):
                events += 1
                if b'"error"' in line[:40]:
                    return events, False
                if stop_after_first:
                    return events, False


def stream_request(rng, max_tokens):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=OP_TIMEOUT)
    body = {"prompt": prompt(rng), "max_tokens": max_tokens, "stream": True}
    c.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return c, c.getresponse()


def k_streamed(rng):
    c, r = stream_request(rng, rng.randint(4, 64))
    try:
        if r.status != 200:
            r.read()
            return status_label(r.status)
        n, done = read_events(c, r)
        return "200 [DONE]" if done else "200 cut short"
    finally:
        c.close()


def k_disconnect(rng):
    c, r = stream_request(rng, 200)
    try:
        if r.status != 200:
            r.read()
            return status_label(r.status)
        read_events(c, r, stop_after_first=True)
        return "200 dropped by the client"
    finally:
        c.close()


MALFORMED = [b"{not json", b'{"prompt": "x", "max_tokens": "ten"}', b'{"prompt": ', b"[1, 2, 3]",
             b'{"messages": "hello"}', b"\xff\xfe\x00garbage", b'{"prompt": "x", "n": -1}', b""]


def k_malformed(rng):
    body = rng.choice(MALFORMED)
    st, raw = request("POST", rng.choice(["/v1/completions", "/v1/chat/completions"]), body)
    return status_label(st)


def k_slow(rng):
    """A header byte per 0.5 s: the server must drop it after its header timeout."""
    s = socket.create_connection(("127.0.0.1", PORT), timeout=OP_TIMEOUT)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 40\r\n\r\n")
    t0 = time.time()
    try:
        s.settimeout(0.5)
        for b in head:
            if time.time() - t0 > HEADER_TIMEOUT + 3:
                return "still open past the header timeout"
            try:
                s.send(bytes([b]))
            except OSError:
                return "dropped by the server"
            try:
                got = s.recv(4096)
                if got == b"":
                    return "dropped by the server"
                m = re.match(rb"HTTP/1\.[01] (\d+)", got)
                return (m.group(1).decode() + " then dropped") if m else "dropped by the server"
            except socket.timeout:
                pass
            except OSError:
                return "dropped by the server"
        return "whole header sent"
    finally:
        s.close()


def k_nonreading(rng):
    """A stream from a client that reads nothing for a few seconds, then goes away."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(OP_TIMEOUT)
    try:
        s.connect(("127.0.0.1", PORT))
        body = json.dumps({"prompt": prompt(rng), "max_tokens": 200, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(min(4.0, max(0.0, STOP_AT - time.time() + 1)))
        return "held unread, closed"
    finally:
        s.close()


BOMB = b'{"max_tokens":4,"messages":[{"role":"user","content":' + b"[" * 100000 + b"]" * 100000 + b"}]}"


def k_bomb(rng):
    st, raw = request("POST", "/v1/chat/completions", BOMB)
    return status_label(st)


KINDS = {  # name: (function, weight in %)
    "normal": (k_normal, 30), "streamed": (k_streamed, 20), "disconnect midway": (k_disconnect, 10),
    "malformed JSON": (k_malformed, 10), "slow sender": (k_slow, 10), "non-reading stream": (k_nonreading, 10),
    "nested-JSON bomb": (k_bomb, 10),
}
EXPECTED = {  # what each kind may get; anything else is a violation (503: the server is full, allowed)
    "normal": {"200", "503"}, "streamed": {"200 [DONE]", "503"},
    "disconnect midway": {"200 dropped by the client", "503"},
    "malformed JSON": {"400", "404", "413", "415", "422", "503"},
    "slow sender": {"dropped by the server", "400 then dropped", "408 then dropped", "503 then dropped"},
    "non-reading stream": {"held unread, closed"}, "nested-JSON bomb": {"400", "413", "503"},
}
counts = defaultdict(lambda: defaultdict(int))
latency = defaultdict(list)
STOP_AT = 0.0


def run_clients(n, until, record):
    names = list(KINDS)
    weights = [KINDS[k][1] for k in names]

    def worker(i):
        rng = random.Random(A.seed * 1000 + i + int(until))
        while time.time() < until and alive():
            kind = rng.choices(names, weights)[0]
            t0 = time.time()
            try:
                label = KINDS[kind][0](rng)
            except socket.timeout:
                label = "timeout"
            except (OSError, http.client.HTTPException) as e:
                label = "error: " + type(e).__name__
            dt = time.time() - t0
            with lock:
                if record:
                    counts[kind][label] += 1
                    latency[kind].append(dt)
            if record and label not in EXPECTED[kind]:
                st = label.split()[0]
                if st.isdigit() and int(st) >= 500 and int(st) != 503:
                    violation(f"a 5xx other than 503: {kind} got {label}")
                elif label == "timeout":
                    pass  # a slow reply on a loaded machine: counted and printed; the liveness probe judges
                elif alive():
                    violation(f"{kind}: {label}")

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def join(threads, until):
    for t in threads:
        t.join(max(0.0, until - time.time()))
    stuck = sum(t.is_alive() for t in threads)
    if stuck:
        violation(f"{stuck} client thread(s) still in an operation at the end (an operation past its timeouts)")


def wait_quiet(seconds):
    """Until no request runs or waits and no KV is in use; returns the last metrics."""
    t0 = time.time()
    m = {}
    while time.time() - t0 < seconds and alive():
        m = metrics()
        if m.get("num_requests_running") == 0 and m.get("num_requests_waiting") == 0 \
                and m.get("kv_cache_usage_perc") == 0:
            break
        time.sleep(0.25)
    return m


def settle():
    """Past the idle timeout, so that the RSS is read in one state each time: no request, no connection."""
    time.sleep(min(IDLE_TIMEOUT + 1, max(0.5, left(12))))


# ---- a liveness probe all along: GET /health once a second must answer 200 within 3 s ----
probe = {"n": 0, "failed": 0, "slow": 0, "max_s": 0.0, "first_failure": None}
probe_stop = threading.Event()


def prober():
    while not probe_stop.wait(1.0):
        if proc.poll() is not None:
            return
        t0 = time.time()
        try:
            st, _ = request("GET", "/health", timeout=3)
        except (OSError, http.client.HTTPException) as e:
            st = "error: " + type(e).__name__
        dt = time.time() - t0
        with lock:
            probe["n"] += 1
            probe["max_s"] = max(probe["max_s"], dt)
            if st != 200:
                probe["failed"] += 1
                if probe["first_failure"] is None:
                    probe["first_failure"] = round(time.time() - T0, 1)
                    log(f"the liveness probe failed: /health {st} after {dt:.1f} s")


threading.Thread(target=prober, daemon=True).start()

# ---- warm-up: every kind at the same concurrency, then quiet, then the RSS baseline ----
log(f"warm-up: {WARM_SECONDS:.0f} s of every client kind at {A.clients} clients")
STOP_AT = time.time() + WARM_SECONDS
join(run_clients(A.clients, STOP_AT, record=False), STOP_AT + OP_TIMEOUT + 2)
m_warm = wait_quiet(3)
settle()
rss_warm = rss()
log(f"after the warm-up: RSS {rss_warm / MB if rss_warm else 0:.1f} MB; metrics {m_warm}")

# ---- the soak ----
soak_t0 = time.time()
soak_for = max(1.0, min(A.seconds, left(30)))  # (what the warm-up took beyond its share is taken from here)
STOP_AT = soak_t0 + soak_for
log(f"soak: {soak_for:.0f} s, {A.clients} clients; kinds (weight %): "
    + ", ".join(f"{k} {w}" for k, (_, w) in KINDS.items()))
threads = run_clients(A.clients, STOP_AT, record=True)
rss_peak = rss_warm or 0
rss_timeline = []  # (seconds into the soak, MB) every 10 s
while time.time() < STOP_AT and alive():
    now_rss = rss() or 0
    rss_peak = max(rss_peak, now_rss)
    if not rss_timeline or time.time() - soak_t0 >= rss_timeline[-1][0] + 10:
        rss_timeline.append((round(time.time() - soak_t0), round(now_rss / MB, 1),
                             metrics().get("heap_in_use_mb")))
    time.sleep(0.5)
join(threads, min(STOP_AT + OP_TIMEOUT + 2, HARD_END - 14))
soak_seconds = time.time() - soak_t0

# ---- the end: quiet, then the checks ----
m_end = wait_quiet(max(1.0, min(8, left(18))))
settle()
rss_end = rss()
if alive():
    if m_end.get("num_requests_running") != 0:
        violation(f"requests still running once quiet: {m_end.get('num_requests_running')}")
    if m_end.get("num_requests_waiting", 0) != 0:
        violation(f"requests still waiting once quiet: {m_end.get('num_requests_waiting')}")
    if m_end.get("kv_cache_usage_perc") != 0:
        violation(f"KV still in use once quiet: {m_end.get('kv_cache_usage_perc')}")
    if rss_warm and rss_end and rss_end > rss_warm * 1.10:
        violation(f"RSS grew past 10 % of its post-warm-up value: {rss_warm / MB:.1f} -> {rss_end / MB:.1f} MB")
    try:
        st_h, _ = request("GET", "/health", timeout=2)
        st_c, _ = request("POST", "/v1/completions", json.dumps({"prompt": "Once", "max_tokens": 4}).encode(),
                          timeout=3)
    except (OSError, http.client.HTTPException) as e:
        st_h = st_c = "error: " + type(e).__name__
    if st_h != 200 or st_c != 200:
        violation(f"the server does not answer at the end: /health {st_h}, a completion {st_c}")
probe_stop.set()
if probe["failed"]:
    violation(f"the liveness probe (/health each second, 3 s allowed) failed {probe['failed']} of {probe['n']} "
              f"times, first at {probe['first_failure']} s")
rc, exit_s = proc.poll(), None
if rc is None:
    t_term = time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=max(1.0, min(DRAIN_TIMEOUT + 3, left(0.5))))
        exit_s = time.time() - t_term
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        exit_s = time.time() - t_term
        violation(f"no exit {exit_s:.1f} s after SIGTERM (killed)")
        rc = "killed"
    else:
        if rc != 0:
            violation(f"exit {rc} after SIGTERM")

# ---- the summary ----
ops = sum(sum(v.values()) for v in counts.values())
print("\nkind                  ops  statuses (mean s)")
for kind in KINDS:
    c = counts.get(kind, {})
    mean = sum(latency[kind]) / len(latency[kind]) if latency[kind] else 0
    print(f"  {kind:20s} {sum(c.values()):4d}  " + ", ".join(f"{k}: {v}" for k, v in sorted(c.items()))
          + f"  ({mean:.2f})")
print(f"operations: {ops} in {soak_seconds:.1f} s = {ops / max(soak_seconds, 1e-9):.1f} /s")
print(f"RSS: {(rss_warm or 0) / MB:.1f} MB after the warm-up, peak {rss_peak / MB:.1f} MB, "
      f"{(rss_end or 0) / MB:.1f} MB at the end")
print(f"liveness probe: {probe['n']} GET /health, {probe['failed']} failed, slowest {probe['max_s']:.2f} s")
print(f"metrics at the end: {m_end}")
print(f"SIGTERM: exit {rc}" + (f" after {exit_s:.1f} s" if exit_s is not None else ""))
print("RSS during the soak (s: RSS MB / heap in use MB): " + ", ".join(f"{t}: {m} / {h}" for t, m, h in rss_timeline))
print(f"total: {time.time() - T0:.1f} s (limit {A.warmup + A.seconds + 52:.0f} s)")
result = {
    "binary": A.loom, "model": A.model, "server_args": cmd[2:], "seconds": A.seconds, "clients": A.clients,
    "counts": {k: dict(v) for k, v in counts.items()},
    "mean_seconds": {k: sum(v) / len(v) for k, v in latency.items() if v},
    "operations": ops, "operations_per_second": ops / max(soak_seconds, 1e-9),
    "rss_warm_bytes": rss_warm, "rss_peak_bytes": rss_peak, "rss_end_bytes": rss_end,
    "rss_timeline_mb": rss_timeline,
    "metrics_warm": m_warm, "metrics_end": m_end, "exit_code": rc, "exit_seconds": exit_s,
    "server_died_at": died_at[0] if died_at else None,
    "liveness_probe": probe, "violations": violations, "ok": not violations, "total_seconds": time.time() - T0,
}
if A.json:
    with open(A.json, "w") as f:
        json.dump(result, f, indent=1)
if violations:
    print(f"\nsoak: {len(violations)} violation(s):")
    for v in violations:
        print("  " + v)
    sys.exit(1)
print("\nsoak: no violation")
