#!/usr/bin/env bash
# The planner's cost as graphs grow: the wall time and peak RSS of whole
# `--plan` processes of the SDXL LoRA training step (scripts/train_sdxl_lora.lua
# for the models as users plan them; bench/plan_scale.lua, compile only, for
# the deep graphs made with --depth-mult), under fixed policies, budget:80%
# and auto (and budget:80% with --offload auto; ck.fit's auto:SIZE on CUDA plans); with each, the thread CPU time of the policy's decision and of
# the training list's plan (p:plan().decide_seconds, plan_seconds), and the
# growth exponent of the time over the op count, fitted per policy.
#
#   bash bench/plan_scale.sh [REPEATS]   (best of REPEATS runs, default 3; the wall
#   timed by the shell to the microsecond, peak RSS and CPU by /usr/bin/time)
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target ckrun -j "$(nproc)" >/dev/null
R=${1:-3}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# one case: best wall time of R runs, its peak RSS, and the plan's figures
run() {
  local label=$1 policy=$2; shift 2
  local best="" rss="" line="" cpu=""
  for _ in $(seq "$R"); do
    local t0=$EPOCHREALTIME
    /usr/bin/time -f "%e %M %U %S" -o "$out.t" "$@" > "$out.o" 2>&1 || { echo "$label $policy: failed"; cat "$out.o"; return; }
    local t1=$EPOCHREALTIME
    read -r t m u s < "$out.t"
    t=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }') # the wall to the microsecond (time's is to 10 ms)
    u=$(awk -v u="$u" -v s="$s" 'BEGIN { printf "%.2f", u + s }')
    if [ -z "$best" ] || awk -v a="$t" -v b="$best" 'BEGIN{exit !(a < b)}'; then best=$t; rss=$m; line=$(tail -1 "$out.o"); fi
    if [ -z "$cpu" ] || awk -v a="$u" -v b="$cpu" 'BEGIN{exit !(a < b)}'; then cpu=$u; fi
  done
  printf '%-30s | %-10s | %6.3f s | %6.1f MiB | %s cpu_s %s\n' "$label" "$policy" "$best" "$(awk -v k="$rss" 'BEGIN{print k/1024}')" "$line" "$cpu"
}

echo "case                           | policy     |   wall   |  peak RSS  | plan"
for policy in none diffusers budget:80% auto:16GiB; do
  run "sdxl-tiny 256 px, batch 2" "$policy" build/ckrun bench/plan_scale.lua --size tiny --batch 2 --checkpoint "$policy"
  run "sdxl-mid 1024 px, batch 1" "$policy" build/ckrun bench/plan_scale.lua --size mid --checkpoint "$policy"
  run "SDXL 1024 px, batch 1" "$policy" build/ckrun bench/plan_scale.lua --size full --checkpoint "$policy"
  run "SDXL 1024 px, depth x4" "$policy" build/ckrun bench/plan_scale.lua --size full --depth-mult 4 --checkpoint "$policy"
  run "sdxl-tiny 256 px, depth x32" "$policy" build/ckrun bench/plan_scale.lua --size tiny --depth-mult 32 --checkpoint "$policy"
done | tee "$out.rows"
echo
echo "whole --plan of the training script (its logging programs too):"
for policy in none budget:80% auto:16GiB; do
  run "train_sdxl_lora --size full" "$policy" build/ckrun --plan scripts/train_sdxl_lora.lua --size full --checkpoint "$policy"
done
# the joint search (keep, recompute or offload; the CUDA default), on an H100's and a 4090's figures
for gpu in H100 4090; do
  run "--offload auto --gpu $gpu" "budget:80%" build/ckrun --plan scripts/train_sdxl_lora.lua --size full \
    --checkpoint budget:80% --offload auto --gpu $gpu
done
# ck.fit (the train scripts' --checkpoint auto:SIZE) where none does not fit,
# on a CUDA plan with the joint search (the CUDA default --offload auto): one
# compile per batch tried
run "train_sdxl_lora --size full, cuda" "auto:12GiB" build/ckrun --plan --device cuda scripts/train_sdxl_lora.lua \
  --size full --checkpoint auto:12GiB
run "train_sdxl_lora --size full, cuda" "auto:12GiB, --offload none" build/ckrun --plan --device cuda \
  scripts/train_sdxl_lora.lua --size full --checkpoint auto:12GiB --offload none
run "train_flux_lora --size dev 1024, cuda" "auto:80GiB" build/ckrun --plan --device cuda scripts/train_flux_lora.lua \
  --size dev --resolution 1024 --checkpoint auto:80GiB
echo
echo "growth exponent of the wall time over the op count (least squares on logs, per policy):"
awk -F'|' '{
  pol = $2; gsub(/ /, "", pol); t = $3 + 0
  if (!match($5, /ops [0-9]+/)) next
  ops = substr($5, RSTART + 4, RLENGTH - 4) + 0
  n[pol]++; lx = log(ops); ly = log(t); sx[pol] += lx; sy[pol] += ly; sxx[pol] += lx * lx; sxy[pol] += lx * ly
} END {
  for (p in n) if (n[p] > 1) printf "  %-11s %.2f\n", p, (n[p] * sxy[p] - sx[p] * sy[p]) / (n[p] * sxx[p] - sx[p] * sx[p])
}' "$out.rows"
echo
echo "the search against one placement: the decision's CPU time over the plan's of none (one placement of the graph):"
awk -F'|' '{
  label = $1; gsub(/ +$/, "", label); pol = $2; gsub(/ /, "", pol)
  d = match($5, /decide_s [0-9.]+/) ? substr($5, RSTART + 9, RLENGTH - 9) + 0 : 0
  p = match($5, /plan_s [0-9.]+/) ? substr($5, RSTART + 7, RLENGTH - 7) + 0 : 0
  if (pol == "none") place[label] = p; else if (d > 0) { dec[label, pol] = d; pols[pol] = 1; labels[label] = 1 }
} END {
  for (l in labels) for (q in pols) if ((l, q) in dec && place[l] > 0)
    printf "  %-30s %-10s %.3f s / %.3f s = %.1f\n", l, q, dec[l, q], place[l], dec[l, q] / place[l]
}' "$out.rows"
echo
echo "the whole budget:80% process against the whole none process (wall seconds, each the least of R; CPU seconds to 10 ms beside):"
awk -F'|' '{
  label = $1; gsub(/ +$/, "", label); pol = $2; gsub(/ /, "", pol)
  if (!match($5, /cpu_s [0-9.]+/)) next
  c = substr($5, RSTART + 6, RLENGTH - 6) + 0; w = $3 + 0
  if (pol == "none") { none[label] = c; nonew[label] = w } else if (pol == "budget:80%") { bud[label] = c; budw[label] = w }
} END {
  for (l in bud) if (none[l] > 0) printf "  %-30s %.3f s / %.3f s = %.2f (CPU %.2f s, %.2f s)\n", l, budw[l], nonew[l], budw[l] / nonew[l], bud[l], none[l]
}' "$out.rows"
rm -f "$out.t" "$out.o" "$out.rows"
