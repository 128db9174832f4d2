#!/usr/bin/env bash
# What logging costs on the SDXL LoRA job (sdxl-tiny, 64x64 latents, batch 1):
# step time relative to checkpointing without logging, and peak memory, for
# logging every step (sync and async) and every 5 steps (bench/logging.lua).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target ckrun -j "$(nproc)" >/dev/null
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} build/ckrun --allow-write "$logs" bench/logging.lua \
  --rounds "${ROUNDS:-30}" --pairs "${PAIRS:-60}" --resolution "${RESOLUTION:-512}" \
  --tables "${TABLES:-setups,pairs,work}" --dir "$logs"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
