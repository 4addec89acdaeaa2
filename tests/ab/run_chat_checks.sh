#!/usr/bin/env bash
# tests/ab/run_chat_checks.sh LOOM SOURCE_DIR OUT_DIR — `loom ab` on chat models (issue 42), on the real
# models scripts/fetch-models.sh installs (LOOM_REAL_MODELS names another directory):
#   1. --chat: four plain questions, each one user turn under SmolLM2-135M-Instruct's template, greedy and
#      sampled: every reply non-empty, greedy's first names Paris; the JSON recomputed; the HTML report
#      rendered in headless Chromium shows the template and the replies;
#   2. a `messages` line (a system and a user turn) compares SmolLM2 (ChatML) with Gemma 3 (its built-in
#      gemma format) in one run: each variant rendered with its own template, only the metrics that do
#      not count tokens compared across the two vocabularies;
#   3. a bad `messages` line is a one-line usage error naming the line (exit 2);
#   4. configs/arith/chat/ (greedy, step search) on generated arithmetic conversations: replies scored.
# Exit 77 (skipped, with the reason) when a model or Chromium is missing.
set -euo pipefail
loom="$1"
src="$2"
out="$3"
models="${LOOM_REAL_MODELS:-$src/models}"
smol="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
gemma="$models/gemma-3-270m-q4_k_m.gguf"
for m in "$smol" "$gemma"; do
  if [ ! -f "$m" ]; then
    echo "SKIPPED: real model missing: $m (scripts/fetch-models.sh installs it; LOOM_REAL_MODELS names another directory)"
    exit 77
  fi
done
mkdir -p "$out"
cfg="$src/configs"

# 1. --chat on the four questions, greedy against sampled, two runs each.
"$loom" ab -c "$cfg/greedy.toml" -c "$cfg/sampling.toml" --set "model.path=\"$smol\"" --set stop.max_tokens=48 \
  --prompts "$src/tests/data/ab/chat_questions.txt" --chat --runs 2 --json --html "$out/chat.html" > "$out/chat.json"
python3 "$src/tests/ab/check_ab_json.py" "$out/chat.json"
python3 - "$out/chat.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["settings"]["chat"] is True
for v in r["variants"]:
    assert v["chat_template"] == "tokenizer.chat_template (chatml turns)", v
assert [p["messages"] for p in r["prompts"]][0] == [{"role": "user", "content": "What is the capital of France?"}]
assert len(r["rows"]) == 16
for x in r["rows"]:
    assert x["ok"] and x["text"].strip(), f"an empty reply: {x}"
    assert "<|im_end|>" not in x["text"] and "<|im_start|>" not in x["text"], x["text"]
first = next(x for x in r["rows"] if x["variant"] == 0 and x["prompt"] == 0 and x["run"] == 0)
assert "Paris" in first["text"], first["text"]
print(f"ab --chat: 16 replies, none empty; greedy's first: {first['text']!r}")
PYEOF

# 2. One conversation, two models with different templates.
for name in smol gemma; do
  path=$smol
  [ "$name" = gemma ] && path=$gemma
  printf '[model]\npath = "%s"\n\n[[sampler]]\nname = "greedy"\n\n[stop]\nmax_tokens = 16\n' "$path" > "$out/$name.toml"
done
cat > "$out/conversation.jsonl" <<'JSONL'
{"id": "capital", "messages": [{"role": "system", "content": "Answer with one word."}, {"role": "user", "content": "What is the capital of France?"}], "expected": "Paris"}
JSONL
"$loom" ab -c "$out/smol.toml" -c "$out/gemma.toml" --prompts "$out/conversation.jsonl" --answer-regex '(Paris)' \
  --json > "$out/two_templates.json"
python3 "$src/tests/ab/check_ab_json.py" "$out/two_templates.json"
python3 - "$out/two_templates.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
t = [v["chat_template"] for v in r["variants"]]
assert t == ["tokenizer.chat_template (chatml turns)", "built-in gemma (the file has no tokenizer.chat_template)"], t
assert r["variants"][0]["vocabulary"] != r["variants"][1]["vocabulary"]
assert all(x["ok"] for x in r["rows"]), r["rows"]
pr = r["pairs"][0]
assert pr["same_vocabulary"] is False and set(pr["metrics"]) <= {"ttft_ms", "exact_match", "total_ms"}, pr
smol = next(x for x in r["rows"] if x["variant"] == 0)
assert smol["correct"] is True, smol["text"]
print(f"ab messages: ChatML and gemma templates in one run; SmolLM2 answered {smol['text']!r}")
PYEOF

# 3. A bad messages line: one line naming the file and line, exit 2.
printf '{"prompt": "fine"}\n{"messages": [{"content": "no role"}]}\n' > "$out/bad.jsonl"
rc=0
"$loom" ab -c "$out/smol.toml" -c "$out/gemma.toml" --prompts "$out/bad.jsonl" > /dev/null 2> "$out/bad.err" || rc=$?
[ "$rc" = 2 ] || { echo "a bad messages line exits 2, got $rc"; cat "$out/bad.err"; exit 1; }
[ "$(wc -l < "$out/bad.err")" = 1 ] || { echo "expected one line:"; cat "$out/bad.err"; exit 1; }
grep -q "bad.jsonl:2: message 0 is not an object with a string \"role\"" "$out/bad.err" \
  || { echo "the error does not name the line:"; cat "$out/bad.err"; exit 1; }

# 4. The arithmetic task set as conversations, with the chat versions of configs/arith.
python3 "$src/tests/tasks/make_arith_tasks.py" --chat -n 3 --steps 1 --seed 21 > "$out/arith_chat.jsonl"
"$loom" ab -c "$cfg/arith/chat/greedy.toml" -c "$cfg/arith/chat/step_search.toml" --set "model.path=\"$smol\"" \
  --prompts "$out/arith_chat.jsonl" --answer-regex 'answer is (-?[0-9]+)' --json > "$out/arith_chat.json"
python3 - "$out/arith_chat.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert len(r["rows"]) == 6 and all(x["ok"] for x in r["rows"]), r["rows"]
answered = sum("answer is" in x["text"] for x in r["rows"])
assert answered >= 4, [x["text"] for x in r["rows"]]
print(f"arith chat configs: {answered} of 6 replies state their answer; "
      f"{sum(bool(x.get('correct')) for x in r['rows'])} right")
PYEOF

. "$src/tests/ab/chromium.sh"
require_chromium
render_dom "$out/chat.html" "$out/chat.dom.html"
grep -q "<table id=\"templates\"" "$out/chat.dom.html" || { echo "the report does not say which template rendered"; exit 1; }
grep -q "tokenizer.chat_template (chatml turns)" "$out/chat.dom.html" || { echo "no template named"; exit 1; }
grep -q "<table id=\"outputs\"" "$out/chat.dom.html" || { echo "the rendered DOM has no outputs table"; exit 1; }
grep -q "Paris" "$out/chat.dom.html" || { echo "the outputs table does not show greedy's reply"; exit 1; }
grep -q "im_start" "$out/chat.dom.html" && { echo "the outputs show the template's markup"; exit 1; }
echo "ab chat: the HTML report rendered by $chromium shows the template and the replies"
