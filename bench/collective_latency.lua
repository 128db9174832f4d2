-- The cost of one small collective on the ranks of an mpirun job: the mean
-- time of ck.allreduce on a 4-value array (each call is two collectives: the
-- ranks' agreement on what they do, then the sum), over many calls, after a
-- warm-up; rank 0 prints it.
--   mpirun -np 2 build/ckrun bench/collective_latency.lua [--calls N]
local ck = require "ck"
local calls = tonumber(args.calls or 2000)
local x = ck.array({4}, 1)
for _ = 1, 200 do ck.allreduce(x) end
ck.barrier()
local t0 = ck.now()
for _ = 1, calls do ck.allreduce(x) end
local dt = ck.now() - t0
if ck.rank() == 0 then
  print(string.format("%d ranks: %.1f us per ck.allreduce of 4 values (%d calls)", ck.world_size(), 1e6 * dt / calls,
    calls))
end
