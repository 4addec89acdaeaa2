#!/usr/bin/env bash
# Sets Loom up on Debian 12: installs the Debian packages that are missing, configures the default
# (Release) preset, builds what runs — loom and its plugins, not the tests (scripts/test.sh builds
# those) — and fetches the demo model. Idempotent: a second run only rebuilds what changed.
#   scripts/setup.sh            # deps + build + model
#   scripts/setup.sh --deps     # only the Debian packages
#   scripts/setup.sh --no-model # skip the model download
set -euo pipefail
cd "$(dirname "$0")/.."

deps_only=0
fetch_model=1
for a in "$@"; do
  case "$a" in
    --deps) deps_only=1 ;;
    --no-model) fetch_model=0 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$a' (see --help)" >&2; exit 2 ;;
  esac
done

# Debian packages (see ../shared/docs/DEPENDENCIES.md for why each is here).
packages=(build-essential cmake ninja-build ccache pkg-config python3 python3-pip clang libclang-rt-dev
  libdnnl-dev ocl-icd-opencl-dev libboost-dev libboost-program-options-dev
  libtomlplusplus-dev libspdlog-dev libfmt-dev libpcre2-dev nlohmann-json3-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev clang-format chromium tmux haproxy)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The official OpenAI client for `loom serve`'s tests, into .pydeps (pip --target: no virtual environment
# needed, nothing installed system-wide).
if ! PYTHONPATH=.pydeps python3 -c "import openai" 2>/dev/null; then
  echo "setup: installing the openai Python client into .pydeps"
  python3 -m pip install --quiet --disable-pip-version-check --target .pydeps "openai>=1.40" >/dev/null 2>&1 ||
    echo "setup: could not install the openai client (pip, PyPI): the serve test's client checks will be skipped" >&2
fi
[ "$deps_only" = 1 ] && exit 0

# loom and its plugins only; scripts/test.sh builds the tests (and the cuda plugin, GPU or not).
gpu=OFF
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then gpu=ON; fi
[ "$gpu" = OFF ] && echo "setup: no GPU here: the cuda backend plugin is left out (scripts/test.sh builds it)"
cmake --preset default -DLOOM_RUNTIME_CUDA=$gpu >/dev/null
cmake --build --preset default --target loom_runtime
ln -sf build/compile_commands.json compile_commands.json

if [ "$fetch_model" = 1 ]; then
  scripts/fetch-models.sh
fi
echo "setup: done. Try: build/bin/loom run -c configs/quickstart.toml -p \"Once upon a time\""
