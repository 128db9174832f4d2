# scripts/train_sdxl_lora.lua as a data-parallel job under Open MPI's mpirun
# (2 ranks oversubscribed on CI's 2 cores, the tiny model): 2 ranks at --batch
# 1 train what one process trains at --batch 2 (the same losses, the adapter
# within fp32 summation-order tolerance: noise and timesteps are keyed by the
# sample's row in the global batch); a second job repeats the first bitwise;
# a job resumed from its state ends with the uninterrupted job's adapter,
# bitwise; rank 0 alone writes the log, and each step's record says every
# rank's step time and wait in collectives; ranks whose options differ are
# refused at start; --plan --world-size N plans one rank of N. SKIPs (77)
# where mpirun is missing or ckrun was built without MPI.
. tests/sh/mpi_setup.sh
A="--allow-write $dir"
T="scripts/train_sdxl_lora.lua --resolution 64 --steps 6 --samples 8 --log-every 1 --val-every 3"
losses() { "$CKRUN" $A -e "local ck = require 'ck'
for line in io.lines('$1') do local r = ck.json_decode(line) if r.loss then io.write(string.format('%d:%.6f ', r.step, r.loss)) end end"; }

$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 --out "$dir/a.safetensors" --log-dir "$dir/la" > "$dir/a.out" 2>&1 ; rc=$?
ok $rc "2 ranks at --batch 1 train ($(tail -1 "$dir/a.out"))"
"$CKRUN" $A $T --batch 2 --out "$dir/one.safetensors" --log-dir "$dir/lone" > "$dir/one.out" 2>&1
[ "$(losses "$dir/la/metrics.jsonl")" = "$(losses "$dir/lone/metrics.jsonl")" ] && [ -n "$(losses "$dir/la/metrics.jsonl")" ]
ok $? "their losses (the mean over ranks) are one process's at --batch 2, step by step ($(losses "$dir/la/metrics.jsonl"))"
close() { # FILE FILE [MEDIAN WORST]: the adapters agree within fp32 summation-order tolerance (or the one given)
  "$CKRUN" $A -e "local ck = require 'ck'
local a, b = ck.safetensors('$1'), ck.safetensors('$2')
local rels, n = {}, 0
for _, k in ipairs(b:keys()) do
  local x, y = a:read(k), b:read(k)
  local num, den = 0, 0
  for i = 1, #y do num = num + (x[i] - y[i]) ^ 2; den = den + y[i] ^ 2 end
  if den > 0 then rels[#rels + 1] = math.sqrt(num / den) end
  n = n + 1
end
table.sort(rels)
local worst, median = rels[#rels], rels[#rels // 2]
io.write(string.format('%d tensors, median rel %.2e, worst %.2e', n, median, worst))
-- AdamW's first steps move each element by about lr whatever its gradient's
-- size, so an element of a lora_up (zero at the start) whose gradient is near
-- zero moves one way or the other with the summation order: a few tensors
-- differ by 1e-4 of their size, the median by 1e-6
assert(n >= 100 and median < ${3:-1e-5} and worst < ${4:-1e-3})"
}
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

# the same with bf16 storage and a recompute policy, accumulation and clipping, and every parameter with 8-bit AdamW
V=1
# (bf16 stores each activation to 8 bits of mantissa, so the ranks' batch-1 kernels and the batch-2 ones,
# which sum in other orders, round apart by 2^-8: these runs differ by a median 5e-3, a quarter of what
# bf16 storage itself moves the same run from fp32's, 2.3e-2 (measured 2026-12-01); 8-bit AdamW
# quantizes its moments by blocks)
for v in "--storage bf16 --checkpoint diffusers|2e-2|1e-1" "--gradient-accumulation-steps 2 --max-grad-norm 0.01||" \
         "--full --optimizer adamw8bit --lr 1e-4|1e-5|1e-2" "--shard-optimizer||"; do
  IFS='|' read -r extra med worst <<< "$v"
  $MPIRUN -np 2 "$CKRUN" $A $T --batch 1 $extra --out "$dir/v$V.a.safetensors" --log-dir "$dir/lv$V.a" > "$dir/v$V.a.out" 2>&1
  "$CKRUN" $A $T --batch 2 $extra --out "$dir/v$V.b.safetensors" --log-dir "$dir/lv$V.b" > "$dir/v$V.b.out" 2>&1
  [ "$extra" = --shard-optimizer ] && "$CKRUN" $A $T --batch 2 --out "$dir/v$V.b.safetensors" --log-dir "$dir/lv$V.c" > /dev/null 2>&1
  close "$dir/v$V.a.safetensors" "$dir/v$V.b.safetensors" $med $worst > "$dir/v$V.cmp" 2>&1
  ok $? "with $extra: 2 ranks train one process's weights within tolerance ($(tail -1 "$dir/v$V.cmp"))"
  V=$((V+1))
done

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
