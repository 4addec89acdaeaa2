#!/usr/bin/env python3
"""Markdown table rows from saved scripts/bench-vs-llamacpp.sh outputs, one file per row:
    scripts/bench-table.py F32=out-f32.txt Q4_0=out-q4_0.txt ...
Columns: prefill and decode medians [min..max] for both engines, the ratios, decode as a share of
the bandwidth bound, and peak RSS as a multiple of file + KV."""
import re
import sys

NUM = r"([\d.]+)"
SPAN = NUM + r" tok/s \[" + NUM + r"\.\." + NUM + r"\]"


def row(label, path):
    text = open(path).read()
    cells = [label]
    for phase in ("prefill", "decode"):
        m = re.search(phase + r"\s+loom\s+" + SPAN + r"\s+llama\.cpp\s+" + SPAN + r"\s+ratio\s+" + NUM + "x", text)
        if not m:
            sys.exit(f"{path}: no {phase} line (did the run finish?)")
        g = m.groups()
        cells += [f"{g[0]} [{g[1]}..{g[2]}]", f"{g[3]} [{g[4]}..{g[5]}]", f"**{g[6]}×**"]
    m = re.search(r"bound\s+" + NUM + r" GB/s.*= " + NUM + r" tok/s; decode at (\d+)% \(loom\), (\d+)% \(llama\.cpp\)", text)
    cells.append(f"{m.group(3)}%, {m.group(4)}% of {m.group(2)} ({m.group(1)} GB/s)" if m else "–")
    rss = re.findall(r"rss\s+\S+\s+peak\s+" + NUM + r" MiB = " + NUM + " x", text)
    cells.append(f"{rss[0][0]} / {rss[1][0]} MiB ({rss[0][1]}× / {rss[1][1]}×)" if len(rss) == 2 else "–")
    return "| " + " | ".join(cells) + " |"


print("| type | Loom prefill | llama.cpp prefill | ratio | Loom decode | llama.cpp decode | ratio |"
      " decode / bound (Loom, llama.cpp) | peak RSS Loom / llama.cpp (× file+KV) |")
print("|---|---|---|---|---|---|---|---|---|")
for arg in sys.argv[1:]:
    label, _, path = arg.partition("=")
    print(row(label, path))
