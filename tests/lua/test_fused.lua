-- Fused updates (compile{fused_backward = true}, kohya's --fused_backward_pass):
-- each parameter's update runs as soon as nothing reads its parameter or
-- gradient any more, inside backward, so gradients do not wait for the end of
-- the step. On sdxl-tiny trained whole: the weights after 3 AdamW steps (and
-- Lion, and SGD) are bitwise those of the unfused program, with and without
-- recompute; the plan holds far fewer gradient bytes at its peak and a lower
-- peak, which the measured high-water mark equals; updates sit inside
-- backward; logging steps report the same gradient norms; a NaN loss is
-- caught before any update; and what cannot be fused is refused naming the line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local policy = require "ck.policy"

local function build(opts)
  local c = {optimizer = "adamw", lr = 1e-3, seed = 5, device = "cpu"}
  for k, v in pairs(opts) do c[k] = v end
  return T.unet_step("sdxl-tiny", {batch = 2, height = 8}, c)
end

local function weights(g, p)
  local s = {}
  for _, prm in ipairs(g:params()) do s[#s + 1] = p:checksum(prm.name) end
  return table.concat(s, " ")
end

for _, c in ipairs{{"adamw"}, {"lion"}, {"sgd"}, {"adamw", policy.diffusers()}} do
  local ga, pa = build{optimizer = c[1], checkpoint = c[2]}
  local gb, pb = build{optimizer = c[1], checkpoint = c[2], fused_backward = true}
  local same = true
  for _ = 1, 3 do same = same and pa:step() == pb:step() end
  T.ok(same and weights(ga, pa) == weights(gb, pb) and pb.updates == 3, string.format(
    "%s%s: 3 fused steps give bitwise the losses and weights of unfused ones", c[1], c[2] and ", diffusers" or ""))
end

do -- the plan
  local _, pa = build{}
  local _, pb = build{fused_backward = true}
  local a, b = pa:plan(), pb:plan()
  T.ok(b.at_peak.gradients * 4 < a.at_peak.gradients and b.peak < a.peak, string.format(
    "gradients at the peak: %d bytes fused, %d unfused; peak %d against %d", b.at_peak.gradients,
    a.at_peak.gradients, b.peak, a.peak))
  local hw = select(2, pb:step{measure = true}).high_water
  T.ok(hw == b.peak, string.format("fused: the planned peak %d is the measured high-water mark %d", b.peak, hw))
  -- updates inside backward: some backward op runs after the first update
  local tl = pb:timeline()
  local first_update, last_backward = nil, 0
  for i, ph in ipairs(tl.phase) do
    if ph == "optimizer" and not first_update then first_update = i end
    if ph == "backward" then last_backward = i end
  end
  T.ok(first_update and first_update < last_backward, string.format(
    "the first update is entry %d, before the last backward entry %d", first_update or -1, last_backward))
end

do -- logging steps (gradient norms, activation statistics) with fused updates: the norms are those of the
  -- unfused program's gradients, and training stays bitwise
  local log = require "ck.log"
  local stats = {blocks = log.unet_blocks}
  local ga, pa = build{stats = stats}
  local gb, pb = build{fused_backward = true, stats = stats}
  local same, norms, last = true, true, nil
  for _ = 1, 3 do
    local la, ra = pa:step{stats = {"grads", "acts"}}
    local lb, rb = pb:step{stats = {"grads", "acts"}}
    same = same and la == lb
    norms = norms and ra.grad_norm == rb.grad_norm and ra.grad_norm > 0
    last = rb.grad_norm
  end
  T.ok(same and norms and weights(ga, pa) == weights(gb, pb), string.format(
    "logging steps: fused gradient norms equal the unfused ones (last %.6g), losses and weights bitwise", last))
end

do -- a NaN loss: caught after forward, before any update
  local g, p, x = build{fused_backward = true}
  local before = weights(g, p)
  local nan = {}
  for i = 1, 2 * 4 * 8 * 8 do nan[i] = 0 / 0 end
  p:set(x.sample, nan)
  local loss, info = p:step{guard = true}
  T.ok(loss ~= loss and info.skipped and info.nonfinite.loss and info.nonfinite.phase == "forward"
    and weights(g, p) == before and p.updates == 0, string.format("a NaN input: the step is skipped after forward "
    .. "(first non-finite output: %s in %s), no weight changes, no update counted", tostring(info.nonfinite.op),
    tostring(info.nonfinite.phase)))
end

for _, bad in ipairs{{{accumulate = 2}, "accumulate"}, {{max_grad_norm = 1}, "clip"}, {{optimizer = "none"}, "optimizer"}} do
  local g = ck.graph()
  local x = g:input("x", {2, 3})
  local y = ck.linear(x, g:param("w", {4, 3}))
  local c = {loss = ck.mean(y), optimizer = "adamw", fused_backward = true}
  for k, v in pairs(bad[1]) do c[k] = v end
  local ok, err = pcall(function() local p = g:compile(c); return p end)
  T.ok(not ok and err:match("test_fused%.lua:%d+:") and err:match("fused_backward") and err:match(bad[2]),
    "fused_backward with " .. bad[2] .. " is refused: " .. tostring(err))
end

T.done()
