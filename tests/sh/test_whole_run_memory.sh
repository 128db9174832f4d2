# The memory promise for a whole run, measured on the whole process: each run
# below logs every step, validates, saves states and resumes, and its peak RSS
# (VmHWM: getrusage's ru_maxrss, printed by the script's last line) must stay
# within the bound that `--plan --json` states before anything runs
# (process_bound_bytes: the arena plus the memory outside it, README "Memory
# outside the plan"). On the emulated GPU the device memory's high-water mark
# over the whole run must equal the plan's prediction (device_bytes) exactly.
set -u
CKRUN=${CKRUN:-build/ckrun}
BUILD=${CK_BUILD:-build}
dir=out/.test_whole_run.$$
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
# the Lua heap's cap is part of the bound: tight caps keep the bound sharp
# enough that a second arena or a second copy of the weights passes it
H="--max-heap 16MiB"

# bound NAME ARGS...: the plan's process bound for these arguments
bound() {
  "$CKRUN" $H --plan --json "$@" > "$dir/plan.json" 2> "$dir/plan.err" || { cat "$dir/plan.err"; echo 0; return; }
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['process_bound_bytes'])" "$dir/plan.json"
}
# peak OUTPUT: the run's peak RSS in bytes from its memory line
peak() { sed -n 's/^memory: peak RSS \([0-9.]*\) MiB.*/\1/p' "$1" | python3 -c "import sys; print(int(float(sys.stdin.read() or 0) * 2**20))"; }
# within WHAT OUTPUT BOUND
within() {
  p=$(peak "$2")
  python3 -c "import sys; p, b = int(sys.argv[1]), int(sys.argv[2]); sys.exit(not (0 < p <= b))" "$p" "$3"
  ok $? "$1: peak RSS $((p / 1048576)) MiB within the plan's bound of $(($3 / 1048576)) MiB"
}

# 1. sdxl-tiny, the main job's model: logging every step, validation, states, resume
T0="scripts/train_sdxl_lora.lua --log-every 1 --val-every 2 --save-every 2 --state-dir $dir/tiny_state"
T="$T0 --steps 4"
b=$(bound $T)
"$CKRUN" $H --allow-write "$dir" $T --out "$dir/tiny.safetensors" --log-dir "$dir/tiny_log" > "$dir/tiny.out" 2>&1
ok $? "sdxl-tiny: 4 steps logging every step, validating, saving states"
within "sdxl-tiny" "$dir/tiny.out" "$b"
"$CKRUN" $H --allow-write "$dir" $T0 --steps 6 --resume "$dir/tiny_state" --out "$dir/tiny.safetensors" > "$dir/tiny2.out" 2>&1
ok $? "sdxl-tiny: resumed from its state to step 6"
within "sdxl-tiny resumed" "$dir/tiny2.out" "$b"

# 2. sdxl-mid (330M parameters, 1.3 GB in fp32): a second copy of the weights,
#    or the base file read whole, would pass the bound by hundreds of MiB
"$CKRUN" --allow-write "$dir" tests/scripts/random_unet.lua --config sdxl-mid --out "$dir/mid_unet.safetensors" > /dev/null 2>&1
ok $? "a random sdxl-mid base written as fp16 (660 MB)"
M="scripts/train_sdxl_lora.lua --size mid --batch 1 --steps 2 --log-every 1 --val-every 1 --save-every 1 --state-dir $dir/mid_state --weights $dir/mid_unet.safetensors"
H="--max-heap 64MiB" # the stdlib's graph building for 330M parameters takes about 40 MiB
b=$(bound $M)
"$CKRUN" $H --allow-write "$dir" $M --out "$dir/mid.safetensors" --log-dir "$dir/mid_log" > "$dir/mid.out" 2>&1
ok $? "sdxl-mid LoRA on the fp16 base: 2 steps logging every step, validating, saving states"
within "sdxl-mid" "$dir/mid.out" "$b"
rm -f "$dir/mid_unet.safetensors"

# 3. the whole UNet trained with 8-bit AdamW, states saved and resumed
H="--max-heap 16MiB"
F0="scripts/train_sdxl_lora.lua --full --optimizer adamw8bit --log-every 1 --val-every 1 --save-every 1 --state-dir $dir/full_state"
F="$F0 --steps 3"
b=$(bound $F)
"$CKRUN" $H --allow-write "$dir" $F --out "$dir/full.safetensors" --log-dir "$dir/full_log" > "$dir/full.out" 2>&1
ok $? "--full --optimizer adamw8bit: 3 steps logging every step, saving states"
within "--full adamw8bit" "$dir/full.out" "$b"
"$CKRUN" $H --allow-write "$dir" $F0 --steps 4 --resume "$dir/full_state" --out "$dir/full.safetensors" > "$dir/full2.out" 2>&1
ok $? "--full adamw8bit: resumed to step 4"
within "--full adamw8bit resumed" "$dir/full2.out" "$b"

# 4. the emulated GPU: the device's high-water mark from start to end is the plan
emu="$BUILD/libck_cuda_emu.so"
if [ -f "$emu" ]; then
  E="scripts/train_sdxl_lora.lua --resolution 64 --batch 1 --samples 2 --steps 2 --log-every 1 --val-every 2 --save-every 1 --state-dir $dir/emu_state"
  CK_CUDA_MODULE="$emu" "$CKRUN" --device cuda --plan --json $E > "$dir/emu_plan.json" 2>&1
  want=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['policies'][0]['device_bytes'])" "$dir/emu_plan.json")
  CK_CUDA_MODULE="$emu" CK_EMU_MEMORY_LOG="$dir/emu_memory" "$CKRUN" --device cuda --allow-write "$dir" $E \
    --out "$dir/emu.safetensors" --log-dir "$dir/emu_log" > "$dir/emu.out" 2>&1
  ok $? "the emulated GPU: 2 steps logging every step, validating, saving states"
  got=$(sed -n 's/^peak_bytes //p' "$dir/emu_memory" 2>/dev/null)
  [ -n "$got" ] && [ "$got" = "$want" ]
  ok $? "the emulated GPU: device high-water ${got:-?} bytes over the whole run = the plan's device_bytes $want"
else
  echo "skip the emulated GPU ($emu not built)"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
