#!/usr/bin/env python3
"""Recomputes every aggregate and interval of a `loom ab --json` report from its per-run rows,
independently of the C++ code, and fails on any difference.

usage: check_ab_json.py REPORT.json

Checked: the per-prompt means (over a prompt's successful runs), each variant's mean / sd / n per
metric, every pair's difference, bootstrap interval (percentile or BCa, SplitMix64 with the report's
seeds), sign-flip permutation p-value, verdict, McNemar's exact test, agreement and win/tie/loss.
"""
import json
import math
import re
import statistics
import sys

MASK = (1 << 64) - 1
BETTER = {"ttft_ms": -1, "tpot_ms": -1, "tok_s": 1, "tokens": 0, "mean_logprob": 1, "distinct_1": 1,
          "distinct_2": 1, "repetition_4": -1, "exact_match": 1, "tokens_evaluated": -1,
          "total_ms": -1}
ANY_VOCABULARY = {"ttft_ms", "exact_match", "total_ms"}  # the metrics compared across vocabularies


class SplitMix64:
    def __init__(self, seed):
        self.s = seed & MASK

    def __call__(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & MASK
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def quantile(s, q):  # type 7, s sorted
    q = min(max(q, 0.0), 1.0)
    h = q * (len(s) - 1)
    i = math.floor(h)
    j = min(i + 1, len(s) - 1)
    return s[i] + (h - i) * (s[j] - s[i])


def bootstrap(d, resamples, seed, level, method):
    m = sum(d) / len(d)
    if all(x == d[0] for x in d):
        return m, m
    rng = SplitMix64(seed)
    boots = []
    for _ in range(resamples):
        s = 0.0
        for _ in range(len(d)):
            s += d[rng() % len(d)]
        boots.append(s / len(d))
    boots.sort()
    alpha = 1 - level
    q_lo, q_hi = alpha / 2, 1 - alpha / 2
    if method == "bca":
        nd = statistics.NormalDist()
        below = sum(1.0 if b < m else 0.5 if b == m else 0.0 for b in boots)
        frac = min(max(below / len(boots), 1e-9), 1 - 1e-9)
        z0 = nd.inv_cdf(frac)
        total = sum(d)
        jack = [(total - x) / (len(d) - 1) for x in d]
        jm = sum(jack) / len(jack)
        num = sum((jm - j) ** 3 for j in jack)
        den = sum((jm - j) ** 2 for j in jack)
        a = num / (6 * den ** 1.5) if den > 0 else 0.0

        def adjust(q):
            z = nd.inv_cdf(q)
            return nd.cdf(z0 + (z0 + z) / (1 - a * (z0 + z)))

        q_lo, q_hi = adjust(q_lo), adjust(q_hi)
    return quantile(boots, q_lo), quantile(boots, q_hi)


def sign_flip(d, resamples, seed):
    nz = [x for x in d if x != 0]
    if not nz:
        return 1.0
    obs = abs(sum(nz) / len(nz)) * (1 - 1e-12)
    n = len(nz)
    if n <= 16:
        extreme = 0
        for s in range(1 << n):
            tot = sum(-x if (s >> i) & 1 else x for i, x in enumerate(nz))
            if abs(tot / n) >= obs:
                extreme += 1
        return extreme / (1 << n)
    rng = SplitMix64(seed)
    extreme = 0
    for _ in range(resamples):
        tot = sum(-x if rng() >> 63 else x for x in nz)
        if abs(tot / n) >= obs:
            extreme += 1
    return (extreme + 1) / (resamples + 1)


def mcnemar(b, c):
    n = b + c
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n)


def distinct(t, n):
    if len(t) < n:
        return None
    grams = [tuple(t[i:i + n]) for i in range(len(t) - n + 1)]
    return len(set(grams)) / len(grams)


def repetition(t, n=4):
    if len(t) < n:
        return None
    seen, rep_ = set(), 0
    for i in range(len(t) - n + 1):
        g = tuple(t[i:i + n])
        rep_ += g in seen
        seen.add(g)
    return rep_ / (len(t) - n + 1)


def close(a, b, tol=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def main():
    rep = json.load(open(sys.argv[1]))
    errors = []

    def check(cond, what):
        if not cond:
            errors.append(what)

    st = rep["settings"]
    V, P = len(rep["variants"]), len(rep["prompts"])
    names = rep["metric_names"]
    R = st["runs"]
    # the text metrics from each row's tokens (present only where defined)
    for r in rep["rows"]:
        if not r["ok"]:
            continue
        t = r["tokens"]
        for key, want in (("tokens", float(len(t))), ("distinct_1", distinct(t, 1)), ("distinct_2", distinct(t, 2)),
                          ("repetition_4", repetition(t, 4))):
            got = r["metrics"].get(key)
            check(close(got, want), f"{key} of row v{r['variant']} p{r['prompt']} r{r['run']}: {got} vs {want}")
    # answers and exact match from the text (last_number, the default extraction)
    if st["answer_regex"] == "last_number":
        num = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
        for r in rep["rows"]:
            exp = rep["prompts"][r["prompt"]]["expected"]
            if not r["ok"] or exp is None:
                continue
            found = num.findall(r["text"])
            answer = found[-1] if found else ""
            want_found = num.findall(exp)
            want = want_found[-1] if want_found else exp
            check(r.get("answer") == answer, f"answer of row {r['variant']},{r['prompt']},{r['run']}")
            check(r.get("correct") == (answer != "" and answer == want), "correct")
            check(close(r["metrics"].get("exact_match"), 1.0 if r.get("correct") else 0.0), "exact_match")
    # the grid: every (variant, prompt, run) once, unless interrupted
    cells = {(r["variant"], r["prompt"], r["run"]) for r in rep["rows"]}
    check(len(cells) == len(rep["rows"]), "a (variant, prompt, run) cell twice")
    if not rep["interrupted"]:
        check(len(cells) == V * P * R, f"{len(cells)} cells, expected {V * P * R}")
    ok_runs = [[0] * P for _ in range(V)]
    for r in rep["rows"]:
        ok_runs[r["variant"]][r["prompt"]] += 1 if r["ok"] else 0
    # per prompt
    per = {}
    for m in names:
        acc = [[[] for _ in range(P)] for _ in range(V)]
        for r in rep["rows"]:
            if r["ok"] and m in r["metrics"]:
                acc[r["variant"]][r["prompt"]].append(r["metrics"][m])
        per[m] = [[(sum(x) / len(x) if x else None) for x in acc[v]] for v in range(V)]
        for v in range(V):
            for i in range(P):
                check(close(per[m][v][i], rep["per_prompt"][m][v][i]), f"per_prompt {m} v{v} p{i}")
    # seeds
    for r in rep["rows"]:
        check(r["seed"] == st["seed"] + r["prompt"] * st["runs"] + r["run"], f"seed of row {r}")
    # aggregates
    for v in range(V):
        agg = rep["aggregates"][v]["metrics"]
        for m in names:
            xs = [x for x in per[m][v] if x is not None]
            check(agg[m]["n"] == len(xs), f"n {m} v{v}")
            check(close(agg[m]["mean"], sum(xs) / len(xs) if xs else None), f"mean {m} v{v}")
            sd = statistics.stdev(xs) if len(xs) >= 2 else 0.0
            check(close(agg[m]["sd"], sd, 1e-7), f"sd {m} v{v}")
    # pairs
    for b in range(1, V):
        pr = rep["pairs"][b - 1]
        paired = [ok_runs[0][i] == R and ok_runs[b][i] == R for i in range(P)]
        check(pr["prompts_paired"] == sum(paired), "prompts_paired")
        same_vocab = rep["variants"][b]["vocabulary"] == rep["variants"][0]["vocabulary"]
        check(pr["same_vocabulary"] == same_vocab, "same_vocabulary")
        for mi, m in enumerate(names):
            if not same_vocab and m not in ANY_VOCABULARY:
                check(m not in pr.get("metrics", {}), f"pair {b} {m} across vocabularies")
                continue
            d = [per[m][b][i] - per[m][0][i] for i in range(P)
                 if paired[i] and per[m][0][i] is not None and per[m][b][i] is not None]
            if not d:
                check(m not in pr.get("metrics", {}), f"pair {b} {m} without data")
                continue
            x = pr["metrics"][m]
            seed = st["seed"] + 1000003 * b + mi
            check(x["bootstrap_seed"] == seed, f"bootstrap seed {m}")
            check(close(x["diff"], sum(d) / len(d)), f"diff {m}")
            lo, hi = bootstrap(d, st["bootstrap"], seed, st["level"], st["ci"])
            check(close(x["ci"][0], lo, 1e-7) and close(x["ci"][1], hi, 1e-7), f"ci {m}: {x['ci']} vs {[lo, hi]}")
            p = sign_flip(d, st["bootstrap"], seed)
            check(close(x["p"], p), f"p {m}")
            covers = lo <= 0 <= hi
            want = "inconclusive"
            if not covers and p < 0.05:
                up = lo > 0
                bt = BETTER.get(m, 0)
                want = ("higher" if up else "lower") if bt == 0 else ("better" if (1 if up else -1) == bt else "worse")
            check(x["verdict"] == want, f"verdict {m}: {x['verdict']} vs {want}")
        # McNemar, agreement, win/tie/loss
        a_rows = {(r["prompt"], r["run"]): r for r in rep["rows"] if r["variant"] == 0}
        mb = mc = same = both = same_ans = both_ans = 0
        for i in range(P):  # McNemar per paired prompt: correct when at least half its runs were
            x, y = per["exact_match"][0][i], per["exact_match"][b][i]
            if not paired[i] or x is None or y is None:
                continue
            mb += x >= 0.5 and y < 0.5
            mc += x < 0.5 and y >= 0.5
        for r in rep["rows"]:
            if r["variant"] != b:
                continue
            a = a_rows.get((r["prompt"], r["run"]))
            if not a or not a["ok"] or not r["ok"]:
                continue
            both += 1
            same += a["text"] == r["text"]
            if "correct" in a and "correct" in r:
                both_ans += 1
                same_ans += a["answer"] == r["answer"]
        check(pr["mcnemar"]["a_only_correct"] == mb and pr["mcnemar"]["b_only_correct"] == mc, "mcnemar counts")
        check(close(pr["mcnemar"]["p"], mcnemar(mb, mc)), "mcnemar p")
        check(close(pr["agreement"], same / both if both else None), "agreement")
        check(close(pr["answer_agreement"], same_ans / both_ans if both_ans else None), "answer agreement")
        w = t = l = 0
        for i in range(P):
            x, y = per["mean_logprob"][0][i], per["mean_logprob"][b][i]
            if not paired[i] or not same_vocab or x is None or y is None:
                continue
            if y > x:
                w += 1
            elif y < x:
                l += 1
            else:
                t += 1
        check(pr["logprob_win_tie_loss"] == [w, t, l], "win/tie/loss")
    if errors:
        print("check_ab_json: %d differences:" % len(errors))
        for e in errors[:50]:
            print("  " + e)
        sys.exit(1)
    print(f"check_ab_json: {len(rep['rows'])} rows, {len(names)} metrics, {V - 1} pairs recomputed: all equal")


if __name__ == "__main__":
    main()
