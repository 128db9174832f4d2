-- A small, fast training job that logs every step: the subject of the kill and
-- signal tests (tests/sh/test_log.sh). After each step's record is handed to
-- the logger it appends the step number to --done, so a test can tell which
-- steps had finished when the process died.
--   ckrun --allow-write DIR tests/scripts/train_log.lua --dir DIR/logs --done DIR/done
--         [--steps N] [--async] [--flush S] [--every N] [--nan-at STEP] [--on-nonfinite stop|skip]
local ck = require "ck"
local log = require "ck.log"
local a = args or {}

local g = ck.graph()
local x = g:input("x", {64, 128})
local t = g:input("t", {64, 16})
local h = g:scope("block1", function() return ck.silu(ck.linear(x, g:param("w", {256, 128}), g:param("b", {256}))) end)
h = g:scope("block2", function() return ck.silu(ck.linear(h, g:param("w", {256, 256}), g:param("b", {256}))) end)
local y = g:scope("head", function() return ck.linear(h, g:param("w", {16, 256})) end)
local log_opts = {dir = a.dir, async = a.async or false, flush_interval = a.flush or 1, every = a.every or 5,
  acts_every = a.every or 5, blocks = {}, batch = 64, on_nonfinite = a["on-nonfinite"] or "stop", tensorboard = true}
local p = g:compile{loss = ck.mse_loss(y, t), optimizer = "adamw", lr = 1e-3, seed = 1,
                    stats = log.stats_request(log_opts)}
p:randn(x, 1, 1.0, 0)
p:randn(t, 2, 1.0, 0)

local logger = log.new(log_opts)
local done = a.done and assert(io.open(a.done, "w"))
for step = 1, a.steps or 1000000 do
  if step == a["nan-at"] then p:set(x, 0 / 0) end
  if step == (a["nan-at"] or 0) + 1 then p:randn(x, 1, 1.0, 0) end
  logger:step(p)
  if done then
    done:write(step, "\n")
    done:flush()
  end
end
logger:close()
print("finished " .. p.steps .. " steps")
