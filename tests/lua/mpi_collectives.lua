-- The collectives across the ranks of one job, run by tests/sh/test_mpi.sh and
-- test_mpi_two_hosts.sh under `mpirun -np N ckrun` (not a test_*.lua: alone it
-- would be one rank). Every value checked is what the collective must give
-- for the inputs each rank makes from its rank (small integers and halves,
-- exact in float32, so every order of summation gives the same bits).
--   --case all      (default) every collective, the agreement errors,
--                   same_on_all_ranks, the step, timeout and wait-time controls
--   --case error    rank 1 raises while rank 0 waits in an allreduce (with
--                   --log DIR, holding a logger that SIGTERM interrupts)
--   --case hang     the last rank loops for a minute while the others wait
--                   in an allreduce (the timeout: CK_DIST_TIMEOUT, or
--                   --timeout S through ck.dist_timeout)
--   --case leave    rank 1 returns while rank 0 waits in an allreduce
--   --case die      rank 1 kills itself (SIGKILL; needs --trust)
-- --world N: the world size expected; --local N: the ranks expected per machine.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

local R, W = ck.rank(), ck.world_size()
local case = args.case or "all"

local function ok(cond, what) return T.ok(cond, string.format("rank %d: %s", R, what)) end

-- the error of f(...) on this rank, which must name this script's line and want
local function fails(want, what, f, ...)
  local good, err = pcall(f, ...)
  err = tostring(err)
  ok(not good and err:match("mpi_collectives%.lua:%d+: ") ~= nil and err:find(want, 1, true) ~= nil,
    what .. " (" .. err .. ")")
end

local function same_list(got, want)
  if #got ~= #want then return false end
  for i = 1, #want do if got[i] ~= want[i] then return false end end
  return true
end

local function values(a)
  if type(a) == "table" then return a end
  return a:table()
end

ck.dist_step(1)
if case == "error" then
  -- --log DIR: rank 0 holds a logger there, so mpirun's SIGTERM interrupts its wait
  local log = R == 0 and args.log and ck.log_open{dir = args.log, tensorboard = false}
  if log then log:write{step = 1, loss = 0.5} end
  ck.allreduce({1})
  if R == 1 then error("rank 1 fails on purpose") end
  ck.allreduce({2}) -- rank 0 waits here until the job ends
  return
elseif case == "hang" then
  if args.timeout then ck.dist_timeout(tonumber(args.timeout)) end
  ck.allreduce({1})
  ck.dist_step(7)
  if R == W - 1 then
    local t = ck.now()
    while ck.now() < t + 60 do end
  end
  ck.allreduce({2})
  return
elseif case == "leave" then
  ck.dist_step(3)
  if R == 1 then return end
  ck.allreduce({2})
  return
elseif case == "die" then
  ck.barrier()
  if R == 1 then os.execute("kill -9 $PPID") end
  ck.allreduce({2})
  return
end

-- the job itself
if args.world then ok(W == tonumber(args.world), string.format("world size %d is %s", W, args.world)) end
ok(R >= 0 and R < W, string.format("rank %d of %d", R, W))
local lr, ls = ck.local_rank(), ck.local_size()
ok(lr >= 0 and lr < ls and ls <= W, string.format("local rank %d of %d on this machine", lr, ls))
if args["local"] then ok(ls == tonumber(args["local"]), string.format("%d ranks on this machine, as expected", ls)) end
-- all ranks on one machine: local ranks follow the ranks
if ls == W then ok(lr == R, string.format("local rank %d of rank %d on a machine of all ranks", lr, R)) end
local ranks = ck.allgather({R})
local want = {}
for r = 1, W do want[r] = r - 1 end
ok(same_list(ranks, want), "every rank has its own rank: " .. table.concat(ranks, ","))

-- allreduce: an array in place (the same object back), a list into a new list
local a = ck.array({5}, (function() local t = {} for i = 1, 5 do t[i] = R * 10 + i end return t end)())
local back = ck.allreduce(a)
ok(rawequal(back, a), "allreduce of an array gives the array back, summed in place")
want = {}
for i = 1, 5 do want[i] = 10 * W * (W - 1) / 2 + W * i end
ok(same_list(a:table(), want), "allreduce of an array: " .. table.concat(a:table(), ","))
local l = {R + 0.5, -R, 2 ^ 20 * R}
local s = ck.allreduce(l)
ok(s ~= l and l[1] == R + 0.5, "allreduce of a list gives a new list and leaves the list as it was")
ok(same_list(s, {W / 2 + W * (W - 1) / 2, -W * (W - 1) / 2, 2 ^ 20 * W * (W - 1) / 2}),
  "allreduce of a list: " .. table.concat(s, ","))
-- a large one (1 MiB), past the sizes MPI sends eagerly
local n = 262144
local big = ck.array({n}, R + 1)
ck.allreduce(big)
ok(big:get(1) == W * (W + 1) / 2 and big:get(n) == W * (W + 1) / 2 and big:get(n // 2) == W * (W + 1) / 2,
  "allreduce of 262144 values")
ok(#ck.allreduce({}) == 0, "allreduce of no values")

-- broadcast: from the last rank into an array in place, from rank 0 (the default) into a new list
local b = ck.array({2, 2}, {R * 100 + 1, R * 100 + 2, R * 100 + 3, R * 100 + 4})
ok(rawequal(ck.broadcast(b, W - 1), b), "broadcast of an array gives the array back")
local r0 = (W - 1) * 100
ok(same_list(b:table(), {r0 + 1, r0 + 2, r0 + 3, r0 + 4}) and b.shape[1] == 2 and b.shape[2] == 2,
  "broadcast from rank " .. (W - 1) .. ": " .. table.concat(b:table(), ","))
ok(same_list(ck.broadcast({R, R * 2}), {0, 0}), "broadcast of a list from rank 0")

-- allgather: an array's first dim grows W-fold, a 0-dim array becomes {W}, a list concatenates
local g = ck.allgather(ck.array({2, 3}, (function() local t = {} for i = 1, 6 do t[i] = R * 1000 + i end return t end)()))
want = {}
for r = 0, W - 1 do for i = 1, 6 do want[#want + 1] = r * 1000 + i end end
ok(g.shape[1] == 2 * W and g.shape[2] == 3 and #g.shape == 2, "allgather of {2, 3} arrays is {" .. table.concat(g.shape, ", ") .. "}")
ok(same_list(g:table(), want), "allgather of arrays in rank order")
local g0 = ck.allgather(ck.array({}, R + 0.5))
ok(#g0.shape == 1 and g0.shape[1] == W and g0:get(W) == W - 0.5, "allgather of 0-dim arrays is {" .. W .. "}")
want = {}
for r = 0, W - 1 do want[#want + 1] = -r; want[#want + 1] = r / 2 end
ok(same_list(ck.allgather({-R, R / 2}), want), "allgather of lists in rank order")

-- reduce_scatter: rank r gets block r of the sum
local x = {}
for j = 1, 4 * W do x[j] = R + j end
local rs = ck.reduce_scatter(ck.array({2 * W, 2}, x))
want = {}
for k = 1, 4 do want[k] = W * (W - 1) / 2 + W * (R * 4 + k) end
ok(rs.shape[1] == 2 and rs.shape[2] == 2, "reduce_scatter of a {2W, 2} array is {" .. table.concat(rs.shape, ", ") .. "}")
ok(same_list(rs:table(), want), "reduce_scatter of an array: block " .. R .. " = " .. table.concat(rs:table(), ","))
local flat = ck.reduce_scatter(ck.array({W + 1, 2 * W}, 1))
ok(W == 1 or (#flat.shape == 1 and flat.shape[1] == 2 * (W + 1) and flat:get(2 * (W + 1)) == W),
  "reduce_scatter of a {W + 1, 2W} array is a flat {" .. table.concat(flat.shape, ", ") .. "}")
ok(same_list(ck.reduce_scatter(x), want), "reduce_scatter of a list")

-- barrier, and the time waited in collectives: rank 0 waits for a slow last rank
ck.comm_time()
if R == W - 1 and W > 1 then
  local t = ck.now()
  while ck.now() < t + 0.3 do end
end
local t0 = ck.now()
ck.barrier()
local waited, ct = ck.now() - t0, ck.comm_time()
if R == 0 and W > 1 then
  ok(waited >= 0.25 and ct >= 0.25 and ct <= waited + 0.01,
    string.format("rank 0 waited %.3f s at the barrier, comm_time says %.3f s", waited, ct))
end
ok(ck.comm_time() < 0.05, "comm_time starts again from zero once read")

-- every rank must agree on the collective, its count and its root: one error on every rank
if W > 1 then
  fails("ck.allreduce: every rank must pass the same count, but rank 0 passes 3 values and rank 1 4",
    "counts that differ are refused on every rank", ck.allreduce, R == 0 and {1, 2, 3} or {1, 2, 3, 4})
  fails("ck.allgather on rank 0 meets ck.barrier on rank 1", "different collectives are refused on every rank",
    R == 0 and ck.allgather or ck.barrier, {1})
  fails("ck.broadcast: every rank must name the same root, but rank 0 names 0 and rank 1 1",
    "different roots are refused on every rank", ck.broadcast, {1}, R)
end
fails("ck.broadcast: root " .. W .. " is not a rank (0.." .. (W - 1) .. ")", "a root past the last rank", ck.broadcast, {1}, W)
if W > 1 then
  local odd = {}
  for j = 1, W + 1 do odd[j] = j end
  fails((W + 1) .. " values do not split into " .. W .. " equal blocks", "reduce_scatter of a count that does not split",
    ck.reduce_scatter, odd)
end
fails("value 2 is a string, not a number", "a list with a string", ck.allreduce, {1, "2"})
fails("wants a ck.array or a list of numbers", "a number is not a buffer", ck.allreduce, 5)
ok(same_list(ck.allreduce({1}), {W}), "the communicator still works after the refusals")

-- the same program on every rank?
ok(ck.same_on_all_ranks("the same script") == true, "same_on_all_ranks of one string is true")
local same, first = ck.same_on_all_ranks(R == 0 and "rank 0's options" or "another rank's options")
ok(W == 1 and same == true or (same == false and first == 1), "same_on_all_ranks names rank 1 as the first that differs")
if W > 2 then
  local s2, f2 = ck.same_on_all_ranks(R == 2 and "b" or "a")
  ok(s2 == false and f2 == 2, "same_on_all_ranks names rank 2")
end

-- the step and the timeout
ck.dist_step(42)
ok(ck.dist_step() == 42, "dist_step keeps the step")
ok(ck.dist_timeout() == 300, "the timeout is 300 s by default (" .. ck.dist_timeout() .. ")")
ck.dist_timeout(12.5)
ok(ck.dist_timeout() == 12.5, "dist_timeout sets the timeout")
fails("ck.dist_timeout wants seconds > 0", "a timeout of 0 is refused", ck.dist_timeout, 0)
ck.barrier()
T.done()
