-- Data-parallel training (compile{world_size = N}) across the ranks of one
-- job, run by tests/sh/test_mpi_ddp.sh under `mpirun -np N ckrun` (not a
-- test_*.lua: alone it would be one rank). Each rank trains on its share of
-- every global batch, as torch's DistributedSampler splits it without
-- shuffling (sample r, r + N, ...); the gradient sums are summed over the ranks
-- in buckets (ALLREDUCE entries in the op list) before each update. Checked:
--   - every rank ends with the same weights, bitwise;
--   - they are the weights one process trains on the whole batch, within
--     fp32 summation-order tolerance: plain, with clipping (the global norm),
--     with gradient accumulation (one reduction per update), with small
--     buckets (several per step), with Lion, with SGD (which, unlike AdamW,
--     sees the gradient's scale: the mean over ranks, not their sum);
--   - a repeat of the run gives the same bits;
--   - ZeRO stage 1 (shard_optimizer): the same weights, each rank holding
--     part of the optimizer state;
--   - the buckets are in the plan; what is refused is refused in one line.
-- With --device cuda every program runs on that device (its sums through
-- NCCL: tests/sh/test_mpi_nccl_emu.sh, on the CUDA emulator).
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

local R, W = ck.rank(), ck.world_size()
local DEVICE = args.device
local function ok(cond, what) return T.ok(cond, string.format("rank %d: %s", R, what)) end

-- a small conv net on [B, 3, 8, 8]: a frozen stem, a trained middle and head
local function build(b, opts)
  local g = ck.graph()
  local x = g:input("x", {b, 3, 8, 8})
  local y = g:input("y", {b, 4, 8, 8})
  local stem = g:param("stem.weight", {8, 3, 3, 3}, {trainable = false, init = "normal", std = 0.3})
  local mid = g:param("mid.weight", {8, 8, 3, 3}, {init = "normal", std = 0.1})
  local mb = g:param("mid.bias", {8}, {init = "zeros"})
  local head = g:param("head.weight", {4, 8, 3, 3}, {init = "normal", std = 0.1})
  local hb = g:param("head.bias", {4}, {init = "zeros"})
  local h1 = ck.silu(ck.conv2d(x, stem, nil, {padding = 1}))
  local h2 = ck.silu(ck.conv2d(h1, mid, mb, {padding = 1}))
  local out = ck.conv2d(h2, head, hb, {padding = 1})
  local c = {loss = ck.mse_loss(out, y), optimizer = "adamw", lr = 2e-2, seed = 11, device = DEVICE}
  for k, v in pairs(opts or {}) do c[k] = v end
  return g:compile(c)
end
local WEIGHTS = {"mid.weight", "mid.bias", "head.weight", "head.bias"}

-- the global batch of step s: B samples, each the same on every rank
local function sample(s, i)
  local r = T.rng(1000 * s + i)
  return T.random_values(r, 3 * 64), T.random_values(r, 4 * 64)
end
local function batch(s, idx)
  local xs, ys = {}, {}
  for _, i in ipairs(idx) do
    local x, y = sample(s, i)
    for _, v in ipairs(x) do xs[#xs + 1] = v end
    for _, v in ipairs(y) do ys[#ys + 1] = v end
  end
  return xs, ys
end
local function mine(B) -- this rank's samples of a global batch of B (DistributedSampler, no shuffle)
  local idx = {}
  for i = R, B - 1, W do idx[#idx + 1] = i end
  return idx
end

local function rel(a, b)
  local num, den = 0, 0
  for i = 1, #a do
    num = num + (a[i] - b[i]) ^ 2
    den = den + b[i] ^ 2
  end
  return math.sqrt(num / math.max(den, 1e-30))
end

-- steps of a global batch B on this rank's share, and on the whole batch in one process
local function compare(label, B, steps, opts)
  local acc = opts.accumulate or 1
  local dp_opts, one_opts = {world_size = W}, {}
  for k, v in pairs(opts) do dp_opts[k], one_opts[k] = v, v end
  one_opts.shard_optimizer = nil -- one process holds all of its state
  local dp = build(B // W // acc, dp_opts)
  local one = build(B // acc, one_opts)
  for s = 1, steps do
    for m = 0, acc - 1 do -- micro-step m takes samples m*B/acc .. of the global batch
      local per = B // acc
      local idx_one, idx_dp = {}, {}
      for i = 0, per - 1 do idx_one[#idx_one + 1] = m * per + i end
      for i = R, per - 1, W do idx_dp[#idx_dp + 1] = m * per + i end
      local x, y = batch(s, idx_dp)
      dp:set("x", x)
      dp:set("y", y)
      dp:step()
      x, y = batch(s, idx_one)
      one:set("x", x)
      one:set("y", y)
      one:step()
    end
  end
  local worst = 0
  for _, n in ipairs(WEIGHTS) do worst = math.max(worst, rel(dp:get(n), one:get(n))) end
  local sums = {}
  for _, n in ipairs(WEIGHTS) do sums[#sums + 1] = dp:checksum(n) end
  local same = ck.same_on_all_ranks(table.concat(sums, " "))
  ok(same, label .. ": every rank holds the same weights, bitwise")
  ok(worst < 2e-5, string.format("%s: the weights are one process's on the whole batch (rel %.2e)", label, worst))
  local moved = rel(dp:get("head.weight"), build(B, one_opts):get("head.weight"))
  ok(moved > 1e-3, string.format("%s: and training moved them (rel %.2e from the start)", label, moved))
  return dp, table.concat(sums, " ")
end

local B = 2 * W
local dp, first = compare("adamw", B, 4, {})
local pl = dp:plan()
ok(pl.world_size == W and pl.buckets == 1 and pl.bucket_bytes >= 4 * (8 * 8 * 9 + 8 + 4 * 8 * 9 + 4),
  string.format("one bucket of 25 MiB holds the gradient sums (%d buckets, %d bytes)", pl.buckets, pl.bucket_bytes))
local _, again = compare("adamw, again", B, 4, {})
ok(again == first, "a repeat of the run gives the same bits")
compare("adamw, clipped to 0.05", B, 4, {max_grad_norm = 0.05})
compare("adamw, accumulating 2 batches", 2 * B, 3, {accumulate = 2})
local small = compare("adamw, buckets of 1 KiB", B, 3, {bucket_mb = 1 / 1024})
ok(small:plan().buckets >= 3, string.format("small buckets: %d of them", small:plan().buckets))
compare("lion", B, 3, {optimizer = "lion", lr = 2e-3})
compare("sgd (the mean over ranks, not their sum)", B, 4, {optimizer = "sgd", lr = 0.5})

-- ZeRO stage 1: each parameter's optimizer state on one rank, which updates it and broadcasts it
local z = compare("adamw, optimizer state sharded (ZeRO-1)", B, 4, {shard_optimizer = true})
compare("adamw8bit, sharded", B, 3, {shard_optimizer = true, optimizer = "adamw8bit"})
compare("sharded, accumulating 2 batches, clipped", 2 * B, 3, {shard_optimizer = true, accumulate = 2, max_grad_norm = 0.05})
do
  local full = build(B // W, {world_size = W})
  ok(z:plan().persistent < full:plan().persistent,
    string.format("sharded, this rank holds less (%d bytes persistent, %d without)", z:plan().persistent,
      full:plan().persistent))
  -- planned for 4 ranks, each rank's state is about a quarter
  local opt_bytes = function(q) return q:plan().persistent end
  local p1, p4 = build(2, {world_size = 4, plan_only = true}), build(2, {world_size = 4, plan_only = true,
    shard_optimizer = true, rank = 3})
  ok(opt_bytes(p4) < opt_bytes(p1), string.format("a plan-only rank 3 of 4 plans its shard (%d < %d bytes)",
    opt_bytes(p4), opt_bytes(p1)))
end

-- the sums start inside backward (as soon as a bucket's gradients are complete), unless
-- accumulating (then once per update, after it)
local function overlapped(q)
  local ph = q:timeline().phase
  local first_opt, last_bwd = math.huge, 0
  for i, x in ipairs(ph) do
    if x == "optimizer" then first_opt = math.min(first_opt, i) end
    if x == "backward" then last_bwd = i end
  end
  return first_opt < last_bwd
end
ok(overlapped(small), "with one step an update, the buckets' sums start inside backward")
ok(not overlapped(build(2, {world_size = W, accumulate = 2})), "accumulating, they follow backward")

-- a step that is not finite on one rank is skipped on every rank
do
  local q = build(2, {world_size = W})
  local x, y = batch(1, mine(B))
  if R == W - 1 then x[1] = 0 / 0 end
  q:set("x", x)
  q:set("y", y)
  local before = q:checksum("head.weight")
  local _, info = q:step{guard = true}
  ok(info.nonfinite ~= nil and q:checksum("head.weight") == before,
    "a NaN on rank " .. (W - 1) .. " skips the update on this rank too")
  x, y = batch(2, mine(B))
  q:set("x", x)
  q:set("y", y)
  local _, info2 = q:step{guard = true}
  ok(info2.nonfinite == nil and q:checksum("head.weight") ~= before and
    ck.same_on_all_ranks(q:checksum("head.weight")), "and the next step trains every rank alike")
end

-- planned for other world sizes without those ranks: the gradient sums are in the plan
local p8 = build(2, {world_size = 8, plan_only = true})
local p1 = build(2, {plan_only = true})
ok(p8:plan().buckets == 1 and p8:plan().persistent > p1:plan().persistent,
  string.format("a plan-only program plans one rank of 8, its gradient sums included (%d > %d bytes)",
    p8:plan().persistent, p1:plan().persistent))

-- refused, in one line
local good, err = pcall(build, 2, {world_size = W + 1})
ok(not good and tostring(err):find(string.format("compiled for %d ranks, but this job has %d", W + 1, W), 1, true),
  "a world size that is not the job's is refused (" .. tostring(err) .. ")")
good, err = pcall(build, 2, {world_size = W, fused_backward = true, max_grad_norm = 0})
ok(not good and tostring(err):find("data parallel training refuses them", 1, true),
  "fused updates are refused (" .. tostring(err) .. ")")
good, err = pcall(build, 2, {world_size = 0})
ok(not good and tostring(err):find("world_size must be", 1, true), "world_size 0 is refused")

T.done()
