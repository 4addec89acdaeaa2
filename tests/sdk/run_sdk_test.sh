#!/usr/bin/env bash
# run_sdk_test.sh BUILD_DIR SOURCE_DIR [EXAMPLE] — the SDK works out of tree.
#
#  1. installs the `sdk` component of BUILD_DIR into a fresh prefix;
#  2. configures and builds sdk/examples/EXAMPLE (default best_of_n) — or, for EXAMPLE `backends`,
#     the first-party backends backends/reference and backends/cpu — against that prefix only
#     (CMAKE_PREFIX_PATH; warnings are errors), failing if the compile commands reach into the
#     source tree (core/, or sdk/include/ in place of the installed headers);
#  3. checks the plugins' exports (tests/plugin/check_exports.sh);
#  4. runs them:
#     best_of_n: docs/plugins.md §0 followed literally (its three files in an empty directory, built there), then
#       `loom run -c best_of_n.toml`; the JSON must have three hypotheses
#       and a stop_reason;
#     length_verifier: self_consistency (first-party, next to loom) weighted by this verifier; every
#       candidate's verifier_score must equal the formula computed here from its text;
#     naive_backend: greedy `loom run --set backend.name="naive"` on several prompts at once (mixed
#       sequences in a batch) must produce exactly the tokens of the built-in reference backend;
#     backends: a copy of `loom` that sees only these out-of-tree builds runs reference_plugin
#       (exactly the built-in reference's tokens) and cpu (generates).
# Models: $LOOM_TEST_MODELS, else $LOOM_TEST_MODELS_DEFAULT (set by CMake). Without
# stories260K.gguf it prints SKIPPED and exits 77 (ctest's SKIP_RETURN_CODE).
set -euo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: run_sdk_test.sh BUILD_DIR SOURCE_DIR [best_of_n|naive_backend|length_verifier|backends]" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
example="${3:-best_of_n}"
case "$example" in
best_of_n | naive_backend | length_verifier | backends) ;;
*)
  echo "run_sdk_test.sh: unknown example '$example'" >&2
  exit 2
  ;;
esac
models="${LOOM_TEST_MODELS:-${LOOM_TEST_MODELS_DEFAULT:-$source_dir/../shared/models}}"
model="$models/stories260K.gguf"
loom="$build_dir/bin/loom"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

if [ ! -f "$model" ]; then
  echo "SKIPPED: model file missing: $model (set LOOM_TEST_MODELS to the directory with the shared test models)"
  exit 77
fi
[ -x "$loom" ] || fail "$loom is not built"
command -v python3 >/dev/null || fail "python3 is needed to check the JSON output"

work=$(mktemp -d "${TMPDIR:-/tmp}/loom-sdk-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
example_build="$work/$example"

echo "== install the SDK component into $prefix"
cmake --install "$build_dir" --component sdk --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install --component sdk"; }
[ -f "$prefix/include/loom/sdk/abi.h" ] || fail "the SDK install lacks include/loom/sdk/abi.h"
[ -f "$prefix/lib/cmake/LoomSdk/LoomSdkConfig.cmake" ] || fail "the SDK install lacks LoomSdkConfig.cmake"
# Only the SDK: no core headers, no libraries.
if [ -d "$prefix/include/loom" ] && find "$prefix/include/loom" -maxdepth 1 -type f | grep -q .; then
  fail "the sdk component installs core headers: $(find "$prefix/include/loom" -maxdepth 1 -type f | tr '\n' ' ')"
fi

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt" | head -n 1)
compiler=()
[ -n "$cxx" ] && compiler=(-DCMAKE_CXX_COMPILER="$cxx")

# build_plugin SRC_DIR OUT_DIR PLUGIN_FILE: builds the CMake project SRC_DIR against $prefix only.
build_plugin() {
  local src=$1 out=$2 file=$3
  echo "== build ${src#"$source_dir"/} against the installed SDK"
  cmake -S "$src" -B "$out" "${generator[@]}" "${compiler[@]}" \
    -DCMAKE_CXX_FLAGS="-Wall -Wextra -Wpedantic -Wshadow -Werror" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$out.configure.log" 2>&1 ||
    { cat "$out.configure.log" >&2; fail "configuring $src"; }
  cmake --build "$out" >"$out.build.log" 2>&1 || { cat "$out.build.log" >&2; fail "building $src"; }
  local commands="$out/compile_commands.json"
  [ -f "$commands" ] || fail "no compile_commands.json in $out"
  if grep -q -e "/core/" -e "$source_dir/sdk/include" -e "$source_dir/attention" "$commands"; then
    cat "$commands" >&2
    fail "the compile commands of $src reach into the source tree (/core/, attention/ or $source_dir/sdk/include);" \
         "it must see only the installed SDK in $prefix"
  fi
  grep -q -e "$prefix/include" "$commands" || { cat "$commands" >&2; fail "$src does not use $prefix/include"; }
  [ -f "$out/$file" ] || fail "$src did not produce $out/$file"
  bash "$source_dir/tests/plugin/check_exports.sh" "$out/$file"
}

prompts="$work/prompts.txt"
printf '%s\n' "Once upon a time" "The little dog" "Lily and Tom went to the park" "One day" >"$prompts"
# run_greedy BACKEND OUT [loom args...]: the four prompts at once, greedy, as JSON lines.
run_greedy() {
  local backend=$1 out=$2 bin=$loom
  shift 2
  [ $# -gt 0 ] && [ "$1" = --loom ] && { bin=$2; shift 2; }
  "$bin" run -m "$model" --prompts "$prompts" --parallel 4 -n 48 --temp 0 --json \
    --set "backend.name=\"$backend\"" "$@" >"$out" 2>"$out.err" ||
    { cat "$out" "$out.err" >&2; fail "loom run with backend $backend exited with $?"; }
}
# same_tokens REF OTHER NAME: the runs produced exactly the same tokens.
same_tokens() {
  python3 - "$1" "$2" "$3" <<'PY' || { cat "$2.err" >&2; exit 1; }
import json, sys
def results(path):
    out = [json.loads(l) for l in open(path, encoding="utf-8").read().splitlines() if l.strip().startswith("{")]
    if len(out) != 4:
        sys.exit(f"FAIL: {path}: expected 4 results (one per prompt), got {len(out)}")
    return out
ref, other, name = results(sys.argv[1]), results(sys.argv[2]), sys.argv[3]
for i, (a, b) in enumerate(zip(ref, other)):
    if not a.get("tokens"):
        sys.exit(f"FAIL: the reference backend generated nothing for prompt {i}: {a!r}")
    if a["tokens"] != b.get("tokens"):
        sys.exit(f"FAIL: prompt {i}: {name} {b.get('tokens')} differs from reference {a['tokens']}")
print(f"ok: {name} matches the reference backend on {len(ref)} prompts ({sum(len(r['tokens']) for r in ref)} tokens)")
PY
}

if [ "$example" = backends ]; then
  build_plugin "$source_dir/backends/reference" "$work/reference" libloom-backend-reference.so
  build_plugin "$source_dir/backends/cpu" "$work/cpu" libloom-backend-cpu.so
  # A loom that finds no plugin next to itself: only the out-of-tree builds are candidates.
  mkdir -p "$work/loom/bin" "$work/loom/lib"
  cp "$loom" "$work/loom/bin/"
  cp -P "$build_dir"/lib/libloom.so* "$work/loom/lib/"
  echo "== loom run with the out-of-tree reference_plugin and cpu backends"
  run_greedy reference "$work/reference.json"
  run_greedy reference_plugin "$work/reference_plugin.json" --loom "$work/loom/bin/loom" --plugin-path "$work/reference"
  same_tokens "$work/reference.json" "$work/reference_plugin.json" reference_plugin
  run_greedy cpu "$work/cpu.json" --loom "$work/loom/bin/loom" --plugin-path "$work/cpu" --set backend.threads=2
  python3 - "$work/cpu.json" <<'PY' || exit 1
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8").read().splitlines() if l.strip().startswith("{")]
if len(rs) != 4 or any(len(r.get("tokens", [])) != 48 for r in rs):
    sys.exit(f"FAIL: cpu: expected 4 results of 48 tokens, got {[len(r.get('tokens', [])) for r in rs]}")
print("ok: cpu generated 4 × 48 tokens")
PY
  grep -q "$work/cpu/libloom-backend-cpu.so" <("$work/loom/bin/loom" plugins --plugin-path "$work/cpu" --json) ||
    fail "loom plugins does not list the out-of-tree cpu backend"
  echo "== SDK test passed"
  exit 0
fi

case "$example" in
best_of_n) plugin_file=libloom-decoder-best_of_n.so ;;
length_verifier) plugin_file=libloom-verifier-length.so ;;
*) plugin_file=libloom-backend-naive.so ;;
esac
example_src="$source_dir/sdk/examples/$example"
if [ "$example" = best_of_n ]; then
  # docs/plugins.md §0 as a third party follows it: its CMakeLists.txt, source and pipeline written into
  # an empty directory (the source must be sdk/examples/best_of_n/best_of_n.cpp, unchanged), built
  # there against the installed SDK and run from the pipeline file.
  example_src="$work/walkthrough"
  python3 - "$source_dir/docs/plugins.md" "$source_dir/sdk/examples/best_of_n/best_of_n.cpp" "$example_src" <<'PY' ||
import os, re, sys
doc, example, out = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(doc, encoding="utf-8").read()
start = text.index("## 0. ")
section = text[start:text.index("\n## 1. ", start)]
blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
want = {"cmake": "CMakeLists.txt", "cpp": "best_of_n.cpp", "toml": "best_of_n.toml"}
got = {lang: body for lang, body in blocks if lang in want}
if set(got) != set(want):
    sys.exit(f"FAIL: docs/plugins.md section 0 lacks a {sorted(set(want) - set(got))} block")
if got["cpp"] != open(example, encoding="utf-8").read():
    sys.exit("FAIL: the decoder in docs/plugins.md section 0 differs from sdk/examples/best_of_n/best_of_n.cpp")
os.makedirs(out)
for lang, name in want.items():
    open(os.path.join(out, name), "w", encoding="utf-8").write(got[lang])
print("ok: docs/plugins.md section 0 written into an empty directory")
PY
    fail "the walk-through of docs/plugins.md"
  mkdir -p "$example_src/models" && ln -s "$model" "$example_src/models/stories260K.gguf"
  example_build="$example_src/build"
fi
build_plugin "$example_src" "$example_build" "$plugin_file"

if [ "$example" = naive_backend ]; then
  echo "== loom run --set backend.name=\"naive\" against the reference backend (greedy)"
  run_greedy reference "$work/reference.json"
  run_greedy naive "$work/naive.json" --plugin-path "$example_build"
  same_tokens "$work/reference.json" "$work/naive.json" naive
  echo "== SDK test passed"
  exit 0
fi

if [ "$example" = length_verifier ]; then
  echo "== loom run --decoder self_consistency with the out-of-tree length_verifier"
  out="$work/sc.json"
  "$loom" run -m "$model" -p "One day, a little" -n 12 --seed 11 --temp 1.0 --json --decoder self_consistency \
    --set decoder.samples=6 --set 'decoder.answer_regex="^\\s*([A-Za-z]+)"' --set 'decoder.verifier="weight"' \
    --set 'verifier.name="length_verifier"' --set verifier.target_words=6 --plugin-path "$example_build" \
    >"$out" 2>"$work/sc.err" || { cat "$out" "$work/sc.err" >&2; fail "loom run exited with $?"; }
  python3 - "$out" <<'PY' || { cat "$out" "$work/sc.err" >&2; exit 1; }
import json, sys
r = json.loads(open(sys.argv[1], encoding="utf-8").read().splitlines()[-1])
cands = r.get("candidates", [])
if len(cands) != 6:
    sys.exit(f"FAIL: expected 6 candidates, got {len(cands)}")
for c in cands:
    want = max(0.0, 1.0 - abs(len(c["text"].split()) - 6) / 6)
    if abs(c.get("verifier_score", -1) - want) > 1e-4:
        sys.exit(f"FAIL: verifier_score {c.get('verifier_score')} for {c['text']!r}, expected {want}")
print(f"ok: 6 candidates scored by length_verifier, answer {r.get('answer')!r}")
PY
  echo "== SDK test passed"
  exit 0
fi

echo "== loom run -c best_of_n.toml (the walk-through's pipeline)"
out="$work/run.json"
(cd "$example_src" && "$loom" run -c best_of_n.toml -p "Once upon a time" -n 16 --seed 1 --json) \
  >"$out" 2>"$work/run.err" || { cat "$out" "$work/run.err" >&2; fail "loom run exited with $?"; }

python3 - "$out" <<'PY' || { cat "$out" "$work/run.err" >&2; exit 1; }
import json, sys
lines = [l for l in open(sys.argv[1], encoding="utf-8").read().splitlines() if l.strip()]
if not lines:
    sys.exit("FAIL: loom run printed nothing")
try:
    r = json.loads(lines[-1])
except ValueError as e:
    sys.exit(f"FAIL: the last line of loom run --json is not JSON: {e}")
if "stop_reason" not in r:
    sys.exit("FAIL: no stop_reason in the result")
nb = r.get("hypotheses")
if not isinstance(nb, list) or len(nb) != 3:
    sys.exit(f"FAIL: expected hypotheses with 3 entries (decoder.n=3), got {nb!r}")
for i, h in enumerate(nb):
    if "stop_reason" not in h:
        sys.exit(f"FAIL: hypotheses[{i}] has no stop_reason: {h!r}")
print(f"ok: 3 hypotheses, stop_reason {r['stop_reason']}")
PY
echo "== SDK test passed"
