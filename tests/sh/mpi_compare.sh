# What the data-parallel job tests compare, sourced after tests/sh/mpi_setup.sh
# (which sets CKRUN; $A is each test's ckrun options): a run's losses from its
# metrics.jsonl, and two adapters within fp32 summation-order tolerance.
losses() { "$CKRUN" $A -e "local ck = require 'ck'
for line in io.lines('$1') do local r = ck.json_decode(line) if r.loss then io.write(string.format('%d:%.6f ', r.step, r.loss)) end end"; }
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
