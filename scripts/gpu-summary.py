#!/usr/bin/env python3
"""scripts/gpu-check.sh's summary: its benches against the ceilings measured in the same run.

Usage: gpu-summary.py DIR OUT.json TESTS_OK RUN...   (DIR holds ceilings.json and RUN.json per bench)
Decode: bytes read per token (weights + KV, loom bench's memory.decode_read_bytes) × tokens/s over the
device-to-device copy bandwidth (bytes read + written). Prefill: 2 × parameters FLOP per token × tokens/s
over the bf16 8192³ matrix product's rate (attention's FLOP left out: at 512 tokens they are under 2 % of
a 1B model's). Load: 64 concurrent requests' output tokens/s over batch-1 decode's.
"""
import json
import sys
import time


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def row(d, name, ceil):
    j = load(f"{d}/{name}.json")
    r = {"run": name, "bench": j}
    bw, peak = ceil.get("copy_bandwidth_bytes_s"), ceil.get("bf16_matmul_flop_s")
    tok_s, per_tok = j.get("decode_tok_s"), j.get("memory", {}).get("decode_read_bytes")
    if tok_s and per_tok and bw:
        r["decode_bytes_per_token"] = per_tok
        r["decode_fraction_of_copy_bandwidth"] = tok_s * per_tok / bw
    pp_s, n = j.get("prefill_tok_s"), j.get("n_params")
    if pp_s and n and peak:
        r["prefill_fraction_of_bf16_peak"] = pp_s * 2 * n / peak
    if name.endswith("-c64"):
        one = load(f"{d}/{name[:-4]}-d0.json").get("decode_tok_s")
        if one and j.get("output_tok_s"):
            r["c64_over_batch1"] = j["output_tok_s"] / one
    return r


def pct(x):
    return f"{100 * x:.1f}%" if x else "-"


def main():
    d, out, ok, names = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4:]
    ceil = load(f"{d}/ceilings.json")
    rows = [row(d, n, ceil) for n in names]
    s = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "ceilings": ceil, "tests_passed": ok, "runs": rows}
    with open(out, "w") as f:
        json.dump(s, f, indent=1)
    print(f"{'run':30} {'decode tok/s':>12} {'of copy bw':>10} {'prefill tok/s':>13} {'of bf16 peak':>12} "
          f"{'TTFT p50 ms':>11} {'c64/1':>6}")
    for r in rows:
        j = r["bench"]
        ttft = j.get("ttft_ms")
        ttft = ttft.get("p50") if isinstance(ttft, dict) else ttft
        print(f"{r['run']:30} {j.get('decode_tok_s') or j.get('output_tok_s') or 0:12.1f} "
              f"{pct(r.get('decode_fraction_of_copy_bandwidth')):>10} {j.get('prefill_tok_s') or 0:13.1f} "
              f"{pct(r.get('prefill_fraction_of_bf16_peak')):>12} {ttft or 0:11.2f} "
              f"{r.get('c64_over_batch1') or 0:6.2f}")


if __name__ == "__main__":
    main()
