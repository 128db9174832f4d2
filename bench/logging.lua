-- What logging costs: one LoRA training step of sdxl-tiny (64x64 latents,
-- batch 1, rank 4, AdamW) under the setups of issue 5, timed round-robin in
-- one process so that other load falls on all alike:
--   A  no checkpointing, every metric every step (loss, lr, time, gradient
--      norms, block activation statistics, memory), sync JSONL + TensorBoard
--   A0 no checkpointing, no logging
--   B  diffusers checkpointing, no logging
--   C  diffusers checkpointing, every metric every 5 steps (loss every step), sync
--   D  diffusers checkpointing, every metric every step, async
--   E  diffusers checkpointing, every metric every step, sync
-- Step time is the wall time of the step call (p:step or logger:step: the
-- statistics, building the record and writing it included), the median over
-- rounds of per-round ratios to B. Memory: the planned peak of the lists each
-- setup runs and the measured high-water mark of a logging step.
--
-- Then the cost of logging on its own, two ways. Adjacent pairs on one
-- program (a plain step, a logging step, a plain step, ...) so that drifting
-- load cancels: the median of logging step / mean of its two plain
-- neighbours, in wall and process CPU time. And the work itself, timed inside
-- the logging steps: the statistics ops (p:profile) and the logger's own
-- time around p:step (choosing, building and writing the record), as a share
-- of the rest of the step; other load slows both alike.
--
--   ckrun --allow-write DIR bench/logging.lua [--rounds 10] [--pairs 60] [--resolution 512] [--dir DIR]
--         [--tables setups,pairs,work]
local ck = require "ck"
local unet = require "ck.unet"
local lora = require "ck.lora"
local diffusion = require "ck.diffusion"
local data = require "ck.data"
local policy = require "ck.policy"
local log = require "ck.log"

local o = require("ck.options").parse(args, {
  about = "What logging costs: a LoRA training step of sdxl-tiny under each logging setup, timed round-robin.",
  {"rounds", "integer", 10, "rounds of the setups table", min = 1},
  {"pairs", "integer", 60, "plain/logging step pairs of the pairs table", min = 1},
  {"resolution", "integer", 512, "pixels per side (latents are 1/8 of it)", arg = "PX", min = 8},
  {"dir", "string", "out/bench_logging", "where the setups write their logs", arg = "DIR"},
  {"tables", "list", "setups,pairs,work", "the tables to print"},
})
if not o then return end
local rounds = o.rounds
local pairs_n = o.pairs
local resolution = o.resolution
local root = o.dir
local latent = resolution // 8
local tables = {}
for _, t in ipairs(o.tables) do tables[t] = true end
local config = unet.config("sdxl-tiny")
local tokens = 77
local pooled_dim = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim

local function build(checkpoint)
  local model = unet.UNet2DConditionModel(config)
  model:freeze()
  lora.attach(model, {rank = 4, alpha = 4})
  local g = ck.graph()
  local objective = diffusion.objective{prediction = "v"}
  objective.seed = 1
  local inputs = {
    prompt_embeds = g:input("prompt_embeds", {1, tokens, config.cross_attention_dim}),
    pooled_prompt_embeds = g:input("pooled_prompt_embeds", {1, pooled_dim}),
    time_ids = g:input("time_ids", {1, 6}),
  }
  local loss = objective:build(g, {1, config.in_channels, latent, latent}, function(noisy, t)
    return model:forward(g, noisy, t, inputs.prompt_embeds, inputs.pooled_prompt_embeds, inputs.time_ids)
  end)
  inputs.latents = objective.inputs.latents
  inputs.noise = objective.inputs.noise
  local p = g:compile{loss = loss, optimizer = "adamw", lr = 1e-4, seed = 1, checkpoint = checkpoint}
  local dataset = data.latents("synthetic", {batch = 1, seed = 1, n = 1, height = latent, width = latent,
    cross_attention_dim = config.cross_attention_dim, pooled_dim = pooled_dim})
  objective:prepare(p, dataset:load(p, inputs, {1}))
  return p
end

local none, diffusers = policy.parse("none"), policy.parse("diffusers")
local function everything(n) return {loss = 1, lr = n, time = n, grad_norm = n, grad_norms = n, acts = n, memory = n} end
local setups = {
  {name = "A", what = "none, log every step, sync", checkpoint = none, log = {metrics = everything(1)}},
  {name = "A0", what = "none, no logging", checkpoint = none},
  {name = "B", what = "diffusers, no logging", checkpoint = diffusers},
  {name = "C", what = "diffusers, log every 5 steps, sync", checkpoint = diffusers, log = {metrics = everything(5)}},
  {name = "D", what = "diffusers, log every step, async", checkpoint = diffusers, log = {metrics = everything(1), async = true}},
  {name = "E", what = "diffusers, log every step, sync", checkpoint = diffusers, log = {metrics = everything(1)}},
}
local by = {}
for _, s in ipairs(setups) do
  s.p = build(s.checkpoint)
  s.plain_peak = s.p:plan().peak
  if s.log then
    s.log.dir = root .. "/" .. s.name
    s.log.blocks = log.unet_blocks
    s.log.batch = 1
    s.logger = log.new(s.log)
    local info = s.logger:attach(s.p)
    s.log_peak = info.peak.all
  end
  s.times = {}
  by[s.name] = s
end

-- wall time and process CPU time (all threads: less sensitive to other load)
local function step(s)
  local t0, c0 = ck.now(), os.clock()
  if s.logger then s.logger:step(s.p) else s.p:step() end
  return ck.now() - t0, os.clock() - c0
end

local median = require("ck.plan").median

local function ratio(x, y, what)
  local r = {}
  for i = 1, #x[what] do r[i] = x[what][i] / y[what][i] end
  return median(r)
end

local MiB = 2 ^ 20

-- ---- the setups, round-robin
local function table_setups()
  for _, s in ipairs(setups) do
    step(s) -- warm-up
    s.cpu = {}
  end
  for r = 1, rounds do
    for _, s in ipairs(setups) do s.times[r], s.cpu[r] = step(s) end
  end
  -- the measured high-water mark of the list each setup's logging steps run
  for _, s in ipairs(setups) do
    if s.logger then
      local _, info = s.p:step{stats = "all", guard = true, measure = true}
      s.measured = info.high_water
    else
      s.measured = select(2, s.p:step{measure = true}).high_water
    end
  end
  print(string.format("sdxl-tiny, %dx%d latents, batch 1, LoRA rank 4, AdamW; %d rounds", latent, latent, rounds))
  print("| setup | step time (ms, median) | vs B (wall) | vs B (CPU) | logging cost vs same policy unlogged (wall / CPU) " ..
    "| planned peak (MiB) | measured peak (MiB) |")
  print("|---|---|---|---|---|---|---|")
  for _, s in ipairs(setups) do
    local base = s.checkpoint == none and by.A0 or by.B
    local planned = s.log_peak and string.format("%.2f (plain list %.2f)", s.log_peak / MiB, s.plain_peak / MiB) or
      string.format("%.2f", s.plain_peak / MiB)
    local cost = s == base and "-" or string.format("%+.2f%% / %+.2f%%", 100 * (ratio(s, base, "times") - 1),
      100 * (ratio(s, base, "cpu") - 1))
    print(string.format("| %s: %s | %.1f | %.4f | %.4f | %s | %s | %.2f |", s.name, s.what, 1e3 * median(s.times),
      ratio(s, by.B, "times"), ratio(s, by.B, "cpu"), cost, planned, s.measured / MiB))
  end
end

-- ---- the cost of logging, in adjacent pairs on one program
local function paired(p, loggers)
  local plain = function()
    local t0, c0 = ck.now(), os.clock()
    p:step()
    return ck.now() - t0, os.clock() - c0
  end
  local res = {}
  for _, l in ipairs(loggers) do res[l.name] = {wall = {}, cpu = {}} end
  local w0, c0 = plain()
  for _ = 1, pairs_n do
    for _, l in ipairs(loggers) do
      local t0, k0 = ck.now(), os.clock()
      for _ = 1, l.n do l.logger:step(p) end
      local w, c = (ck.now() - t0) / l.n, (os.clock() - k0) / l.n
      local w1, c1 = plain()
      table.insert(res[l.name].wall, w / ((w0 + w1) / 2))
      table.insert(res[l.name].cpu, c / ((c0 + c1) / 2))
      w0, c0 = w1, c1
    end
  end
  return res
end

local function table_pairs()
  print()
  print(string.format("Logging cost in adjacent pairs (%d pairs each; a logging step against its plain neighbours):", pairs_n))
  print("| policy | logging | cost (wall, median) | cost (CPU, median) |")
  print("|---|---|---|---|")
  for _, pol in ipairs{{"none", by.A0.p}, {"diffusers", by.B.p}} do
    local p = pol[2]
    local function logger(name, n, async)
      return log.new{dir = root .. "/pair_" .. name .. "_" .. pol[1], metrics = everything(n), blocks = log.unet_blocks,
                     async = async}
    end
    local ls = {
      {name = "every step, sync", n = 1, logger = logger("sync", 1, false)},
      {name = "every step, async", n = 1, logger = logger("async", 1, true)},
      {name = "every 5 steps, sync (per step, over 5)", n = 5, logger = logger("5", 5, false)},
    }
    for _, l in ipairs(ls) do l.logger:attach(p) end
    local res = paired(p, ls)
    for _, l in ipairs(ls) do
      print(string.format("| %s | %s | %+.2f%% | %+.2f%% |", pol[1], l.name, 100 * (median(res[l.name].wall) - 1),
        100 * (median(res[l.name].cpu) - 1)))
      l.logger:close()
    end
  end
end

-- ---- the work of logging, timed inside logging steps
local function table_work()
  print()
  print(string.format("The work of logging every step, timed inside %d logging steps (median per step):", pairs_n))
  print("| policy | mode | step without logging (ms) | statistics ops (ms) | logger around the step (ms) | cost |")
  print("|---|---|---|---|---|---|")
  for _, pol in ipairs{{"none", by.A0.p}, {"diffusers", by.B.p}} do
    for _, async in ipairs{false, true} do
      local p = pol[2]
      local lg = log.new{dir = root .. "/work_" .. pol[1] .. (async and "_async" or ""), metrics = everything(1),
                         blocks = log.unet_blocks, async = async}
      lg:attach(p)
      local rest, stats, around, cost = {}, {}, {}, {}
      for i = 1, pairs_n do
        p:profile(true)
        local t0 = ck.now()
        local _, info = lg:step(p)
        local total = ck.now() - t0
        local prof = p:profile()
        p:profile(false)
        local st = (prof.stats or 0) + (prof.sumsq or 0)
        local ar = total - info.step_time
        rest[i], stats[i], around[i] = total - st - ar, st, ar
        cost[i] = (st + ar) / rest[i]
      end
      lg:close()
      print(string.format("| %s | %s | %.1f | %.3f | %.3f | %.2f%% |", pol[1], async and "async" or "sync",
        1e3 * median(rest), 1e3 * median(stats), 1e3 * median(around), 100 * median(cost)))
    end
  end
end

if tables.setups then table_setups() end
for _, s in ipairs(setups) do
  if s.logger then s.logger:close() end
end
if tables.pairs then table_pairs() end
if tables.work then table_work() end
