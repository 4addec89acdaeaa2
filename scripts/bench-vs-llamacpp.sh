#!/usr/bin/env bash
# Loom vs llama.cpp on the same GGUF and threads, interleaved (one repetition of each in turn, so
# machine noise hits both alike); prints medians and the Loom/llama.cpp ratios.
#   scripts/bench-vs-llamacpp.sh MODEL.gguf [THREADS] [BACKEND]
# Env: PP (512), TG (128), REPS (5), LOOM (build/bin/loom). Installs llama-cpp-python into
# .venv-bench on first use (it compiles llama.cpp: a few minutes).
#   scripts/bench-vs-llamacpp.sh --peer NAME=PATH/llama-bench [--peer …] [bench_peers.py options] MODEL…
# With --peer: each peer's own llama-bench instead (mainline llama.cpp, ik_llama.cpp — a NAME starting
# with "ik" gets -rtr 1 -fa 1), at depths 0 and 512, and the Markdown table rows (scripts/bench_peers.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--peer" ]; then exec python3 scripts/bench_peers.py "$@"; fi
model=${1:?usage: scripts/bench-vs-llamacpp.sh MODEL.gguf [THREADS] [BACKEND]}
threads=${2:-2}
backend=${3:-cpu}
pp=${PP:-512}; tg=${TG:-128}; reps=${REPS:-5}
loom=${LOOM:-build/bin/loom}
venv=.venv-bench
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "bench: installing llama-cpp-python into $venv (builds llama.cpp; a few minutes)" >&2
  python3 -m venv "$venv"
  CMAKE_ARGS="-DGGML_NATIVE=ON" "$venv/bin/pip" install -q llama-cpp-python
fi
lver=$("$venv/bin/python" -c "import llama_cpp; print(llama_cpp.__version__)")
# the decode bound: read bandwidth at these threads (loom bench --bandwidth)
bw=$("$loom" bench --bandwidth -t "$threads" -r 3 --json)
loom_runs=(); cpp_runs=()
for r in $(seq "$reps"); do
  echo "bench: repetition $r/$reps" >&2
  loom_runs+=("$("$loom" bench -m "$model" --pp "$pp" --tg "$tg" -r 1 -t "$threads" --set "backend.name=\"$backend\"" --json)")
  cpp_runs+=("$("$venv/bin/python" scripts/bench_llamacpp.py "$model" --threads "$threads" --pp "$pp" --tg "$tg" -r 1)")
done
python3 - "$model" "$threads" "$backend" "$lver" "$pp" "$tg" "$bw" <<PY
import json, statistics, sys
model, threads, backend, lver, pp, tg, bw = sys.argv[1:]
bw = json.loads(bw)["read_gb_s"] * 1e9
loom = [json.loads(l) for l in """$(printf '%s\n' "${loom_runs[@]}")""".strip().splitlines()]
cpp = [json.loads(l) for l in """$(printf '%s\n' "${cpp_runs[@]}")""".strip().splitlines()]
def col(rows, k): return [r[k] for r in rows]
print(f"model {model}, threads {threads}, loom backend {backend}, llama-cpp-python {lver}, pp{pp} tg{tg}, {len(loom)} interleaved runs")
for k, name in (("prefill_tok_s", "prefill"), ("decode_tok_s", "decode")):
    a, b = col(loom, k), col(cpp, k)
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{name:8s} loom {ma:9.1f} tok/s [{min(a):.1f}..{max(a):.1f}]   llama.cpp {mb:9.1f} tok/s [{min(b):.1f}..{max(b):.1f}]   ratio {ma/mb:5.2f}x")
# a decode step reads every weight byte once (of the token-embedding table only one row):
# those bytes / read bandwidth bound it (the KV cache it also reads is left out: the bound is optimistic)
mem = loom[0]["memory"]
bound = bw / mem["decode_read_bytes"]
a, b = statistics.median(col(loom, "decode_tok_s")), statistics.median(col(cpp, "decode_tok_s"))
print(f"bound    {bw/1e9:.1f} GB/s read ({threads} threads) / {mem['decode_read_bytes']/2**20:.0f} MiB read per token = {bound:.1f} tok/s;"
      f" decode at {100*a/bound:.0f}% (loom), {100*b/bound:.0f}% (llama.cpp) of it")
kv = mem["kv_bytes"]
for name, rows in (("loom", loom), ("llama.cpp", cpp)):
    rss = statistics.median(col(rows, "peak_rss_bytes"))
    print(f"rss      {name:9s} peak {rss/2**20:8.1f} MiB = {rss/(mem['file_bytes']+kv):.2f} x (file {mem['file_bytes']/2**20:.0f} MiB + KV {kv/2**20:.0f} MiB)")
PY
