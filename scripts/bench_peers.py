#!/usr/bin/env python3
"""Loom against the peers' own `llama-bench` (mainline llama.cpp and/or ik_llama.cpp, each built
natively, e.g. by ../shared/tools/build-peer-bench.sh), like for like, interleaved: for every model,
depth and repetition, one run of `loom bench` and then one of each peer, so machine noise hits all
alike. Prints a Markdown table (medians, [min..max] over the repetitions, Loom ÷ the faster peer)
and, with --json, every run.

  scripts/bench_peers.py --peer mainline=PATH/llama-bench --peer ik=PATH/llama-bench \\
      [--depth 0 --depth 512] [--pp 512] [--tg 128] [-t 2] [-r 1] MODEL.gguf...

Measurements (the same for every engine): prefill = PP tokens in one batch after DEPTH positions;
decode = TG single-token steps after DEPTH (+ nothing else) positions. Loom: `loom bench -d DEPTH`;
mainline: `llama-bench -p PP -n TG -d DEPTH`; a peer named `ik*` (ik_llama.cpp has no -d): its
run-time repacking, flash attention and fused MoE up/gate (`-rtr 1 -fa 1 -fmoe 1`; -fmoe is its default), prefill at depth 0 only, decode at depth D
as `-gp D,TG` (TG tokens timed after a D-token prompt). Peak RSS: each process's maximum resident
set (getrusage of the child)."""
import argparse
import csv
import io
import json
import os
import resource
import statistics
import subprocess
import sys

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("models", nargs="+")
ap.add_argument("--peer", action="append", default=[], help="NAME=PATH to a llama-bench binary")
ap.add_argument("--depth", action="append", type=int, help="positions before the timed steps (default: 0 and 512)")
ap.add_argument("--pp", type=int, default=512)
ap.add_argument("--tg", type=int, default=128)
ap.add_argument("-t", "--threads", type=int, default=2)
ap.add_argument("-r", "--repetitions", type=int, default=1)
ap.add_argument("--loom", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "loom"))
ap.add_argument("--backend", default="cpu")
ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                help="passed to loom bench --set (e.g. backend.f16_as_bf16=true)")
ap.add_argument("--json", action="store_true", help="also print every run as one JSON object per line")
a = ap.parse_args()
depths = a.depth or [0, 512]
peers = []
for p in a.peer:
    name, _, path = p.partition("=")
    if not path or not os.access(path, os.X_OK):
        sys.exit(f"bench_peers.py: --peer {p}: expected NAME=PATH to an executable llama-bench")
    peers.append((name, path))
if not os.access(a.loom, os.X_OK):
    sys.exit(f"bench_peers.py: {a.loom} not found: build Loom first (cmake --build --preset default)")


def run(cmd):
    """stdout of cmd and the child's peak RSS in bytes (a fresh wrapper process per run)."""
    wrap = [sys.executable, "-c",
            "import resource,subprocess,sys\n"
            "p=subprocess.run(sys.argv[1:],stdout=subprocess.PIPE,stderr=subprocess.PIPE)\n"
            "sys.stdout.buffer.write(p.stdout)\n"
            "sys.stderr.write(p.stderr.decode(errors='replace')[-2000:] if p.returncode else '')\n"
            "sys.stderr.write('\\n'+str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss*1024))\n"
            "sys.exit(p.returncode)"] + cmd
    p = subprocess.run(wrap, capture_output=True, text=True)
    if p.returncode != 0:  # the command's own last words (e.g. loom's one-line error for a bad --set)
        said = "\n".join(p.stderr.strip().splitlines()[:-1]).strip()
        sys.exit(f"bench_peers.py: {' '.join(cmd)} failed (exit {p.returncode})" + (f":\n{said}" if said else ""))
    return p.stdout, int(p.stderr.strip().splitlines()[-1])


def loom_run(model, depth):
    out, rss = run([a.loom, "bench", "-m", model, "--pp", str(a.pp), "--tg", str(a.tg), "-d", str(depth), "-r",
                    "1", "-t", str(a.threads), "--set", f'backend.name="{a.backend}"', "--json"]
                   + [arg for kv in a.set for arg in ("--set", kv)])
    d = json.loads(out)
    return {"pp": d["prefill_tok_s"], "tg": d["decode_tok_s"], "rss": rss, "isa": d.get("backend_info", "")}


def peer_run(name, path, model, depth):
    ik = name.startswith("ik")
    cmd = [path, "-m", model, "-t", str(a.threads), "-r", "1", "-o", "csv"]
    if ik:
        cmd += ["-rtr", "1", "-fa", "1", "-fmoe", "1", "-p", str(a.pp) if depth == 0 else "0"]
        cmd += ["-n", str(a.tg)] if depth == 0 else ["-n", "0", "-gp", f"{depth},{a.tg}"]
    else:
        cmd += ["-p", str(a.pp), "-n", str(a.tg), "-d", str(depth)]
    out, rss = run(cmd)
    r = {"pp": None, "tg": None, "rss": rss}
    for row in csv.DictReader(io.StringIO(out)):
        ts = float(row["avg_ts"])
        if int(row["n_prompt"]) > 0 and int(row["n_gen"]) == 0:
            r["pp"] = ts
        elif int(row["n_gen"]) > 0:
            r["tg"] = ts
    return r


def med(xs):
    xs = [x for x in xs if x is not None]
    return (statistics.median(xs), min(xs), max(xs)) if xs else None


def cell(m):
    return "—" if m is None else f"{m[0]:.1f} [{m[1]:.1f}..{m[2]:.1f}]" if m[1] != m[2] else f"{m[0]:.1f}"


rows = []
for model in a.models:
    for depth in depths:
        runs = {"loom": []} | {n: [] for n, _ in peers}
        for rep in range(a.repetitions):
            print(f"bench_peers: {os.path.basename(model)} depth {depth} repetition {rep + 1}/{a.repetitions}",
                  file=sys.stderr)
            runs["loom"].append(loom_run(model, depth))
            for n, p in peers:
                runs[n].append(peer_run(n, p, model, depth))
            if a.json:
                for eng, rs in runs.items():
                    print(json.dumps({"model": model, "depth": depth, "engine": eng} | rs[-1]))
        rows.append((model, depth, runs))

names = [n for n, _ in peers]
print(f"\n{a.threads} threads, pp{a.pp}, tg{a.tg}, {a.repetitions} interleaved run(s); "
      f"Loom: {rows[0][2]['loom'][0]['isa'] if rows else ''}")
head = ["model", "depth", "Loom prefill"] + [f"{n} prefill" for n in names] + ["Loom / best"]
head += ["Loom decode"] + [f"{n} decode" for n in names] + ["Loom / best", "peak RSS MiB (Loom / " + " / ".join(names) + ")"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for model, depth, runs in rows:
    line = [os.path.basename(model), str(depth)]
    for k in ("pp", "tg"):
        lm = med([r[k] for r in runs["loom"]])
        pm = [med([r[k] for r in runs[n]]) for n in names]
        line.append(cell(lm))
        line += [cell(m) for m in pm]
        best = max((m[0] for m in pm if m), default=None)
        line.append(f"**{lm[0] / best:.2f}×**" if lm and best else "—")
    rss = [statistics.median(r["rss"] for r in runs[e]) / 2**20 for e in ["loom"] + names]
    line.append(" / ".join(f"{x:.0f}" for x in rss))
    print("| " + " | ".join(line) + " |")
