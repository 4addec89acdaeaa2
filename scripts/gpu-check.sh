#!/usr/bin/env bash
# The cuda backend on a GPU machine in one go (a few minutes on an H200; prepare .gpu with scripts/gpu-deps.sh):
#   1. binaries: the ones gpu-deps.sh built here for sm_90a (.gpu/build-gpu) when they start there, else a
#      build there (-DCMAKE_CUDA_ARCHITECTURES=90a, override: CUDA_ARCH) against the Debian packages in
#      .gpu/debs unpacked into a sysroot (nothing is downloaded there);
#   2. the backend-op tests of every op and dtype against the reference (BackendOps.*/cuda, token-tree rows
#      included) and stories260K end to end on cuda (CudaBackendEndToEnd.*: greedy tokens, batched, paged
#      under preemption): they must pass, not skip; a failure is rerun under compute-sanitizer (memcheck);
#   3. the ceilings, measured in the same run through PyTorch: device-to-device copy bandwidth (bytes read
#      + written) and a bf16 8192³ matrix product (tensor-core rate);
#   4. loom bench on synth models (made on the CPUs while the tests run) — Llama-3 1B and 8B shapes, BF16
#      and Q4_0: batch-1 decode at depth 0 and 4096, prefill 512, and --requests 64 --concurrency 64;
#      then where the time goes: loom bench --profile (engine phases, [backend] profile's per-op table),
#      and runs without CUDA graphs and without the exact head;
#   5. one JSON summary (gpu-check.json, in $OUT when set): every bench's numbers, decode's bytes per token
#      (weights + KV read) as a fraction of the copy bandwidth, prefill's 2·params FLOP per token as a
#      fraction of the tensor-core rate, and 64 concurrent requests' throughput over batch-1 decode's.
# Usage: bash scripts/gpu-check.sh [--quick] [--no-bench] [--no-profile]   (--quick: the 1B shape only)
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
say() { echo "gpu-check [$(($(date +%s) - t0))s] $*"; }
quick=0 bench=1 profile=1
for a in "$@"; do
  case "$a" in
  --quick) quick=1 ;;
  --no-bench) bench=0 ;;
  --no-profile) profile=0 ;;
  *) echo "gpu-check: unknown option '$a' (--quick, --no-bench, --no-profile)" >&2; exit 2 ;;
  esac
done
out=${OUT:-.}
synth=/tmp/loom-synth
logs=$synth/logs # all come back as $out/gpu-logs.tgz
mkdir -p "$logs"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 |
  sed 's/^/gpu-check: /'

# The CUDA libraries (toolkit or PyTorch's wheels), for binaries built elsewhere.
cuda_dirs() {
  find /usr/local/cuda* /usr/lib/x86_64-linux-gnu /opt -name 'libcublasLt.so.13*' -o -name 'libcudart.so.13*' \
    2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd:
}
export LD_LIBRARY_PATH="$(cuda_dirs)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- synth models in the background: CPU work while the GPU runs the tests ----
shapes=(llama-3.2-1b-like)
[ $quick = 1 ] || shapes+=(llama-3-8b)
if [ $bench = 1 ]; then
  for shape in "${shapes[@]}"; do
    for type in bf16 q4_0; do echo "$shape-$type"; done
  done > "$synth/list"
fi
start_synth() {
  while read -r name; do
    (build-gpu/bin/loom synth --shape "${name%-*}" --type "${name##*-}" -o "$synth/$name.gguf.part" \
      > "$synth/$name.synth.log" 2>&1 && mv "$synth/$name.gguf.part" "$synth/$name.gguf") &
  done < "$synth/list"
}

# ---- 1. binaries ----
prebuilt() {
  [ -f .gpu/build-gpu/built-at ] || return 1
  local root
  root=$(cat .gpu/build-gpu/built-at)
  if [ "$(pwd -P)" != "$root" ] && ! [ -e "$root" ]; then mkdir -p "$(dirname "$root")" && ln -s "$PWD" "$root"; fi
  rm -rf build-gpu && cp -a .gpu/build-gpu build-gpu
  export LD_LIBRARY_PATH="$PWD/.gpu/libs:$LD_LIBRARY_PATH"
  build-gpu/bin/loom --version > /dev/null && build-gpu/tests/plugin/loom_plugin_tests --gtest_list_tests > /dev/null
}
build_here() {
  local sys=/tmp/loom-sysroot cmake_extra=()
  if [ -d .gpu/debs ] && ! [ -f /usr/include/boost/version.hpp ]; then
    say "unpacking $(ls .gpu/debs | wc -l) Debian packages into $sys"
    mkdir -p "$sys"
    for d in .gpu/debs/*.deb; do
      if command -v dpkg > /dev/null; then dpkg -x "$d" "$sys"; else (cd "$sys" && ar p "$OLDPWD/$d" data.tar.xz | tar xJ); fi
    done
    cmake_extra+=(-DCMAKE_PREFIX_PATH="$sys/usr" -DCMAKE_INCLUDE_PATH="$sys/usr/include"
      -DCMAKE_LIBRARY_PATH="$sys/usr/lib/x86_64-linux-gnu" -DOPENSSL_ROOT_DIR="$sys/usr")
    export PKG_CONFIG_PATH="$sys/usr/lib/x86_64-linux-gnu/pkgconfig:$sys/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR="$sys"
    export LD_LIBRARY_PATH="$sys/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"
  fi
  rm -rf build-gpu
  say "configure (sm_${CUDA_ARCH:-90a})"
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90a}" \
    -DLOOM_BACKEND_CPU=OFF -DLOOM_BUILD_BENCH=OFF -DLOOM_WARNINGS_AS_ERRORS=OFF "${cmake_extra[@]}" \
    > "$logs/gpu-configure.log" 2>&1 || { tail -30 "$logs/gpu-configure.log"; return 1; }
  say "build ($(nproc) jobs)"
  cmake --build build-gpu -j "$(nproc)" --target loom_cli loom_plugin_backend_cuda loom_plugin_backend_reference \
    loom_plugin_tests > "$logs/gpu-build.log" 2>&1 || { grep -m20 -B2 -A8 "error" "$logs/gpu-build.log"; return 1; }
}
if prebuilt 2> "$logs/gpu-prebuilt.log"; then
  say "prebuilt binaries start here (built at $(cat .gpu/build-gpu/built-at))"
else
  say "prebuilt binaries do not start here: $(tail -1 "$logs/gpu-prebuilt.log"); building"
  build_here || exit 1
fi
[ $bench = 1 ] && start_synth
build-gpu/bin/loom plugins 2>&1 | grep -A2 "^cuda"

# ---- 2. tests ----
models=.gpu/models
[ -d "$models" ] || models=${LOOM_TEST_MODELS:-../shared/models}
filter='EveryBackend/BackendOps.*/cuda:CudaBackendEndToEnd.*:OutputHead.*'
say "backend-op and end-to-end tests"
LOOM_TEST_MODELS=$models timeout 150 build-gpu/tests/plugin/loom_plugin_tests --gtest_filter="$filter" \
  > "$out/gpu-tests.log" 2>&1
tests_rc=$?
grep -E "^\[ *(OK|FAILED|SKIPPED) *\]|^\[  PASSED|tests? ran" "$out/gpu-tests.log" | tail -20
tests_ok=0
[ $tests_rc = 0 ] && ! grep -q "SKIPPED \]" "$out/gpu-tests.log" && tests_ok=1
if [ $tests_rc != 0 ]; then
  say "tests failed (rc $tests_rc): the failures' first lines"
  grep -m12 -B1 -A4 "Failure\|error\|SKIPPED" "$out/gpu-tests.log" | cut -c1-300
  first=$(grep -m1 -oE "^\[  FAILED  \] [A-Za-z0-9_/.]+" "$out/gpu-tests.log" | awk '{print $NF}')
  if [ -n "$first" ] && command -v compute-sanitizer > /dev/null; then
    say "memcheck of $first"
    LOOM_TEST_MODELS=$models timeout 120 compute-sanitizer --tool memcheck --print-limit 5 \
      build-gpu/tests/plugin/loom_plugin_tests --gtest_filter="$first" > "$logs/gpu-memcheck.log" 2>&1
    grep -m30 -E "=========|Failure" "$logs/gpu-memcheck.log" | cut -c1-300
  fi
fi
[ $bench = 1 ] || { tar -czf "$out/gpu-logs.tgz" -C "$synth" logs; say "done (tests $([ $tests_ok = 1 ] && echo passed || echo FAILED))"; [ $tests_ok = 1 ]; exit; }

# ---- 3. ceilings ----
timeout 120 python3 - > "$synth/ceilings.json" 2> "$logs/gpu-ceilings.log" << 'PY'
import json, torch
def median_s(f, n=10):
    for _ in range(3): f()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        s.record(); f(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
    return sorted(ts)[n // 2]
n = 1 << 31
x = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
bw = 2 * n / median_s(lambda: y.copy_(x))
del x, y
m = 8192
a = torch.randn(m, m, dtype=torch.bfloat16, device="cuda"); b = torch.randn_like(a)
peak = 2 * m**3 / median_s(lambda: a @ b)
print(json.dumps({"copy_bandwidth_bytes_s": bw, "bf16_matmul_flop_s": peak, "gpu": torch.cuda.get_device_name()}))
PY
say "ceilings: $(cat "$synth/ceilings.json")"

# ---- 4. bench ----
runs=()
run_bench() { # name, model, args...
  local name=$1 model=$2
  shift 2
  say "bench $name"
  local b=(timeout 150 build-gpu/bin/loom bench -m "$model" --set backend.name=cuda --set kv_cache.dtype=f16 "$@" --json)
  if ! "${b[@]}" > "$synth/$name.json" 2> "$synth/$name.err"; then
    tail -3 "$synth/$name.err"
    say "again without CUDA graphs"
    "${b[@]}" --set backend.cuda_graphs=false > "$synth/$name.json" 2> "$synth/$name.err" ||
      { tail -3 "$synth/$name.err"; return 0; }
  fi
  runs+=("$name")
}
while read -r name; do
  for _ in $(seq 240); do [ -f "$synth/$name.gguf" ] || sleep 1; done
  m=$synth/$name.gguf
  [ -f "$m" ] || { say "synth $name did not finish: $(tail -2 "$synth/$name.synth.log")"; continue; }
  run_bench "$name-d0" "$m" --pp 512 --tg 128 -r 3
  run_bench "$name-d4096" "$m" --pp 512 --tg 64 -d 4096 -r 2
  run_bench "$name-c64" "$m" --requests 64 --concurrency 64 --prompt-len 128 --gen-len 64
done < "$synth/list"
cp "$synth"/*.err "$synth"/*.json "$synth"/*.synth.log "$logs/" 2> /dev/null

# ---- 5. summary ----
python3 scripts/gpu-summary.py "$synth" "$out/gpu-check.json" "$tests_ok" "${runs[@]}"
tar -czf "$out/gpu-logs.tgz" -C "$synth" logs

# Where the time goes ([backend] profile: per-op GPU time, the host's share), and what graphs and the exact
# head cost: on the 1B BF16 and 8B Q4_0 files, batch-1 decode and 16 concurrent requests.
variant() { # name, model, args...
  local name=$1 model=$2
  shift 2
  [ -f "$model" ] || return 0
  timeout 120 build-gpu/bin/loom bench -m "$model" --set backend.name=cuda --set kv_cache.dtype=f16 "$@" --json \
    > "$synth/$name.json" 2> "$synth/$name.err" || { tail -3 "$synth/$name.err"; return 0; }
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(f'gpu-check: {sys.argv[2]:34} decode {j.get(\"decode_tok_s\") or j.get(\"output_tok_s\") or 0:9.1f} tok/s')" \
    "$synth/$name.json" "$name"
  grep "cuda profile" "$synth/$name.err" | head -14
}
for name in llama-3.2-1b-like-bf16 llama-3-8b-q4_0; do
  [ $profile = 1 ] || break
  m=$synth/$name.gguf
  variant "$name-nographs" "$m" --pp 64 --tg 64 -r 2 --set backend.cuda_graphs=false
  variant "$name-inexacthead" "$m" --pp 64 --tg 64 -r 2 --set backend.exact_logits=false
  variant "$name-profile" "$m" --pp 512 --tg 32 -r 1 --profile
  variant "$name-c16-profile" "$m" --requests 16 --concurrency 16 --prompt-len 128 --gen-len 16 \
    --profile
done

cp "$synth"/*-nographs.* "$synth"/*-inexacthead.* "$synth"/*profile.* "$logs/" 2> /dev/null
tar -czf "$out/gpu-logs.tgz" -C "$synth" logs
say "done: $out/gpu-check.json (tests $([ $tests_ok = 1 ] && echo passed || echo FAILED))"
[ $tests_ok = 1 ]
