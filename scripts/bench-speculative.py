#!/usr/bin/env python3
"""Speculative decoding, measured: target alone vs speculative, side by side, interleaved runs.

usage: scripts/bench-speculative.py LOOM TARGET.gguf [--draft NAME=FILE]... [--ngram] [--self]
                                   [-k 4] [-n 64] [--threads 2] [--runs 3] [--backend cpu]

For each drafter it reports the target's tok/s alone and with speculative decoding (median and
range over the runs), the acceptance rate alpha, the mean accepted length per round, the draft/target
cost ratio c (the draft model's own decode time per token over the target's, measured here; 0 for
the n-gram drafter), the speed-up alpha and c predict, (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)),
and the measured speed-up. Greedy (--temp 0), --ignore-eos, the same prompt in every run.
Markdown on stdout; --json for the raw numbers.
"""
import argparse
import json
import statistics
import subprocess
import sys


def run(loom, model, args, n, threads, backend, extra):
    cmd = [loom, "run", "-m", model, "-p", args.prompt, "-n", str(n), "--temp", "0", "--ignore-eos",
           "--json", "--no-echo", "--set", f'backend.name="{backend}"', "--set", f"backend.threads={threads}",
           "--ctx-size", "512"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    j = json.loads(out)
    m = j["metrics"]
    return m, j["tokens"]


def med(xs):
    return statistics.median(xs), min(xs), max(xs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("loom")
    ap.add_argument("target")
    ap.add_argument("--draft", action="append", default=[], help="NAME=FILE: a draft model")
    ap.add_argument("--ngram", action="store_true", help="also the n-gram drafter")
    ap.add_argument("--self", action="store_true", help="also the target as its own draft")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    drafters = [(name, path) for name, path in (d.split("=", 1) for d in a.draft)]
    if a.self:
        drafters.append(("target itself", a.target))
    if a.ngram:
        drafters.append(("n-gram", None))

    alone = {"tok_s": []}
    own = {path: [] for _, path in drafters if path}  # the draft model's own decode tok/s
    spec = {name: {"tok_s": [], "alpha": [], "len": [], "tf": []} for name, _ in drafters}
    ref_tokens = None
    for r in range(a.runs):  # interleaved: every configuration once per round
        m, toks = run(a.loom, a.target, a, a.n, a.threads, a.backend, [])
        alone["tok_s"].append(m["decode_tok_s"])
        ref_tokens = ref_tokens or toks
        for path in own:
            m, _ = run(a.loom, path, a, a.n, a.threads, a.backend, [])
            own[path].append(m["decode_tok_s"])
        for name, path in drafters:
            extra = ["--decoder", "speculative", "--set", f"decoder.k={a.k}"]
            extra += ["--set", f'decoder.draft="{path}"'] if path else ["--set", 'decoder.drafter="ngram"']
            m, toks = run(a.loom, a.target, a, a.n, a.threads, a.backend, extra)
            if toks != ref_tokens:
                print(f"warning: {name}: greedy output differs from the target's", file=sys.stderr)
            s = spec[name]
            s["tok_s"].append(m["decode_tok_s"])
            s["alpha"].append(m["acceptance_rate"])
            s["len"].append(m["mean_accepted_len"])
            s["tf"].append(m["target_forwards"])

    base = statistics.median(alone["tok_s"])
    rows = []
    for name, path in drafters:
        s = spec[name]
        alpha = statistics.median(s["alpha"])
        c = base / statistics.median(own[path]) if path else 0.0
        k = a.k
        pred = (k + 1) / (k * c + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
        meas = statistics.median(s["tok_s"]) / base
        rows.append({"drafter": name, "alpha": alpha, "mean_accepted_len": statistics.median(s["len"]),
                     "c": c, "predicted": pred, "measured": meas, "tok_s": med(s["tok_s"]),
                     "target_forwards": statistics.median(s["tf"])})
    if a.json:
        print(json.dumps({"target": a.target, "alone_tok_s": med(alone["tok_s"]), "k": a.k, "rows": rows}, indent=1))
        return
    lo, hi = min(alone["tok_s"]), max(alone["tok_s"])
    print(f"target {a.target}: {base:.1f} tok/s alone ({lo:.1f}–{hi:.1f}), k = {a.k}, {a.runs} runs, "
          f"{a.threads} threads, backend {a.backend}\n")
    print("| drafter | tok/s speculative | α | mean accepted / round | c | predicted × | measured × |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        t = r["tok_s"]
        print(f"| {r['drafter']} | {t[0]:.1f} ({t[1]:.1f}–{t[2]:.1f}) | {r['alpha']:.3f} | "
              f"{r['mean_accepted_len']:.2f} | {r['c']:.3f} | {r['predicted']:.2f} | {r['measured']:.2f} |")


if __name__ == "__main__":
    main()
