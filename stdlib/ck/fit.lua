-- Fitting a run to the machine: the checkpoint policy (auto) and the batch
-- (auto) whose whole-run plan fits the free memory of the device the run
-- uses, less a headroom. The rule: no recompute when none fits, else the
-- least recompute that fits (a budget); with batch auto, the largest batch
-- that fits so. Plans only: nothing is allocated or run.
--
--   local fit = require "ck.fit"
--   local c = fit.choose{build = function(batch, policy) return plan_only_program end,
--                        checkpoint = policy.parse("auto"), batch = "auto"}
--   print(c.reason) -- then compile c.checkpoint at c.batch
local ck = require "ck"
local policy = require "ck.policy"
local plan = require "ck.plan"

local M = {}

M.HEADROOM = 0.1

-- The memory to fit: {bytes = what a run may take, free =, total =, words}.
-- size: bytes given instead of the device's free memory (auto:SIZE);
-- device: "cuda" (cudaMemGetInfo) or "cpu" (available memory), default ck.device.
function M.memory(o)
  o = o or {}
  local headroom = o.headroom or M.HEADROOM
  if type(headroom) ~= "number" or headroom < 0 or headroom >= 1 then
    error("fit: headroom must be a number in [0, 1), got " .. tostring(headroom), 2)
  end
  local free, total, words
  if o.size then
    free, words = o.size, "given"
  elseif (o.device or ck.device) == "cuda" then
    free, total = ck.device_memory()
    if not free then
      error("there is no CUDA device here to read free memory from; give a size (auto:24GiB) or a fixed policy", 2)
    end
    words = "free"
  else
    free, total = ck.host_memory()
    words = "available"
  end
  return {bytes = math.floor(free * (1 - headroom)), free = free, total = total, headroom = headroom, words = words}
end

local fmt = plan.fmt_bytes

-- "20.38 GiB of 22.64 GiB available"
local function room(mem)
  return string.format("%s of %s %s", fmt(mem.bytes), fmt(mem.free), mem.words)
end

-- At one batch, the cheapest policy whose whole-run plan (p:plan().device_bytes)
-- fits limit bytes: none, else a budget for the training list. The budget
-- leaves the device's fixed bytes, rounds down to its pages, and leaves what
-- the run's other lists need above the training list (as none's plan shows);
-- a plan still over the limit is tightened by its excess. Returns
-- {checkpoint =, needs = device bytes, none = none's device bytes, budget =,
-- recompute_pct =}, or nil and {needs = what the smallest plan needs, none =}.
-- Each plan is dropped before the next is built: full SDXL's are large.
function M.cheapest(build, batch, limit)
  local p0 = build(batch, policy.none())
  local s0 = p0:plan()
  local _, fixed, granule = p0:device()
  p0 = nil
  collectgarbage()
  local none = s0.device_bytes
  if none <= limit then return {checkpoint = policy.none(), needs = none, none = none} end
  -- the run's other lists (logging) need a few KB above the training list, by
  -- policy: start from none's, then loosen by the room a fitting plan leaves
  -- (a policy needing less above its list may fit with less recompute) and
  -- tighten by the excess of one that does not fit
  local extra = math.max(0, s0.arena - s0.peak)
  local b = (limit - fixed) // granule * granule - extra
  local best, tried = nil, {}
  for _ = 1, 4 do
    if b <= 0 or tried[b] then break end
    tried[b] = true
    local pol = policy.budget(b)
    local ok, p = pcall(build, batch, pol)
    if not ok then
      local least = tonumber(tostring(p):match("smallest peak.-%((%d+) bytes%)"))
      if not least then error(p, 0) end
      if best then break end
      -- the smallest training list as the device would take it (with
      -- offload allowed, the error names the smallest without it too)
      local function device(bytes) return -(-(bytes + extra) // granule) * granule + fixed end
      local without = tonumber(tostring(p):match("with offload, [^(]*%((%d+) bytes%) without"))
      return nil, {needs = device(least), needs_without = without and device(without), none = none}
    end
    local pl = p:plan()
    p = nil
    collectgarbage()
    if pl.device_bytes <= limit then
      if not best or pl.recompute_flops < best.flops then
        best = {checkpoint = pol, needs = pl.device_bytes, none = none, budget = b, flops = pl.recompute_flops,
                recompute_pct = 100 * pl.recompute_flops / math.max(pl.step_flops - pl.recompute_flops, 1),
                offload = pl.offload_bytes, pinned = pl.host_bytes + (pl.weights_host_bytes or 0)}
      end
      if pl.recompute_flops == 0 then break end
      b = b + (limit - pl.device_bytes) + (pl.arena - pl.peak < extra and extra - (pl.arena - pl.peak) or 0)
    else
      b = b - (pl.device_bytes - limit)
    end
  end
  if best then return best end
  return nil, {needs = nil, none = none}
end

-- what a choice at one batch says
local function says(c, mem)
  if c.budget then
    return string.format("none needs %s, %s: a budget of %s for the step plans %s, recomputing %.1f%% of the " ..
      "step's FLOPs%s", fmt(c.none), room(mem), fmt(c.budget), fmt(c.needs), c.recompute_pct,
      (c.offload or 0) > 0 and string.format(" and offloading %s each way (%s of pinned host memory)",
        fmt(c.offload), fmt(c.pinned)) or "")
  end
  return string.format("none fits (%s) in %s: no recompute", fmt(c.needs), room(mem))
end

local function refusal(why, mem)
  if why.needs and why.needs_without then
    return string.format("nothing fits in %s: the smallest plan needs %s with offload, %s without (none needs %s)",
      room(mem), fmt(why.needs), fmt(why.needs_without), fmt(why.none))
  elseif why.needs then
    return string.format("nothing fits in %s: the smallest plan needs %s (none needs %s)", room(mem), fmt(why.needs),
      fmt(why.none))
  end
  return string.format("nothing fits in %s (none needs %s)", room(mem), fmt(why.none))
end

-- o: build = function(batch, policy) -> a plan_only program (compiled as the
-- run compiles), checkpoint = a policy (auto, or fixed), batch = n or "auto",
-- headroom (default: the auto policy's, else M.HEADROOM), device (ck.device).
-- Returns {checkpoint = the policy to compile, batch =, reason = one line}.
-- When nothing fits it refuses in one line naming what the smallest plan
-- needs; every error names the line that called choose.
function M.choose(o)
  local auto = type(o.checkpoint) == "table" and o.checkpoint.kind == "auto"
  local what = (auto and "checkpoint auto" or "") .. (auto and o.batch == "auto" and ", " or "") ..
    (o.batch == "auto" and "batch auto" or "")
  local ok, r = pcall(function()
    local fixed = not auto and (o.checkpoint or policy.none()) or nil
    local mem = M.memory{size = auto and o.checkpoint.device or nil, device = o.device,
                         headroom = o.headroom or (auto and o.checkpoint.headroom) or nil}
    -- at one batch: the cheapest policy that fits, or the fixed one if it fits
    local function at(batch)
      if auto then return M.cheapest(o.build, batch, mem.bytes) end
      local needs = o.build(batch, fixed):plan().device_bytes
      collectgarbage()
      if needs <= mem.bytes then return {checkpoint = fixed, needs = needs, fixed = true} end
      return nil, {needs = needs, fixed = true}
    end
    local function line(c, why)
      if c and c.fixed then return string.format("%s plans %s in %s", policy.name(fixed), fmt(c.needs), room(mem)) end
      if c then return says(c, mem) end
      if why.fixed then return string.format("%s needs %s, %s", policy.name(fixed), fmt(why.needs), room(mem)) end
      return refusal(why, mem)
    end
    if o.batch ~= "auto" then
      local c, why = at(o.batch)
      if not c then error(line(nil, why), 0) end
      return {checkpoint = c.checkpoint, batch = o.batch, reason = what .. ": " .. line(c)}
    end
    -- the largest batch that fits: plan.search_batch's doubling and bisection
    local tried = {}
    local r = plan.search_batch(function(batch)
      local c, why = at(batch)
      tried[batch] = {c = c, why = why}
      if c then return c.needs end
      return nil, line(nil, why)
    end, mem.bytes)
    if r.batch == 0 then error("even batch 1 does not fit: " .. line(nil, tried[1].why), 0) end
    local next_words = r.capped and "the search stops there" or
      string.format("batch %d: %s", r.next, r.next_peak and ("needs " .. fmt(r.next_peak)) or tostring(r.next_error))
    local c = tried[r.batch].c
    return {checkpoint = c.checkpoint, batch = r.batch,
            reason = string.format("%s: batch %d (%s); %s", what, r.batch, next_words, line(c))}
  end)
  if not ok then error(what .. ": " .. plan.strip_where(r), 2) end
  return r
end

return M
