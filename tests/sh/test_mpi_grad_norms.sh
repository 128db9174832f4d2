# The gradient norms a data-parallel job logs (2 ranks under Open MPI's
# mpirun, oversubscribed on CI's 2 cores, the tiny model) are those of the
# mean gradients after the reduction: what one process logs at the global
# batch (within fp32 summation-order tolerance), not rank 0's own gradients;
# with and without ZeRO-1, and at a logging cadence that skips steps. SKIPs
# (77) where mpirun is missing or ckrun was built without MPI.
. tests/sh/mpi_setup.sh
A="--allow-write $dir"
T="scripts/train_sdxl_lora.lua --resolution 64 --samples 8 --val-every 0 --steps 4"
# FILE FILE: every step that logs grad_norm in either logs it in both, and
# each norm (the global and each block's) agrees within 1e-4 relative
norms() { "$CKRUN" $A -e "local ck = require 'ck'
local function read(path)
  local t = {}
  for line in io.lines(path) do local r = ck.json_decode(line) if r.grad_norm then t[r.step] = r end end
  return t
end
local a, b = read('$1'), read('$2')
local n, worst = 0, 0
for step, rb in pairs(b) do
  local ra = assert(a[step], 'step ' .. step .. ' has no grad_norm in $1')
  local function cmp(x, y, what)
    assert(y > 0, what)
    local rel = math.abs(x - y) / y
    assert(rel < 1e-4, string.format('step %d %s: %.8g against %.8g', step, what, x, y))
    if rel > worst then worst = rel end
  end
  cmp(ra.grad_norm, rb.grad_norm, 'grad_norm')
  for k, v in pairs(rb.grad_norms) do cmp(assert(ra.grad_norms[k], k), v, k) end
  n = n + 1
end
for step in pairs(a) do assert(b[step], 'step ' .. step .. ' has no grad_norm in $2') end
assert(n >= 2, n)
io.write(string.format('%d steps, worst rel %.1e', n, worst))"; }

"$CKRUN" $A $T --batch 2 --log-every 1 --out "$dir/one.safetensors" --log-dir "$dir/lone" > "$dir/one.out" 2>&1
$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 --log-every 1 --out "$dir/a.safetensors" --log-dir "$dir/la" > "$dir/a.out" 2>&1 ; rc=$?
norms "$dir/la/metrics.jsonl" "$dir/lone/metrics.jsonl" > "$dir/cmp.a" 2>&1
ok $? "2 ranks at --batch 1 log one process's gradient norms at --batch 2 (rc $rc: $(tail -1 "$dir/cmp.a"))"
$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 --log-every 1 --shard-optimizer --out "$dir/s.safetensors" --log-dir "$dir/ls" \
  > "$dir/s.out" 2>&1 ; rc=$?
norms "$dir/ls/metrics.jsonl" "$dir/lone/metrics.jsonl" > "$dir/cmp.s" 2>&1
ok $? "and so do they with --shard-optimizer (rc $rc: $(tail -1 "$dir/cmp.s"))"
"$CKRUN" $A $T --batch 2 --log-every 2 --out "$dir/one2.safetensors" --log-dir "$dir/lone2" > "$dir/one2.out" 2>&1
$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 --log-every 2 --out "$dir/b.safetensors" --log-dir "$dir/lb" > "$dir/b.out" 2>&1 ; rc=$?
norms "$dir/lb/metrics.jsonl" "$dir/lone2/metrics.jsonl" > "$dir/cmp.b" 2>&1
ok $? "and at --log-every 2 (rc $rc: $(tail -1 "$dir/cmp.b"))"
# rank 0's own gradients are not what the job logs: the check above can tell them apart
"$CKRUN" $A $T --batch 1 --log-every 1 --out "$dir/r0.safetensors" --log-dir "$dir/lr0" > "$dir/r0.out" 2>&1
! norms "$dir/lr0/metrics.jsonl" "$dir/lone/metrics.jsonl" > /dev/null 2>&1
ok $? "the comparison tells one sample's gradient norms from the batch's"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
