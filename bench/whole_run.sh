#!/usr/bin/env bash
# The whole run's memory on the CPU: what --plan states against what the
# process takes (peak RSS), for full SDXL LoRA and sdxl-mid on a random fp16
# base file, logging every step (gradient norms and block statistics),
# validating and saving states; and the time to load the base.
#
#   bash bench/whole_run.sh [OUTDIR]        # default out/whole_run; needs ~12 GB of RAM and 6 GB of disk
#
# Prints a Markdown table (also OUTDIR/whole_run.md).
set -euo pipefail
cd "$(dirname "$0")/.."
CKRUN=${CKRUN:-build/ckrun}
out=${1:-out/whole_run}
mkdir -p "$out"
steps=${STEPS:-2}
H="--max-heap 64MiB" # the Lua heap's cap is part of the bound; full SDXL's graph building needs more

base() { # CONFIG FILE: a random fp16 base, written once
    [ -s "$2" ] || "$CKRUN" --allow-write "$out" tests/scripts/random_unet.lua --config "$1" --out "$2" --dtype F16 > /dev/null
}
mib() { python3 -c "import sys; print('%.1f' % (int(sys.argv[1]) / 2**20))" "$1"; }
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); v=d; [v := v[k] for k in sys.argv[2].split('.')]; print(v)" "$1" "$2"; }

# row NAME CKRUN SIZE RESOLUTION BASEFILE: plan, then the run, one table row
row() {
    local name=$1 bin=$2 size=$3 res=$4 file=$5 tag
    tag=$(echo "$name" | tr 'A-Z' 'a-z' | tr -c 'a-z0-9\n' '_')
    local args="scripts/train_sdxl_lora.lua --size $size --resolution $res --batch 1 --steps $steps --log-every 1 --val-every 1 --save-every 1 --state-dir $out/state_$tag --weights $file"
    local plan="-" bound="-"
    if "$bin" $H --plan --json $args > "$out/plan_$tag.json" 2> /dev/null && grep -q process_bound_bytes "$out/plan_$tag.json"; then
        plan=$(mib "$(field "$out/plan_$tag.json" arena_bytes)")
        bound=$(mib "$(field "$out/plan_$tag.json" process_bound_bytes)")
    fi
    local t0 t1
    t0=$(date +%s.%N)
    "$bin" $H --allow-write "$out" $args --out "$out/lora_$tag.safetensors" --log-dir "$out/log_$tag" > "$out/run_$tag.txt" 2>&1 &
    local pid=$! hwm=0 v
    # (the script's own last line says the same from getrusage)
    while kill -0 $pid 2> /dev/null; do # VmHWM from outside, for builds that do not print it
        v=$(awk '/VmHWM/{print $2}' /proc/$pid/status 2> /dev/null || true)
        [ -n "$v" ] && hwm=$v
        sleep 0.2
    done
    wait $pid
    t1=$(date +%s.%N)
    local load
    load=$(sed -n 's/^loaded .* in \([0-9.]*\) s$/\1/p' "$out/run_$tag.txt")
    python3 -c "import sys; a = sys.argv; print('| %s | %s | %s | %.1f | %s | %.0f |' % (a[1], a[2], a[3], int(a[4]) / 1024, a[5], float(a[7]) - float(a[6])))" \
        "$name" "$plan" "$bound" "$hwm" "${load:--}" "$t0" "$t1"
}

{
    echo "Whole runs on the CPU: $steps steps of batch 1, logging every step, validating every step, a state saved"
    echo "every step, LoRA rank 4 on a random fp16 base read with --weights; $(nproc) cores, $(date -u +%Y-%m-%d)."
    echo
    echo "| run | plan: arena MiB | plan: process bound MiB | peak RSS (VmHWM) MiB | load --weights s | wall s |"
    echo "|---|---:|---:|---:|---:|---:|"
    base sdxl-mid "$out/mid_fp16.safetensors"
    row "sdxl-mid 256 px" "$CKRUN" mid 256 "$out/mid_fp16.safetensors"
    base sdxl "$out/sdxl_fp16.safetensors"
    H="--max-heap 256MiB"
    row "full SDXL 256 px" "$CKRUN" full 256 "$out/sdxl_fp16.safetensors"
} | tee "$out/whole_run.md"
# the plan at 1024, where SDXL LoRA is trained
"$CKRUN" --max-heap 256MiB --plan --json scripts/train_sdxl_lora.lua --size full --resolution 1024 > "$out/plan_full_1024.json"
echo
echo "full SDXL LoRA at 1024 (plan only): arena $(mib "$(field "$out/plan_full_1024.json" arena_bytes)") MiB," \
    "process bound $(mib "$(field "$out/plan_full_1024.json" process_bound_bytes)") MiB" | tee -a "$out/whole_run.md"
