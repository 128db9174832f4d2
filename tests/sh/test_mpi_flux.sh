# Data parallel for the Flux family (scripts/train_flux_lora.lua on
# flux-tiny): 2 ranks at --batch 1 under Open MPI's mpirun train what one
# process trains at --batch 2, the losses step by step (the mean over the
# ranks) and the adapter within fp32 summation-order tolerance. SKIPs (77)
# where mpirun is missing or ckrun was built without MPI.
. tests/sh/mpi_setup.sh
. tests/sh/mpi_compare.sh
A="--allow-write $dir"
T="scripts/train_flux_lora.lua --resolution 64 --t5xxl-max-token-length 8 --samples 8 --lr 0.01 --steps 8 --log-every 1"

$MPIRUN -np 2 "$CKRUN" $A $T --batch 1 --out "$dir/a.safetensors" --log-dir "$dir/la" > "$dir/a.out" 2>&1 ; rc=$?
ok $rc "2 ranks at --batch 1 train flux-tiny ($(tail -1 "$dir/a.out"))"
"$CKRUN" $A $T --batch 2 --out "$dir/one.safetensors" --log-dir "$dir/lone" > "$dir/one.out" 2>&1
[ "$(losses "$dir/la/metrics.jsonl")" = "$(losses "$dir/lone/metrics.jsonl")" ] && [ -n "$(losses "$dir/la/metrics.jsonl")" ]
ok $? "their losses are one process's at --batch 2 ($(losses "$dir/la/metrics.jsonl"))"
"$CKRUN" $A -e "local ck = require 'ck'
local a, b = ck.safetensors('$dir/a.safetensors'), ck.safetensors('$dir/one.safetensors')
local worst, n = 0, 0
for _, k in ipairs(b:keys()) do
  local x, y = a:read(k), b:read(k)
  local num, den = 0, 0
  for i = 1, #y do num = num + (x[i] - y[i]) ^ 2; den = den + y[i] ^ 2 end
  if den > 0 then worst = math.max(worst, math.sqrt(num / den)) end
  n = n + 1
end
io.write(string.format('%d tensors, worst rel %.2e', n, worst))
assert(n == 78 and worst < 1e-4)" > "$dir/cmp.out" 2>&1
ok $? "the adapter is one process's within fp32 summation-order tolerance ($(cat "$dir/cmp.out"))"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
