# --checkpoint auto and --batch auto (ck.fit) on sdxl-tiny: none when the
# whole-run plan fits the memory (auto:SIZE, less the 10% headroom), a budget
# when it does not, one clear refusal when nothing fits; never a refusal where
# a fixed policy fits; the largest batch that fits (and batch + 1 planned
# again does not); plain auto on the CPU reads its available memory; the
# default is none on the CPU and auto on a CUDA device (the emulated one);
# a run prints and logs its choice.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }

dir=$(mktemp -d "$PWD/out/.test_fit.XXXXXX" 2>/dev/null || { mkdir -p out && mktemp -d "$PWD/out/.test_fit.XXXXXX"; })
trap 'rm -rf "$dir"' EXIT
S=scripts/train_sdxl_lora.lua
# a JSON plan's field: json FILE EXPR (EXPR in Python over d, the report)
json() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

"$CKRUN" --plan --json --policies none,diffusers,sqrt_n,selective,every_n:2,every_n:3 $S > "$dir/fixed.json"
none=$(json "$dir/fixed.json" 'd["policies"][0]["device_bytes"]')
[ "$none" -gt 0 ]; ok $? "none's whole-run plan: $none bytes"

# room for none: none
size=$((none * 2))
"$CKRUN" --plan --json $S --checkpoint auto:$size > "$dir/roomy.json"; rc=$?
[ $rc = 0 ] && [ "$(json "$dir/roomy.json" 'd["checkpoint"]')" = none ] \
  && json "$dir/roomy.json" 'd["fit"]' | grep -qE "^checkpoint auto: none fits \([0-9.]+ MiB\) in [0-9.]+ MiB of [0-9.]+ MiB given: no recompute$"
ok $? "auto:$size: none fits, no recompute ($(json "$dir/roomy.json" 'd["fit"]'))"

# less room: a budget, recomputing, whose whole run fits SIZE less the headroom
size=$((none * 8 / 10)); limit=$((size * 9 / 10))
"$CKRUN" --plan --json $S --checkpoint auto:$size > "$dir/tight.json"; rc=$?
python3 - "$dir/tight.json" $limit <<'EOF'; ok $? "auto:$size: a budget that recomputes, its whole-run plan within $limit bytes"
import json, sys
d, limit = json.load(open(sys.argv[1])), int(sys.argv[2])
p = d["policies"][0]
assert d["checkpoint"].startswith("budget:") and p["recompute_flops"] > 0, d["checkpoint"]
assert p["device_bytes"] <= limit, (p["device_bytes"], limit)
assert d["fit"].startswith("checkpoint auto: none needs ") and "recomputing" in d["fit"], d["fit"]
EOF
out=$("$CKRUN" --plan $S --checkpoint auto:$size)
printf '%s\n' "$out" | grep -qE "^fit +checkpoint auto: none needs" && printf '%s\n' "$out" | grep -qE "^checkpoint +budget:"
ok $? "--plan's table names the choice and why (fit, checkpoint)"

# --policies auto:SIZE: the row plans the choice, a line after the table says why
out=$("$CKRUN" --plan --policies none,auto:$size $S)
printf '%s\n' "$out" | grep -qE "^auto:$size +[0-9.]+ +[0-9.]+ +[1-9][0-9.]*%" \
  && printf '%s\n' "$out" | grep -q "^auto:$size: checkpoint auto: none needs"
ok $? "--policies none,auto:$size: a row that recomputes, and why"

# no room: one line naming the script line, what the smallest plan needs, non-zero
size=$((none * 3 / 10))
"$CKRUN" --plan $S --checkpoint auto:$size > "$dir/none.out" 2> "$dir/none.err"; rc=$?
[ $rc != 0 ] && [ "$(wc -l < "$dir/none.err")" = 1 ] && [ ! -s "$dir/none.out" ] \
  && grep -qE "^ckrun: scripts/train_sdxl_lora.lua:[0-9]+: checkpoint auto: nothing fits in .* given: the smallest plan needs [0-9.]+ MiB(, [0-9.]+ MiB with --offload auto)? \(none needs [0-9.]+ MiB\)$" "$dir/none.err"
ok $? "auto:$size: refused in one line ($(cat "$dir/none.err"))"

# a CUDA plan whose limit the device's own bytes (its libraries' workspaces) take whole: refused in one line saying so
"$CKRUN" --plan --device cuda $S --checkpoint auto:4MiB > "$dir/own.out" 2> "$dir/own.err"; rc=$?
[ $rc != 0 ] && [ "$(wc -l < "$dir/own.err")" = 1 ] && [ ! -s "$dir/own.out" ] \
  && grep -qE "^ckrun: scripts/train_sdxl_lora.lua:[0-9]+: checkpoint auto: nothing fits in .* given: the device's own [0-9.]+ MiB \(its libraries' workspaces, outside every plan\) leave no room for the step \(none needs [0-9.]+ MiB\)$" "$dir/own.err"
ok $? "--device cuda auto:4MiB: refused in one line naming the device's own bytes ($(cat "$dir/own.err"))"

# auto never refuses what a fixed policy fits: at each one's whole-run figure, no headroom
for name in diffusers sqrt_n selective every_n:2 every_n:3; do
  bytes=$(json "$dir/fixed.json" "[p for p in d['policies'] if p['name'] == '$name'][0]['device_bytes']")
  flops=$(json "$dir/fixed.json" "[p for p in d['policies'] if p['name'] == '$name'][0]['recompute_flops']")
  "$CKRUN" --plan --json $S --checkpoint auto:$bytes --fit-headroom 0 > "$dir/at.json"; rc=$?
  [ $rc = 0 ] && python3 - "$dir/at.json" $bytes $flops <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))["policies"][0]
assert p["device_bytes"] <= int(sys.argv[2]) and p["recompute_flops"] <= float(sys.argv[3]), p
EOF
  ok $? "auto at $name's whole-run figure ($bytes bytes, no headroom) fits, recomputing no more than $name"
done

# --batch auto: the largest batch that fits; one more, planned again, does not
size=100MiB; limit=$((100 * 1048576 * 9 / 10))
"$CKRUN" --plan --json $S --checkpoint auto:$size --batch auto > "$dir/batch.json"; rc=$?
b=$(json "$dir/batch.json" 'd["batch"]')
[ $rc = 0 ] && [ "$b" -ge 3 ] && [ "$(json "$dir/batch.json" 'd["policies"][0]["device_bytes"]')" -le $limit ] \
  && json "$dir/batch.json" 'd["fit"]' | grep -q "^checkpoint auto, batch auto: batch $b (batch $((b + 1)): nothing fits"
ok $? "--batch auto with auto:$size: batch $b, its plan within $limit bytes ($(json "$dir/batch.json" 'd["fit"]'))"
"$CKRUN" --plan $S --checkpoint auto:$size --batch $((b + 1)) > /dev/null 2> "$dir/next.err"; rc=$?
[ $rc != 0 ] && grep -q "checkpoint auto: nothing fits" "$dir/next.err"
ok $? "batch $((b + 1)) at auto:$size planned again: nothing fits"
"$CKRUN" --plan $S --checkpoint auto:$size --batch $b > /dev/null; ok $? "batch $b at auto:$size planned again fits"

# plain auto on the CPU: the available memory
"$CKRUN" --plan --json $S --checkpoint auto > "$dir/cpu.json"; rc=$?
[ $rc = 0 ] && json "$dir/cpu.json" 'd["fit"]' | grep -qE "^checkpoint auto: none fits \([0-9.]+ MiB\) in [0-9.]+ [MG]iB of [0-9.]+ [MG]iB available: no recompute$"
ok $? "--checkpoint auto on the CPU fits its available memory ($(json "$dir/cpu.json" 'd["fit"]'))"

# defaults: none on the CPU, nothing chosen; auto on a CUDA device (emulated: 16 GiB free)
"$CKRUN" --plan --json $S > "$dir/default.json"
[ "$(json "$dir/default.json" 'd["checkpoint"], "fit" in d')" = "('none', False)" ]
ok $? "the CPU's default checkpoint is none, with nothing chosen"
emu="${CK_BUILD:-build}/libck_cuda_emu.so"
if [ -f "$emu" ]; then
  CK_CUDA_MODULE="$emu" "$CKRUN" --plan --json $S > "$dir/gpu.json"; rc=$?
  [ $rc = 0 ] && [ "$(json "$dir/gpu.json" 'd["device"], d["checkpoint"]')" = "('cuda', 'none')" ] \
    && json "$dir/gpu.json" 'd["fit"]' | grep -q "^checkpoint auto: none fits .* in 14.40 GiB of 16.00 GiB free: no recompute$"
  ok $? "on a CUDA device (emulated) the default is auto, on its free memory ($(json "$dir/gpu.json" 'd["fit"]'))"
  CK_CUDA_MODULE="$emu" "$CKRUN" --plan --json $S --checkpoint diffusers > "$dir/given.json"
  [ "$(json "$dir/given.json" 'd["checkpoint"], "fit" in d')" = "('diffusers', False)" ]
  ok $? "an explicit --checkpoint wins over the GPU's default"
else
  echo "(no emulated CUDA backend in this build: the GPU default is not checked)"
fi
if "$CKRUN" -e 'local ck = require "ck"; assert(not ck.device_memory())' 2> /dev/null; then
  "$CKRUN" --plan --device cuda $S --checkpoint auto > /dev/null 2> "$dir/nodev.err"; rc=$?
  [ $rc != 0 ] && grep -q "checkpoint auto: there is no CUDA device here to read free memory from; give a size" "$dir/nodev.err"
  ok $? "--plan --device cuda --checkpoint auto without a device asks for a size ($(cat "$dir/nodev.err"))"
fi

# bad values
"$CKRUN" --plan $S --batch most 2>&1 | grep -q "^ckrun: scripts/train_sdxl_lora.lua:[0-9]*: --batch must be an integer >= 1 or auto, got 'most'$"
ok $? "--batch most is refused, naming auto"
"$CKRUN" --plan $S --fit-headroom 1 2>&1 | grep -q -- "--fit-headroom must be a number in \[0, 1)"
ok $? "--fit-headroom 1 is refused"

# a run prints its choice and its log records it (at 128 pixels, with room
# for none less the headroom: a budget)
"$CKRUN" --plan --json $S --resolution 128 > "$dir/small.json"
size=$(json "$dir/small.json" 'd["policies"][0]["device_bytes"]')
"$CKRUN" $S --resolution 128 --steps 2 --samples 2 --checkpoint auto:$size --log-dir "$dir/log" \
  --out "$dir/lora.safetensors" > "$dir/run.out" 2>&1; rc=$?
[ $rc = 0 ] && head -1 "$dir/run.out" | grep -q "^checkpoint auto: none needs .* recomputing"
ok $? "a run prints its choice first ($(head -1 "$dir/run.out"))"
python3 - "$dir/log/metrics.jsonl" <<'EOF'; ok $? "the run's log records the choice: checkpoint, batch and fit"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
r = [r for r in recs if "fit" in r]
assert len(r) == 1 and r[0]["step"] == 0 and r[0]["checkpoint"].startswith("budget:") and r[0]["batch"] == 2, r
assert r[0]["fit"].startswith("checkpoint auto: none needs"), r
EOF

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
