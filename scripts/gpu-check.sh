#!/usr/bin/env bash
# The cuda backend on a GPU machine in one go (≤ 5 minutes on an H200 from a bare machine, build included):
#   1. dependencies: where the machine lacks them, the Debian packages scripts/gpu-deps.sh put in .gpu/debs
#      are unpacked into a sysroot (nothing is downloaded there);
#   2. configure with -DCMAKE_CUDA_ARCHITECTURES=90a (override: CUDA_ARCH) and build only what the check
#      runs: loom, the cuda and reference_plugin backends, the plugin tests;
#   3. the backend-op tests of every op and dtype against the reference (BackendOps.*/cuda) and stories260K
#      end to end on cuda (CudaBackendEndToEnd.*: greedy tokens, batched, paged under preemption): they must
#      pass, not skip;
#   4. loom bench on synth models made there — Llama-3 1B and 8B shapes, BF16 and Q4_0: batch-1 decode at
#      depth 0 and 4096, prefill 512, and --requests 64 --concurrency 64;
#   5. one JSON summary (gpu-check.json, and $OUT/ when set): every bench's numbers, bytes moved per decoded
#      token (weights + KV read) and that traffic's fraction of the device-to-device copy bandwidth
#      measured in the same run (PyTorch, bytes read + written, as docs/benchmarks.md reports it).
# Usage: bash scripts/gpu-check.sh [--quick]   (--quick: the 1B shape only, no 8B)
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
say() { echo "gpu-check [$(( $(date +%s) - t0 ))s] $*"; }
quick=0
[ "${1:-}" = "--quick" ] && quick=1
out=${OUT:-.}
summary=$out/gpu-check.json
jobs=$(nproc)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu-check: /'

# ---- 1. dependencies ----
sys=/tmp/loom-sysroot
cmake_extra=()
if [ -d .gpu/debs ] && ! [ -f /usr/include/boost/version.hpp ]; then
  say "unpacking $(ls .gpu/debs | wc -l) Debian packages into $sys"
  mkdir -p "$sys"
  for d in .gpu/debs/*.deb; do
    if command -v dpkg >/dev/null; then dpkg -x "$d" "$sys"
    else (cd "$sys" && ar p "$OLDPWD/$d" data.tar.xz | tar xJ); fi
  done
  cmake_extra+=(-DCMAKE_PREFIX_PATH="$sys/usr" -DCMAKE_INCLUDE_PATH="$sys/usr/include"
    -DCMAKE_LIBRARY_PATH="$sys/usr/lib/x86_64-linux-gnu" -DOPENSSL_ROOT_DIR="$sys/usr")
  export PKG_CONFIG_PATH="$sys/usr/lib/x86_64-linux-gnu/pkgconfig:$sys/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$sys"
  export LD_LIBRARY_PATH="$sys/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# ---- 2. build ----
say "configure (sm_${CUDA_ARCH:-90a})"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90a}" \
  -DLOOM_BACKEND_CPU=OFF -DLOOM_BUILD_BENCH=OFF -DLOOM_WARNINGS_AS_ERRORS=OFF "${cmake_extra[@]}" \
  > "$out/gpu-configure.log" 2>&1 || { tail -30 "$out/gpu-configure.log"; exit 1; }
say "build ($jobs jobs)"
cmake --build build-gpu -j "$jobs" --target loom_cli loom_plugin_backend_cuda loom_plugin_backend_reference \
  loom_plugin_tests > "$out/gpu-build.log" 2>&1 || { grep -m20 -B2 -A8 "error" "$out/gpu-build.log"; exit 1; }
loom=build-gpu/bin/loom
$loom plugins 2>/dev/null | grep -A2 "^cuda" || true

# ---- 3. tests ----
models=.gpu/models
[ -d "$models" ] || models=${LOOM_TEST_MODELS:-../shared/models}
tests_ok=1
say "backend-op tests"
LOOM_TEST_MODELS=$models build-gpu/tests/plugin/loom_plugin_tests \
  --gtest_filter='EveryBackend/BackendOps.*/cuda:CudaBackendEndToEnd.*' --gtest_brief=1 \
  2>&1 | tee "$out/gpu-ops.log" | tail -15
grep -q "SKIPPED \]\|FAILED" "$out/gpu-ops.log" && tests_ok=0

# ---- 4. bench ----
bw=$(python3 - <<'PY' 2>/dev/null
import torch
n = 1 << 30
x = torch.empty(n, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(10):
    s.record(); y.copy_(x); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
ts.sort()
print(2 * n / ts[len(ts) // 2])  # bytes read + written per second, median
PY
)
say "device-to-device copy: ${bw:-unmeasured} B/s"
mkdir -p /tmp/loom-synth
runs=()
bench() { # name, model, args...
  local name=$1 model=$2; shift 2
  say "bench $name"
  $loom bench -m "$model" --set backend.name=cuda --set kv_cache.dtype=f16 "$@" --json \
    > "/tmp/loom-synth/$name.json" 2> "/tmp/loom-synth/$name.err" || { tail -3 "/tmp/loom-synth/$name.err"; return 0; }
  runs+=("$name")
}
shapes=(llama-3.2-1b-like)
[ $quick = 1 ] || shapes+=(llama-3-8b)
for shape in "${shapes[@]}"; do
  for type in bf16 q4_0; do
    m=/tmp/loom-synth/$shape-$type.gguf
    [ -f "$m" ] || { say "synth $shape $type"; $loom synth --shape "$shape" --type "$type" -o "$m" > /dev/null 2>&1; }
    bench "$shape-$type-d0" "$m" --pp 512 --tg 128 -r 3
    bench "$shape-$type-d4096" "$m" --pp 512 --tg 64 -d 4096 -r 2
    bench "$shape-$type-c64" "$m" --requests 64 --concurrency 64 --prompt-len 128 --gen-len 128
  done
done

# ---- 5. summary ----
python3 - "$summary" "${bw:-0}" "$tests_ok" "${runs[@]}" <<'PY'
import json, sys, os, time
path, bw, ok, names = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1", sys.argv[4:]
rows = []
for n in names:
    j = json.load(open(f"/tmp/loom-synth/{n}.json"))
    r = {"run": n, "bench": j}
    tok_s = j.get("decode_tok_s")
    per_tok = j.get("memory", {}).get("decode_read_bytes")
    if tok_s and per_tok:
        r["bytes_per_token"] = per_tok
        r["bytes_per_s"] = tok_s * per_tok
        r["fraction_of_copy_bandwidth"] = tok_s * per_tok / bw if bw > 0 else None
    rows.append(r)
s = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "copy_bandwidth_bytes_s": bw or None, "tests_passed": ok, "runs": rows}
json.dump(s, open(path, "w"), indent=1)
print(f"{'run':34} {'decode tok/s':>12} {'prefill tok/s':>13} {'B/token':>12} {'of copy bw':>10}")
for r in rows:
    j = r["bench"]
    f = r.get("fraction_of_copy_bandwidth")
    print(f"{r['run']:34} {j.get('decode_tok_s') or j.get('output_tok_s') or 0:12.1f} {j.get('prefill_tok_s') or 0:13.1f} "
          f"{r.get('bytes_per_token') or 0:12.3e} {(f'{100*f:.1f}%' if f else '-'):>10}")
PY
say "done: $summary (tests $([ $tests_ok = 1 ] && echo passed || echo FAILED))"
[ $tests_ok = 1 ]
