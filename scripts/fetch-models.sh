#!/usr/bin/env bash
# Puts the demo model into models/: from $LOOM_MODELS_MIRROR (a directory or URL prefix) when set,
# else from its public Hugging Face location; verifies the pinned sha256 either way.
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
  exit 0
fi
tmp="$dest.part"
rm -f "$tmp"
if [ -n "${LOOM_MODELS_MIRROR:-}" ]; then
  case "$LOOM_MODELS_MIRROR" in
    http://*|https://*) curl -fsSL --retry 3 -o "$tmp" "$LOOM_MODELS_MIRROR/$name" ;;
    *)
      if [ ! -f "$LOOM_MODELS_MIRROR/$name" ]; then
        echo "fetch-models: $LOOM_MODELS_MIRROR/$name not found (LOOM_MODELS_MIRROR must hold $name)" >&2
        exit 1
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
    exit 1
  fi
fi
if ! verify "$tmp"; then
  echo "fetch-models: sha256 mismatch for $name (expected $sha256); not installing it" >&2
  rm -f "$tmp"
  exit 1
fi
mv "$tmp" "$dest"
echo "fetch-models: $dest verified"
