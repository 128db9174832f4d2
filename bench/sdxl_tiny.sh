#!/usr/bin/env bash
# Step time and whole-process peak memory (max RSS) of the SDXL LoRA job on
# sdxl-tiny: 32x32 latents at batch 2 and 64x64 latents at batch 1, with fp32
# and bf16 storage (STORAGES="fp32 bf16"), one after the other per shape.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target ckrun -j "$(nproc)" >/dev/null
steps=${STEPS:-60}
mkdir -p out
echo "| latents | batch | storage | step time (ms) | max RSS (MiB) | planned peak (MiB) | held for backward (MiB) |"
echo "|---|---|---|---|---|---|---|"
for cfg in "256 2" "512 1"; do
  set -- $cfg
  for st in ${STORAGES:-fp32 bf16}; do
    json=$(build/ckrun --plan --json scripts/train_sdxl_lora.lua --resolution "$1" --batch "$2" --storage "$st")
    plan=$(echo "$json" | sed -E 's/.*"peak_bytes": ([0-9]+).*/\1/')
    held=$(echo "$json" | sed -E 's/.*"activation_bytes": ([0-9]+).*/\1/')
    out=$( { /usr/bin/time -f "RSS %M" build/ckrun scripts/train_sdxl_lora.lua --resolution "$1" --batch "$2" \
             --storage "$st" --steps "$steps" --out out/.bench_lora.safetensors > out/.bench_sdxl_tiny.out; } 2>&1 )
    ms=$(sed -nE 's/^step time: ([0-9.]+) ms.*/\1/p' out/.bench_sdxl_tiny.out)
    rss=$(echo "$out" | sed -nE 's/^RSS ([0-9]+)/\1/p')
    echo "| $(( $1 / 8 ))x$(( $1 / 8 )) | $2 | $st | $ms | $(( rss / 1024 )) | $(( plan / 1048576 )) | $(( held / 1048576 )) |"
  done
done
rm -f out/.bench_lora.safetensors out/.bench_sdxl_tiny.out
