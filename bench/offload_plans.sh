#!/usr/bin/env bash
# Keep, recompute or offload per card size (BENCHMARKS.md, "Keep, recompute
# or offload: plans per card"): `--plan --device cuda` (no GPU, no weights)
# with --checkpoint auto:CARD --offload auto at batch 1, the cost model's
# figures of a card of that size (--gpu), for full SDXL's LoRA at 1024 pixels
# (fp32 and bf16), the full SDXL UNet trained (--full, bf16, with and without
# --fused-backward) and FLUX.1-dev's LoRA (--mixed-precision bf16, bf16 or fp8
# base, 512 and 1024 pixels). One line per plan: what auto chose, the peak,
# the predicted step (a prediction from the cost model's table, not a
# measurement) beside recompute alone's at the same budget, the pinned host
# bytes; or the refusal naming the smallest peak with offload and without.
#   usage: bench/offload_plans.sh [build/ckrun]
set -u
CK=${1:-build/ckrun}
gpu_of() { case $1 in 8) echo 4060 ;; 12) echo 3060 ;; 16) echo 4080 ;; 24) echo 4090 ;; 48) echo A6000 ;; *) echo H100 ;; esac; }
row() { # card label args...
  local card=$1 label=$2; shift 2
  local out
  out=$("$CK" --plan --json --device cuda "$@" --batch 1 --checkpoint auto:${card}GiB --offload auto \
    --gpu "$(gpu_of "$card")" 2>&1)
  python3 - "$card" "$label" "$(gpu_of "$card")" <<EOF
import json, re, sys
card, label, gpu = sys.argv[1:4]
out = r'''$out'''
try:
    d = json.loads(out)
except ValueError:
    m = re.search(r"smallest peak ckrun can plan is ([0-9.]+ \w+) \(\d+ bytes\) with offload, ([0-9.]+ \w+) \(\d+ bytes\) without", out)
    m2 = re.search(r"the smallest plan needs ([0-9.]+ \w+( with offload, [0-9.]+ \w+ without)?)", out)
    why = ("nothing fits: smallest peak %s with offload, %s without" % m.groups()) if m else \
          ("nothing fits: the smallest plan needs %s" % m2.group(1)) if m2 else out.strip().splitlines()[-1]
    print("%-5s %-22s %-6s | %s" % (card + "GB", label, gpu, why))
    sys.exit(0)
p = d["policies"][0]
G = 1024.0 ** 3
dec = p.get("offload_decision") or ""
alone = re.search(r"recompute alone: ([0-9.e+-]+) s", dec)
chose = re.match(r"(?:budget|auto): ([^;]*);", dec)
what = "none" if d["checkpoint"] == "none" else (chose.group(1) if chose else d["checkpoint"])
swap = re.search(r"streaming the (?:trained and )?frozen weights of the last (\d+) blocks", d.get("fit", ""))
if swap:
    what += " (--blocks-to-swap %s)" % swap.group(1)
if "(--offload-optimizer)" in d.get("fit", ""):
    what += " (--offload-optimizer)"
print("%-5s %-22s %-6s | %s, peak %.2f GiB (device %.2f), %.1f%% recomputed, step %.3g s%s, pinned %.2f GiB" % (
    card + "GB", label, gpu, what, p["peak_bytes"] / G, p["device_bytes"] / G, p["recompute_pct"],
    p["predicted_step_seconds"], " (recompute alone %s s)" % alone.group(1) if alone else "",
    p.get("pinned_host_bytes", 0) / G))
EOF
}
printf '%-5s %-22s %-6s | %s\n' card model figures "what auto chose, peak, recompute, predicted step, pinned host"
for card in 8 12 16 24 48 80; do
  row $card "SDXL LoRA 1024 fp32" scripts/train_sdxl_lora.lua --size full --resolution 1024
  row $card "SDXL LoRA 1024 bf16" scripts/train_sdxl_lora.lua --size full --resolution 1024 --mixed-precision bf16
  # the whole UNet trained (fp32 weights, AdamW): the optimizer state offloaded, then blocks streamed, where needed
  row $card "SDXL full 1024 bf16" scripts/train_sdxl_lora.lua --size full --resolution 1024 --mixed-precision bf16 --full
  row $card "SDXL full 1024 bf16 fused" scripts/train_sdxl_lora.lua --size full --resolution 1024 \
    --mixed-precision bf16 --full --fused-backward
  for base in bf16 fp8; do
    for px in 512 1024; do
      fp=; [ $base = fp8 ] && fp=--fp8-base
      row $card "Flux-dev $base base $px" scripts/train_flux_lora.lua --size dev --mixed-precision bf16 $fp \
        --resolution $px
    done
  done
done
