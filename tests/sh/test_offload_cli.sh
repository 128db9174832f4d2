# The trainers' --offload and --gpu on sdxl-tiny, planned: with --offload
# auto a budget may offload, and then plans within the budget at a predicted
# step no longer than recompute alone at the same budget; --plan prints the
# predicted step, the pinned host bytes and what was chosen (text and JSON);
# --offload activations (kohya's --cpu_offload_checkpointing) under diffusers
# offloads what diffusers keeps and recomputes what it recomputes; a budget
# nothing fits is one line naming the smallest peak with offload and
# without (with --offload none too); an unknown --gpu is refused in one line
# (--offload weights and --blocks_to_swap: tests/sh/test_swap_cli.sh); a short run offloading trains bitwise as keeping
# everything does and logs the predicted step beside the measured one; on the
# emulated CUDA device --offload auto is the default.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }

dir=$(mktemp -d "$PWD/out/.test_offload_cli.XXXXXX" 2>/dev/null || { mkdir -p out && mktemp -d "$PWD/out/.test_offload_cli.XXXXXX"; })
trap 'rm -rf "$dir"' EXIT
S=scripts/train_sdxl_lora.lua
json() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

"$CKRUN" --plan --json $S --checkpoint none > "$dir/none.json"
none=$(json "$dir/none.json" 'd["peak_bytes"]')
budget=$((none * 70 / 100))
"$CKRUN" --plan --json $S --checkpoint budget:$budget --offload auto > "$dir/auto.json"; rc1=$?
"$CKRUN" --plan --json $S --checkpoint budget:$budget --offload none > "$dir/rec.json"; rc2=$?
[ $rc1 = 0 ] && [ $rc2 = 0 ]; ok $? "budget:$budget plans with --offload auto and none"
python3 - "$dir/auto.json" "$dir/rec.json" "$budget" <<'EOF'; ok $? "--offload auto: within the budget, pinned host bytes, a predicted step no longer than recompute alone's"
import json, sys
a = json.load(open(sys.argv[1]))["policies"][0]
r = json.load(open(sys.argv[2]))["policies"][0]
b = int(sys.argv[3])
assert a["peak_bytes"] <= b and r["peak_bytes"] <= b, (a["peak_bytes"], r["peak_bytes"], b)
assert a["pinned_host_bytes"] > 0 and a["offload_bytes"] > 0 and a["transfers"] > 0, a
assert r.get("pinned_host_bytes", 0) == 0, r
assert a["predicted_step_seconds"] <= r["predicted_step_seconds"], (a["predicted_step_seconds"], r["predicted_step_seconds"])
assert a["predicted_on"] == "cpu" and a["offload_decision"].startswith("budget: "), a
EOF

"$CKRUN" --plan $S --checkpoint budget:$budget --offload auto > "$dir/auto.txt"
grep -qE "^predicted step +[0-9.e+-]+ s on cpu's figures: a prediction from the cost model's table, not a measurement$" "$dir/auto.txt" \
  && grep -qE "^pinned host +[0-9.]+ [KMG]iB: [0-9.]+ [KMG]iB offloaded each way in [0-9]+ transfers, prefetch 8 entries$" "$dir/auto.txt" \
  && grep -qE "^offload +budget: .* predicted step [0-9.e+-]+ s on cpu" "$dir/auto.txt" \
  && grep -qE "^policy +MiB +bwd MiB +FLOPs +s \(pred\.\) +MiB +\|" "$dir/auto.txt"
ok $? "--plan prints the predicted step, the pinned host bytes, the choice and their columns"

# --checkpoint auto with offload: ck.fit's line says what goes out
size=$((none * 80 / 100))
"$CKRUN" --plan --json $S --checkpoint auto:$size --offload auto > "$dir/fit.json"; rc=$?
[ $rc = 0 ] && json "$dir/fit.json" 'd["fit"]' \
  | grep -qE "^checkpoint auto: none needs .* a budget of .* and offloading [0-9.]+ [KMG]iB each way \([0-9.]+ [KMG]iB of pinned host memory\)$"
ok $? "--checkpoint auto:$size --offload auto: the choice offloads and says so ($(json "$dir/fit.json" 'd["fit"]'))"

# kohya's --cpu_offload_checkpointing: diffusers' recompute, what it keeps offloaded
"$CKRUN" --plan --json $S --checkpoint diffusers > "$dir/d.json"
"$CKRUN" --plan --json $S --gradient_checkpointing --cpu_offload_checkpointing > "$dir/do.json"; rc=$?
python3 - "$dir/d.json" "$dir/do.json" <<'EOF'; ok $? "--cpu_offload_checkpointing: diffusers' recompute, its kept inputs in pinned memory, a lower peak"
import json, sys
d = json.load(open(sys.argv[1]))["policies"][0]
o = json.load(open(sys.argv[2]))["policies"][0]
assert o["recompute_flops"] == d["recompute_flops"], (o["recompute_flops"], d["recompute_flops"])
assert o["pinned_host_bytes"] > 0 and o["peak_bytes"] < d["peak_bytes"], (o, d)
EOF

# one line each for what cannot be
"$CKRUN" --plan $S --checkpoint budget:20% --offload auto > "$dir/small.out" 2>&1; rc=$?
[ $rc != 0 ] && [ "$(wc -l < "$dir/small.out")" = 1 ] \
  && grep -qE "nothing fits in [0-9.]+ MiB; the smallest peak ckrun can plan is [0-9.]+ MiB \([0-9]+ bytes\) with offload, [0-9.]+ MiB \([0-9]+ bytes\) without$" "$dir/small.out"
ok $? "a budget nothing fits: one line, the smallest peak with offload and without ($(cat "$dir/small.out"))"
"$CKRUN" --plan $S --checkpoint budget:20% --offload none > "$dir/small.out" 2>&1; rc=$?
[ $rc != 0 ] && [ "$(wc -l < "$dir/small.out")" = 1 ] \
  && grep -qE "nothing fits in [0-9.]+ MiB; the smallest peak ckrun can plan is [0-9.]+ MiB \([0-9]+ bytes\); with offload \(--offload auto\), [0-9.]+ MiB \([0-9]+ bytes\)$" "$dir/small.out"
ok $? "--offload none: the same line names the smallest peak without offload, then with it ($(cat "$dir/small.out"))"
for args in "--gpu no-such-card --checkpoint budget:70% --offload auto"; do
  "$CKRUN" --plan $S $args > "$dir/bad.out" 2>&1; rc=$?
  [ $rc != 0 ] && [ "$(wc -l < "$dir/bad.out")" = 1 ] && grep -q "$S" "$dir/bad.out"
  ok $? "$args: refused in one line naming the script ($(cat "$dir/bad.out"))"
done

# a run: 3 steps under --offload auto train the adapter bitwise as keeping everything does,
# and the log holds the predicted step beside the measured one
"$CKRUN" $S --steps 3 --checkpoint budget:$budget --offload auto --log-every 1 --log-dir "$dir/log" \
  --out "$dir/off.safetensors" > "$dir/run.out" 2>&1; rc1=$?
"$CKRUN" $S --steps 3 --checkpoint none --out "$dir/kept.safetensors" > /dev/null 2>&1; rc2=$?
python3 - "$dir/off.safetensors" "$dir/kept.safetensors" "$dir/log/metrics.jsonl" <<'EOF'; ok $? "3 steps offloading train the adapter bitwise as keeping everything, the log holds predicted_step_time beside step_time (rc $rc1 $rc2)"
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: b[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]] for k, v in h.items()}
a, k = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a and a == k, "adapters differ"
recs = [json.loads(l) for l in open(sys.argv[3])]
timed = [r for r in recs if "step_time" in r]
assert timed and all(r["predicted_step_time"] > 0 for r in timed), timed
EOF

# on the emulated CUDA device --offload auto is the default: a budget offloads there, its step
# predicted on the H100's figures, said to be assumed (tests/c/emu_offload.c runs such lists)
emu="${CK_BUILD:-build}/libck_cuda_emu.so"
if [ -f "$emu" ]; then
  CK_CUDA_MODULE="$emu" "$CKRUN" --plan --json $S --checkpoint budget:70% > "$dir/emu.json"; rc=$?
  python3 - "$dir/emu.json" <<'EOF'; ok $? "emulated CUDA: the default offloads under budget:70%, predicted on the H100's figures, assumed (rc $rc)"
import json, sys
p = json.load(open(sys.argv[1]))["policies"][0]
assert p["pinned_host_bytes"] > 0 and p["predicted_on"] == "H100" and p["predicted_on_assumed"], p
EOF
else
  echo "(no emulated CUDA backend in this build: the device default is not checked)"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
