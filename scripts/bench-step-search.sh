#!/usr/bin/env bash
# Step search against greedy, best-of-n with the same verifier and unweighted self-consistency on
# generated arithmetic word problems (tests/tasks/make_arith_tasks.py), SmolLM2-135M-Instruct, then
# accuracy against compute (loom ab --sweep) — the measurements of docs/decoders.md.
#   scripts/bench-step-search.sh [--chat] [--no-sweep] [N_TASKS] [STEPS] [OUT_DIR]
#     (defaults: 100 1 /tmp/loom-step-search). --chat: the same problems as conversations under the
#     model's chat template (make_arith_tasks.py --chat, configs/arith/chat/); --no-sweep: the comparison only.
set -euo pipefail
cd "$(dirname "$0")/.."
chat=0
sweep=1
while [ "${1:-}" = --chat ] || [ "${1:-}" = --no-sweep ]; do
  [ "$1" = --chat ] && chat=1
  [ "$1" = --no-sweep ] && sweep=0
  shift
done
n="${1:-100}"
steps="${2:-1}"
out="${3:-/tmp/loom-step-search}"
mkdir -p "$out"
loom=build/bin/loom
[ -x "$loom" ] || { echo "build first: cmake --build --preset default" >&2; exit 1; }
[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] || { echo "scripts/fetch-models.sh first" >&2; exit 1; }
cfg=configs/arith
chat_flag=()
if [ "$chat" = 1 ]; then
  cfg=configs/arith/chat
  chat_flag=(--chat)
fi
python3 tests/tasks/make_arith_tasks.py -n "$n" --steps "$steps" --seed 21 "${chat_flag[@]}" > "$out/tasks.jsonl"
re='answer is (-?[0-9]+)'
echo "== $n tasks of $steps step(s)${chat_flag:+, as conversations}: greedy, step search 4x4, best-of-8, self-consistency 8 ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
"$loom" ab -c $cfg/greedy.toml -c $cfg/step_search.toml -c $cfg/best_of_n.toml \
  -c $cfg/self_consistency.toml --prompts "$out/tasks.jsonl" --answer-regex "$re" \
  --json --html "$out/compare.html" > "$out/compare.json"
python3 - "$out/compare.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for a in r["aggregates"]:
    m = a["metrics"]
    print(f"  {a['variant']:18s} accuracy {m['exact_match']['mean']:.3f}  tokens evaluated/task {m['tokens_evaluated']['mean']:7.1f}"
          f"  ms/task {m['total_ms']['mean']:7.0f}")
for p in r["pairs"]:
    e = p["metrics"]["exact_match"]
    print(f"  {p['b']} - {p['a']}: accuracy {e['diff']:+.3f} [{e['ci'][0]:+.3f}, {e['ci'][1]:+.3f}] p {e['p']:.3f}")
PY
[ "$sweep" = 1 ] || exit 0
echo "== accuracy against compute"
for spec in "step_search decoder.expansions=1,2,4" "best_of_n decoder.expansions=2,4,8" "self_consistency decoder.samples=2,4,8"; do
  set -- $spec
  "$loom" ab -c "$cfg/$1.toml" --sweep "$2" --prompts "$out/tasks.jsonl" --answer-regex "$re" \
    --json --html "$out/sweep-$1.html" > "$out/sweep-$1.json"
  python3 - "$out/sweep-$1.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
sw = r["sweep"]
for c in sw["curves"]:
    for p in c["points"]:
        g = p.get("gain")
        gs = f"  gain {g['diff']:+.3f} [{g['ci'][0]:+.3f}, {g['ci'][1]:+.3f}]" if g else ""
        print(f"  {p['variant']:32s} accuracy {p['accuracy']:.3f} [{p['ci'][0]:.3f}, {p['ci'][1]:.3f}]"
              f"  tokens/task {p['tokens_per_run']:7.1f}  wall {p['wall_s']:6.1f} s{gs}")
    print(f"  stops paying after: {c['stops_paying_after']}")
PY
done
echo "reports: $out/*.html"
