#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored) for scripts/gpu-check.sh on a GPU machine that cannot download anything:
# the Debian 12 packages the build needs beyond a compiler, CMake, ninja and CUDA (Boost, toml++,
# nlohmann/json, PCRE2, OpenSSL, GoogleTest; about 17 MB of .deb files, unpacked there into a sysroot),
# and the test models and references (stories260K and its run.c token ids). Run here, then carry `.gpu`:
#   scripts/gpu-deps.sh && <device run, carry .gpu> bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
models=${LOOM_TEST_MODELS:-../shared/models}
mkdir -p .gpu/debs .gpu/models/reference
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
pkgs=(libboost1.74-dev libboost-program-options1.74-dev libboost-program-options1.74.0 libtomlplusplus-dev
  libtomlplusplus3 nlohmann-json3-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libssl-dev libssl3 libgtest-dev libgmock-dev)
(cd .gpu/debs && apt-get download "${pkgs[@]}" 2>/dev/null)
cp "$models/stories260K.gguf" .gpu/models/
cp "$models/reference/token_ids.txt" .gpu/models/reference/
du -sh .gpu
echo "gpu-deps: .gpu is ready; carry it with the device run (scripts/gpu-check.sh)"
