-- Mixed precision as kohya and diffusers name it (compile{precision =
-- "no"|"bf16"|"fp16"}, storage = its other name) with fp16's dynamic loss
-- scaling as torch.cuda.amp.GradScaler does it: training curves follow fp32's,
-- the scale follows GradScaler's rule exactly (backoff on overflow, growth
-- after growth_interval applied updates), skipped updates change nothing,
-- accumulation checks once per update, scaling by a power of two changes no
-- fp32 bit (clipping included), recompute stays bitwise under bf16 and fp16,
-- a training state carries the scale, and bad settings name the script line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local unet = require "ck.unet"
local policy = require "ck.policy"
local state = require "ck.state"

local function tiny(opts)
  local model = unet.UNet2DConditionModel(unet.config("sdxl-tiny"))
  local o = {optimizer = "adamw", lr = 1e-3, seed = 5, keep_grads = true, device = "cpu"}
  for k, v in pairs(opts or {}) do o[k] = v end
  local g, p = T.unet_step(model, {batch = 2, height = 16}, o)
  return g, p
end

-- 20 steps of bf16 and of fp16 (with loss scaling) follow fp32's losses
do
  local curves, scales = {}, nil
  for _, prec in ipairs{"no", "bf16", "fp16"} do
    local _, p = tiny{precision = prec, max_grad_norm = 1.0}
    local ls = {}
    for s = 1, 20 do
      local info
      ls[s], info = p:step{guard = true}
      assert(not info.skipped, "no step of this run overflows")
      if prec == "fp16" then scales = info.loss_scale end
    end
    curves[prec] = ls
  end
  for _, prec in ipairs{"bf16", "fp16"} do
    local worst = 0
    for s = 1, 20 do worst = math.max(worst, math.abs(curves[prec][s] - curves.no[s]) / curves.no[s]) end
    -- bf16 keeps 8 bits of mantissa, fp16 11: a step's relative error stays within a few of their units.
    -- bf16's products and convolutions also take bf16 operands (as under autocast), and the loss falls 50x
    -- over the run, so its last steps' relative error is several bf16 units (0.023 measured)
    local tol = prec == "bf16" and 3e-2 or 4e-3
    T.ok(worst < tol, string.format("20 AdamW steps in %s follow fp32's losses (%.4f -> %.4f against %.4f -> %.4f; " ..
      "worst relative difference %.2g < %.0e)", prec, curves[prec][1], curves[prec][20], curves.no[1], curves.no[20],
      worst, tol))
  end
  T.ok(scales == 65536, "fp16 scales the loss by GradScaler's 2^16 by default: " .. tostring(scales))
end

-- GradScaler's rule with a forced overflow: loss = mean(x w) on one element,
-- so the fp16 activation gradient is the scale itself: it overflows exactly
-- when the scale is above fp16's largest value, 65504
local function one_weight(opts)
  local g = ck.graph()
  local x = g:input("x", {1, 1})
  local w = g:param("w", {1, 1}, {init = "ones"})
  local y = ck.linear(x, w)
  local o = {loss = ck.mean(y), optimizer = "sgd", lr = 0.25, weight_decay = 0, precision = "fp16", device = "cpu"}
  for k, v in pairs(opts) do o[k] = v end
  local p = g:compile(o)
  p:set(x, {1})
  return p, x
end
do
  local interval = 3
  local p = one_weight{loss_scale = {init = 2 ^ 19, growth_interval = interval}}
  -- the documented rule, with overflow meaning scale > 65504
  local scale, tracker, updates, expect = 2 ^ 19, 0, 0, {}
  for s = 1, 16 do
    local over = scale > 65504
    expect[s] = {scale = scale, skipped = over}
    if over then
      scale, tracker = scale * 0.5, 0
    else
      updates = updates + 1
      if tracker + 1 == interval then scale, tracker = scale * 2, 0 else tracker = tracker + 1 end
    end
  end
  local got, want, w_ok = {}, {}, true
  local w = 1
  for s = 1, 16 do
    local _, info = p:step()
    got[s] = string.format("%g%s", info.loss_scale, info.skipped and "!" or "")
    want[s] = string.format("%g%s", expect[s].scale, expect[s].skipped and "!" or "")
    if not expect[s].skipped then w = w - 0.25 end -- SGD on the unscaled gradient, x = 1
    w_ok = w_ok and p:get("w")[1] == w and (info.overflow or false) == expect[s].skipped
  end
  T.ok(table.concat(got, " ") == table.concat(want, " "),
    "the scale each step used, ! where it skipped: " .. table.concat(got, " ") .. " (GradScaler: " ..
    table.concat(want, " ") .. ")")
  T.ok(w_ok, string.format("a skipped step leaves the weight, an applied one moves it by lr times the unscaled " ..
    "gradient (w = %g)", w))
  T.ok(p.updates == updates and p.steps == 16 and p.loss_scale == scale,
    string.format("steps 16, updates %d (skipped ones uncounted, as the optimizer's step count), scale now %g",
      p.updates, p.loss_scale))
end

-- as under autocast, the product of an fp16 activation runs in fp16 (its fp32
-- weight and input cast): the weight's gradient x * scale is an fp16 value, so
-- with x = 3 it overflows at a scale of 2^15 (98304 > 65504) though the scale
-- itself fits, and with x = 1 it does not
do
  local p, x = one_weight{loss_scale = {init = 2 ^ 15}}
  p:set(x, {3})
  local _, info = p:step()
  local q, qx = one_weight{loss_scale = {init = 2 ^ 15}}
  q:set(qx, {1})
  local _, qinfo = q:step()
  T.ok(info.skipped and info.overflow and p.loss_scale == 2 ^ 14 and not qinfo.skipped and q.loss_scale == 2 ^ 15,
    string.format("an fp16 product's weight gradient is fp16: x = 3 overflows at 2^15 (skipped %s, scale now %g), " ..
      "x = 1 does not (skipped %s)", tostring(info.skipped), p.loss_scale, tostring(qinfo.skipped)))
end

-- accumulation: one check per update; one micro step that overflows skips
-- the whole update and backs the scale off once. loss = mean((x w)^2): the
-- activation gradient 2 x w scale overflows at x = 64, scale 2^10
do
  local g = ck.graph()
  local x = g:input("x", {1, 1})
  local w = g:param("w", {1, 1}, {init = "ones"})
  local h = ck.linear(x, w)
  local p = g:compile{loss = ck.mean(ck.mul(h, h)), optimizer = "sgd", lr = 0.25, weight_decay = 0, precision = "fp16",
                      accumulate = 2, loss_scale = {init = 2 ^ 10, growth_interval = 100}, device = "cpu"}
  local seen = {}
  for s, xv in ipairs{1, 64, 1, 1} do
    p:set(x, {xv})
    local l, info = p:step()
    seen[s] = string.format("%g%s", info.loss_scale, info.overflow and "!" or "")
    assert(l == xv * xv)
  end
  T.ok(table.concat(seen, " ") == "1024 1024! 512 512",
    "accumulated steps: the update of steps 1-2 skipped once, at the update, the scale halved: " .. table.concat(seen, " "))
  -- steps 3-4: the mean of 2 x^2 w = 2 over the two steps, unscaled
  T.ok(p.updates == 1 and p:get("w")[1] == 1 - 0.25 * 2 and p.micro == 0,
    string.format("one update applied, from the mean unscaled gradient (w = %g, updates %d)", p:get("w")[1], p.updates))
end

-- a non-finite loss under loss scaling: reported (guarded: the op named),
-- the update skipped and the scale backed off, as GradScaler would on the
-- gradients it makes
do
  for _, guard in ipairs{true, false} do
    local p, x = one_weight{loss_scale = {init = 2 ^ 10}}
    p:set(x, {0 / 0})
    local l, info = p:step{guard = guard}
    local nf = info.nonfinite or {}
    T.ok(l ~= l and info.skipped and nf.loss and not info.overflow and p.updates == 0 and p:get("w")[1] == 1 and
      p.loss_scale == 2 ^ 9 and (not guard or nf.input == "x"),
      string.format("a NaN input (guard %s): the loss is reported non-finite%s, the update skipped, the scale halved",
        tostring(guard), guard and " and the op named (" .. tostring(nf.op) .. ", input " .. tostring(nf.input) .. ")" or ""))
  end
end

-- fp16 storage holds rounded values; a value beyond fp16 is refused, naming the tensor
do
  local g = ck.graph()
  local x = g:input("x", {1, 2})
  local f = g:param("frozen", {1, 2}, {trainable = false})
  local w = g:param("w", {1, 2})
  local p = g:compile{loss = ck.mean(ck.mul(ck.mul(x, f), w)), precision = "fp16", device = "cpu"}
  p:set(f, {1 + 2 ^ -11, 1 + 2 ^ -10})
  local v = p:get(f)
  T.ok(v[1] == 1 and v[2] == 1 + 2 ^ -10, string.format("a frozen fp16 weight holds what was set, rounded to fp16 " ..
    "(nearest even: %.10g, %.10g)", v[1], v[2]))
  local ok, err = pcall(p.set, p, f, {1, 1e5})
  T.ok(not ok and tostring(err):find("'frozen' holds 100000 at element 1, beyond what fp16 stores (largest 65504)", 1,
    true), "a frozen weight beyond fp16 is refused: " .. tostring(err))
end

-- a power-of-two scale changes no bit of an fp32 run: the update reads the
-- gradients times 1/scale, clipping sees the unscaled norm, accumulation sums
-- scaled gradients and unscales once
do
  local function mlp_run(extra)
    local g, c, x, t = T.mlp(4, {optimizer = "adamw", lr = 1e-2, seed = 3, max_grad_norm = 0.05, accumulate = 2,
                                 device = "cpu"}, extra)
    local p = g:compile(c)
    local r = T.rng(7)
    local out = {}
    for s = 1, 6 do
      p:set(x, T.random_values(r, 12))
      p:set(t, T.random_values(r, 8))
      out[#out + 1] = tostring(p:step())
    end
    for _, n in ipairs(T.MLP_PARAMS) do out[#out + 1] = p:checksum(n) end
    return table.concat(out, " "), p
  end
  local plain = mlp_run{}
  local scaled, p = mlp_run{loss_scale = {init = 2 ^ 12, growth_interval = 2}}
  T.ok(plain == scaled and p.loss_scale == 2 ^ 13,
    string.format("fp32, clipped and accumulated: losses and weights bitwise those without scaling (scale grew to %g)",
      p.loss_scale))
end

-- recompute gives bitwise gradients under bf16 and fp16, under every policy
do
  local function grads(g, p)
    local s = {}
    for _, prm in ipairs(g:params()) do s[#s + 1] = p:checksum(prm.name, "grad") .. "/" .. p:checksum(prm.name) end
    return table.concat(s, " ")
  end
  local function run(prec, checkpoint)
    local g, p = tiny{precision = prec, checkpoint = checkpoint}
    local l1, l2 = p:step(), p:step()
    return l1 .. " " .. l2 .. " " .. grads(g, p), p:plan()
  end
  for _, prec in ipairs{"bf16", "fp16"} do
    local base, bplan = run(prec, nil)
    local policies = {
      {"diffusers", policy.diffusers()},
      {"blocks", policy.blocks{"mid_block", "up_blocks.*.attentions.*"}},
      {"every_n(2)", policy.every_n(2)},
      {"sqrt_n", policy.sqrt_n()},
      {"selective", policy.selective()},
      {"budget", policy.budget(math.floor(bplan.persistent + 0.995 * (bplan.peak - bplan.persistent)))},
      {"a Lua function", function(t) return (t.op == "group_norm" or t.op == "silu") and "recompute" or "save" end},
    }
    local bad = {}
    for _, e in ipairs(policies) do
      local r, plan = run(prec, e[2])
      if r ~= base or plan.recompute_ops == 0 then bad[#bad + 1] = e[1] end
    end
    T.ok(#bad == 0, string.format("%s: under %d policies that recompute, losses, gradients and weights after two " ..
      "steps are bitwise those of none%s", prec, #policies, #bad > 0 and " (not: " .. table.concat(bad, ", ") .. ")" or ""))
  end
end

-- a training state holds the scale and its growth count: a resumed run
-- continues bitwise
do
  local tmp = string.format("out/test_mixed_precision.%d", math.floor(ck.now() * 1e6))
  assert(ck.mkdir(tmp))
  local function run(p, x, from, to)
    local out = {}
    for s = from, to do
      p:set(x, {s % 3 + 1})
      local l, info = p:step()
      out[#out + 1] = string.format("%s@%g", tostring(l), info.loss_scale)
    end
    return table.concat(out, " ") .. " " .. p:checksum("w") .. " " .. p.loss_scale
  end
  local interval = 3
  -- the weight's gradient comes from the fp16 product (x up to 3 times the
  -- scale): 2^13 grows once within the first four steps without overflowing
  local a, ax = one_weight{optimizer = "adamw", lr = 1e-2, loss_scale = {init = 2 ^ 13, growth_interval = interval}}
  run(a, ax, 1, 4)
  state.save(a, tmp, {}, 2)
  local rest = run(a, ax, 5, 12)
  local b, bx = one_weight{optimizer = "adamw", lr = 1e-2, loss_scale = {init = 2 ^ 13, growth_interval = interval}}
  state.load(b, state.latest(tmp))
  T.ok(b.loss_scale == 2 ^ 14 and b.steps == 4, string.format("the state restores the scale (%g after one growth)",
    b.loss_scale))
  local resumed = run(b, bx, 5, 12)
  T.ok(resumed == rest, "resumed: losses, scales and weights bitwise the uninterrupted run's: " .. resumed)
  for _, f in ipairs(ck.listdir(tmp) or {}) do os.remove(tmp .. "/" .. f) end
  os.remove(tmp)
end

-- bad settings: one error naming the script line
do
  local function err_of(opts)
    local g = ck.graph()
    local x = g:input("x", {2, 3})
    local w = g:param("w", {4, 3})
    local o = {loss = ck.mean(ck.linear(x, w)), device = "cpu"}
    for k, v in pairs(opts) do o[k] = v end
    local ok, e = pcall(function() return g:compile(o) end)
    return not ok and tostring(e) or "no error"
  end
  local here = "test_mixed_precision%.lua:%d+: compile: "
  local cases = {
    {{precision = "fp8"}, "precision must be no %(fp32%), bf16 or fp16, got 'fp8'"},
    {{storage = "fp8"}, "storage must be fp32, bf16 or fp16, got 'fp8'"},
    {{precision = "fp16", storage = "bf16"}, "precision = 'fp16' and storage = 'bf16' differ"},
    {{precision = "fp16", loss_scale = {growth_interval = -1}}, "loss_scale.growth_interval must be a whole number"},
    {{precision = "fp16", loss_scale = {init = 0}}, "loss_scale.init must be a finite number > 0"},
    {{precision = "fp16", loss_scale = {backoff_factor = 2}}, "loss_scale.backoff_factor must be between 0 and 1"},
    {{precision = "fp16", loss_scale = {growth_factr = 2}}, "loss_scale takes init, growth_factor, backoff_factor " ..
      "and growth_interval, got 'growth_factr'"},
    {{precision = "fp16", fused_backward = true}, "loss scaling checks every gradient for an overflow before any update, so it cannot go with fused_backward"},
    {{precision = "fp16", optimizer = "none"}, "loss scaling skips the updates whose gradients overflow: it needs an optimizer"},
  }
  for _, c in ipairs(cases) do
    local e = err_of(c[1])
    T.ok(e:match(here .. c[2]) and not e:find("\n"), "one line naming the line: " .. e)
  end
  T.ok(err_of{precision = "fp16", storage = "fp16"} == "no error" and err_of{precision = "no", storage = "fp32"} ==
    "no error", "precision and storage may both be given when they agree")
end

T.done()
