#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored) for scripts/gpu-check.sh on a GPU machine that cannot download anything:
#   .gpu/build-gpu  what the check runs, built here for sm_90a (CUDA_ARCH to change it) when nvcc is here:
#                   loom, its plugins, libloom, the plugin tests — so the GPU's minutes go to the run, not
#                   to a build (the check still builds there when these do not start);
#   .gpu/libs       the Debian runtime libraries those binaries need beyond glibc, libstdc++ and CUDA;
#   .gpu/debs       the Debian 12 packages a build there needs beyond a compiler, CMake, ninja and CUDA
#                   (Boost, toml++, nlohmann/json, PCRE2, OpenSSL, GoogleTest; unpacked there into a sysroot);
#   .gpu/models     stories260K and its run.c token ids.
# About 40 MB. Run here, then carry `.gpu`:  scripts/gpu-deps.sh && <device run, carry .gpu> bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
models=${LOOM_TEST_MODELS:-../shared/models}
mkdir -p .gpu/debs .gpu/models/reference .gpu/libs
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
pkgs=(libboost1.74-dev libboost-program-options1.74-dev libboost-program-options1.74.0 libtomlplusplus-dev
  libtomlplusplus3 nlohmann-json3-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libssl-dev libssl3 libgtest-dev libgmock-dev)
[ -n "$(ls .gpu/debs)" ] || (cd .gpu/debs && apt-get download "${pkgs[@]}" 2>/dev/null)
cp "$models/stories260K.gguf" .gpu/models/
cp "$models/reference/token_ids.txt" .gpu/models/reference/

if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=$PATH:/usr/local/cuda/bin
  # Built where the check runs it (build-gpu at the repository's root); the prebuilt copy keeps that layout.
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90a}" \
    -DLOOM_BACKEND_CPU=OFF -DLOOM_BUILD_BENCH=OFF -DLOOM_WARNINGS_AS_ERRORS=OFF >/dev/null
  cmake --build build-gpu -j "$(nproc)" --target loom_cli loom_plugin_backend_cuda loom_plugin_backend_reference \
    loom_plugin_tests
  rm -rf .gpu/build-gpu && mkdir -p .gpu/build-gpu/tests/plugin
  cp -a build-gpu/bin build-gpu/lib .gpu/build-gpu/
  cp -a build-gpu/tests/plugin/loom_plugin_tests .gpu/build-gpu/tests/plugin/
  echo "$PWD" > .gpu/build-gpu/built-at # the tests find plugins and sources by this absolute path
  for f in .gpu/build-gpu/bin/* .gpu/build-gpu/tests/plugin/loom_plugin_tests; do ldd "$f"; done |
    awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|/cuda|/work/' |
    xargs -r cp -L -t .gpu/libs
fi
du -sh .gpu
echo "gpu-deps: .gpu is ready; carry it with the device run (scripts/gpu-check.sh)"
