#!/usr/bin/env bash
# Builds and runs the kernel benchmark (bench/kernels.c) at 1 and 2 threads.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target bench_kernels -j "$(nproc)" >/dev/null
for t in 1 2; do OMP_NUM_THREADS=$t build/bench_kernels; done
