-- Data parallel through the device's own collectives (NCCL on "cuda"), run
-- under mpirun by tests/sh/test_mpi_nccl_emu.sh on the CUDA emulator and by
-- bench/gpu_check.sh as one rank on a GPU (CK_COMM_FORCE=1 gives a world of
-- one its buckets and collectives). Each rank trains its share of every
-- global batch in several buckets, optimizer state sharded (ZeRO-1) when
-- there are several ranks; checked: every rank ends with the same weights,
-- bitwise, and they are one process's on the whole batch within fp32
-- summation-order tolerance. The last line ("nccl: ...") says how many
-- collectives each rank ran, for the caller to hold against the NCCL calls
-- seen, and the weights' checksums, for a repeat to compare.
--   ckrun tests/lua/mpi_nccl.lua [--device cuda]
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

local R, W = ck.rank(), ck.world_size()
local DEVICE = args.device or "cuda"
local STEPS = 3

local function build(b, opts)
  local g = ck.graph()
  local x = g:input("x", {b, 3, 8, 8})
  local y = g:input("y", {b, 4, 8, 8})
  local mid = g:param("mid.weight", {8, 3, 3, 3}, {init = "normal", std = 0.2})
  local mb = g:param("mid.bias", {8}, {init = "zeros"})
  local head = g:param("head.weight", {4, 8, 3, 3}, {init = "normal", std = 0.1})
  local hb = g:param("head.bias", {4}, {init = "zeros"})
  local h = ck.silu(ck.conv2d(x, mid, mb, {padding = 1}))
  local c = {loss = ck.mse_loss(ck.conv2d(h, head, hb, {padding = 1}), y), optimizer = "adamw", lr = 2e-2,
    seed = 3, device = DEVICE}
  for k, v in pairs(opts) do c[k] = v end
  return g:compile(c)
end
local WEIGHTS = {"mid.weight", "mid.bias", "head.weight", "head.bias"}

local function batch(s, idx)
  local xs, ys = {}, {}
  for _, i in ipairs(idx) do
    local r = T.rng(1000 * s + i)
    for _ = 1, 3 * 64 do xs[#xs + 1] = r() end
    for _ = 1, 4 * 64 do ys[#ys + 1] = r() end
  end
  return xs, ys
end

local B = 2 * W
local dp = build(B // W, {world_size = W, bucket_mb = 1 / 1024, shard_optimizer = W > 1 or nil})
local one = build(B, {})
T.ok(dp:device() == DEVICE, "the program runs on " .. DEVICE)
local loss
for s = 1, STEPS do
  ck.dist_step(s) -- the step a timeout names
  local mine, all = {}, {}
  for i = 0, B - 1 do
    all[#all + 1] = i
    if i % W == R then mine[#mine + 1] = i end
  end
  local x, y = batch(s, mine)
  dp:set("x", x)
  dp:set("y", y)
  loss = dp:step()
  x, y = batch(s, all)
  one:set("x", x)
  one:set("y", y)
  one:step()
end

local worst, sums = 0, {}
for _, n in ipairs(WEIGHTS) do
  local a, b = dp:get(n), one:get(n)
  local num, den = 0, 0
  for i = 1, #a do
    num = num + (a[i] - b[i]) ^ 2
    den = den + b[i] ^ 2
  end
  worst = math.max(worst, math.sqrt(num / math.max(den, 1e-30)))
  sums[#sums + 1] = dp:checksum(n)
end
T.ok(ck.same_on_all_ranks(table.concat(sums, " ")), string.format("rank %d: every rank holds the same weights", R))
T.ok(worst < 2e-5, string.format("rank %d: the weights are one process's on the whole batch (rel %.2e)", R, worst))
local buckets = dp:plan().buckets
T.ok(buckets >= 3, string.format("rank %d: the sums go in several buckets (%d)", R, buckets))
-- what each rank ran: a sum per bucket and step (the whole-batch program's too
-- when CK_COMM_FORCE gives it buckets), a broadcast per parameter and step when sharded
print(string.format("nccl: %d ranks, %d buckets, %d steps, loss %.6g, rel %.2e; allreduce %d broadcast %d; weights %s",
  W, buckets, STEPS, loss, worst, STEPS * (buckets + one:plan().buckets), W > 1 and STEPS * #WEIGHTS or 0,
  table.concat(sums, " ")))
T.done()
