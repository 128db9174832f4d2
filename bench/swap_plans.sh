#!/usr/bin/env bash
# Streaming frozen weights by block (BENCHMARKS.md, "Streaming frozen weights
# by block (issue 31)"): FLUX.1-dev LoRA planned with `--plan --device cuda`
# (no GPU, no weights) at --blocks-to-swap 0/8/16/22/28 (kohya's count: N // 2
# double and (N - N // 2) * 2 single blocks, the last of each), 512 and 1024
# pixels, a bf16 and an fp8 base (--mixed-precision bf16), batch 1, kohya's
# gradient checkpointing (--checkpoint diffusers), no activation offload, the
# cost model's figures of one card (--gpu, default 4090). One line per plan:
# the device peak (the arena, what the card must hold), the pinned host bytes
# (the streamed weights), the bytes a step brings in, and the predicted step
# (a prediction from the cost model's table, not a measurement).
#   usage: bench/swap_plans.sh [build/ckrun] [GPU]
set -u
CK=${1:-build/ckrun}
GPU=${2:-4090}
printf '%-4s %-5s %-5s | %10s %10s %10s %10s %9s\n' base px swap "peak GiB" "device GiB" "pinned GiB" "in/step GiB" "step s"
for base in bf16 fp8; do
  for px in 512 1024; do
    for n in 0 8 16 22 28; do
      fp=; [ $base = fp8 ] && fp=--fp8-base
      out=$("$CK" --plan --json --device cuda scripts/train_flux_lora.lua --size dev --mixed-precision bf16 $fp \
        --resolution $px --batch 1 --checkpoint diffusers --offload none --blocks-to-swap $n --gpu "$GPU" 2>&1)
      python3 - "$base" "$px" "$n" <<EOF
import json, sys
base, px, n = sys.argv[1:4]
out = r'''$out'''
try:
    s = json.loads(out)["policies"][0]
except ValueError:
    print("%-4s %-5s %-5s | %s" % (base, px, n, out.strip().splitlines()[-1]))
    sys.exit(0)
G = float(1 << 30)
print("%-4s %-5s %-5s | %10.2f %10.2f %10.2f %10.2f %9.3f" % (base, px, n, s["peak_bytes"] / G, s["device_bytes"] / G,
      s.get("pinned_host_bytes", 0) / G, s.get("stream_bytes", 0) / G, s["predicted_step_seconds"]))
EOF
    done
  done
done
