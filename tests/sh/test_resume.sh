# Kill and resume: a run of N steps that is SIGKILLed at arbitrary moments
# (during steps or state saves) and resumed from its last state ends with an
# adapter file byte-identical to an uninterrupted run of N steps, and its log
# holds every step once. The run follows a cosine learning-rate schedule with
# warmup, which a resumed run continues from its step, and accumulates the
# gradients of 3 steps per update: states saved every 2 steps hold partial
# gradient sums, which a resumed run continues.
set -u
dir=out/.test_resume.$$
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
S0="scripts/train_sdxl_lora.lua --resolution 128 --steps 60 --samples 6 --save-every 2 --keep-states 2 --log-every 1 --lr-warmup-steps 5 --gradient-accumulation-steps 3"
S="$S0 --lr-scheduler cosine"

"$CKRUN" $S --log-dir "$dir/straight_log" --out "$dir/straight.safetensors" > /dev/null ; ok $? "an uninterrupted run of 60 steps"

# kill at spread-out moments, resume until a run finishes: each round waits
# until the run has saved a newer state, then kills it a random moment later
# (during a step or a save), so the kills land mid-run however fast it is
# (only finished states: a save under way is a temp file, state-N.safetensors.tmp.PID,
# which --resume rightly passes over; counting it led to "--resume: no saved state")
states() { ls "$dir/state" 2> /dev/null | grep -E '^state-[0-9]+\.safetensors$'; }
newest() { states | tail -n 1; }
kills=0 resumes=0
for round in 1 2 3 4; do
  args=""
  [ -n "$(newest)" ] && args="--resume $dir/state"
  before=$(newest)
  "$CKRUN" $S --state-dir "$dir/state" --log-dir "$dir/resumed_log" --out "$dir/resumed.safetensors" $args > "$dir/log" 2>&1 &
  pid=$!
  for _ in $(seq 400); do
    [ "$(newest)" != "$before" ] && break
    kill -0 $pid 2> /dev/null || break
    sleep 0.02
  done
  sleep "0.0$(( RANDOM % 10 ))"
  if kill -9 $pid 2> /dev/null; then kills=$((kills+1)); fi
  wait $pid 2> /dev/null
  [ -n "$args" ] && resumes=$((resumes+1))
  [ -s "$dir/resumed.safetensors" ] && break
done
# finish the run
while [ ! -s "$dir/resumed.safetensors" ]; do
  "$CKRUN" $S --state-dir "$dir/state" --log-dir "$dir/resumed_log" --out "$dir/resumed.safetensors" --resume "$dir/state" > "$dir/log" 2>&1 || { cat "$dir/log"; break; }
  resumes=$((resumes+1))
done
[ "$kills" -ge 2 ] ; ok $? "the run was killed $kills times and resumed $resumes times"
cmp -s "$dir/straight.safetensors" "$dir/resumed.safetensors" ; ok $? "the resumed adapter is byte-identical to the uninterrupted one"
[ "$(states | wc -l)" -le 2 ] ; ok $? "only the last 2 states are kept"
# a save cut short by a kill leaves its temp file; resuming removes it
touch "$dir/state/state-000000002.safetensors.tmp.99999"
"$CKRUN" $S --state-dir "$dir/state" --log-dir "$dir/again_log" --resume "$dir/state" --out "$dir/again.safetensors" > /dev/null 2>&1
[ ! -e "$dir/state/state-000000002.safetensors.tmp.99999" ] && [ "$(states | wc -l)" -le 2 ]
ok $? "resuming removes the temp file of a save a kill cut short"
steps() { grep -o '^{"step":[0-9]*' "$1" | cut -d: -f2 | tr '\n' ' '; }
[ -n "$(steps "$dir/resumed_log/metrics.jsonl")" ] && [ "$(steps "$dir/resumed_log/metrics.jsonl")" = "$(steps "$dir/straight_log/metrics.jsonl")" ]
ok $? "the resumed run's log has the uninterrupted run's steps, each once: $(steps "$dir/resumed_log/metrics.jsonl" | cut -c1-60)..."
lrs() { python3 -c 'import json, sys; print(" ".join("%d:%r" % (r["step"], r["lr"]) for r in map(json.loads, open(sys.argv[1])) if "lr" in r))' "$1"; }
[ "$(lrs "$dir/resumed_log/metrics.jsonl")" = "$(lrs "$dir/straight_log/metrics.jsonl")" ] && lrs "$dir/straight_log/metrics.jsonl" | grep -qE "^1:0(\.0)? "
ok $? "the resumed run's learning rates are the uninterrupted run's, step by step (warmup from 0): $(lrs "$dir/resumed_log/metrics.jsonl" | cut -c1-50)..."
out=$("$CKRUN" $S0 --state-dir "$dir/state" --resume "$dir/state" --lr-scheduler linear --out "$dir/x.safetensors" 2>&1)
echo "$out" | grep -q "saved with lr_scheduler = cosine, this run has linear" ; ok $? "resuming with another schedule is refused: $out"
out=$("$CKRUN" $S --state-dir "$dir/state" --resume "$dir/state" --batch 1 --out "$dir/x.safetensors" 2>&1)
echo "$out" | grep -q "saved with batch = 2, this run has 1" ; ok $? "resuming with other settings is refused: $out"
out=$("$CKRUN" $S --resume "$dir/nothing" --out "$dir/x.safetensors" 2>&1)
echo "$out" | grep -q "no saved state in '$dir/nothing'" ; ok $? "resuming from an empty directory is refused: $out"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
