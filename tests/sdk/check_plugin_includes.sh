#!/usr/bin/env bash
# check_plugin_includes.sh BUILD_DIR SOURCE_DIR — every plugin built in the tree (the backends in
# backends/, the plugins in plugins/) is built against the SDK alone, as a third party's would be:
# in BUILD_DIR/compile_commands.json no source of a plugin target lies in core/ or attention/, and
# none of their compile commands names an include directory there (or backends/common).
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: check_plugin_includes.sh BUILD_DIR SOURCE_DIR" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
commands="$build_dir/compile_commands.json"
[ -f "$commands" ] || { echo "FAIL: no $commands (configure with CMAKE_EXPORT_COMPILE_COMMANDS=ON)" >&2; exit 1; }

python3 - "$commands" "$source_dir" <<'PY'
import json, re, shlex, sys
commands, src = sys.argv[1], sys.argv[2]
entries = json.load(open(commands, encoding="utf-8"))
forbidden = [f"{src}/core", f"{src}/attention", f"{src}/backends/common"]
checked, bad = set(), []
for e in entries:
    m = re.search(r"CMakeFiles/(loom_plugin_(?:backend|sampler|stop|decoder)_[A-Za-z0-9_]+)\.dir/", e.get("output", "") + " " + e.get("command", ""))
    if not m:
        continue
    target = m.group(1)
    checked.add(target)
    f = e["file"]
    if any(f.startswith(p + "/") for p in forbidden):
        bad.append(f"{target}: compiles {f}")
    args = e.get("arguments") or shlex.split(e["command"])
    incs = []
    for i, a in enumerate(args):
        for flag in ("-I", "-isystem", "-iquote"):
            if a == flag and i + 1 < len(args):
                incs.append(args[i + 1])
            elif a.startswith(flag) and len(a) > len(flag):
                incs.append(a[len(flag):])
    for d in incs:
        if any(d == p or d.startswith(p + "/") for p in forbidden):
            bad.append(f"{target}: include directory {d}")
    if not any(d.rstrip("/") == f"{src}/sdk/include" for d in incs):
        bad.append(f"{target}: {f} is not compiled against {src}/sdk/include")
need = {"loom_plugin_backend_cpu", "loom_plugin_backend_reference"}
missing = need - checked
if missing:
    sys.exit(f"FAIL: no compile commands for {sorted(missing)} in {commands}")
if bad:
    sys.exit("FAIL: plugins reach into the host's sources:\n  " + "\n  ".join(sorted(set(bad))))
print(f"ok: {len(checked)} plugin targets built against the SDK only: {', '.join(sorted(checked))}")
PY
