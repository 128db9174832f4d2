# The SDXL job's --mixed-precision (kohya's and diffusers' option): fp16 runs
# with dynamic loss scaling, logs loss_scale, and a run resumed from a state
# saved midway writes an adapter byte-identical to the uninterrupted run's;
# --storage is the same choice by its other name; a bad value, the two
# options given different values, or fp16 with --fused-backward, is one line
# naming the script line, a non-zero exit and no adapter written.
set -u
dir=out/.test_mixed_precision_job.$$
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
B="scripts/train_sdxl_lora.lua --resolution 128 --samples 4 --log-every 1"
S="$B --steps 6"

"$CKRUN" $S --mixed-precision fp16 --log-dir "$dir/log" --out "$dir/straight.safetensors" > "$dir/out" 2>&1
ok $? "6 steps with --mixed-precision fp16"
python3 - "$dir/log/metrics.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "loss" in r and r["step"] > 0]
assert len(steps) == 6 and all(r.get("loss_scale") == 65536 for r in steps), steps
PY
ok $? "every step's record holds loss_scale (65536: no overflow at this size)"
"$CKRUN" -e "local f = require('ck').safetensors('$dir/straight.safetensors')
assert(f:metadata().ss_mixed_precision == 'fp16')"
ok $? "the adapter records ss_mixed_precision, as kohya's"

"$CKRUN" $S --mixed-precision fp16 --save-every 3 --state-dir "$dir/state" --log-dir "$dir/log2" \
  --out "$dir/saved.safetensors" > /dev/null 2>&1 &&
"$CKRUN" $S --mixed-precision fp16 --state-dir "$dir/state" --resume --log-dir "$dir/log3" \
  --out "$dir/resumed.safetensors" > "$dir/out" 2>&1 && grep -q "at step 3" "$dir/out" &&
cmp -s "$dir/straight.safetensors" "$dir/resumed.safetensors"
ok $? "resumed from the state of step 3: the adapter is byte-identical to the uninterrupted run's"

"$CKRUN" $B --steps 2 --mixed-precision bf16 --out "$dir/a.safetensors" --log-dir "$dir/la" > /dev/null 2>&1 &&
"$CKRUN" $B --steps 2 --storage bf16 --out "$dir/b.safetensors" --log-dir "$dir/lb" > /dev/null 2>&1 &&
cmp -s "$dir/a.safetensors" "$dir/b.safetensors"
ok $? "--storage bf16 is --mixed-precision bf16"

for bad in "--mixed-precision fp8" "--mixed-precision fp16 --storage bf16" "--mixed-precision fp16 --fused-backward"; do
  "$CKRUN" $S $bad --out "$dir/bad.safetensors" --log-dir "$dir/lbad" > "$dir/err" 2>&1
  rc=$?
  [ $rc != 0 ] && [ "$(wc -l < "$dir/err")" = 1 ] && grep -q '^ckrun: scripts/train_sdxl_lora.lua:[0-9]*: --mixed-precision' "$dir/err" &&
    [ ! -e "$dir/bad.safetensors" ]
  ok $? "$bad: one line naming the script line, exit $rc, nothing written: $(cat "$dir/err")"
done

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
