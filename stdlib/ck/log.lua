-- Logging: what a run records, how often, and where. Cadences pick steps;
-- a logger observes each training step: before it, it says which statistics
-- its metric groups are due for (reductions placed in that step's op list
-- only); after it, it writes one record per step to JSONL, TensorBoard event
-- files and a progress line. The loop that runs the steps is the caller's
-- (ck.train's).
--
--   local log = require "ck.log"
--   local logger = log.new{dir = "runs/demo", every = 10, steps = 200, batch = 2,
--                          metrics = {acts = log.every(50)}, on_nonfinite = "skip"}
--   for step = 1, 200 do
--     local o = logger:request(p, {lr = 1e-4}); local t0 = ck.now()
--     local loss, info = p:step(o)
--     loss = logger:observe(p, loss, info, t0, ck.now())
--   end                                  -- (logger:step(p) does those three)
--   logger:close()
local ck = require "ck"
local progress = require "ck.progress"

local M = {}

-- ---- cadences: c:due(step) before the step, c:observe(step, values) after it

local Cadence = {}
Cadence.__index = Cadence

local function cadence(pick, observe)
  return setmetatable({pick = pick, on_observe = observe}, Cadence)
end

-- Whether step is picked. Asked once per step however many groups share the
-- cadence: the first answer is kept.
function Cadence:due(step)
  if self.asked ~= step then
    self.asked = step
    self.answer = self.pick(self, step) and true or false
    if self.answer then self.last = step end
  end
  return self.answer
end

-- What the step measured ({loss=, grad_norm=, nonfinite=}); returns the name of
-- a trigger that fired, if any.
function Cadence:observe(step, values)
  if self.observed == step then return nil end
  self.observed = step
  self.seen = values
  if self.on_observe then return self.on_observe(self, step, values) end
end

local function check_count(n, what)
  if math.type(n) ~= "integer" or n < 1 then
    error(string.format("log.%s: expected a positive integer, got %s", what, tostring(n)), 3)
  end
end

-- steps n, 2n, 3n, ...
function M.every(n)
  check_count(n, "every")
  return cadence(function(_, step) return step % n == 0 end)
end

function M.always() return cadence(function() return true end) end
function M.never()
  local c = cadence(function() return false end)
  c.is_never = true
  return c
end

-- the first step, then each step at least s seconds after the last one picked;
-- o.clock: a function returning seconds (default ck.now, a monotonic clock)
function M.seconds(s, o)
  if type(s) ~= "number" or s < 0 then error("log.seconds: expected a number of seconds, got " .. tostring(s), 2) end
  local clock = (o and o.clock) or ck.now
  local at
  return cadence(function(_, _)
    local now = clock()
    if at == nil or now - at >= s then
      at = now
      return true
    end
    return false
  end)
end

-- the listed steps
function M.at(steps)
  if type(steps) ~= "table" then error("log.at: expected a list of steps", 2) end
  local set = {}
  for _, s in ipairs(steps) do
    check_count(s, "at")
    set[s] = true
  end
  return cadence(function(_, step) return set[step] == true end)
end

-- fn(step, last, seen) -> bool, where last is the last step this cadence
-- picked (nil before the first) and seen what the step before this one
-- observed (nil before the first): loss, grad_norm, nonfinite and, in a
-- data-parallel job, step_time_max and comm_time_max (seconds, the slowest
-- rank's step and the longest wait in collectives); run under the VM's
-- instruction budget for callbacks
function M.when(fn)
  if type(fn) ~= "function" then error("log.when: expected a function (step, last, seen) -> bool", 2) end
  local call = ck.call_limited or function(f, ...) return f(...) end
  return cadence(function(self, step) return call(fn, step, self.last, self.seen) end)
end

local function as_cadence(c, what)
  if c == nil or c == false then return M.never() end
  if c == true then return M.always() end
  if math.type(c) == "integer" then return M.every(c) end
  if getmetatable(c) == Cadence then return c end
  error(string.format("%s: expected a cadence (log.every, log.seconds, log.at, log.adaptive, log.when), " ..
    "a step count, true or false; got %s", what, tostring(c)), 3)
end
M.cadence = function(c) return as_cadence(c, "log.cadence") end

local function finite(x) return x == x and x ~= math.huge and x ~= -math.huge end

-- The base cadence, and every step for k steps after a trigger: a loss more than
-- spike standard deviations above the mean of the last window losses (once
-- min_window are in), a gradient norm more than jump times the last one seen, a
-- non-finite loss or gradient, a data-parallel step whose slowest rank took
-- more than slow times the mean of the last window's. o: base (cadence or step
-- count, default never), k = 10, window = 50, min_window = 10, spike = 3
-- (false: off), jump = 3 (false: off), slow = 2 (false: off), nonfinite = true.
function M.adaptive(o)
  o = o or {}
  local base = as_cadence(o.base, "log.adaptive base")
  local k = o.k or 10
  check_count(k, "adaptive k")
  local window, min_window = o.window or 50, o.min_window or math.min(o.window or 50, 10)
  local spike = o.spike == nil and 3 or o.spike
  local jump = o.jump == nil and 3 or o.jump
  local on_nonfinite = o.nonfinite ~= false
  local slow = o.slow == nil and 2 or o.slow
  local losses, last_norm, until_step, times = {}, nil, 0, {}
  local c = cadence(function(_, step) return base:due(step) or step <= until_step end,
    function(_, step, v)
      local why
      if on_nonfinite and (v.nonfinite or (v.loss ~= nil and not finite(v.loss))) then
        why = "nonfinite"
      elseif spike and v.loss ~= nil and #losses >= min_window then
        local sum, sq = 0, 0
        for _, x in ipairs(losses) do sum = sum + x end
        local mean = sum / #losses
        for _, x in ipairs(losses) do sq = sq + (x - mean) ^ 2 end
        if v.loss - mean > spike * math.sqrt(sq / #losses) then why = "loss_spike" end
      end
      if not why and jump and v.grad_norm ~= nil and last_norm and finite(v.grad_norm) and
         v.grad_norm > jump * last_norm then
        why = "grad_norm_jump"
      end
      if not why and slow and v.step_time_max ~= nil and #times >= min_window then
        local sum = 0
        for _, x in ipairs(times) do sum = sum + x end
        if v.step_time_max > slow * sum / #times then why = "slow_rank" end
      end
      if v.step_time_max ~= nil then
        times[#times + 1] = v.step_time_max
        if #times > window then table.remove(times, 1) end
      end
      if v.loss ~= nil and finite(v.loss) then
        losses[#losses + 1] = v.loss
        if #losses > window then table.remove(losses, 1) end
      end
      if v.grad_norm ~= nil and finite(v.grad_norm) then last_norm = v.grad_norm end
      base:observe(step, v)
      if why then until_step = step + k end
      return why
    end)
  return c
end

-- ---- the logger

-- Metric groups and what each records:
--   loss        the step's loss
--   lr          the learning rate
--   time        step_time (seconds of the step) and images_per_s (batch over the
--               time since the previous step ended, data loading included)
--   grad_norm   the global gradient norm
--   grad_norms  gradient norms per block
--   acts        mean, std and absmax of each block's output
--   memory      planned (the arena peak of the list that ran), rss and rss_peak,
--               device_used on a GPU (cudaMemGetInfo's total less free);
--               with measure_memory = true also measured (sentinel scan, costly)
M.groups = {"loss", "lr", "time", "grad_norm", "grad_norms", "acts", "memory"}

-- diffusers' UNet: a block is a resnet, attention, down- or upsampler of a
-- down/up block, or a resnet or attention of the mid block; elsewhere the
-- scope's first component (conv_in, time_embedding, ...)
M.unet_blocks = {"down_blocks.*.*.*", "mid_block.*.*", "up_blocks.*.*.*"}

local Logger = {}
Logger.__index = Logger

-- A directory under root named by the local time, new for this run.
function M.run_dir(root)
  root = root or "runs"
  local base = root .. "/" .. os.date("%Y%m%d-%H%M%S")
  local dir, n = base, 1
  while ck.listdir(dir) do
    n = n + 1
    dir = base .. "-" .. n
  end
  return dir
end

-- o: dir (files go there; nil: no files), jsonl = true, tensorboard = true,
-- progress = true (a line on a terminal, plain lines otherwise; false: none),
-- async = false, flush_interval = 1, queue = 1024, fsync = false,
-- every = 10 (the cadence of grad_norm, grad_norms and memory), acts_every =
-- 5 * every, metrics = {group = cadence | step count | true | false} (loss,
-- lr and time default to every step), blocks = M.unet_blocks, on_nonfinite =
-- "stop" | "skip" | false (default "stop"), batch (images per step), steps
-- (the run's length; the progress line needs it), measure_memory = false, out (a
-- file for the progress line, default io.stdout), stop_note (words the stop
-- error adds after what was not finite, e.g. "nothing was saved").
-- The cadence of each metric group that logger options o give.
local function cadences_of(o, level)
  local every = o.every == nil and 10 or o.every
  local acts_every = o.acts_every
  if acts_every == nil then acts_every = math.type(every) == "integer" and 5 * every or every end
  local defaults = {loss = true, lr = true, time = true, grad_norm = every, grad_norms = every, acts = acts_every,
                    memory = every}
  local metrics = o.metrics or {}
  for k in pairs(metrics) do
    if defaults[k] == nil then
      error(string.format("log.new: unknown metric group '%s' (%s)", tostring(k), table.concat(M.groups, ", ")), level)
    end
  end
  local cadences = {}
  for _, gname in ipairs(M.groups) do
    local c = metrics[gname]
    if c == nil then c = defaults[gname] end
    cadences[gname] = as_cadence(c, "log.new metrics." .. gname)
  end
  return cadences
end

-- What a logger made from options o will ask a program to compute:
-- g:compile{stats = log.stats_request(o)} plans it into the program's one
-- arena. nil when no group needs statistics.
local function request_of(c, blocks)
  local grads = not c.grad_norm.is_never or not c.grad_norms.is_never
  local acts = not c.acts.is_never
  if not grads and not acts then return nil end
  return {grads = grads, acts = acts, blocks = blocks or M.unet_blocks}
end

function M.stats_request(o)
  o = o or {}
  return request_of(cadences_of(o, 3), o.blocks)
end

function M.new(o)
  o = o or {}
  local self = setmetatable({}, Logger)
  self.cadences = cadences_of(o, 3)
  self.on_nonfinite = o.on_nonfinite == nil and "stop" or o.on_nonfinite
  if self.on_nonfinite ~= false and self.on_nonfinite ~= "stop" and self.on_nonfinite ~= "skip" then
    error("log.new: on_nonfinite must be \"stop\", \"skip\" or false, got " .. tostring(self.on_nonfinite), 2)
  end
  self.stop_note = o.stop_note
  self.blocks = o.blocks or M.unet_blocks
  self.batch = o.batch or 1
  self.measure_memory = o.measure_memory or false
  self.dir = o.dir
  if o.dir and (o.jsonl ~= false or o.tensorboard ~= false) then
    -- the directory now (a path the sandbox denies fails here, not later);
    -- the files with the first step that trains: a run stopped before it (a
    -- non-finite first step) leaves no file behind, as it saves nothing
    local made, why = ck.mkdir(o.dir)
    if not made then error("log.new: " .. why, 2) end
    self.sink_opts = {dir = o.dir, jsonl = o.jsonl ~= false, tensorboard = o.tensorboard ~= false,
                      async = o.async or false, flush_interval = o.flush_interval, queue = o.queue,
                      fsync = o.fsync or false, sigterm = o.sigterm ~= false}
    self.pending = {}
  end
  if o.progress ~= false and o.steps then
    self.bar = progress.new(o.steps or 0, {out = o.out, tty = o.tty, every = o.progress_every})
  end
  self.steps = o.steps
  -- a data-parallel job: each step's loss is the mean over the ranks (one
  -- process's on the whole batch), and the record says each rank's step time
  -- and time waiting in collectives (every rank calls step together)
  self.world = o.world or 1
  return self
end

-- Adds the statistics the metric groups can ask for to p (once; the first step
-- does it when the script has not). The program's arena must hold them:
-- compile it with stats = log.stats_request(the same options).
function Logger:attach(p)
  if self.attached == p then return self.stats_info end
  local req = request_of(self.cadences, self.blocks)
  if req then self.stats_info = p:enable_stats(req) end
  self.attached = p
  return self.stats_info
end

function Logger:can_pick(group) return not self.cadences[group].is_never end

local function describe(step, info, loss, note)
  local nf = info.nonfinite
  local shown = loss ~= loss and "nan" or tostring(loss)
  local msg = nf.loss and string.format("step %d: loss is not finite (%s)", step, shown) or
    string.format("step %d: gradients are not finite", step)
  if note then msg = msg .. "; " .. note end
  if nf.op then
    msg = msg .. string.format("; first non-finite output: %s in %s (%s, %s)", nf.op,
      nf.scope ~= "" and nf.scope or "the top scope", nf.where, nf.phase)
  end
  if nf.input then msg = msg .. string.format("; its input '%s' holds non-finite values", nf.input) end
  return msg
end

-- What the step about to run (p's next) should compute for the logger:
-- p:step's options {lr = opts.lr, stats = the statistics the metric groups
-- are due for, guard, measure}. The trainer runs p:step with them, then
-- hands what happened to observe.
function Logger:request(p, opts)
  if self.attached ~= p then self:attach(p) end
  local step = p.steps + 1
  local due, stats = {}, {}
  for _, gname in ipairs(M.groups) do due[gname] = self.cadences[gname]:due(step) end
  if due.grad_norm or due.grad_norms then stats[#stats + 1] = "grads" end
  if due.acts then stats[#stats + 1] = "acts" end
  self.due, self.due_step = due, step
  return {lr = opts and opts.lr, stats = stats, guard = self.on_nonfinite ~= false,
          measure = due.memory and self.measure_memory}
end

-- what the step observed: its record, the cadences' triggers, the progress
-- line; level: where a stop on a non-finite value is raised
local function observe(self, p, loss, info, t0, t1, level)
  local step = self.due_step
  if not step then error("log: a step observed without its request (logger:request(p) before p:step)", level) end
  local due = self.due
  self.due_step = nil
  info.step_time = t1 - t0
  local ranks
  if self.world > 1 then -- every rank's loss, step time and wait, in rank order
    ck.dist_step(step)
    local all = ck.allgather({loss, t1 - t0, ck.comm_time()})
    local sum, slowest, most_wait = 0, 0, 0
    ranks = {step_time = {}, comm_time = {}}
    for r = 0, self.world - 1 do
      local l, st, ct = all[3 * r + 1], all[3 * r + 2], all[3 * r + 3]
      sum = sum + l
      ranks.step_time[r + 1], ranks.comm_time[r + 1] = st, ct
      if st > ranks.step_time[slowest + 1] then slowest = r end
      most_wait = math.max(most_wait, ct)
    end
    loss = sum / self.world
    ranks.step_time_max, ranks.slowest_rank, ranks.comm_time_max = ranks.step_time[slowest + 1], slowest, most_wait
    info.ranks = ranks
  end
  local rec = {step = step, time = ck.wall_time()}
  if due.loss then rec.loss = loss end
  -- fp16's loss scale (GradScaler's), and the updates its overflows skip
  if info.loss_scale and (due.loss or info.overflow) then rec.loss_scale = info.loss_scale end
  if info.overflow then rec.overflow = true end
  if due.lr then rec.lr = p.lr end
  if due.time then
    rec.step_time = t1 - t0
    -- the cost model's prediction beside it (vm/plan/cost.c), read once per program
    if self.predicted_of ~= p then self.predicted_of, self.predicted = p, p:plan().predicted_step_seconds end
    rec.predicted_step_time = self.predicted
    rec.images_per_s = self.batch / math.max(t1 - (self.last_end or t0), 1e-9)
    if ranks then rec.ranks = ranks end
  end
  self.last_end = t1
  if due.grad_norm then rec.grad_norm = info.grad_norm end
  if due.grad_norms then rec.grad_norms = info.grad_norms end
  if due.acts then rec.acts = info.acts end
  if due.memory then
    local rss, rss_peak = ck.rss()
    rec.memory = {planned = info.plan_peak, measured = info.high_water, rss = rss, rss_peak = math.max(rss, rss_peak)}
    if p:device() ~= "cpu" then -- the device's memory in use (cudaMemGetInfo), the whole device's
      local free, total = ck.device_memory()
      if free then rec.memory.device_used = total - free end
    end
  end
  if info.nonfinite then
    rec.event = "nonfinite"
    rec.action = self.on_nonfinite
    rec.nonfinite = info.nonfinite
    rec.loss = loss
  end
  local seen = {loss = loss, grad_norm = info.grad_norm, nonfinite = info.nonfinite ~= nil,
                step_time_max = ranks and ranks.step_time_max, comm_time_max = ranks and ranks.comm_time_max}
  local triggers
  for _, gname in ipairs(M.groups) do
    local why = self.cadences[gname]:observe(step, seen)
    if why then
      triggers = triggers or {}
      triggers[why] = true
    end
  end
  if triggers then
    local list = {}
    for k in pairs(triggers) do list[#list + 1] = k end
    table.sort(list)
    rec.trigger = table.concat(list, ",")
  end
  local stopping = info.nonfinite and self.on_nonfinite == "stop"
  if not stopping then self:open() end
  for k in pairs(rec) do
    if k ~= "step" and k ~= "time" then
      self:write(rec)
      break
    end
  end
  if info.nonfinite then
    self.nonfinite_steps = (self.nonfinite_steps or 0) + 1
    if self.on_nonfinite == "stop" then
      self.stopped = true
      self:close()
      error(describe(step, info, loss, self.stop_note), level)
    end
    self:print(describe(step, info, loss) .. "; skipped: the update was not applied")
  elseif self.bar then
    local extra = info.grad_norm and string.format("grad norm %.4g", info.grad_norm) or nil
    self.bar:update(step, loss, extra)
  end
  return loss, info
end

-- What p's step did, after p:step{logger:request(p)} ran from t0 to t1
-- (ck.now()): loss and info as p:step returned them. Writes the step's
-- record and returns the loss (in a data-parallel job the mean over the
-- ranks, which every rank observes together) and info, with step_time (t1 -
-- t0) and ranks. With on_nonfinite = "stop", a non-finite step raises an
-- error naming the step and the first op that made a non-finite value, at the
-- caller's line; with "skip" its update was dropped, the event is logged and
-- training goes on.
function Logger:observe(p, loss, info, t0, t1)
  local l, i = observe(self, p, loss, info, t0, t1, 3)
  return l, i
end

-- The same for a loop of one's own: p's next step with what the cadences ask
-- for (opts.lr sets the learning rate), observed. Returns the loss and info.
function Logger:step(p, opts)
  local o = self:request(p, opts)
  local t0 = ck.now()
  local loss, info = p:step(o)
  local t1 = ck.now()
  local l, i = observe(self, p, loss, info, t0, t1, 3)
  return l, i
end

-- Opens the files (the first step that trains does) and writes the records
-- held until then.
function Logger:open()
  if self.sink or not self.sink_opts then return end
  self.sink = ck.log_open(self.sink_opts)
  self.sink_opts = nil
  for _, rec in ipairs(self.pending) do self.sink:write(rec) end
  self.pending = nil
end

-- a record of the script's own ({step=, ...}; time defaults to now, the
-- capture time); held until the files open
function Logger:write(rec)
  if self.sink then
    self.sink:write(rec)
  elseif self.pending then
    rec.time = rec.time or ck.wall_time()
    self.pending[#self.pending + 1] = rec
  end
end

-- a line on the progress output that does not break the bar
function Logger:print(line)
  if self.bar then self.bar:print(line) end
end

-- everything written so far reaches the files (sync = true: the disk)
function Logger:flush(sync)
  if self.sink then self.sink:flush(sync) end
end

-- Flushes and closes the files; returns the JSONL and event file paths. A run
-- that stopped on a non-finite value before any step trained writes nothing.
function Logger:close()
  if self.stopped then self.pending, self.sink_opts = nil, nil end
  if self.pending and #self.pending > 0 then self:open() end
  if not self.sink then return self.paths_closed end
  local a, b = self.sink:paths()
  self.paths_closed = {jsonl = a, events = b}
  local sink = self.sink
  self.sink = nil
  sink:close()
  return self.paths_closed
end

function Logger:paths()
  if self.sink then
    local a, b = self.sink:paths()
    return {jsonl = a, events = b}
  end
  return self.paths_closed
end

Logger.__close = Logger.close

-- Drops the records of steps after `step` from dir/metrics.jsonl, so that a
-- run resumed from a state saved at `step` continues its log without
-- duplicated steps. Only whole records (a line that ends its object) are kept;
-- the file is written anew and renamed into place.
function M.rewind(dir, step)
  local path = dir .. "/metrics.jsonl"
  local f = io.open(path, "rb")
  if not f then return end
  local keep = {}
  for line in f:lines() do
    local s = tonumber(line:match('^{"step":(%-?%d+)'))
    if s and s <= step and line:sub(-1) == "}" then keep[#keep + 1] = line .. "\n" end
  end
  f:close()
  local tmp = path .. ".rewind"
  local o = assert(io.open(tmp, "wb"))
  o:write(table.concat(keep))
  o:close()
  assert(os.rename(tmp, path))
end

return M
