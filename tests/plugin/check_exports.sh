#!/usr/bin/env bash
# check_exports.sh PATH... — every plugin exports exactly loom_plugin_init and loom_plugin_score.
#
# A PATH is a plugin file, or a directory whose libloom-*.so files are all checked (a directory
# without any fails: the check must not pass on nothing). Uses `nm -D --defined-only`: anything
# else in the dynamic symbol table (a leaked C++ symbol, a static dependency's API) can clash with
# the host or another plugin, so loom_add_plugin() hides it with a version script.
set -euo pipefail

if [ $# -eq 0 ]; then
  echo "usage: check_exports.sh PLUGIN_OR_DIR..." >&2
  exit 2
fi
if ! command -v nm >/dev/null; then
  echo "check_exports.sh: nm (binutils) is not installed" >&2
  exit 2
fi

expected=$'loom_plugin_init\nloom_plugin_score'
files=()
for arg in "$@"; do
  if [ -d "$arg" ]; then
    shopt -s nullglob
    found=("$arg"/libloom-*.so)
    shopt -u nullglob
    if [ ${#found[@]} -eq 0 ]; then
      echo "FAIL: no libloom-*.so in $arg (nothing to check)" >&2
      exit 1
    fi
    files+=("${found[@]}")
  elif [ -f "$arg" ]; then
    files+=("$arg")
  else
    echo "FAIL: $arg: no such file or directory" >&2
    exit 1
  fi
done

status=0
for f in "${files[@]}"; do
  if ! syms=$(nm -D --defined-only "$f" 2>&1); then
    echo "FAIL: $f: nm cannot read it: $syms" >&2
    status=1
    continue
  fi
  # "0000000000001234 T loom_plugin_init" → the name; version suffixes (name@@VER) are dropped.
  names=$(printf '%s\n' "$syms" | awk 'NF >= 3 { sub(/@.*/, "", $3); print $3 }' | sort -u)
  if [ "$names" != "$expected" ]; then
    extra_all=$(comm -13 <(printf '%s\n' "$expected") <(printf '%s\n' "$names"))
    n_extra=$(printf '%s\n' "$extra_all" | grep -c . || true)
    extra=$(printf '%s\n' "$extra_all" | head -n 8 | tr '\n' ' ')
    if [ "$n_extra" -gt 8 ]; then extra="$extra... ($n_extra in all)"; fi
    missing=$(comm -23 <(printf '%s\n' "$expected") <(printf '%s\n' "$names") | tr '\n' ' ')
    echo "FAIL: $f must export exactly loom_plugin_init and loom_plugin_score" \
         "(build it with loom_add_plugin(), which applies the SDK's version script);" \
         "missing: [${missing% }], unexpected: [${extra% }]" >&2
    status=1
  else
    echo "ok: $f"
  fi
done
exit $status
