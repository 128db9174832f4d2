#!/usr/bin/env bash
# Checkpoint policies: on sdxl-tiny at 64x64 latents (LoRA rank 4, batch 1)
# measured on the CPU, and on full SDXL LoRA at 1024x1024, batch 1, from the
# plan in fp32 and in bf16 storage.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target ckrun -j "$(nproc)" >/dev/null
P=none,diffusers,selective,sqrt_n,every_n:2,every_n:3,budget:90%,budget:75%,budget:62%,budget:55%
echo "== sdxl-tiny, 64x64 latents, batch 1, LoRA rank 4: measured on the CPU"
build/ckrun scripts/policy_sweep.lua --resolution 512 --batch 1 --steps ${STEPS:-6} \
  --budgets 90%,75%,62%,55% --svg out/policy_sweep.svg
for storage in fp32 bf16; do
  echo "== full SDXL LoRA rank 4, 1024x1024, batch 1, $storage storage: from the plan"
  build/ckrun --plan --policies "$P" scripts/train_sdxl_lora.lua --size full --storage "$storage"
done
