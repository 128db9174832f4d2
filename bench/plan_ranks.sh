#!/usr/bin/env bash
# Full SDXL fine-tuning (every UNet parameter, AdamW, fp32, 1024 px, batch 1
# per rank, no recompute) planned for one rank of 1, 2, 4 and 8 with
# `ckrun --plan --world-size N`, launching none: plain data parallel (the
# gradient sums in the persistent region) and ZeRO stage 1
# (--shard-optimizer: each rank holds the AdamW state of its share of the
# parameters). Figures in GiB, per rank: the planned peak and the persistent
# part of it.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target ckrun -j "$(nproc)" >/dev/null
S="scripts/train_sdxl_lora.lua --size full --full --resolution 1024 --batch 1 ${EXTRA:-}"
fig() { build/ckrun --max-heap 256MiB --plan --json "$@" | python3 -c '
import json, sys
d = json.load(sys.stdin)
print("%.2f %.2f" % (d["peak_bytes"] / 2**30, d["persistent_bytes"] / 2**30))'; }
echo "| ranks | data parallel: peak | persistent | ZeRO-1: peak | persistent |"
echo "|---:|---:|---:|---:|---:|"
for n in 1 2 4 8; do
  if [ "$n" = 1 ]; then
    read -r pk ps < <(fig $S)
    echo "| 1 (one process) | $pk | $ps | - | - |"
  else
    read -r pk ps < <(fig --world-size "$n" $S)
    read -r zk zs < <(fig --world-size "$n" $S --shard-optimizer)
    echo "| $n | $pk | $ps | $zk | $zs |"
  fi
done
