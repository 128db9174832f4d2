-- Fitting a run to the machine: the checkpoint policy (auto) and the batch
-- (auto) whose whole-run plan fits the free memory of the device the run
-- uses, less a headroom. The rule: no recompute when none fits, else the
-- least recompute that fits (a budget); with batch auto, the largest batch
-- that fits so. Plans only: nothing is allocated or run.
--
--   local fit = require "ck.fit"
--   local c = fit.choose{build = function(batch, policy) return plan_only_program end, -- or {program =, ...}
--                        checkpoint = policy.parse("auto"), batch = "auto"}
--   print(c.reason) -- then compile c.checkpoint at c.batch
local ck = require "ck"
local policy = require "ck.policy"
local bytes = require "ck.bytes"
local errors = require "ck.errors"

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

local fmt = bytes.fmt

-- "20.38 GiB of 22.64 GiB available"
local function room(mem)
  return string.format("%s of %s %s", fmt(mem.bytes), fmt(mem.free), mem.words)
end

-- At one batch, the cheapest policy whose whole-run plan (p:plan().device_bytes)
-- fits limit bytes on device: none, else a budget for the training list.
-- One program is compiled under auto at the budget the limit leaves the
-- training list (less the device's fixed bytes, rounded down to its pages):
-- its decision is none where none's plan fits that budget, else the budget
-- search's, and it places none to say what none needs. The run's other lists
-- (logging, sampling) may need bytes above the training list: a plan over the
-- limit is tightened (its peak less the excess), and one whose other lists
-- need less than was left for them is loosened by the difference. Returns
-- {checkpoint =, needs = device bytes, none = none's device bytes, budget =,
-- recompute_pct =, program = the chosen trial's build result when keep}, or
-- nil and {needs = what the smallest plan needs, none =, device_own = the
-- device's own bytes where they take the whole limit}. A trial's program is
-- dropped before the next is built: full SDXL's are large.
function M.cheapest(build, batch, limit, device, keep)
  local _, fixed, granule = ck.device_layout(device)
  local function device_bytes(arena) return -(-arena // granule) * granule + fixed end
  local b, extra = (limit - fixed) // granule * granule, 0 -- extra: what the other lists need above the training list
  local best, tried, none = nil, {}, nil
  local function none_needs() -- what none needs, from its own plan
    local pn = build(batch, policy.none())
    local s0 = (pn.program or pn):plan()
    pn = nil
    collectgarbage()
    extra, none = math.max(0, s0.arena - s0.peak), s0.device_bytes
  end
  if b <= 0 then -- the device's own bytes take the whole limit
    none_needs()
    return nil, {none = none, device_own = fixed}
  end
  for _ = 1, 4 do
    if b <= 0 or tried[b] then break end
    tried[b] = true
    local report = {} -- the decision's figures (compile fills it: ck_decide_report)
    local pol = policy.auto{device = b, headroom = 0}
    pol.report = report
    local ok, r = pcall(build, batch, pol)
    if not ok then
      local least = report.floor
      if not least then error(r, 0) end
      if best then break end
      -- the smallest training list as the device would take it (with
      -- offload allowed, the smallest without it too)
      local without = report.floor_without
      if not none then none_needs() end
      local offload = report.floor_offload -- offload not allowed: what it would reach
      return nil, {needs = device_bytes(least + extra), needs_without = without and device_bytes(without + extra),
                   needs_offload = offload and offload < least and device_bytes(offload + extra) or nil, none = none}
    end
    local p = r.program or r
    local pl = p:plan()
    local above = math.max(0, pl.arena - pl.peak)
    none = device_bytes((report.none_peak or pl.peak) + above)
    if pl.device_bytes <= limit then
      local c = {needs = pl.device_bytes, none = none, flops = pl.recompute_flops}
      -- what the run compiles: this trial's decision at this room, so that
      -- every program of the run (each bucket's shape, not only the square)
      -- decides under the same room and fits it; named as what it chose here
      c.checkpoint = policy.auto{device = b, headroom = 0}
      if pl.recompute_flops == 0 and pl.offload_bytes == 0 then
        c.checkpoint.shown = "none"
      else
        c.checkpoint.shown, c.budget = policy.name(policy.budget(b)), b
        c.recompute_pct = 100 * pl.recompute_flops / math.max(pl.step_flops - pl.recompute_flops, 1)
        c.offload, c.pinned = pl.offload_bytes, pl.host_bytes + (pl.weights_host_bytes or 0) -- streamed weights too
      end
      if not best or c.flops < best.flops then
        best = c
        best.program = keep and r or nil
      end
      r, p = nil, nil
      collectgarbage()
      if c.flops == 0 or above >= extra then break end
      b, extra = b + (extra - above), above
    else
      r, p = nil, nil
      collectgarbage()
      -- from the plan's peak, which may be under b: from b alone a small
      -- excess can leave the same answer, over again
      b, extra = math.min(b, pl.peak) - (pl.device_bytes - limit), math.max(extra, above)
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
  if why.device_own then
    return string.format("nothing fits in %s: the device's own %s (its libraries' workspaces, outside every plan) " ..
      "leave no room for the step (none needs %s)", room(mem), fmt(why.device_own), fmt(why.none))
  elseif why.needs and why.needs_without then
    return string.format("nothing fits in %s: the smallest plan needs %s with offload, %s without (none needs %s)",
      room(mem), fmt(why.needs), fmt(why.needs_without), fmt(why.none))
  elseif why.needs and why.needs_offload then
    return string.format("nothing fits in %s: the smallest plan needs %s, %s with --offload auto (none needs %s)",
      room(mem), fmt(why.needs), fmt(why.needs_offload), fmt(why.none))
  elseif why.needs then
    return string.format("nothing fits in %s: the smallest plan needs %s (none needs %s)", room(mem), fmt(why.needs),
      fmt(why.none))
  end
  return string.format("nothing fits in %s (none needs %s)", room(mem), fmt(why.none))
end

-- The largest batch whose planned peak fits limit: doubling, then bisection.
-- peak_of(b) -> peak bytes, or nil, a message and (when known) the smallest
-- peak that b could be planned at, when b cannot be planned.
-- A budget that nothing fits says the smallest peak it could plan; while that
-- is within the limit a larger batch may still plan (a percentage budget grows
-- with the batch faster than the least peak does), so the doubling goes on.
-- Returns {batch = largest fitting batch or 0, peak = its peak, next = the
-- first batch that does not fit, next_peak = its peak or nil, next_error, capped}.
local MAX_BATCH_CAP = 4096
function M.search_batch(peak_of, limit)
  local cache = {}
  local function get(b)
    if cache[b] == nil then
      local pk, err, least = peak_of(b)
      cache[b] = {peak = pk, err = err, least = pk == nil and least or nil}
    end
    return cache[b]
  end
  local function fits(b)
    local r = get(b)
    return r.peak ~= nil and r.peak <= limit
  end
  local function hopeless(b)
    local r = get(b)
    return r.peak ~= nil or not r.least or r.least > limit
  end
  local lo = 1
  while not fits(lo) do
    if hopeless(lo) or lo >= MAX_BATCH_CAP then
      local r = get(lo)
      return {batch = 0, next = lo, next_peak = r.peak, next_error = r.err, first = get(1)}
    end
    lo = lo * 2
  end
  local hi = lo * 2
  while fits(hi) do
    lo = hi
    if hi >= MAX_BATCH_CAP then return {batch = hi, peak = get(hi).peak, capped = true} end
    hi = hi * 2
  end
  while hi - lo > 1 do
    local mid = (lo + hi) // 2
    if fits(mid) then lo = mid else hi = mid end
  end
  return {batch = lo, peak = get(lo).peak, next = hi, next_peak = get(hi).peak, next_error = get(hi).err}
end

-- o: build = function(batch, policy) -> a plan_only program (compiled as the
-- run compiles), checkpoint = a policy (auto, or fixed), batch = n or "auto",
-- headroom (default: the auto policy's, else M.HEADROOM), device (ck.device),
-- keep (with a given batch: return the chosen trial's build result as run).
-- Returns {checkpoint = the policy to compile, batch =, reason = one line, run =}.
-- When nothing fits it refuses in one line naming what the smallest plan
-- needs; every error names the line that called choose. With o.soft, that
-- refusal is returned instead: nil and {what = "checkpoint auto" (what was
-- asked), refusal = the line after it}.
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
      if auto then return M.cheapest(o.build, batch, mem.bytes, o.device, o.keep and o.batch ~= "auto") end
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
      if not c then return {refusal = line(nil, why)} end
      return {checkpoint = c.checkpoint, batch = o.batch, reason = what .. ": " .. line(c), run = c.program}
    end
    -- the largest batch that fits: M.search_batch's doubling and bisection
    local tried = {}
    local r = M.search_batch(function(batch)
      local c, why = at(batch)
      tried[batch] = {c = c, why = why}
      if c then return c.needs end
      return nil, line(nil, why), why.needs
    end, mem.bytes)
    if r.batch == 0 then return {refusal = "even batch 1 does not fit: " .. line(nil, tried[1].why)} end
    local next_words = r.capped and "the search stops there" or
      string.format("batch %d: %s", r.next, r.next_peak and ("needs " .. fmt(r.next_peak)) or tostring(r.next_error))
    local c = tried[r.batch].c
    return {checkpoint = c.checkpoint, batch = r.batch,
            reason = string.format("%s: batch %d (%s); %s", what, r.batch, next_words, line(c))}
  end)
  if ok and r.refusal and o.soft then return nil, {what = what, refusal = r.refusal} end
  if ok and r.refusal then r, ok = r.refusal, false end
  if not ok then error(what .. ": " .. errors.strip_where(r), 2) end
  return r
end

return M
