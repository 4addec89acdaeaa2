#!/usr/bin/env python3
"""Speculative decoding on prompt sets: plain greedy against each variant, prompt by prompt, interleaved.

usage: scripts/bench-speculative-sets.py LOOM TARGET.gguf SET.jsonl [SET.jsonl ...]
           --variant NAME="--decoder speculative --set decoder.drafter='\"ngram\"' ..." [--variant ...]
           [-n 64] [--threads 2] [--rounds 1] [--temp 0] [--seed 1] [--json OUT.json]

Each prompt of a set (JSONL: {"id", "prompt"}) is rendered by the model's chat template (`loom run
--messages`) and its reply generated (at most -n tokens; greedy runs give every variant the same length), first
plainly, then with each variant, in turn (interleaved: a slow period hits every variant alike), `--rounds`
times. Per variant and set it reports the speed-up (variant decode tok/s over plain's on the same prompt
and round): median, geometric mean and range over the prompts; whether greedy outputs were identical;
the decoder's acceptance (α per tested draft position = accepted / (accepted + rejections), mean accepted
per round) and the measured cost ratios: c (a draft forward over the plain one-token forward, 0 without a
draft model) and v (a verification forward over the one-token forward, for the round's actual node count);
and the speed-up the formula (1 − α^(k+1)) / ((1 − α)(k·c + v)) predicts with them, beside the forwards'
accounting (tokens per round over the rounds' forward cost, in one-token forwards). CPU, threads and
command are printed. Markdown on stdout; --json writes every run.
"""
import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(loom, model, prompt, n, threads, temp, seed, extra, ignore_eos=False):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([{"role": "user", "content": prompt}], f)
        path = f.name
    try:
        cmd = [loom, "run", "-m", model, "--messages", path, "-n", str(n), "--json",
               "--temp", str(temp), "--seed", str(seed), "--set", f"backend.threads={threads}",
               "--ctx-size", "2048"] + (["--ignore-eos"] if ignore_eos else []) + extra
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"failed: {shlex.join(cmd)}\n{out.stderr}")
        return json.loads(out.stdout)
    finally:
        os.unlink(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("loom")
    ap.add_argument("target")
    ap.add_argument("sets", nargs="+")
    ap.add_argument("--variant", action="append", default=[], help='NAME="extra loom run arguments"')
    ap.add_argument("-n", type=int, default=256, help="new tokens at most (the reply ends at end-of-turn)")
    ap.add_argument("--ignore-eos", action="store_true", help="always -n tokens (past end-of-turn: the model's "
                    "text after its reply, which no passage grounds)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts of each set")
    ap.add_argument("--json", help="write every run here")
    a = ap.parse_args()
    variants = [(v.split("=", 1)[0], shlex.split(v.split("=", 1)[1])) for v in a.variant]
    runs = []
    print(f"{cpu_name()}, {a.threads} threads; target {os.path.basename(a.target)}; {a.n} tokens, "
          f"temperature {a.temp}, {a.rounds} round(s), interleaved per prompt\n")
    table = []
    for set_path in a.sets:
        prompts = [json.loads(l) for l in open(set_path) if l.strip()]
        if a.limit:
            prompts = prompts[:a.limit]
        per = {name: [] for name, _ in variants}
        for r in range(a.rounds):
            for p in prompts:
                base = run(a.loom, a.target, p["prompt"], a.n, a.threads, a.temp, a.seed, [], a.ignore_eos)
                bm = base["metrics"]
                t1 = (bm["forward_ms"] - bm["prefill_ms"]) / max(len(base["tokens"]) - 1, 1)
                runs.append({"set": set_path, "id": p["id"], "variant": "plain", "round": r, "metrics": bm})
                for name, extra in variants:
                    j = run(a.loom, a.target, p["prompt"], a.n, a.threads, a.temp, a.seed, extra, a.ignore_eos)
                    m = j["metrics"]
                    runs.append({"set": set_path, "id": p["id"], "variant": name, "round": r, "metrics": m})
                    tested = m.get("accepted_tokens", 0) + m.get("rejections", 0)
                    tf = max(m.get("target_forwards", 1) - 1, 1)
                    df = max(m.get("draft_forwards", 0) - 1, 0)
                    draft_ms = m.get("draft_forward_ms", 0.0) - m.get("draft_prefill_ms", 0.0)
                    per[name].append({
                        "speedup": m["decode_tok_s"] / bm["decode_tok_s"],
                        "same": j["tokens"] == base["tokens"],
                        "alpha": m.get("accepted_tokens", 0) / tested if tested else 0.0,
                        "len": m.get("mean_accepted_len", 0.0),
                        "rounds": m.get("draft_rounds", 0), "tf": tf,
                        "k": m.get("k", 0),
                        "c": (draft_ms / df / t1) if df else 0.0,
                        "v": (m["forward_ms"] - m["prefill_ms"]) / tf / t1,
                        "acct": (len(j["tokens"]) - 1) / tf / ((draft_ms / tf if df else 0.0) / t1 +
                                                               (m["forward_ms"] - m["prefill_ms"]) / tf / t1),
                    })
                print(f"  {os.path.basename(set_path)} {p['id']}: " + ", ".join(
                    f"{name} {per[name][-1]['speedup']:.2f}×" for name, _ in variants), file=sys.stderr)
        for name, _ in variants:
            rows = per[name]
            sp = [x["speedup"] for x in rows]
            alpha = statistics.median(x["alpha"] for x in rows)
            k = statistics.median(x["k"] for x in rows)
            c = statistics.median(x["c"] for x in rows)
            v = statistics.median(x["v"] for x in rows)
            gain = (k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
            table.append({
                "set": os.path.basename(set_path), "variant": name, "median": statistics.median(sp),
                "geomean": math.exp(statistics.mean(math.log(x) for x in sp)), "min": min(sp), "max": max(sp),
                "identical": sum(x["same"] for x in rows), "n": len(rows), "alpha": alpha,
                "len": statistics.median(x["len"] for x in rows), "k": k, "c": c, "v": v,
                "formula": gain / (k * c + v), "accounting": statistics.median(x["acct"] for x in rows)})
    print("| set | variant | speed-up median | geo-mean | range | greedy identical | α | accepted / round | k | c | v | formula × | accounting × |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for t in table:
        print(f"| {t['set']} | {t['variant']} | {t['median']:.2f} | {t['geomean']:.2f} | {t['min']:.2f}–{t['max']:.2f} | "
              f"{t['identical']}/{t['n']} | {t['alpha']:.3f} | {t['len']:.2f} | {t['k']:.0f} | {t['c']:.3f} | "
              f"{t['v']:.2f} | {t['formula']:.2f} | {t['accounting']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu_name(), "threads": a.threads, "n": a.n, "temp": a.temp, "table": table,
                       "runs": runs}, f)


if __name__ == "__main__":
    main()
