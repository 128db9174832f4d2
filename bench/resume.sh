#!/usr/bin/env bash
# Kill-and-resume trials (each: a 40-step run of sdxl-tiny SIGKILLed at random
# moments and resumed until done, compared byte for byte with an uninterrupted
# run) and the cost of a state save.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target ckrun -j "$(nproc)" >/dev/null
trials=${TRIALS:-5}
dir=out/.bench_resume
rm -rf "$dir"; mkdir -p "$dir"
S="scripts/train_sdxl_lora.lua --resolution 128 --steps 40 --samples 6 --save-every 2 --keep-states 2"
build/ckrun $S --out "$dir/straight.safetensors" > /dev/null
mismatch=0 kills=0
for t in $(seq "$trials"); do
  rm -rf "$dir/state" "$dir/resumed.safetensors"
  while [ ! -s "$dir/resumed.safetensors" ]; do
    args=""
    ls "$dir/state"/state-*.safetensors > /dev/null 2>&1 && args="--resume $dir/state"
    build/ckrun $S --state-dir "$dir/state" --out "$dir/resumed.safetensors" $args > /dev/null 2>&1 &
    pid=$!
    sleep "0.$(( (RANDOM % 9) + 3 ))"
    if kill -9 $pid 2> /dev/null; then kills=$((kills+1)); fi
    wait $pid 2> /dev/null || true
  done
  cmp -s "$dir/straight.safetensors" "$dir/resumed.safetensors" || mismatch=$((mismatch+1))
done
echo "kill-and-resume: $trials trials, $kills kills, $mismatch mismatches"
echo "| state | tensors | save (ms, median of 7) | size (MiB) |"
echo "|---|---|---|---|"
build/ckrun bench/state_save.lua
rm -rf "$dir" out/.bench_state
