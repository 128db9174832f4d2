# scripts/train_sdxl_lora.lua as a data-parallel job under Open MPI's mpirun
# (2 ranks oversubscribed on CI's 2 cores, the tiny model): 2 ranks at --batch
# 1 train what one process trains at --batch 2 (the same losses, the adapter
# within fp32 summation-order tolerance: noise and timesteps are keyed by the
# sample's row in the global batch); a second job repeats the first bitwise;
# a job resumed from its state ends with the uninterrupted job's adapter,
# bitwise, and so does one killed (SIGKILL) after its state and resumed;
# rank 0 renders the samples while the other ranks wait; rank 0 alone writes the log, and each step's record says every
# rank's step time and wait in collectives; ranks whose options differ are
# refused at start; --plan --world-size N plans one rank of N. SKIPs (77)
# where mpirun is missing or ckrun was built without MPI.
. tests/sh/mpi_setup.sh
. tests/sh/mpi_compare.sh
A="--allow-write $dir"
T0="scripts/train_sdxl_lora.lua --resolution 64 --samples 8 --log-every 1 --val-every 3"
T="$T0 --steps 6"

$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 --out "$dir/a.safetensors" --log-dir "$dir/la" > "$dir/a.out" 2>&1 ; rc=$?
ok $rc "2 ranks at --batch 1 train ($(tail -1 "$dir/a.out"))"
"$CKRUN" $A $T --batch 2 --out "$dir/one.safetensors" --log-dir "$dir/lone" > "$dir/one.out" 2>&1
[ "$(losses "$dir/la/metrics.jsonl")" = "$(losses "$dir/lone/metrics.jsonl")" ] && [ -n "$(losses "$dir/la/metrics.jsonl")" ]
ok $? "their losses (the mean over ranks) are one process's at --batch 2, step by step ($(losses "$dir/la/metrics.jsonl"))"
close "$dir/a.safetensors" "$dir/one.safetensors" > "$dir/cmp.out" 2>&1
ok $? "the adapter is one process's within fp32 summation-order tolerance ($(cat "$dir/cmp.out" | tail -1))"
"$CKRUN" $A -e "local ck = require 'ck'
local n = 0
for line in io.lines('$dir/la/metrics.jsonl') do
  local r = ck.json_decode(line)
  if r.step_time then
    local k = r.ranks
    assert(k and #k.step_time == 2 and #k.comm_time == 2 and (k.slowest_rank == 0 or k.slowest_rank == 1), line)
    assert(k.step_time_max >= k.step_time[1] and k.step_time_max >= k.step_time[2] and k.comm_time_max >= 0, line)
    n = n + 1
  end
end
assert(n == 6, n)" 2>&1 ; ok $? "each step's record holds every rank's step time and wait in collectives, the slowest rank"
[ -s "$dir/la/metrics.jsonl" ] && [ "$(grep -c '"step":1,' "$dir/la/metrics.jsonl")" = 1 ]
ok $? "rank 0 alone writes the log: each step once"

$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 --out "$dir/b.safetensors" --log-dir "$dir/lb" > "$dir/b.out" 2>&1
cmp -s "$dir/a.safetensors" "$dir/b.safetensors" ; ok $? "a second job on 2 ranks repeats the first bitwise"

# a state at step 3, and the job resumed from it
$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 --save-every 3 --state-dir "$dir/st" --out "$dir/c.safetensors" \
  --log-dir "$dir/lc" > "$dir/c.out" 2>&1
cmp -s "$dir/a.safetensors" "$dir/c.safetensors" && [ -n "$(ls "$dir/st" 2>/dev/null)" ]
ok $? "a job saving states trains the same adapter, and rank 0 wrote the state ($(ls "$dir/st" 2>/dev/null | tr '\n' ' '))"
$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 --save-every 3 --state-dir "$dir/st" --resume --out "$dir/d.safetensors" \
  --log-dir "$dir/ld" > "$dir/d.out" 2>&1 ; rc=$?
grep -q "resumed from .* at step 3" "$dir/d.out" && cmp -s "$dir/a.safetensors" "$dir/d.safetensors"
ok $? "the job resumed at step 3 ends with the uninterrupted job's adapter, bitwise (rc $rc)"

# the 2-rank state resumed by one process at the same global batch (--batch 2): the same global sample position
"$CKRUN" $A $T --batch 2 --save-every 3 --state-dir "$dir/st1" --resume "$dir/st" --out "$dir/f.safetensors" \
  --log-dir "$dir/lf" > "$dir/f.out" 2>&1 ; rc=$?
grep -q "resumed from .* at step 3" "$dir/f.out" && [ "$(losses "$dir/lf/metrics.jsonl" | cut -d' ' -f1)" = "4:$(losses "$dir/la/metrics.jsonl" | tr ' ' '\n' | grep '^4:' | cut -d: -f2)" ]
ok $? "one process resumes the 2-rank state at step 3 and trains step 4 on the samples the job did ($(losses "$dir/lf/metrics.jsonl" | cut -d' ' -f1))"
close "$dir/f.safetensors" "$dir/a.safetensors" > "$dir/cmpf.out" 2>&1
ok $? "and ends with the 2-rank job's adapter within tolerance ($(tail -1 "$dir/cmpf.out"))"

# the same with a recompute policy, accumulation and clipping, every parameter with 8-bit AdamW
# (which quantizes its moments by blocks), and ZeRO-1
V=1
for v in "--checkpoint diffusers||" "--gradient-accumulation-steps 2 --max-grad-norm 0.01||" \
         "--full --optimizer adamw8bit --lr 1e-4|1e-5|1e-2" "--shard-optimizer||"; do
  IFS='|' read -r extra med worst <<< "$v"
  $MPIRUN -np 2 "$CKRUN" $A $T --batch 1 $extra --out "$dir/v$V.a.safetensors" --log-dir "$dir/lv$V.a" > "$dir/v$V.a.out" 2>&1
  one_extra=$extra; [ "$extra" = --shard-optimizer ] && one_extra=""
  "$CKRUN" $A $T --batch 2 $one_extra --out "$dir/v$V.b.safetensors" --log-dir "$dir/lv$V.b" > "$dir/v$V.b.out" 2>&1
  close "$dir/v$V.a.safetensors" "$dir/v$V.b.safetensors" $med $worst > "$dir/v$V.cmp" 2>&1
  ok $? "with $extra: 2 ranks train one process's weights within tolerance ($(tail -1 "$dir/v$V.cmp"))"
  V=$((V+1))
done
# bf16 stores each activation to 8 bits of mantissa, so the ranks' batch-1 kernels and the batch-2 ones,
# which sum in other orders, round apart: the 2-rank adapter must be nearer one process's bf16 adapter
# than that is to its fp32 one (what bf16 itself moves), step losses within 2%
$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 --storage bf16 --out "$dir/h.a.safetensors" --log-dir "$dir/lh.a" > "$dir/h.a.out" 2>&1
"$CKRUN" $A $T --batch 2 --storage bf16 --out "$dir/h.b.safetensors" --log-dir "$dir/lh.b" > "$dir/h.b.out" 2>&1
median() { "$CKRUN" $A -e "local ck = require 'ck'
local a, b = ck.safetensors('$1'), ck.safetensors('$2')
local rels = {}
for _, k in ipairs(b:keys()) do
  local x, y = a:read(k), b:read(k)
  local num, den = 0, 0
  for i = 1, #y do num = num + (x[i] - y[i]) ^ 2; den = den + y[i] ^ 2 end
  if den > 0 then rels[#rels + 1] = math.sqrt(num / den) end
end
table.sort(rels)
io.write(string.format('%.3e', rels[#rels // 2]))"; }
m_dp=$(median "$dir/h.a.safetensors" "$dir/h.b.safetensors"); m_bf=$(median "$dir/h.b.safetensors" "$dir/one.safetensors")
"$CKRUN" $A -e "local ck = require 'ck'
local function ls(path) local t = {} for line in io.lines(path) do local r = ck.json_decode(line) if r.loss then t[#t + 1] = r.loss end end return t end
local a, b = ls('$dir/lh.a/metrics.jsonl'), ls('$dir/lh.b/metrics.jsonl')
assert(#a == 6 and #b == 6)
for i = 1, 6 do assert(math.abs(a[i] - b[i]) <= 0.02 * math.abs(b[i]), i) end
assert($m_dp < $m_bf, 'nearer')" 2>&1
ok $? "with --storage bf16: the losses within 2% and the adapter nearer one process's (median $m_dp) than bf16 is to fp32 ($m_bf)"

# rank 0 renders the samples while the others wait; training is as without them
printf 'a red circle --w 64 --h 32 --s 2\n' > "$dir/p.txt"
$MPIRUN -np 2 "$CKRUN" $A --allow-read "$dir" $T --batch 1 --sample-every 3 --sample-prompts "$dir/p.txt" \
  --out "$dir/s/a.safetensors" --log-dir "$dir/ls" > "$dir/s.out" 2>&1 ; rc=$?
[ $rc = 0 ] && [ "$(ls "$dir/s/samples" 2>/dev/null | tr '\n' ' ')" = "a_000003_00.png a_000006_00.png " ] &&
  cmp -s "$dir/a.safetensors" "$dir/s/a.safetensors"
ok $? "rank 0 writes the samples at steps 3 and 6, and the adapter is the job's without them (rc $rc: $(ls "$dir/s/samples" 2>/dev/null | tr '\n' ' '))"

# a job killed after its state at step 3 and resumed ends as the uninterrupted one, bitwise
$MPIRUN -np 2 "$CKRUN" $A $T0 --steps 200 --batch 1 --save-every 3 --state-dir "$dir/kst" --out "$dir/k.safetensors" \
  --log-dir "$dir/lk" > "$dir/k.out" 2>&1 &
job=$!
# a state is complete once renamed from its .tmp: wait for that name, not the temporary one
for _ in $(seq 1 300); do [ -e "$dir/kst/state-000000003.safetensors" ] && break; sleep 0.1; done
pkill -9 -f -- "ckrun --allow-write $dir .*--state-dir $dir/kst " 2>/dev/null
wait $job
[ -e "$dir/kst/state-000000003.safetensors" ] && [ ! -e "$dir/k.safetensors" ] ; ok $? "the job was killed after its first state ($(ls "$dir/kst" | tr '\n' ' '))"
rm -rf "$dir/kst2" && mkdir "$dir/kst2" && cp "$dir/kst"/state-000000003.safetensors "$dir/kst2/" 2>/dev/null
$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 --save-every 3 --state-dir "$dir/kst2" --resume --out "$dir/k.safetensors" \
  --log-dir "$dir/lk2" > "$dir/k2.out" 2>&1 ; rc=$?
grep -q "resumed from .* at step 3" "$dir/k2.out" && cmp -s "$dir/a.safetensors" "$dir/k.safetensors"
ok $? "resumed from the killed job's step-3 state, it ends with the uninterrupted job's adapter, bitwise (rc $rc)"

# ranks that would train different things are refused before the first step
$MPIRUN -np 1 "$CKRUN" $A $T --batch 1 --lr 1e-3 --out "$dir/e.safetensors" --log-dir "$dir/le" : \
  -np 1 "$CKRUN" $A $T --batch 1 --lr 2e-3 --out "$dir/e.safetensors" --log-dir "$dir/le" > "$dir/e.out" 2>&1 ; rc=$?
[ $rc != 0 ] && grep -q "rank 1's script, options or weights differ from rank 0's" "$dir/e.out" && [ ! -e "$dir/e.safetensors" ]
ok $? "ranks with other options are refused, naming the rank, and nothing is written ($(grep -m1 differ "$dir/e.out"))"

err=$("$CKRUN" $A $T --batch 2 --shard-optimizer 2>&1 >/dev/null)
echo "$err" | grep -q "splits the optimizer state over the ranks" ; ok $? "--shard-optimizer in one process is refused ($err)"

# planned for 4 ranks, launching none
out=$("$CKRUN" --plan --world-size 4 scripts/train_sdxl_lora.lua --batch 1 2>&1)
echo "$out" | grep -q "^world_size  *4$" && echo "$out" | grep -q "^rank_batch  *1$" && echo "$out" | grep -qE "^buckets  *[1-9]"
ok $? "--plan --world-size 4 plans one rank of 4: its share of the batch and its buckets"
err=$($MPIRUN -np 2 "$CKRUN" $A $T --batch 1 --fused-backward --max-grad-norm 0 2>&1 >/dev/null | grep -m1 "not supported on several ranks")
[ -n "$err" ] ; ok $? "what the job cannot do on several ranks yet is refused in one line ($err)"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
