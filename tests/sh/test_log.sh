# Logging survives the process: killed with SIGKILL mid-run, a sync log holds
# a whole JSON line for every finished step, without a gap from step 1; an
# async log loses at most one flush interval; SIGTERM and SIGINT flush every
# record. Event files are TFRecords whose CRCs an independent reader checks,
# and TensorBoard itself reads them where it is installed. The SDXL LoRA
# script logs to --log-dir at --log-every, sync or --log-async.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
J=tests/scripts/train_log.lua

# Checks a run directory: every line parses, steps run 1..n without a gap, and
# the event file's records are whole with valid CRCs (a cut tail allowed).
# Prints "n last_time" of the JSONL on success.
check_logs() { # logdir, min_lines
  python3 - "$1" "$2" <<'EOF'
import glob, json, struct, sys
d, least = sys.argv[1], int(sys.argv[2])
lines = open(d + "/metrics.jsonl", "rb").read().split(b"\n")
if lines[-1] != b"": sys.exit("the last line is partial: %r" % lines[-1][:80])
recs = [json.loads(l) for l in lines[:-1]]
steps = [r["step"] for r in recs]
if steps != list(range(1, len(steps) + 1)): sys.exit("steps have a gap or repeat")
if len(steps) < least: sys.exit("only %d lines" % len(steps))
if not all(isinstance(r["time"], float) and "loss" in r for r in recs): sys.exit("a record lacks time or loss")
# CRC-32C, written independently of vm/formats/logtb.c
T = []
for i in range(256):
    c = i
    for _ in range(8): c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    T.append(c)
def crc(b):
    c = 0xFFFFFFFF
    for x in b: c = (c >> 8) ^ T[(c ^ x) & 0xFF]
    return c ^ 0xFFFFFFFF
def masked(b):
    c = crc(b)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
(ev,) = glob.glob(d + "/events.out.tfevents.*")
data, at, n = open(ev, "rb").read(), 0, 0
while len(data) - at >= 12:
    (length,), (lc,) = struct.unpack_from("<Q", data, at), struct.unpack_from("<I", data, at + 8)
    if lc != masked(data[at:at + 8]): sys.exit("record %d: bad length CRC" % n)
    if len(data) - at - 12 < length + 4: break  # a cut tail
    body = data[at + 12:at + 12 + length]
    if struct.unpack_from("<I", data, at + 12 + length)[0] != masked(body): sys.exit("record %d: bad data CRC" % n)
    if n == 0 and b"\x1a\x0dbrain.Event:2" not in body: sys.exit("the first event is not file_version")
    at, n = at + 12 + length + 4, n + 1
if n < 1: sys.exit("no event records")
print(len(steps), recs[-1]["time"])
EOF
}

# waits (up to 60 s: under load and sanitizers the runs are slow, and a kill
# must come after the moment it waits for, not after a guess at the time)
# until the file $2 has at least $3 lines or process $1 has ended
wait_lines() {
  for _ in $(seq 1200); do
    [ "$(cat "$2" 2>/dev/null | wc -l)" -ge "$3" ] && return 0
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# ---- SIGKILL, sync: every finished step is on disk, whole lines only
for round in 1 2 3; do
  d="$dir/kill$round"; mkdir -p "$d"
  "$CKRUN" --allow-write "$d" $J --dir "$d/logs" --done "$d/done" > /dev/null 2>&1 &
  pid=$!
  wait_lines $pid "$d/logs/metrics.jsonl" $((150 * round))
  kill -KILL $pid; wait $pid 2>/dev/null
  res=$(check_logs "$d/logs" $((150 * round)) 2>&1); rc=$?
  n=${res%% *}; finished=$(tail -n 1 "$d/done")
  [ $rc = 0 ] && [ "$n" -ge "$finished" ]; ok $? "sync, SIGKILL mid-run ($round): $n whole lines, steps 1..$n without a gap, every one of the $finished finished steps logged, event CRCs valid ${res#* }"
done

# ---- SIGKILL, async: at most one flush interval lost
d="$dir/akill"; mkdir -p "$d"
"$CKRUN" --allow-write "$d" $J --dir "$d/logs" --done "$d/done" --async --flush 0.25 > /dev/null 2>&1 &
pid=$!
wait_lines $pid "$d/logs/metrics.jsonl" 1000
sleep 0.37
killed_at=$(date +%s.%N); kill -KILL $pid; wait $pid 2>/dev/null
res=$(check_logs "$d/logs" 1000 2>&1); rc=$?
last=${res#* }
lost=$(python3 -c "print('%.3f' % ($killed_at - $last))" 2>/dev/null)
[ $rc = 0 ] && python3 -c "import sys; sys.exit(not ($killed_at - $last <= 0.25 + 0.5))"
ok $? "async (flush 0.25 s), SIGKILL: whole lines without a gap; the newest record was captured $lost s before the kill (<= 0.25 s + 0.5 s for scheduling) ($res)"

# ---- SIGTERM and SIGINT, async with a long interval: everything is flushed
for sig in TERM INT; do
  d="$dir/sig$sig"; mkdir -p "$d"
  "$CKRUN" --allow-write "$d" $J --dir "$d/logs" --done "$d/done" --async --flush 60 > /dev/null 2> "$d/err" &
  pid=$!
  wait_lines $pid "$d/done" 500
  kill -$sig $pid
  for _ in $(seq 600); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
  kill -0 $pid 2>/dev/null && { kill -KILL $pid; echo "  (did not exit)"; }
  wait $pid; code=$?
  res=$(check_logs "$d/logs" 500 2>&1); rc=$?
  n=${res%% *}; finished=$(tail -n 1 "$d/done")
  [ $rc = 0 ] && [ "$n" -ge "$finished" ] && [ $code -ne 0 ] && grep -q interrupted "$d/err"
  ok $? "async (flush 60 s), SIG$sig: the run stops (exit $code, $(head -c 60 "$d/err")) and all $finished finished steps are in the log ($n lines)"
done

# ---- normal exit, async: every record
d="$dir/normal"; mkdir -p "$d"
"$CKRUN" --allow-write "$d" $J --dir "$d/logs" --steps 300 --async --flush 60 > /dev/null
res=$(check_logs "$d/logs" 300 2>&1); rc=$?
[ $rc = 0 ] && [ "${res%% *}" = 300 ]; ok $? "async, normal exit: all 300 records written ($res)"

# ---- non-finite loss in a run: stop and skip
d="$dir/nan"; mkdir -p "$d"
"$CKRUN" --allow-write "$d" $J --dir "$d/stop" --steps 20 --nan-at 7 > /dev/null 2> "$d/err"; code=$?
[ $code -ne 0 ] && [ "$(wc -l < "$d/err")" = 1 ] && grep -q "step 7: loss is not finite (nan); first non-finite output: linear in block1 (.*train_log.lua:14, forward); its input .x. holds" "$d/err" \
  && [ "$(wc -l < "$d/stop/metrics.jsonl")" = 7 ] && tail -n 1 "$d/stop/metrics.jsonl" | grep -q '"event":"nonfinite"'
ok $? "on_nonfinite stop: one error line naming step 7 and the op, the event logged ($(cat "$d/err"))"
"$CKRUN" --allow-write "$d" $J --dir "$d/skip" --steps 20 --nan-at 7 --on-nonfinite skip > "$d/out" 2>&1; code=$?
[ $code = 0 ] && [ "$(wc -l < "$d/skip/metrics.jsonl")" = 20 ] && grep -q "finished 20 steps" "$d/out" \
  && grep '"step":7,' "$d/skip/metrics.jsonl" | grep -q '"action":"skip"' && ! grep '"step":8,' "$d/skip/metrics.jsonl" | grep -q nonfinite
ok $? "on_nonfinite skip: step 7's update is dropped and logged, the run goes on to step 20"

# ---- TensorBoard reads the event files
if python3 -c "import tensorboard" 2>/dev/null; then
  python3 - "$dir/normal/logs" <<'EOF'
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(glob.glob(sys.argv[1] + "/events.out.tfevents.*")[0]); ea.Reload()
loss = ea.Scalars("loss")
assert [e.step for e in loss] == list(range(1, 301)), "loss steps"
assert "grad_norm" in ea.Tags()["scalars"] and "grad_norms/block1" in ea.Tags()["scalars"]
EOF
  ok $? "TensorBoard's EventAccumulator reads 300 loss scalars and the gradient norms"
else
  echo "skip TensorBoard reads the event files: the tensorboard Python package is not installed (pip install tensorboard)"
fi

# ---- the SDXL LoRA script: --log-dir, --log-every, --log-async
S=scripts/train_sdxl_lora.lua
"$CKRUN" --allow-write "$dir" $S --steps 6 --resolution 128 --log-dir "$dir/sdxl" --log-every 2 --out "$dir/lora.safetensors" > "$dir/sdxl.out"
python3 - "$dir/sdxl" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
train = [r for r in recs if "loss" in r]
assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6], "loss every step"
assert [r["step"] for r in train if "grad_norm" in r] == [2, 4, 6], "gradient norms every 2"
assert all(r["grad_norms"] and r["memory"]["planned"] > 0 for r in train if "grad_norm" in r)
assert [r["step"] for r in recs if "val_loss" in r] == [0, 6], "validation before and after"
EOF
ok $? "train_sdxl_lora --log-every 2: loss every step, gradient norms and memory at steps 2, 4, 6, validation records"
"$CKRUN" --allow-write "$dir" $S --steps 10 --resolution 128 --log-dir "$dir/sdxl_async" --log-every 2 --log-async --out "$dir/lora.safetensors" > /dev/null
python3 - "$dir/sdxl_async" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert [r["step"] for r in recs if "loss" in r] == list(range(1, 11))
acts = [r for r in recs if "acts" in r]
assert [r["step"] for r in acts] == [10] and "mid_block.attentions.0" in acts[0]["acts"], "activation statistics every 10"
a = acts[0]["acts"]["mid_block.attentions.0"]
assert a["std"] > 0 and a["absmax"] >= abs(a["mean"])
EOF
ok $? "train_sdxl_lora --log-async: every record written; activation statistics of UNet blocks at step 10 (5 x --log-every)"
grep -q "^wrote logs to $dir/sdxl$" "$dir/sdxl.out"; ok $? "the script says where the logs went"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
