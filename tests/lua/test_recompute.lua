-- Recompute never changes gradients, and the plan is exact: on sdxl-tiny with
-- dropout, every built-in policy and a Lua function policy give gradients
-- after two AdamW steps that are bitwise those of policy none, and each
-- policy's predicted peak equals the arena high-water mark measured by
-- scanning a sentinel fill. Bad policies fail with one clear error naming the
-- script line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local unet = require "ck.unet"
local policy = require "ck.policy"

local config = unet.config("sdxl-tiny")
config.dropout = 0.1

local function build(checkpoint, extra)
  local g = ck.graph()
  local _, y, x = unet.build(g, config, {batch = 2, height = 16, width = 16})
  local t = g:input("target", y.shape)
  local o = {loss = ck.mse_loss(y, t), optimizer = "adamw", lr = 1e-3, seed = 5, keep_grads = true,
             checkpoint = checkpoint}
  for k, v in pairs(extra or {}) do o[k] = v end
  local p = g:compile(o)
  return g, p, x, t
end

local function run(checkpoint)
  local g, p, x, t = build(checkpoint)
  local r = T.rng(3)
  p:set(x.sample, T.random_values(r, 2 * 4 * 16 * 16))
  p:set(t, T.random_values(r, 2 * 4 * 16 * 16))
  p:set(x.encoder_hidden_states, T.random_values(r, 2 * 77 * 64))
  p:set(x.text_embeds, T.random_values(r, 2 * 64))
  p:set(x.timesteps, {17, 901})
  p:set(x.time_ids, {128, 128, 0, 0, 128, 128, 128, 128, 0, 0, 128, 128})
  local losses, measured = {}, {}
  for s = 1, 2 do
    local info
    losses[s], info = p:step{measure = true}
    measured[s] = info.high_water
  end
  return {losses = losses, measured = measured, plan = p:plan(), grads = T.param_digest(g, p)}
end

local base = run(nil)
T.ok(base.plan.recompute_ops == 0, "policy none recomputes nothing")
T.ok(base.plan.peak == base.measured[1] and base.plan.peak == base.measured[2],
  string.format("none: predicted peak %d equals the measured high-water mark %d", base.plan.peak, base.measured[2]))

local calls = 0
local function norms_and_activations(t)
  calls = calls + 1
  assert(t.op and t.scope and t.shape and t.bytes and t.flops and t.block, "the policy sees op, scope, shape, bytes, flops, block")
  if t.op == "group_norm" or t.op == "silu" or t.op == "dropout" then return "recompute" end
  return "save"
end

local policies = {
  {"diffusers", policy.diffusers()},
  {"blocks mid_block, up_blocks.*.attentions.*", policy.blocks{"mid_block", "up_blocks.*.attentions.*"}},
  {"every_n(2)", policy.every_n(2)},
  {"sqrt_n", policy.sqrt_n()},
  {"selective (default ops)", policy.selective()},
  {"selective{silu, dropout}", policy.selective{recompute = {"silu", "dropout"}}},
  -- the persistent bytes (parameters, AdamW state) dominate at this size: budgets cut the rest
  {"budget in bytes", policy.budget(math.floor(base.plan.persistent + 0.995 * (base.plan.peak - base.plan.persistent)))},
  {"budget as a share of none's peak", policy.budget(string.format("%.4f%%", 100 * (base.plan.peak - 4096) / base.plan.peak))},
  {"auto on a small device", policy.auto{device = (base.plan.peak - 4096) / 0.95, headroom = 0.05}},
  {"auto that fits without recompute", policy.auto{device = base.plan.peak * 2}},
  {"a Lua function", norms_and_activations},
}
for _, e in ipairs(policies) do
  local r = run(e[2])
  local recomputes = r.plan.recompute_ops > 0
  T.ok(r.grads == base.grads and r.losses[1] == base.losses[1] and r.losses[2] == base.losses[2],
    string.format("%s: losses and all %s gradients after two steps are bitwise those of none (%d recompute ops)",
      e[1], "parameter", r.plan.recompute_ops))
  T.ok(r.plan.peak == r.measured[1] and r.plan.peak == r.measured[2],
    string.format("%s: predicted peak %d equals the measured high-water mark %d", e[1], r.plan.peak, r.measured[2]))
  if e[1] ~= "auto that fits without recompute" then
    -- the bytes live at once: the arena adds the packing's gaps, which move by
    -- kilobytes either way with any change to the op list
    T.ok(recomputes and r.plan.activation_bytes < base.plan.activation_bytes and r.plan.live_peak <= base.plan.live_peak,
      string.format("%s: recomputes, holds fewer activations for backward (%.2f -> %.2f MiB), live peak %.2f -> %.2f MiB",
        e[1], base.plan.activation_bytes / 2 ^ 20, r.plan.activation_bytes / 2 ^ 20, base.plan.live_peak / 2 ^ 20,
        r.plan.live_peak / 2 ^ 20))
  else
    T.ok(not recomputes, "auto with room to spare recomputes nothing")
  end
end
T.ok(calls > 100, string.format("the function policy was asked about every candidate (%d calls)", calls))

-- budget is never worse than a fixed policy: at that policy's peak, no more recompute
for _, name in ipairs{"diffusers", "selective", "sqrt_n", "every_n:2"} do
  local _, fixed = build(policy.parse(name), {plan_only = true})
  local f = fixed:plan()
  local _, b = build(policy.budget(f.peak), {plan_only = true})
  local bp = b:plan()
  T.ok(bp.peak <= f.peak and bp.recompute_flops <= f.recompute_flops,
    string.format("budget at %s's peak: peak %.2f <= %.2f MiB, recompute %.3g <= %.3g FLOPs", name, bp.peak / 2 ^ 20,
      f.peak / 2 ^ 20, bp.recompute_flops, f.recompute_flops))
end

-- errors name the script line of the compile
local function compile_error(checkpoint)
  local ok, err = pcall(build, checkpoint, {plan_only = true})
  return not ok and tostring(err) or nil
end
local line = debug.getinfo(1, "l").currentline
local err = compile_error(function() return "keep" end)
T.ok(err and err:find("test_recompute.lua:%d+: compile: checkpoint policy function %(defined at .*test_recompute.lua:" .. (line + 1) .. "%) returned \"keep\"")
  and err:find('expected "save" or "recompute"', 1, true), "a function returning something else: " .. tostring(err))
err = compile_error(function() return nil end)
T.ok(err and err:find("returned nil"), "a function returning nil: " .. tostring(err))
err = compile_error(function() error("policy bug") end)
T.ok(err and err:find("policy bug"), "a function that raises: " .. tostring(err))
err = compile_error(policy.budget(1024))
T.ok(err and err:find("test_recompute.lua:%d+: compile: budget: nothing fits in 0.0 MiB; the smallest peak ckrun can plan is"),
  "a budget nothing fits names the smallest peak: " .. tostring(err))
err = compile_error(policy.auto{device = 2 ^ 20})
T.ok(err and err:find("auto: nothing fits"), "auto on a device too small refuses before running: " .. tostring(err))
err = compile_error(policy.blocks{"down_blocks.7"})
T.ok(err and err:find("test_recompute.lua:%d+: compile: blocks: pattern 'down_blocks.7' matches no scope of the model"),
  "a scope pattern that matches nothing: " .. tostring(err))
local ok, perr = pcall(policy.parse, "fastest")
T.ok(not ok and tostring(perr):find("unknown checkpoint policy 'fastest'"), "an unknown policy name: " .. tostring(perr))
ok, perr = pcall(policy.budget, "lots")
T.ok(not ok and tostring(perr):find("not a size: 'lots'"), "a budget that is not a size: " .. tostring(perr))

T.done()
