#!/usr/bin/env bash
# Runs Loom's tests — the command the README gives and CI runs:
#   1. default (Release) preset: build, then every ctest test (unit, integration, golden, configs, fuzz
#      replays);
#   2. asan preset (ASan + UBSan, -O1; the tests' own code not instrumented): build, then the same tests
#      under the sanitizers but for a few long ones the other presets run (RealModels, 500 prompt
#      lengths, ab's speculative identity check, speculative sampling's chi-square, the out-of-tree
#      build of the first-party backends against the installed SDK: default; the parallel paged-store
#      scheduler test: tsan) — CMakePresets.json lists them;
#   3. tsan preset (ThreadSanitizer): the engine's scheduling and threading tests;
#   4. fuzz preset (clang + libFuzzer, -O1): each fuzz target for LOOM_FUZZ_SECONDS (default 20) from its
#      seed corpus; a crash fails the run and leaves its input in tests/fuzz/corpus/<target>/ to commit.
# Integration and golden tests read models from LOOM_TEST_MODELS (default ../shared/models); without
# them they print SKIPPED with the reason.
#   scripts/test.sh            # all four
#   scripts/test.sh --quick    # only the default preset
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown option '$a'" >&2; exit 2 ;;
  esac
done
export LOOM_TEST_MODELS="${LOOM_TEST_MODELS:-$(cd .. && pwd)/shared/models}"
jobs="${LOOM_JOBS:-2}"

echo "== format (clang-format --dry-run --Werror)"
if command -v clang-format >/dev/null; then
  git ls-files '*.cpp' '*.hpp' '*.h' | xargs clang-format --dry-run --Werror
else
  echo "clang-format not installed: skipped (scripts/setup.sh --deps installs it)"
fi

echo "== default preset"
cmake --preset default >/dev/null
cmake --build --preset default -j "$jobs"
ctest --preset default -j "$jobs"
[ "$quick" = 1 ] && exit 0

echo "== asan preset (ASan + UBSan)"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs"

echo "== tsan preset (ThreadSanitizer: submit / cancel from other threads while one steps)"
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$jobs"
ctest --preset tsan -j "$jobs"

echo "== fuzz preset (libFuzzer, ${LOOM_FUZZ_SECONDS:-20} s per target)"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$jobs"
gguf_seeds=$(mktemp -d)
python3 tests/fuzz/make_gguf_seeds.py "$gguf_seeds"   # generated, not committed
for t in gguf tokenizer pipeline_config chat_template safetensors json_schema serve_request; do
  work=$(mktemp -d)
  seeds="tests/fuzz/corpus/$t"
  extra=""
  [ "$t" = gguf ] && extra="$gguf_seeds"
  [ "$t" = chat_template ] && extra="tests/data/chat/templates"
  # Crashes land in the seed directory, so a found input joins the corpus (and the replay test).
  if ! build-fuzz/tests/fuzz/fuzz_$t -max_total_time="${LOOM_FUZZ_SECONDS:-20}" -max_len=65536 -timeout=10 \
       -rss_limit_mb=4096 -artifact_prefix="$seeds/crash-" -print_final_stats=1 "$work" "$seeds" $extra \
       >"$work.log" 2>&1; then
    tail -40 "$work.log"
    echo "fuzz_$t: FAILED — the input is in $seeds/ (commit it with the fix)" >&2
    exit 1
  fi
  grep -E "stat::number_of_executed_units|Done" "$work.log" | tail -2 | sed "s/^/fuzz_$t: /"
  rm -rf "$work" "$work.log"
done
echo "== all tests passed"
