#!/usr/bin/env bash
# tests/ab/run_checks.sh LOOM SOURCE_DIR OUT_DIR — `loom ab` end to end on stories260K:
#   1. every aggregate and interval of --json is recomputed from the rows by check_ab_json.py
#      (three variants, two runs, JSONL prompts with expected answers; percentile and BCa);
#   2. the --html report is opened in headless Chromium: the rendered DOM must hold the summary
#      table and the SVG plots, the console must be free of errors; a screenshot is saved in OUT_DIR.
# Exit 77 (skipped, with the reason) when the model or Chromium is missing.
set -euo pipefail
loom="$1"
src="$2"
out="$3"
models="${LOOM_TEST_MODELS:-$src/models}"
model="$models/stories260K.gguf"
if [ ! -f "$model" ]; then
  echo "SKIPPED: $model is missing (set LOOM_TEST_MODELS)"
  exit 77
fi
mkdir -p "$out"
set_model=(--set "model.path=\"$model\"")
cfg="$src/configs"

cat > "$out/ab_prompts.jsonl" <<'EOF'
{"prompt": "Once upon a time", "expected": "1", "id": "first"}
{"prompt": "Tom had 2 apples and", "expected": "3"}
{"prompt": "The little dog", "expected": "2"}
{"prompt": "Lily and Ben", "expected": "5"}
{"prompt": "One day", "expected": "1"}
EOF
"$loom" ab -c "$cfg/greedy.toml" -c "$cfg/sampling.toml" -c "$cfg/quickstart.toml" --prompts "$out/ab_prompts.jsonl" \
  --runs 2 -n 24 --json "${set_model[@]}" > "$out/ab_percentile.json"
python3 "$src/tests/ab/check_ab_json.py" "$out/ab_percentile.json"
"$loom" ab -c "$cfg/greedy.toml" -c "$cfg/sampling.toml" --prompts "$src/tests/data/ab_prompts.txt" --ci bca -n 24 \
  --json --html "$out/ab.html" "${set_model[@]}" > "$out/ab_bca.json"
python3 "$src/tests/ab/check_ab_json.py" "$out/ab_bca.json"

# Ctrl-C: the run stops after the current generation and still reports what it measured (exit 130).
for i in $(seq 1 60); do echo "Once upon a time $i"; done > "$out/many.txt"
"$loom" ab -c "$cfg/greedy.toml" -c "$cfg/sampling.toml" --prompts "$out/many.txt" -n 300 --json "${set_model[@]}" \
  > "$out/ab_interrupted.json" &
pid=$!
sleep 1
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 130 ] || { echo "an interrupted ab exits 130, got $rc"; exit 1; }
python3 - "$out/ab_interrupted.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["interrupted"] is True, "interrupted flag"
assert 0 < len(r["rows"]) < 120, f"partial rows: {len(r['rows'])}"
print(f"ab: interrupted after {len(r['rows'])} of 120 runs; the report was written")
PYEOF
python3 "$src/tests/ab/check_ab_json.py" "$out/ab_interrupted.json"

# --sweep: a variant per value of one key; accuracy (with its CI) against tokens evaluated and wall time.
"$loom" ab -c "$cfg/greedy.toml" --sweep stop.max_tokens=4,12,24 --prompts "$out/ab_prompts.jsonl" --json \
  --html "$out/ab_sweep.html" "${set_model[@]}" > "$out/ab_sweep.json"
python3 "$src/tests/ab/check_ab_json.py" "$out/ab_sweep.json"
python3 - "$out/ab_sweep.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
sw = r["sweep"]
assert sw["key"] == "stop.max_tokens" and sw["values"] == ["4", "12", "24"], sw["values"]
assert [v["sweep_value"] for v in r["variants"]] == ["4", "12", "24"]
pts = sw["curves"][0]["points"]
assert len(pts) == 3
for v, p in enumerate(pts):
    rows = [x for x in r["rows"] if x["variant"] == v and x["ok"]]
    tok = sum(x["metrics"]["tokens_evaluated"] for x in rows)
    assert abs(p["tokens_evaluated"] - tok) < 1e-6, (p["tokens_evaluated"], tok)
    acc = [a for a in r["per_prompt"]["exact_match"][v] if a is not None]
    assert abs(p["accuracy"] - sum(acc) / len(acc)) < 1e-12
    assert p["ci"][0] <= p["accuracy"] <= p["ci"][1]
    for x in rows:  # a run's compute: its prompt once plus each generated token but the last (greedy)
        assert x["metrics"]["tokens_evaluated"] >= x["metrics"]["tokens"], x["metrics"]
assert pts[0]["tokens_evaluated"] < pts[2]["tokens_evaluated"], "more tokens, more compute"
assert "gain" not in pts[0] and "gain" in pts[1] and "gain" in pts[2]
print(f"ab --sweep: {len(pts)} points, accuracy and compute recomputed from the rows")
PYEOF

. "$src/tests/ab/chromium.sh"
require_chromium
render_dom "$out/ab.html" "$out/ab.dom.html"
grep -q "<table id=\"summary\"" "$out/ab.dom.html" || { echo "the rendered DOM has no summary table"; exit 1; }
grep -q "<table id=\"outputs\"" "$out/ab.dom.html" || { echo "the rendered DOM has no outputs table"; exit 1; }
n_svg=$(grep -o "<svg" "$out/ab.dom.html" | wc -l)
[ "$n_svg" -ge 3 ] || { echo "expected 3 SVG plots (TPOT, length, CI bars), found $n_svg"; exit 1; }
render_dom "$out/ab_sweep.html" "$out/ab_sweep.dom.html"
grep -q "<table id=\"sweep\"" "$out/ab_sweep.dom.html" || { echo "the sweep report has no sweep table"; exit 1; }
n_curves=$(grep -o "<svg[^>]*class=\"sweep\"" "$out/ab_sweep.dom.html" | wc -l)
[ "$n_curves" -eq 2 ] || { echo "expected 2 accuracy-vs-compute plots, found $n_curves"; exit 1; }
grep -q "<th>expected</th>" "$out/ab_sweep.dom.html" || { echo "the outputs table has no expected column"; exit 1; }
grep -q "class=\"right\"\|class=\"wrong\"" "$out/ab_sweep.dom.html" || { echo "no answer marked right or wrong"; exit 1; }
"$chromium" $(chromium_flags "$out") --screenshot="$out/ab.png" --window-size=1280,2000 "file://$out/ab.html" \
  > /dev/null 2>&1 || { echo "the screenshot failed"; exit 1; }
[ -s "$out/ab.png" ] || { echo "no screenshot written"; exit 1; }
echo "ab: JSON recomputed; HTML rendered by $chromium ($n_svg SVG plots, no console errors); screenshot $out/ab.png"
