-- Gradient clipping, compile{max_grad_norm = c}: as torch.nn.utils.clip_grad_norm_,
-- every gradient is scaled by min(1, c / (||all gradients|| + 1e-6)) before the
-- update. Checked against that formula on the raw gradients (p:grad reads them
-- before clipping); a norm no gradient reaches changes nothing, bit for bit;
-- recompute keeps the clipped updates bitwise; bf16 storage keeps the clipped
-- gradients fp32; a negative norm is refused naming the line.
package.path = "tests/lua/?.lua;" .. package.path
local T = require "check"

local names = T.MLP_PARAMS
local function build(opts)
  local g, c, x, t = T.mlp(16, {optimizer = "sgd", lr = 0.5, weight_decay = 0, seed = 4, keep_grads = true}, opts)
  local p = g:compile(c)
  local r = T.rng(9)
  p:set(x, T.random_values(r, 16 * 3))
  p:set(t, T.random_values(r, 16 * 2))
  return p
end

local function weights(p)
  local w = {}
  for _, n in ipairs(names) do w[n] = p:get(n) end
  return w
end

-- one SGD step, against w - lr * g * min(1, c / (||g|| + 1e-6)) on the raw gradients
local function check_formula(c, label, storage)
  local p = build{max_grad_norm = c, storage = storage}
  local before = weights(p)
  p:step()
  local sq, grads = 0, {}
  for _, n in ipairs(names) do
    grads[n] = p:grad(n)
    for _, v in ipairs(grads[n]) do sq = sq + v * v end
  end
  local norm = math.sqrt(sq)
  local factor = math.min(1, c / (norm + 1e-6))
  local after, worst = weights(p), 0
  for _, n in ipairs(names) do
    for i, w0 in ipairs(before[n]) do
      local want = w0 - 0.5 * grads[n][i] * factor
      worst = math.max(worst, math.abs(after[n][i] - want) / math.max(1e-3, math.abs(want)))
    end
  end
  T.ok(worst < 1e-5, string.format("%s: gradient norm %.4f, factor %.4f, updates as the formula (worst %.2g)", label,
    norm, factor, worst))
  return norm
end

local norm = check_formula(0.05, "max_grad_norm 0.05")
T.ok(norm > 0.05, "the gradients' norm is above 0.05, so the clip acted")
check_formula(0.05, "bf16 storage, max_grad_norm 0.05", "bf16")

-- a norm the gradients do not reach: the factor is exactly 1, the updates bitwise those without clipping
do
  local a, b = build(), build{max_grad_norm = 1e6}
  for _ = 1, 3 do a:step(); b:step() end
  local same = true
  for _, n in ipairs(names) do same = same and a:checksum(n) == b:checksum(n) end
  T.ok(same, "max_grad_norm above the gradients' norm: weights after 3 steps bitwise those without clipping")
end

-- recompute does not change a bit of the clipped updates (AdamW)
do
  local a = build{max_grad_norm = 0.05, optimizer = "adamw"}
  local b = build{max_grad_norm = 0.05, optimizer = "adamw", checkpoint = function() return "recompute" end}
  for _ = 1, 3 do a:step(); b:step() end
  local same = b:plan().recompute_ops > 0
  for _, n in ipairs(names) do same = same and a:checksum(n) == b:checksum(n) end
  T.ok(same, string.format("every activation recomputed (%d ops): clipped AdamW updates bitwise those of none",
    b:plan().recompute_ops))
end

local ok, err = pcall(function() local p = build{max_grad_norm = -1}; return p end)
T.ok(not ok and err:match("test_clip%.lua:%d+:") and err:match("max_grad_norm must be"),
  "a negative max_grad_norm is refused naming the line: " .. tostring(err))
T.done()
