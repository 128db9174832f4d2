#!/usr/bin/env bash
# Before bench/gpu_check.sh goes to a GPU machine that has no package
# registry: puts the Debian packages ckrun builds against (Lua 5.4, OpenBLAS's
# OpenMP build and the Fortran runtime it needs, jansson, libsentencepiece, toml++'s headers, ICU, zlib, libpng,
# libjpeg-turbo and libwebp) into .gpu_deps/ as .deb files (about 30 MB, ignored by git). There, gpu_check.sh unpacks them into a
# private prefix when the machine lacks Lua or OpenBLAS, and builds against
# that (CMake's CK_DEPS_ROOT). Run here, where apt works:
#
#   bash bench/gpu_deps.sh      # then carry .gpu_deps with the working tree
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(liblua5.4-0 liblua5.4-dev libopenblas0-openmp libopenblas-openmp-dev libgfortran5 libquadmath0 libjansson4 libjansson-dev
      libsentencepiece0 libsentencepiece-dev libtomlplusplus-dev libicu72 libicu-dev zlib1g zlib1g-dev
      libpng16-16 libpng-dev libjpeg62-turbo libjpeg62-turbo-dev libwebp7 libwebp-dev)
rm -rf .gpu_deps
mkdir -p .gpu_deps
# apt-get download writes into the current directory (as _apt where it can); with no package lists yet, fetch them first
fetch() { (cd .gpu_deps && chmod 777 . && apt-get download -q "${pkgs[@]}"); }
fetch || { apt-get update -qq && fetch; }
n=$(ls .gpu_deps/*.deb | wc -l)
[ "$n" -eq "${#pkgs[@]}" ] || { echo "gpu_deps: $n packages in .gpu_deps, expected ${#pkgs[@]}" >&2; exit 1; }
echo "gpu_deps: $n packages in .gpu_deps ($(du -sh .gpu_deps | cut -f1))"
