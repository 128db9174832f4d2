#!/usr/bin/env bash
# Offload planned, then run: for each case, what --checkpoint auto:SIZE
# (--offload auto, the CUDA default: keep, recompute or offload per tensor,
# and streamed blocks where nothing else fits) chooses for a card of SIZE,
# its planned device bytes and predicted step time (--plan --json), then a
# short run of the same command: the step time the trainer measures (mean
# of steps 2..N) and the device memory the run holds above its start
# (cudaMemGetInfo; on the CPU, the process's peak RSS against the plan's
# bound). One JSON line per case (out/gpu_check/offload.jsonl) and a table
# (out/gpu_check/offload.md). A run that fails, or holds more device memory
# than its plan states, fails the script once the table is written.
#
#   bash bench/gpu_offload.sh                 # on the GPU: the cases below, cuda
#   bash bench/gpu_offload.sh cpu 3           # DEVICE STEPS: the small cases on the CPU
#   GPU_OFFLOAD_SECONDS=300                   # stop starting cases after this long
#   GPU_OFFLOAD_CASES=Flux-dev                # only the cases whose label holds this text
#
# The cases on a GPU: full SDXL LoRA at 1024 px in fp32 on cards of 8, 12, 16
# and 24 GiB (kohya's table for SDXL LoRA: 12 GB with gradient checkpointing,
# 8 GB with its CPU offload), and flux-tiny at 1024 px with each card at
# 90, 70 and 50% of what none needs, and the full SDXL UNet trained in bf16
# on 24 and 16 GiB (the optimizer state offloaded, then blocks streamed with
# their trained weights, where needed). On the CPU (a smoke test of this
# script): sdxl-tiny and flux-tiny at 256 px, each at 90, 70 and 50% of none,
# and sdxl-tiny trained whole at 70, 50 and 30%.
# Last, FLUX.1-dev's LoRA at 1024 px over an fp8 base on 24, 16 and 12 GiB
# (kohya's table: 12 GB with --blocks_to_swap 16), as time allows: its 12B
# random weights are made on the host first. Each run is stopped at the
# budget (GPU_OFFLOAD_SECONDS), and the table is written all the same.
set -uo pipefail
cd "$(dirname "$0")/.."
device=${1:-cuda}
steps=${2:-4}
out=out/gpu_check
mkdir -p "$out"
: > "$out/offload.jsonl"
ckrun=${CKRUN:-build/ckrun}
# run alone after bench/gpu_check.sh: the library path its build runs with
# (the dependencies it unpacked from .gpu_deps, cuDNN from python3's wheel)
if [ -s "$out/ld_library_path.txt" ]; then
    LD_LIBRARY_PATH=$(cat "$out/ld_library_path.txt")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export LD_LIBRARY_PATH
fi
start=$(date +%s)
failures=""
fail() { failures="$failures
  $*"; echo "FAIL $*" >&2; }

if [ "$device" = cuda ]; then
    sdxl="scripts/train_sdxl_lora.lua --size full --resolution 1024"
    flux="scripts/train_flux_lora.lua --size tiny --resolution 1024"
    cases=("SDXL LoRA 1024 fp32|$sdxl|8GiB 12GiB 16GiB 24GiB" "flux-tiny 1024|$flux|90% 70% 50%"
           "SDXL full 1024 bf16|$sdxl --full --mixed-precision bf16|24GiB 16GiB"
           "Flux-dev LoRA 1024 fp8 base|scripts/train_flux_lora.lua --size dev --resolution 1024 --mixed-precision bf16 --fp8-base|24GiB 16GiB 12GiB")
else
    cases=("sdxl-tiny 256|scripts/train_sdxl_lora.lua --size tiny --resolution 256|90% 70% 50%"
           "flux-tiny 256|scripts/train_flux_lora.lua --size tiny --resolution 256|90% 70% 50%"
           "sdxl-tiny full 256|scripts/train_sdxl_lora.lua --size tiny --resolution 256 --full|70% 50% 30%")
fi

# a field of the plan's JSON (its first occurrence; numbers and strings)
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); p=d["policies"][0]; v=p.get(sys.argv[2], d.get(sys.argv[2])); print("" if v is None else v)' "$1" "$2"; }

for c in "${cases[@]}"; do
    IFS='|' read -r label args sizes <<< "$c"
    [ -z "${GPU_OFFLOAD_CASES:-}" ] || [[ "$label" == *"$GPU_OFFLOAD_CASES"* ]] || continue
    # none's device bytes, for the percentage cards
    none_json=$(mktemp)
    $ckrun --device "$device" --plan --json $args --checkpoint none --offload none > "$none_json" 2>&1 ||
        { fail "$label: --plan under none: $(tail -1 "$none_json")"; rm -f "$none_json"; continue; }
    none_bytes=$(field "$none_json" device_bytes)
    rm -f "$none_json"
    for s in $sizes; do
        if [ $(( $(date +%s) - start )) -gt "${GPU_OFFLOAD_SECONDS:-300}" ]; then
            fail "$label at $s: not run (past the ${GPU_OFFLOAD_SECONDS:-300} s budget)"
            continue
        fi
        case "$s" in
            *%) card=$(( none_bytes * ${s%\%} / 100 )) ;;
            *) card=$s ;;
        esac
        w=$(mktemp -d)
        if ! $ckrun --device "$device" --plan --json $args --checkpoint "auto:$card" --offload auto > "$w/plan.json" \
            2> "$w/plan.txt"; then
            # a card nothing fits: its refusal is the row
            python3 - "$label" "$s" "$card" "$w/plan.txt" "$w/plan.json" >> "$out/offload.jsonl" <<'EOF'
import json, sys
label, size, card, txt, js = sys.argv[1:]
why = (open(txt).read() + open(js).read()).strip().splitlines()
print(json.dumps({"case": label, "card": size, "card_bytes": int(card) if card.isdigit() else card,
                  "refused": why[-1] if why else "?"}))
EOF
            rm -rf "$w"
            continue
        fi
        t0=$(date +%s)
        # a run past the budget is stopped (its row says so) and the table is still written
        left=$(( ${GPU_OFFLOAD_SECONDS:-300} - (t0 - start) ))
        [ "$left" -lt 10 ] && left=10
        timeout -k 5 "$left" $ckrun --device "$device" --allow-write "$w" $args --checkpoint "auto:$card" \
            --offload auto --steps "$steps" --log-dir "$w/log" --out "$w/lora.safetensors" > "$w/run.txt" 2>&1
        rc=$?
        [ $rc = 124 ] && echo "stopped after $left s: past the ${GPU_OFFLOAD_SECONDS:-300} s budget" >> "$w/run.txt"
        python3 - "$label" "$s" "$card" "$w" "$rc" "$(( $(date +%s) - t0 ))" >> "$out/offload.jsonl" <<'EOF'
import json, re, sys
label, size, card, w, rc, secs = sys.argv[1:]
plan = json.load(open(w + "/plan.json"))
p = plan["policies"][0]
run = open(w + "/run.txt").read()
row = {"case": label, "card": size, "card_bytes": int(card) if card.isdigit() else card, "fit": plan.get("fit"),
       "checkpoint": p.get("name"), "device_bytes": p.get("device_bytes"), "peak_bytes": p.get("peak_bytes"),
       "offload_bytes": p.get("offload_bytes", 0), "streamed_weights_bytes": p.get("streamed_weights_bytes", 0),
       "pinned_host_bytes": p.get("pinned_host_bytes", 0), "recompute_flops": p.get("recompute_flops"),
       "step_flops": p.get("step_flops"), "predicted_step_s": p.get("predicted_step_seconds"),
       "predicted_on": p.get("predicted_on"), "run_rc": int(rc), "run_s": int(secs)}
m = re.search(r"step time: ([0-9.]+) ms", run)
row["measured_step_s"] = float(m.group(1)) / 1000 if m else None
m = re.search(r"the device's plan ([0-9.]+) MiB, in use ([0-9.]+) MiB more than before the program", run)
if m:  # CUDA: the device memory the run held above its start, against the plan's
    row["plan_device_mib"], row["used_device_mib"] = float(m.group(1)), float(m.group(2))
m = re.search(r"peak RSS ([0-9.]+) MiB, within the plan's bound of ([0-9.]+) MiB", run)
if m:
    row["peak_rss_mib"], row["rss_bound_mib"] = float(m.group(1)), float(m.group(2))
if int(rc) != 0:
    row["error"] = run.strip().splitlines()[-1] if run.strip() else "exit %s" % rc
print(json.dumps(row))
EOF
        # the plan leaves the libraries' own memory (cuda_context in --plan) to the fit's headroom: the run
        # fails this check when what it held, plan and libraries, is more than the card it was fitted to
        rc2=$(tail -1 "$out/offload.jsonl" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read());
over = r.get("used_device_mib") is not None and isinstance(r["card_bytes"], int) and \
    r["used_device_mib"] * 2 ** 20 > r["card_bytes"]
print("error" if r.get("error") else "over" if over else "ok")')
        [ "$rc2" = error ] && fail "$label at $s: $(tail -1 "$w/run.txt")"
        [ "$rc2" = over ] && fail "$label at $s: the run held more device memory than the card it was fitted to (see $out/offload.jsonl)"
        rm -rf "$w"
    done
done

python3 - "$out/offload.jsonl" "$device" <<'EOF' | tee "$out/offload.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
mib = 2 ** 20
print(f"Offload planned and run on {sys.argv[2]} (bench/gpu_offload.sh): --checkpoint auto:CARD --offload auto")
print()
print("| case | card | chosen | recompute | offloaded | streamed | pinned | planned device | held | predicted step | measured step |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
def m(b): return "" if b is None else f"{b / mib:.0f} MiB"
for r in rows:
    if "refused" in r:
        print(f"| {r['case']} | {r['card']} | refused: {r['refused']} | | | | | | | | |")
        continue
    rec = r["recompute_flops"] / max(r["step_flops"] - r["recompute_flops"], 1) * 100 if r.get("step_flops") else 0
    held = f"{r['used_device_mib']:.0f} MiB" if "used_device_mib" in r else (
        f"RSS {r['peak_rss_mib']:.0f} of {r['rss_bound_mib']:.0f} MiB" if "peak_rss_mib" in r else "")
    ps = r.get("predicted_step_s"); ms = r.get("measured_step_s")
    print(f"| {r['case']} | {r['card']} | {r['checkpoint']} | {rec:.1f}% | {m(r['offload_bytes'])} | "
          f"{m(r['streamed_weights_bytes'])} | {m(r['pinned_host_bytes'])} | {m(r['device_bytes'])} | {held} | "
          f"{'' if ps is None else f'{ps:.3f} s'} | {'' if ms is None else f'{ms:.3f} s'}"
          f"{' (' + r['error'] + ')' if r.get('error') else ''} |")
EOF
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp "$out/offload.md" "$out/offload.jsonl" "$OUT/" 2>/dev/null || true; fi
echo "gpu_offload: $(grep -c . "$out/offload.jsonl") cases in $(( $(date +%s) - start )) s"
[ -z "$failures" ] || { echo "gpu_offload: $(echo "$failures" | grep -c .) failures:$failures" >&2; exit 1; }
