# The trainers' --blocks-to-swap (kohya's --blocks_to_swap) and --offload
# weights: frozen weights of the last blocks streamed from pinned host memory.
# Planned: the streamed blocks are kohya's count (Flux: N // 2 double and
# (N - N // 2) * 2 single blocks; SDXL: the last N of its 7 top-level
# blocks), their bytes leave the persistent region and are the pinned host
# bytes, --offload weights streams every block, and --plan prints the line;
# with --cpu_offload_checkpointing both happen; a budget holds the plan with
# the weights' device copies. --checkpoint auto with
# --offload auto streams blocks (a bisection over their count) when nothing
# fits otherwise. With --full the blocks' trained weights and their optimizer
# state stream too, --offload-optimizer moves every optimizer state to
# pinned memory, and auto does that first. Bad values are one line naming the option. Run: two steps streaming train the adapter bitwise as
# keeping the weights, on flux-tiny and sdxl-tiny, and one step on the
# emulated CUDA device for flux-tiny.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }

dir=$(mktemp -d "$PWD/out/.test_swap_cli.XXXXXX" 2>/dev/null || { mkdir -p out && mktemp -d "$PWD/out/.test_swap_cli.XXXXXX"; })
trap 'rm -rf "$dir"' EXIT
F="scripts/train_flux_lora.lua --size tiny"
S=scripts/train_sdxl_lora.lua

"$CKRUN" --plan --json $F > "$dir/f0.json"; r0=$?
"$CKRUN" --plan --json $F --blocks_to_swap 2 > "$dir/f3.json"; r3=$?
"$CKRUN" --plan --json $F --offload weights > "$dir/fw.json"; rw=$?
"$CKRUN" --plan --json $F --blocks-to-swap 2 --cpu_offload_checkpointing --checkpoint diffusers > "$dir/fa.json"; ra=$?
python3 - "$dir/f0.json" "$dir/f3.json" "$dir/fw.json" "$dir/fa.json" <<'EOF'; ok $? "flux-tiny: --blocks_to_swap 2 streams 1 double and 2 single blocks' weights, out of the persistent region into pinned memory; --offload weights every block; with activation offload too (rc $r0 $r3 $rw $ra)"
import json, sys
k, s, w, a = (json.load(open(p))["policies"][0] for p in sys.argv[1:5])
# flux-tiny has 2 double and 2 single blocks: 2 is 1 double and 2 single, every block 2 and 2
assert "streamed_weights_bytes" not in k or not k["streamed_weights_bytes"], k
assert s["streamed_weights_bytes"] > 0 and s["pinned_host_bytes"] == s["streamed_weights_bytes"], s
assert k["persistent_bytes"] - s["persistent_bytes"] == s["streamed_weights_bytes"], (k["persistent_bytes"], s)
assert s["stream_bytes"] >= s["streamed_weights_bytes"], s
assert w["streamed_weights_bytes"] > s["streamed_weights_bytes"], (w, s)
assert a["streamed_weights_bytes"] == s["streamed_weights_bytes"] and a["offload_bytes"] > 0, a
assert a["pinned_host_bytes"] > a["streamed_weights_bytes"], a
EOF
"$CKRUN" --plan $F --blocks-to-swap 1 > "$dir/f1.txt" 2>&1
grep -qE "^streamed weights +[0-9.]+ [KMG]iB of frozen weights in pinned host memory: [0-9.]+ [KMG]iB brought in a step, prefetch 8 entries$" "$dir/f1.txt"
ok $? "--plan prints the streamed weights' pinned bytes and what a step brings in"

"$CKRUN" --plan --json $S > "$dir/s0.json"
"$CKRUN" --plan --json $S --blocks-to-swap 7 > "$dir/s7.json"
"$CKRUN" --plan --json $S --offload weights > "$dir/sw.json"
python3 - "$dir/s0.json" "$dir/s7.json" "$dir/sw.json" <<'EOF'; ok $? "sdxl-tiny: --blocks-to-swap 7 is every block, as --offload weights; a lower peak"
import json, sys
k, s, w = (json.load(open(p))["policies"][0] for p in sys.argv[1:4])
assert s["streamed_weights_bytes"] == w["streamed_weights_bytes"] > 0, (s, w)
assert k["persistent_bytes"] - s["persistent_bytes"] == s["streamed_weights_bytes"], (k, s)
assert s["peak_bytes"] < k["peak_bytes"], (s["peak_bytes"], k["peak_bytes"])
EOF

# --full: the streamed blocks' trained weights and their optimizer state
# stream too; --offload-optimizer moves every optimizer state to pinned memory
"$CKRUN" --plan --json $S --full > "$dir/u0.json"; r0=$?
"$CKRUN" --plan --json $S --full --offload-optimizer > "$dir/uo.json"; ro=$?
"$CKRUN" --plan --json $S --full --blocks-to-swap 3 > "$dir/u3.json"; r3=$?
"$CKRUN" --plan --json $S --full --blocks-to-swap 3 --offload-optimizer > "$dir/u3o.json"; r3o=$?
python3 - "$dir/u0.json" "$dir/uo.json" "$dir/u3.json" "$dir/u3o.json" <<'EOF'; ok $? "sdxl-tiny --full: --offload-optimizer streams every optimizer state, --blocks-to-swap 3 the blocks' trained weights and their state; out of the persistent region, lower peaks (rc $r0 $ro $r3 $r3o)"
import json, sys
k, o, s, so = (json.load(open(p))["policies"][0] for p in sys.argv[1:5])
assert not k.get("streamed_weights_bytes"), k
# every moment of AdamW, in the pinned region alone
assert o["streamed_weights_bytes"] == o["streamed_optimizer_state_bytes"] > 0 and "streamed_trained_bytes" not in o, o
assert k["persistent_bytes"] - o["persistent_bytes"] == o["streamed_weights_bytes"], (k["persistent_bytes"], o)
assert o["at_peak"]["optimizer_state"] == 0 < k["at_peak"]["optimizer_state"], (o["at_peak"], k["at_peak"])
assert s["streamed_trained_bytes"] > 0 and 0 < s["streamed_optimizer_state_bytes"] < o["streamed_optimizer_state_bytes"], s
assert s["streamed_weights_bytes"] == s["streamed_trained_bytes"] + s["streamed_optimizer_state_bytes"], s
assert k["persistent_bytes"] - s["persistent_bytes"] == s["streamed_weights_bytes"], (k["persistent_bytes"], s)
assert so["streamed_trained_bytes"] == s["streamed_trained_bytes"], (so, s)
assert so["streamed_optimizer_state_bytes"] == o["streamed_optimizer_state_bytes"], (so, o)
assert so["peak_bytes"] < s["peak_bytes"] < k["peak_bytes"] and o["peak_bytes"] < k["peak_bytes"], \
    [x["peak_bytes"] for x in (k, o, s, so)]
EOF
"$CKRUN" --plan $S --full --offload-optimizer > "$dir/uo.txt" 2>&1
grep -qE "^streamed weights +[0-9.]+ [KMG]iB of optimizer state in pinned host memory: " "$dir/uo.txt" &&
  "$CKRUN" --plan $S --full --offload-optimizer --blocks-to-swap 2 2>&1 | grep -qE "^streamed weights +[0-9.]+ [KMG]iB of weights and optimizer state \([0-9.]+ [KMG]iB trained weights, [0-9.]+ [KMG]iB optimizer state\) in pinned host memory: "
ok $? "--plan says what the streamed bytes are: optimizer state, trained weights"
# --checkpoint auto with --offload auto: a full fine-tune that does not fit moves the optimizer state first
"$CKRUN" --plan --json $S --full --checkpoint auto:100MiB --offload auto > "$dir/ua.json"; r1=$?
"$CKRUN" --plan --json $S --full --checkpoint auto:70MiB --offload auto > "$dir/ub.json"; r2=$?
python3 - "$dir/ua.json" "$dir/ub.json" <<'EOF'; ok $? "sdxl-tiny --full, auto:100MiB --offload auto: the optimizer state offloaded, said in the fit line; auto:70MiB: blocks streamed too (rc $r1 $r2)"
import json, re, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
pa, pb = a["policies"][0], b["policies"][0]
assert a["fit"].endswith("; the optimizer state in pinned host memory (--offload-optimizer)"), a["fit"]
assert "streaming" not in a["fit"] and pa["streamed_optimizer_state_bytes"] > 0 and "streamed_trained_bytes" not in pa, pa
assert pa["device_bytes"] <= 100 * 2**20 * 0.9, pa
assert re.search(r"; streaming the trained and frozen weights of the last (\d+) blocks \(--blocks-to-swap \1, found by "
                 r"bisection\); the optimizer state in pinned host memory \(--offload-optimizer\)$", b["fit"]), b["fit"]
assert pb["streamed_trained_bytes"] > 0 and pb["device_bytes"] <= 70 * 2**20 * 0.9, pb
EOF
# not with data parallel: one line naming the option
"$CKRUN" --plan --world-size 2 $S --full --offload-optimizer > "$dir/dp.out" 2>&1; rc=$?
[ $rc != 0 ] && [ "$(wc -l < "$dir/dp.out")" = 1 ] && grep -q -- "--offload-optimizer" "$dir/dp.out"
ok $? "--offload-optimizer planned for 2 ranks: refused in one line naming the option ($(cat "$dir/dp.out"))"

for args in "$S --blocks-to-swap 8" "$S --blocks-to-swap -1" "$S --blocks-to-swap two" "$F --blocks_to_swap 5"; do

  "$CKRUN" --plan $args > "$dir/bad.out" 2>&1; rc=$?
  [ $rc != 0 ] && [ "$(wc -l < "$dir/bad.out")" = 1 ] && grep -q -- "--blocks-to-swap" "$dir/bad.out"
  ok $? "$args: refused in one line naming the option ($(cat "$dir/bad.out"))"
done

# a budget with streamed weights: the weights' device copies are not in the
# list the decision sees, so the plan with them is held to the budget (a
# decision again under the budget cut by what they added)
over=""
for m in "$F --blocks-to-swap 1" "$F --blocks-to-swap 2" "$S --blocks-to-swap 3"; do
  case "$m" in *flux*) budgets="2200 2100 2000 1900" ;; *) budgets="50000 45000 40000" ;; esac
  for off in none auto; do
    for kib in $budgets; do
      "$CKRUN" --plan --json $m --offload $off --checkpoint budget:${kib}KiB > "$dir/b.json" 2>&1
      python3 -c 'import json, sys; p = json.load(open(sys.argv[1]))["policies"][0]; sys.exit(p["peak_bytes"] > int(sys.argv[2]) * 1024)' \
        "$dir/b.json" "$kib" || over="$over; $m --offload $off budget:${kib}KiB: $(head -c 300 "$dir/b.json")"
    done
  done
done
[ -z "$over" ]
ok $? "budgets with streamed blocks (flux-tiny, sdxl-tiny; --offload none and auto): every plan's peak within its budget$over"

# a budget the list fits only without the copies: refused in one line that says the budget was cut for them
"$CKRUN" --plan $F --blocks-to-swap 2 --offload none --checkpoint budget:1320KiB > "$dir/cut.out" 2>&1; rc=$?
[ $rc != 0 ] && [ "$(wc -l < "$dir/cut.out")" = 1 ] && grep -q "^ckrun: scripts/train_flux_lora.lua:[0-9]*: " "$dir/cut.out" \
  && grep -q "nothing fits in .*(the budget less [0-9.]* MiB for the streamed weights' device copies)$" "$dir/cut.out"
ok $? "budget:1320KiB with 2 blocks streamed: the list fits it, not with the copies: one line naming the cut ($(cat "$dir/cut.out"))"
# a budget the list itself does not fit: the smallest peak named is the list's, and the line says what the copies add
"$CKRUN" --plan $F --blocks-to-swap 2 --offload none --checkpoint budget:1MiB > "$dir/floor.out" 2>&1; rc=$?
[ $rc != 0 ] && [ "$(wc -l < "$dir/floor.out")" = 1 ] && grep -q "^ckrun: scripts/train_flux_lora.lua:[0-9]*: " "$dir/floor.out" \
  && grep -qE "the smallest peak ckrun can plan is .* \(the streamed weights' device copies not counted: under none they hold [0-9.]+ (KiB|MiB) at once\)$" "$dir/floor.out"
ok $? "budget:1MiB with 2 blocks streamed: one line whose smallest peak says the copies are not in it ($(cat "$dir/floor.out"))"

# --checkpoint auto with --offload auto: when nothing fits, blocks streamed (a bisection) that let it fit
"$CKRUN" --plan --json $F --checkpoint auto:1300KiB --offload auto > "$dir/auto.json"; rc=$?
python3 - "$dir/auto.json" <<'EOF'; ok $? "flux-tiny, auto:1300KiB --offload auto: nothing fits without streaming; blocks streamed that fit, said in the fit line (rc $rc)"
import json, re, sys
d = json.load(open(sys.argv[1]))
p = d["policies"][0]
m = re.search(r"; streaming the frozen weights of the last (\d+) blocks \(--blocks-to-swap \1, found by bisection\)$", d["fit"])
assert m and p["streamed_weights_bytes"] > 0 and p["device_bytes"] <= 1300 * 1024 * 0.9, (d["fit"], p)
EOF
"$CKRUN" --plan $F --checkpoint auto:1300KiB --offload none > "$dir/none.out" 2>&1; rc=$?
[ $rc != 0 ] && [ "$(wc -l < "$dir/none.out")" = 1 ] && ! grep -q streaming "$dir/none.out"
ok $? "the same with --offload none: refused, nothing streamed ($(cat "$dir/none.out"))"
"$CKRUN" --plan $F --checkpoint auto:1MiB --offload auto > "$dir/small.out" 2>&1; rc=$?
[ $rc != 0 ] && [ "$(wc -l < "$dir/small.out")" = 1 ] && grep -q "^ckrun: scripts/train_flux_lora.lua:[0-9]*: " "$dir/small.out" \
  && grep -qE "; streaming every block's frozen weights \(--blocks-to-swap 2\), nothing fits in .* the smallest plan needs" "$dir/small.out"
ok $? "auto:1MiB: one line naming the script line and the smallest plan without streaming and with every block streamed"

same() { cmp -s "$1" "$2"; }
"$CKRUN" $F --steps 2 --resolution 64 --checkpoint diffusers --blocks-to-swap 2 --out "$dir/fs.safetensors" --log-dir "$dir/l1" > /dev/null 2>&1; r1=$?
"$CKRUN" $F --steps 2 --resolution 64 --checkpoint diffusers --out "$dir/fk.safetensors" --log-dir "$dir/l2" > /dev/null 2>&1; r2=$?
[ $r1 = 0 ] && [ $r2 = 0 ] && same "$dir/fs.safetensors" "$dir/fk.safetensors"
ok $? "flux-tiny: 2 steps at 64 px streaming 2 blocks train the adapter bitwise as keeping the weights (rc $r1 $r2)"
"$CKRUN" $S --steps 2 --resolution 64 --checkpoint diffusers --blocks-to-swap 3 --out "$dir/ss.safetensors" --log-dir "$dir/l3" > /dev/null 2>&1; r1=$?
"$CKRUN" $S --steps 2 --resolution 64 --checkpoint diffusers --out "$dir/sk.safetensors" --log-dir "$dir/l4" > /dev/null 2>&1; r2=$?
[ $r1 = 0 ] && [ $r2 = 0 ] && same "$dir/ss.safetensors" "$dir/sk.safetensors"
ok $? "sdxl-tiny: 2 steps at 64 px streaming 3 blocks train the adapter bitwise as keeping the weights (rc $r1 $r2)"

# --full: each update brings its weight and state in and writes them back;
# the sampler's program streams the group's trained weights too
echo 'a cat --n blurry --s 2 --w 64 --h 64' > "$dir/prompts.txt"
mkdir -p "$dir/us" "$dir/uk"
"$CKRUN" $S --full --steps 2 --resolution 64 --checkpoint diffusers --offload-optimizer --blocks-to-swap 3 \
  --sample-every 2 --sample-prompts "$dir/prompts.txt" --out "$dir/us/u.safetensors" --log-dir "$dir/l7" \
  > /dev/null 2>&1; r1=$?
"$CKRUN" $S --full --steps 2 --resolution 64 --checkpoint diffusers --sample-every 2 --sample-prompts "$dir/prompts.txt" \
  --out "$dir/uk/u.safetensors" --log-dir "$dir/l8" > /dev/null 2>&1; r2=$?
[ $r1 = 0 ] && [ $r2 = 0 ] && same "$dir/us/u.safetensors" "$dir/uk/u.safetensors" &&
  same "$dir/us/samples/u_000002_00.png" "$dir/uk/samples/u_000002_00.png"
ok $? "sdxl-tiny --full: 2 steps at 64 px with the optimizer state offloaded and 3 blocks' trained weights streamed write the UNet and render the sample bitwise as keeping them (rc $r1 $r2)"

# a training state saved with the optimizer state offloaded resumes kept (and the run is the kept run)
U="$S --full --resolution 64 --checkpoint diffusers"
"$CKRUN" $U --steps 4 --offload-optimizer --blocks-to-swap 3 --save-every 2 --state-dir "$dir/ust" \
  --out "$dir/u4s.safetensors" --log-dir "$dir/l11" > /dev/null 2>&1; r1=$?
"$CKRUN" $U --steps 4 --resume "$dir/ust" --state-dir "$dir/ust" --out "$dir/u4r.safetensors" --log-dir "$dir/l12" \
  > "$dir/u4r.out" 2>&1; r2=$?
"$CKRUN" $U --steps 4 --out "$dir/u4k.safetensors" --log-dir "$dir/l13" > /dev/null 2>&1; r3=$?
[ $r1 = 0 ] && [ $r2 = 0 ] && [ $r3 = 0 ] && grep -q "resumed from .*state-000000002.safetensors at step 2" "$dir/u4r.out" &&
  same "$dir/u4s.safetensors" "$dir/u4k.safetensors" && same "$dir/u4r.safetensors" "$dir/u4k.safetensors"
ok $? "sdxl-tiny --full: a state saved at step 2 with the optimizer state offloaded resumes with it kept; 4 steps either way are the kept run's (rc $r1 $r2 $r3)"

emu="${CK_BUILD:-build}/libck_cuda_emu.so"
if [ -f "$emu" ]; then
  CK_CUDA_MODULE="$emu" "$CKRUN" --device cuda $S --full --steps 1 --resolution 64 --checkpoint diffusers \
    --offload-optimizer --blocks-to-swap 3 --out "$dir/eu.safetensors" --log-dir "$dir/l9" > /dev/null 2>&1; r1=$?
  CK_CUDA_MODULE="$emu" "$CKRUN" --device cuda $S --full --steps 1 --resolution 64 --checkpoint diffusers \
    --out "$dir/euk.safetensors" --log-dir "$dir/l10" > /dev/null 2>&1; r2=$?
  [ $r1 = 0 ] && [ $r2 = 0 ] && same "$dir/eu.safetensors" "$dir/euk.safetensors"
  ok $? "emulated CUDA, sdxl-tiny --full: a step at 64 px with the optimizer state offloaded and 3 blocks streamed is bitwise the kept step (rc $r1 $r2)"

  CK_CUDA_MODULE="$emu" "$CKRUN" --device cuda $F --steps 1 --resolution 64 --checkpoint diffusers --blocks-to-swap 2 \
    --out "$dir/es.safetensors" --log-dir "$dir/l5" > /dev/null 2>&1; r1=$?
  CK_CUDA_MODULE="$emu" "$CKRUN" --device cuda $F --steps 1 --resolution 64 --checkpoint diffusers \
    --out "$dir/ek.safetensors" --log-dir "$dir/l6" > /dev/null 2>&1; r2=$?
  [ $r1 = 0 ] && [ $r2 = 0 ] && same "$dir/es.safetensors" "$dir/ek.safetensors"
  ok $? "emulated CUDA, flux-tiny: a step at 64 px streaming 2 blocks trains bitwise as keeping the weights (rc $r1 $r2)"
else
  echo "(no emulated CUDA backend in this build: the emulated run is not checked)"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
