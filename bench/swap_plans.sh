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
# A second table: --checkpoint auto:CARD --offload auto at 8, 12 and 16 GB,
# where the trainer streams the fewest blocks that fit.
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

# --checkpoint auto:CARD --offload auto with no blocks named: nothing fits the
# card without streaming, so the trainer streams the fewest blocks that fit
# (its fit line says how many), with the card's own figures.
echo
printf '%-5s %-4s %-5s | %s\n' card base px "what auto chose (the fit line), peak, pinned, predicted step"
gpu_of() { case $1 in 8) echo 4060 ;; 12) echo 3060 ;; 16) echo 4080 ;; *) echo 4090 ;; esac; }
for card in 8 12 16; do
  for base in bf16 fp8; do
    for px in 512 1024; do
      fp=; [ $base = fp8 ] && fp=--fp8-base
      out=$("$CK" --plan --json --device cuda scripts/train_flux_lora.lua --size dev --mixed-precision bf16 $fp \
        --resolution $px --batch 1 --checkpoint auto:${card}GiB --offload auto --gpu "$(gpu_of $card)" 2>&1)
      python3 - "$card" "$base" "$px" <<PYEOF
import json, re, sys
card, base, px = sys.argv[1:4]
out = r'''$out'''
try:
    d = json.loads(out)
except ValueError:
    print("%-5s %-4s %-5s | %s" % (card + "GB", base, px, out.strip().splitlines()[-1].replace("ckrun: ", "")))
    sys.exit(0)
s = d["policies"][0]
m = re.search(r"streaming the frozen weights of the last (\d+) blocks", d["fit"])
G = float(1 << 30)
print("%-5s %-4s %-5s | %s, peak %.2f GiB (device %.2f), pinned %.2f GiB (weights %.2f), step %.3g s" % (
    card + "GB", base, px, ("--blocks-to-swap %s" % m.group(1)) if m else "no streaming", s["peak_bytes"] / G,
    s["device_bytes"] / G, s.get("pinned_host_bytes", 0) / G, s.get("streamed_weights_bytes", 0) / G,
    s["predicted_step_seconds"]))
PYEOF
    done
  done
done
