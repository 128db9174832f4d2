#!/usr/bin/env bash
# FLUX.1-dev LoRA plans per card size (BENCHMARKS.md, "FLUX.1-dev LoRA plans"):
# scripts/train_flux_lora.lua --plan (no GPU, no weights) with
# --checkpoint auto:CARD --batch auto, at 512 and 1024 pixels, in bf16 and with
# an fp8 base. Prints one line per plan: what auto chose and its peak, or the
# refusal naming the smallest plan. usage: bench/flux_plans.sh [build/ckrun]
set -u
CK=${1:-build/ckrun}
printf '%-5s %-10s %-5s | %s\n' card base px "batch, policy, peak, recompute (or why nothing fits)"
for card in 8 12 16 24 48 80; do
  for base in bf16 fp8; do
    for px in 512 1024; do
      fp=; [ $base = fp8 ] && fp=--fp8-base
      out=$("$CK" --plan --device cuda scripts/train_flux_lora.lua --size dev --mixed-precision bf16 $fp \
        --resolution $px --checkpoint auto:${card}GiB --batch auto 2>&1)
      if [ $? = 0 ]; then
        b=$(awk '$1 == "batch" { print $2 }' <<< "$out")
        row=$(grep -A1 '^policy' <<< "$out" | tail -1)
        line="batch $b, $(awk '{ printf "%s, %s GiB, %s", $1, $2, $4 }' <<< "$row")"
      else
        line=$(tail -1 <<< "$out" | sed 's/^.*batch auto: //')
      fi
      printf '%-5s %-10s %-5s | %s\n' "${card}GB" $base $px "$line"
    done
  done
done
