#!/usr/bin/env bash
# Two builds of ckrun planning the same cases, alternating, best of R whole
# processes each (wall seconds, and CPU seconds, user and system: steadier on
# a shared machine), with the recompute FLOPs of each plan (compile
# only: bench/plan_scale.lua's last line; "-" for the training scripts'
# --plan). For the planner's cost against an earlier head (BENCHMARKS.md, "The
# planner's cost"): build the earlier head's ckrun elsewhere
# (git worktree add /tmp/old HEAD~3 && cmake -S /tmp/old -B /tmp/old/build
# -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/old/build --target ckrun).
#   bash bench/plan_compare.sh OLD_CKRUN [NEW_CKRUN (build/ckrun)] [R (3)]
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=${1:?usage: bench/plan_compare.sh OLD_CKRUN [NEW_CKRUN] [R]}
NEW=${2:-build/ckrun}
R=${3:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
best() { # ckrun args...: "wall cpu|last plan line" (each the least of R)
  local bin=$1 b="" c="" line="" t u
  shift
  for _ in $(seq "$R"); do
    /usr/bin/time -f "%e %U %S" -o "$tmp/t" "$bin" "$@" > "$tmp/o" 2>&1 || { echo "failed|"; return; }
    read -r t u s < "$tmp/t"
    u=$(awk -v u="$u" -v s="$s" 'BEGIN { printf "%.2f", u + s }')
    if [ -z "$b" ] || awk -v a="$t" -v b="$b" 'BEGIN { exit !(a < b) }'; then b=$t; fi
    if [ -z "$c" ] || awk -v a="$u" -v b="$c" 'BEGIN { exit !(a < b) }'; then c=$u; fi
    line=$(grep -E "recompute_flops" "$tmp/o" | tail -1 || true)
  done
  echo "$b $c|$line"
}
flops() { echo "$1" | grep -oE "recompute_flops [0-9]+" | cut -d' ' -f2 || true; }
echo "| case | wall, old | new | CPU, old | new | recompute FLOPs, old | new |"
echo "|---|---:|---:|---:|---:|---:|---:|"
while IFS='|' read -r label args; do
  # shellcheck disable=SC2086
  o=$(best "$OLD" $args)
  # shellcheck disable=SC2086
  n=$(best "$NEW" $args)
  of=$(flops "${o#*|}")
  nf=$(flops "${n#*|}")
  read -r ow oc <<< "${o%%|*}"
  read -r nw nc <<< "${n%%|*}"
  printf "| %s | %s s | %s s | %s s | %s s | %s | %s |\n" "$label" "$ow" "$nw" "$oc" "$nc" "${of:--}" "${nf:--}"
done <<'CASES'
sdxl-tiny 256 px, batch 2, budget:80%|bench/plan_scale.lua --size tiny --batch 2 --checkpoint budget:80%
sdxl-mid 1024 px, budget:80%|bench/plan_scale.lua --size mid --checkpoint budget:80%
SDXL 1024 px, budget:80%|bench/plan_scale.lua --size full --checkpoint budget:80%
SDXL 1024 px, auto:16GiB|bench/plan_scale.lua --size full --checkpoint auto:16GiB
SDXL 1024 px depth x4, budget:80%|bench/plan_scale.lua --size full --depth-mult 4 --checkpoint budget:80%
sdxl-tiny 256 px depth x32, budget:80%|bench/plan_scale.lua --size tiny --depth-mult 32 --checkpoint budget:80%
SDXL 1024 px depth x3, budget:70%|bench/plan_scale.lua --size full --depth-mult 3 --checkpoint budget:70%
sdxl-tiny 256 px depth x32, budget:62%|bench/plan_scale.lua --size tiny --depth-mult 32 --checkpoint budget:62%
train_sdxl_lora --size full --checkpoint budget:80% (--plan)|--plan scripts/train_sdxl_lora.lua --size full --checkpoint budget:80%
train_sdxl_lora --size full, cuda, auto:12GiB (--plan, joint)|--plan --device cuda scripts/train_sdxl_lora.lua --size full --checkpoint auto:12GiB
train_flux_lora --size dev 1024, cuda, auto:80GiB (--plan, joint)|--plan --device cuda scripts/train_flux_lora.lua --size dev --resolution 1024 --checkpoint auto:80GiB
CASES
