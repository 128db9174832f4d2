#!/usr/bin/env bash
# Samples during training on sdxl-tiny (256 px, batch 2): the time each
# sampling takes (the log's sample_time: every prompt's text embeddings were
# made once before training; each rendering runs the UNet at batch 2 for
# every sampler step and the VAE's decoder once, its weights loaded again
# first), the training steps' time with and without sampling, the planned
# arena (the larger of training's and sampling's) and the peak RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target ckrun -j "$(nproc)" >/dev/null
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
steps=${STEPS:-20}
cat > "$w/prompts.txt" <<'P'
a red circle on a white background --s 30
a blue square on a black background --w 512 --h 256 --s 30 --ss dpmpp_2m
P
T="scripts/train_sdxl_lora.lua --resolution 256 --batch 2 --steps $steps --log-every 10"
echo "| run | step time (ms) | sampling s (2 prompts, 30 steps each) | planned arena (MiB) | peak RSS (MiB) |"
echo "|---|---:|---:|---:|---:|"
for mode in without with; do
  extra=""
  [ "$mode" = with ] && extra="--sample-every 10 --sample-prompts $w/prompts.txt"
  plan=$(build/ckrun --allow-read "$w" --plan --json $T $extra | sed -E 's/.*"group_arena_bytes": ([0-9]+).*/\1/')
  out=$( { /usr/bin/time -f "RSS %M" build/ckrun --allow-write "$w" $T $extra --out "$w/lora.safetensors" \
           --log-dir "$w/log_$mode" > "$w/out_$mode"; } 2>&1 )
  ms=$(sed -nE 's/^step time: ([0-9.]+) ms.*/\1/p' "$w/out_$mode")
  rss=$(echo "$out" | sed -nE 's/^RSS ([0-9]+)/\1/p')
  st=$(sed -nE 's/.*"sample_time":([0-9.]+).*/\1/p' "$w/log_$mode/metrics.jsonl" | awk '{printf "%s%.2f", (NR > 1 ? ", " : ""), $1}')
  echo "| $mode samples | $ms | ${st:--} | $(( plan / 1048576 )) | $(( rss / 1024 )) |"
done
