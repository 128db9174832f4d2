#!/usr/bin/env bash
# Data parallel on the CPU (mpirun, Open MPI): the SDXL LoRA job on sdxl-tiny
# at 256 px, one process at --batch B against N ranks at --batch B/N (the same
# global batch) and N ranks at --batch B (N times the images per step). Step
# time is the job's mean (data loading included); images/s the global batch
# over it; scaling efficiency images/s over N times one process's at the same
# per-rank batch; comm s the mean over steps of the longest wait in collectives
# (the log's ranks.comm_time_max). On a machine with fewer cores than ranks
# times threads the ranks share cores, and the figures say so.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target ckrun -j "$(nproc)" >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
steps=${STEPS:-20} B=${BATCH:-2} N=${RANKS:-2} threads=${THREADS:-1}
T="scripts/train_sdxl_lora.lua --resolution 256 --steps $steps --log-every 1000"
run() { # name ranks batch
  local out="$w/$1.out"
  if [ "$2" = 1 ]; then OMP_NUM_THREADS=$threads build/ckrun --allow-write "$w" $T --batch "$3" --out "$w/$1.safetensors" --log-dir "$w/$1" > "$out"
  else mpirun --oversubscribe -np "$2" -x OMP_NUM_THREADS=$threads build/ckrun --allow-write "$w" $T --batch "$3" \
         --out "$w/$1.safetensors" --log-dir "$w/$1" > "$out"; fi
  local ms; ms=$(sed -nE 's/^step time: ([0-9.]+) ms.*/\1/p' "$out")
  local comm; comm=$(sed -nE 's/.*"comm_time_max":([0-9.e-]+).*/\1/p' "$w/$1/metrics.jsonl" | awk '{s += $1} END {printf "%.4f", NR ? s / NR : 0}')
  echo "$1 $2 $3 $ms $comm"
}
echo "| run | ranks | batch per rank | step time (ms) | images/s | scaling efficiency | comm s per step |"
echo "|---|---:|---:|---:|---:|---:|---:|"
declare -A one_ips # images/s of one process, by batch
while read -r name ranks b ms comm; do
  ips=$(awk -v g=$((ranks * b)) -v ms="$ms" 'BEGIN {printf "%.2f", g / (ms / 1000)}')
  if [ "$ranks" = 1 ]; then
    one_ips[$b]=$ips
    eff=- comm=-
  else
    eff=$(awk -v ips="$ips" -v base="${one_ips[$b]}" -v n="$ranks" 'BEGIN {printf "%.2f", ips / (n * base)}')
  fi
  echo "| $name | $ranks | $b | $ms | $ips | $eff | $comm |"
done < <(run one_small 1 $((B / N)); run one 1 "$B"; run split "$N" $((B / N)); run scaled "$N" "$B")
