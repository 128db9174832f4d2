# Training states of a ZeRO-1 job (--shard-optimizer) under Open MPI's mpirun
# (2 ranks oversubscribed on CI's 2 cores, the tiny model): rank 0 gathers each
# optimizer state from its owner rank and writes one file in the layout an
# unsharded job writes (the same tensors, bitwise: ZeRO-1 updates as the
# unsharded job does); the job resumed from it ends bitwise as the
# uninterrupted one; an unsharded job's state resumes sharded, and a sharded
# one in one process at the same global batch; AdamW and 8-bit AdamW; with
# gradient accumulation, states at updates (a cadence between them is
# refused: each rank holds its own part of the sums there). SKIPs
# (77) where mpirun is missing or ckrun was built without MPI.
. tests/sh/mpi_setup.sh
. tests/sh/mpi_compare.sh
A="--allow-write $dir"
T="scripts/train_sdxl_lora.lua --resolution 64 --samples 8 --log-every 1 --val-every 3 --steps 6"
same_tensors() { # FILE FILE: the same tensor names, shapes and values, bitwise
  "$CKRUN" $A -e "local ck = require 'ck'
local a, b = ck.safetensors('$1'), ck.safetensors('$2')
local ka, kb = a:keys(), b:keys()
assert(#ka == #kb, #ka .. ' and ' .. #kb .. ' tensors')
local moments = 0
for i, k in ipairs(kb) do
  assert(ka[i] == k, ka[i] .. ' against ' .. k)
  local x, y = a:read(k), b:read(k)
  assert(#x == #y, k)
  for j = 1, #y do assert(x[j] == y[j] or (x[j] ~= x[j] and y[j] ~= y[j]), k .. ' differs at ' .. j) end
  if k:match('^exp_avg') or k:match('^adam8_') then moments = moments + 1 end
end
io.write(#kb .. ' tensors, ' .. moments .. ' of optimizer state')
assert(moments > 0)"
}

for opt in adamw adamw8bit; do
  O="--optimizer $opt"
  $MPIRUN -np 2 "$CKRUN" $A $T --batch 1 $O --save-every 3 --state-dir "$dir/u.$opt" --out "$dir/u.$opt.safetensors" \
    --log-dir "$dir/lu.$opt" > "$dir/u.$opt.out" 2>&1
  $MPIRUN -np 2 "$CKRUN" $A $T --batch 1 $O --shard-optimizer --save-every 3 --state-dir "$dir/s.$opt" \
    --out "$dir/s.$opt.safetensors" --log-dir "$dir/ls.$opt" > "$dir/s.$opt.out" 2>&1 ; rc=$?
  [ $rc = 0 ] && cmp -s "$dir/u.$opt.safetensors" "$dir/s.$opt.safetensors"
  ok $? "$opt: a sharded job saving states trains the unsharded job's adapter, bitwise (rc $rc)"
  same_tensors "$dir/s.$opt/state-000000003.safetensors" "$dir/u.$opt/state-000000003.safetensors" > "$dir/cmp.$opt" 2>&1
  ok $? "$opt: the sharded job's state is the unsharded job's, tensor by tensor ($(tail -1 "$dir/cmp.$opt"))"

  $MPIRUN -np 2 "$CKRUN" $A $T --batch 1 $O --shard-optimizer --save-every 3 --state-dir "$dir/s.$opt" --resume \
    --out "$dir/r.$opt.safetensors" --log-dir "$dir/lr.$opt" > "$dir/r.$opt.out" 2>&1 ; rc=$?
  grep -q "resumed from .* at step 3" "$dir/r.$opt.out" && cmp -s "$dir/s.$opt.safetensors" "$dir/r.$opt.safetensors"
  ok $? "$opt: the sharded job resumed at step 3 ends with the uninterrupted job's adapter, bitwise (rc $rc)"

  $MPIRUN -np 2 "$CKRUN" $A $T --batch 1 $O --shard-optimizer --resume "$dir/u.$opt" \
    --out "$dir/x.$opt.safetensors" --log-dir "$dir/lx.$opt" > "$dir/x.$opt.out" 2>&1 ; rc=$?
  grep -q "resumed from .* at step 3" "$dir/x.$opt.out" && cmp -s "$dir/s.$opt.safetensors" "$dir/x.$opt.safetensors"
  ok $? "$opt: an unsharded job's state resumes sharded, bitwise (rc $rc)"

  # one process at the job's global batch: the same samples from step 4 on
  "$CKRUN" $A $T --batch 2 $O --resume "$dir/s.$opt" --out "$dir/one.$opt.safetensors" --log-dir "$dir/lo.$opt" \
    > "$dir/one.$opt.out" 2>&1 ; rc=$?
  l1=$(losses "$dir/lo.$opt/metrics.jsonl" | cut -d' ' -f1)
  l2=$(losses "$dir/ls.$opt/metrics.jsonl" | tr ' ' '\n' | grep '^4:')
  grep -q "resumed from .* at step 3" "$dir/one.$opt.out" && [ -n "$l1" ] && [ "$l1" = "$l2" ]
  ok $? "$opt: one process resumes the sharded state at step 3 and trains step 4 on the job's samples ($l1, rc $rc)"
  "$CKRUN" $A -e "local ck = require 'ck'
local a, b = ck.safetensors('$dir/one.$opt.safetensors'), ck.safetensors('$dir/s.$opt.safetensors')
local rels = {}
for _, k in ipairs(b:keys()) do
  local x, y = a:read(k), b:read(k)
  local num, den = 0, 0
  for i = 1, #y do num = num + (x[i] - y[i]) ^ 2; den = den + y[i] ^ 2 end
  if den > 0 then rels[#rels + 1] = math.sqrt(num / den) end
end
table.sort(rels)
io.write(string.format('median rel %.2e, worst %.2e', rels[#rels // 2], rels[#rels]))
assert(#rels >= 100 and rels[#rels // 2] < 1e-5 and rels[#rels] < 1e-2)" > "$dir/close.$opt" 2>&1
  ok $? "$opt: and ends with the sharded job's adapter within fp32 summation-order tolerance ($(tail -1 "$dir/close.$opt"))"
done

# with gradient accumulation a state is saved at an update, when the sums are empty, and resumes bitwise; between
# two updates each rank holds its own part of the sums, so a cadence that would save there is refused at start
G="--gradient-accumulation-steps 2 --shard-optimizer"
$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 $G --out "$dir/g.safetensors" --log-dir "$dir/lg" > "$dir/g.out" 2>&1
$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 $G --save-every 2 --state-dir "$dir/gst" --out "$dir/g1.safetensors" \
  --log-dir "$dir/lg1" > "$dir/g1.out" 2>&1
$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 $G --save-every 2 --state-dir "$dir/gst" --resume --out "$dir/g2.safetensors" \
  --log-dir "$dir/lg2" > "$dir/g2.out" 2>&1 ; rc=$?
grep -q "resumed from .* at step 4" "$dir/g2.out" && cmp -s "$dir/g.safetensors" "$dir/g2.safetensors"
ok $? "accumulating over 2 steps: the job resumed at step 4 ends with the uninterrupted job's adapter, bitwise (rc $rc)"
err=$($MPIRUN -np 2 "$CKRUN" $A $T --batch 1 $G --save-every 3 --state-dir "$dir/gst3" --out "$dir/g3.safetensors" 2>&1 |
  grep -m1 "must be a multiple of --gradient-accumulation-steps")
[ -n "$err" ] && [ ! -e "$dir/g3.safetensors" ] && [ -z "$(ls "$dir/gst3" 2>/dev/null | grep '^state-')" ]
ok $? "a state cadence between updates is refused in one line, nothing written ($err)"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
