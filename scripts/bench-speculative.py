#!/usr/bin/env python3
"""Speculative decoding, measured: target alone vs speculative, side by side, interleaved runs.

usage: scripts/bench-speculative.py LOOM TARGET.gguf [--draft NAME=FILE]... [--ngram] [--self]
                                   [-k 4] [-n 64] [--threads 2] [--runs 3] [--backend cpu]

For each drafter it reports the target's tok/s alone and with speculative decoding (median and
range over the runs), alpha (the per-position acceptance probability: accepted / (accepted +
rejections), since a round tests drafts only up to its first rejection) beside the decoder's
acceptance_rate (accepted / all drafted), the mean accepted length per round, the draft/target
cost ratio c (0 for the n-gram drafter), the speed-up alpha and c predict, (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)),
and the measured speed-up. c is measured inside the run: the mean draft forward over the target's
mean one-token forward when it decodes alone (`metrics.forward_ms`, `draft_forward_ms`, less each
model's first forward, the prompt's: `prefill_ms`, `draft_prefill_ms`). That
formula takes the target's forward of k + 1 positions to cost one decode step; v, the mean
verification forward over the one-token forward, is measured the same way, and the prediction with
it, (1 - alpha^(k+1)) / ((1 - alpha)(k c + v)), is what the forwards alone allow: what is left between
it and the measurement is the engine's and the decoder's own work (last column: the share of the wall
time spent outside forward passes). The forwards' accounting column is the speed-up the forward
times alone allow with the acceptance as it happened (tokens per target forward over the forwards'
cost per target forward, in one-token target forwards); it differs from the α formula where
acceptances are not independent (they come in runs). Greedy (--temp 0), --ignore-eos, the same prompt in every run.
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

    alone = {"tok_s": [], "t1": [], "other": []}
    spec = {name: {"tok_s": [], "alpha": [], "rate": [], "len": [], "c": [], "v": [], "other": [], "acct": []}
            for name, _ in drafters}
    ref_tokens = None
    for r in range(a.runs):  # interleaved: every configuration once per round
        m, toks = run(a.loom, a.target, a, a.n, a.threads, a.backend, [])
        alone["tok_s"].append(m["decode_tok_s"])
        alone["t1"].append((m["forward_ms"] - m["prefill_ms"]) / (a.n - 1))  # the n - 1 one-token forwards
        alone["other"].append(1 - m["forward_ms"] / m["total_ms"])
        ref_tokens = ref_tokens or toks
        t1 = statistics.median(alone["t1"])
        for name, path in drafters:
            extra = ["--decoder", "speculative", "--set", f"decoder.k={a.k}"]
            extra += ["--set", f'decoder.draft="{path}"'] if path else ["--set", 'decoder.drafter="ngram"']
            m, toks = run(a.loom, a.target, a, a.n, a.threads, a.backend, extra)
            if toks != ref_tokens:
                print(f"warning: {name}: greedy output differs from the target's", file=sys.stderr)
            s = spec[name]
            s["tok_s"].append(m["decode_tok_s"])
            # α per tested position: a round tests drafts until the first rejection
            tested = m["accepted_tokens"] + m["rejections"]
            s["alpha"].append(m["accepted_tokens"] / tested if tested else 0.0)
            s["rate"].append(m["acceptance_rate"])
            s["len"].append(m["mean_accepted_len"])
            draft_ms = m.get("draft_forward_ms", 0.0)
            # Per forward after the prompt's (each model's first forward is its prompt)
            s["c"].append((draft_ms - m.get("draft_prefill_ms", 0.0)) / max(m["draft_forwards"] - 1, 1) / t1
                          if path else 0.0)
            s["v"].append((m["forward_ms"] - m["prefill_ms"]) / max(m["target_forwards"] - 1, 1) / t1)
            s["other"].append(1 - (m["forward_ms"] + draft_ms) / m["total_ms"])
            # Accounting: tokens per target forward over the forwards' cost per target forward.
            tf, df = m["target_forwards"] - 1, max(m["draft_forwards"] - 1, 0)
            s["acct"].append((a.n - 1) / tf / (df / tf * s["c"][-1] + s["v"][-1]))

    base = statistics.median(alone["tok_s"])
    rows = []
    k = a.k
    for name, _ in drafters:
        s = spec[name]
        alpha, c, v = (statistics.median(s[x]) for x in ("alpha", "c", "v"))
        gain = (k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
        rows.append({"drafter": name, "alpha": alpha, "acceptance_rate": statistics.median(s["rate"]),
                     "mean_accepted_len": statistics.median(s["len"]),
                     "c": c, "v": v, "predicted": gain / (k * c + 1), "predicted_v": gain / (k * c + v),
                     "accounting": statistics.median(s["acct"]),
                     "measured": statistics.median(s["tok_s"]) / base, "tok_s": med(s["tok_s"]),
                     "other_share": statistics.median(s["other"])})
    if a.json:
        print(json.dumps({"target": a.target, "alone_tok_s": med(alone["tok_s"]), "k": a.k,
                          "alone_other_share": statistics.median(alone["other"]), "rows": rows}, indent=1))
        return
    lo, hi = min(alone["tok_s"]), max(alone["tok_s"])
    print(f"target {a.target}: {base:.1f} tok/s alone ({lo:.1f}–{hi:.1f}; "
          f"{100 * statistics.median(alone['other']):.1f}% of the time outside forwards), k = {a.k}, "
          f"{a.runs} runs, {a.threads} threads, backend {a.backend}\n")
    print("| drafter | tok/s speculative | α | acceptance_rate | accepted / round | c | v | predicted × (v = 1) | "
          "predicted × (c, v as measured) | forwards' accounting × | measured × | time outside forwards |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t = r["tok_s"]
        print(f"| {r['drafter']} | {t[0]:.1f} ({t[1]:.1f}–{t[2]:.1f}) | {r['alpha']:.3f} | {r['acceptance_rate']:.3f} | "
              f"{r['mean_accepted_len']:.2f} | {r['c']:.3f} | {r['v']:.2f} | {r['predicted']:.2f} | "
              f"{r['predicted_v']:.2f} | {r['accounting']:.2f} | {r['measured']:.2f} | {100 * r['other_share']:.1f}% |")


if __name__ == "__main__":
    main()
