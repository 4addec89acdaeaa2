#!/usr/bin/env bash
# Load figures of `loom serve` against `llama-server` on the same model and machine, interleaved (loom,
# llama-server, loom, llama-server, …: drift on a shared machine hits both alike), with
# scripts/load_serve.py at 1, 8 and 64 concurrent clients (greedy, streamed). Prints one JSON line per
# (round, server, concurrency) and keeps them in the output file.
#   scripts/serve_vs_llama_server.sh MODEL.gguf LLAMA_SERVER [ROUNDS] [OUT.jsonl]
# LLAMA_SERVER: built from the same llama-cpp-python sdist as the bench peer
# (../shared/tools/build-peer-bench.sh mainline builds llama-bench; build the llama-server target in the
# same build directory). LOOM_SERVE_ARGS / LLAMA_SERVER_ARGS add options; LOAD_ARGS go to load_serve.py.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: serve_vs_llama_server.sh MODEL.gguf LLAMA_SERVER [ROUNDS] [OUT.jsonl]}
llama=${2:?the llama-server binary}
rounds=${3:-2}
out=${4:-serve_vs_llama_server.jsonl}
threads=$(nproc)
load_args=${LOAD_ARGS:---concurrency 1,8,64 --requests 64 --max-tokens 64}
: >"$out"

wait_up() { # port
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "serve_vs_llama_server: the server on port $1 did not come up" >&2
  return 1
}

run_one() { # round name port cmd...
  local round=$1 name=$2 port=$3
  shift 3
  "$@" >/dev/null 2>&1 &
  local pid=$!
  wait_up "$port"
  # shellcheck disable=SC2086
  python3 scripts/load_serve.py --url "http://127.0.0.1:$port" $load_args --json |
    while read -r line; do
      echo "{\"round\": $round, \"server\": \"$name\", \"row\": $line}" | tee -a "$out"
    done
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
}

for r in $(seq 1 "$rounds"); do
  # shellcheck disable=SC2086
  run_one "$r" loom 18411 build/bin/loom serve -m "$model" --port 18411 --parallel 64 ${LOOM_SERVE_ARGS:-}
  # shellcheck disable=SC2086
  run_one "$r" llama-server 18412 "$llama" -m "$model" --port 18412 -np 64 -c $((64 * 256)) -t "$threads" \
    --no-webui ${LLAMA_SERVER_ARGS:-}
done
echo "serve_vs_llama_server: $(wc -l <"$out") rows in $out" >&2
