#!/usr/bin/env python3
"""Two `loom serve` replicas behind HAProxy (deploy/haproxy/loom.cfg) on loopback: a bounded burst through the
router gets every reply right and spreads over both replicas (least connections); requests that name a
conversation (X-Conversation-Id) stay on one replica; after one replica is killed, every request — those
whose conversation hashed to it included — is served by the other.

usage: test_router.py LOOM_BINARY SOURCE_DIR   (models: $LOOM_TEST_MODELS; LOOM_REQUIRE_HAPROXY=1 makes a
       missing haproxy a failure, as CI sets it: scripts/setup.sh --deps installs it)
"""
import concurrent.futures
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

LOOM, SRC = sys.argv[1], sys.argv[2]
MODELS = os.environ.get("LOOM_TEST_MODELS") or os.path.join(SRC, "..", "shared", "models")
MODEL = os.path.join(MODELS, "stories260K.gguf")
CFG = os.path.join(SRC, "deploy", "haproxy", "loom.cfg")
if not os.path.exists(MODEL):
    print(f"SKIPPED: {MODEL} is missing (set LOOM_TEST_MODELS)")
    sys.exit(0)
HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
if not HAPROXY:
    if os.environ.get("LOOM_REQUIRE_HAPROXY") == "1":
        print("FAIL: haproxy is required here (LOOM_REQUIRE_HAPROXY=1); scripts/setup.sh --deps installs it")
        sys.exit(1)
    print("SKIPPED: haproxy is not installed (scripts/setup.sh --deps installs it)")
    sys.exit(0)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}", flush=True)


def replica():
    p = subprocess.Popen([LOOM, "serve", "-c", os.path.join(SRC, "configs", "quickstart.toml"), "-m", MODEL,
                          "--port", "0", "--set", "stop.eos=false"],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, int(m.group(1))
    raise RuntimeError("a replica did not start")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(port, body, headers=None, stream=False):
    """(status, text, replica header) of one completion."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=stream)).encode(), headers=h)
    r = c.getresponse()
    raw = r.read().decode()
    c.close()
    if r.status != 200:
        return r.status, raw, r.getheader("X-Loom-Replica")
    if not stream:
        return r.status, json.loads(raw)["choices"][0]["text"], r.getheader("X-Loom-Replica")
    text = ""
    for line in raw.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            ch = json.loads(line[6:])["choices"]
            text += ch[0].get("text", "") if ch else ""
    return r.status, text, r.getheader("X-Loom-Replica")


(r1, p1), (r2, p2) = replica(), replica()
router_port = free_port()
env = dict(os.environ, LOOM_ROUTER_BIND=f"127.0.0.1:{router_port}", LOOM_REPLICA_1=f"127.0.0.1:{p1}",
           LOOM_REPLICA_2=f"127.0.0.1:{p2}")
hap = subprocess.Popen([HAPROXY, "-f", CFG, "-db"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
try:
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", router_port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            time.sleep(0.2)
    else:
        raise RuntimeError("the router did not come up")

    prompts = ["Once upon a time", "The little dog", "Lily", "Tom and Sue", "One day", "The sun"]
    alone = {p: post(p1, {"prompt": p, "max_tokens": 24})[1] for p in prompts}

    # ---- a bounded burst: 24 requests, 8 at a time, streamed and not ----
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        futs = [(prompts[i % 6], ex.submit(post, router_port, {"prompt": prompts[i % 6], "max_tokens": 24}, None, i % 2 == 0))
                for i in range(24)]
        got = [(p, f.result(timeout=120)) for p, f in futs]
    check(all(st == 200 and text == alone[p] for p, (st, text, _) in got),
          "every reply through the router equals the request alone: " + repr([g for g in got if g[1][1] != alone[g[0]]][:2]))
    served = {rep for _, (_, _, rep) in got}
    check(served == {"r1", "r2"}, "least connections spreads a burst over both replicas: " + repr(served))
    print(f"burst of 24 through the router: {time.time() - t0:.2f} s, replicas {sorted(served)}", flush=True)

    # ---- affinity: a conversation stays on one replica ----
    homes = {}
    for conv in [f"conversation-{k}" for k in range(8)]:
        reps = {post(router_port, {"prompt": "Lily", "max_tokens": 4}, {"X-Conversation-Id": conv})[2] for _ in range(3)}
        check(len(reps) == 1, f"{conv} stays on one replica: {reps}")
        homes[conv] = reps.pop()
    check(set(homes.values()) == {"r1", "r2"}, "conversations hash over both replicas: " + repr(homes))

    # ---- failover: kill r1; everything goes to r2, r1's conversations included ----
    r1.send_signal(signal.SIGKILL)
    r1.wait(10)
    moved = [c for c, h in homes.items() if h == "r1"]
    results = [post(router_port, {"prompt": "Lily", "max_tokens": 4}, {"X-Conversation-Id": c}) for c in moved]
    results += [post(router_port, {"prompt": p, "max_tokens": 24}) for p in prompts]
    check(all(st == 200 and rep == "r2" for st, _, rep in results),
          "after r1 is killed every request is served by r2: " + repr([(st, rep) for st, _, rep in results]))
    check(all(text == alone[p] for p, (st, text, rep) in zip(prompts, results[len(moved):])),
          "... with the same replies")
finally:
    for p in (hap, r1, r2):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in (hap, r1, r2):
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()

if failures:
    print(f"{len(failures)} check(s) failed", flush=True)
    sys.exit(1)
print("router: every check passed", flush=True)
