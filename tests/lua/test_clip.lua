-- Gradient clipping, compile{max_grad_norm = c}: as torch.nn.utils.clip_grad_norm_,
-- every gradient is scaled by min(1, c / (||all gradients|| + 1e-6)) before the
-- update. Checked against that formula on the raw gradients (p:grad reads them
-- before clipping); a norm no gradient reaches changes nothing, bit for bit;
-- recompute keeps the clipped updates bitwise; bf16 storage keeps the clipped
-- gradients fp32; a negative norm is refused naming the line. The squared
-- norms are summed a few gradients per node (a chain of running totals): a
-- deeper MLP has more parameters than one node takes, and a last, partial node.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

local names = T.MLP_PARAMS
-- compiled, on 16 fixed rows
local function ready(g, c, x, t)
  local p = g:compile(c)
  T.set_random(p, 9, {x, t})
  return p
end

local function build(opts)
  return ready(T.mlp(16, {optimizer = "sgd", lr = 0.5, weight_decay = 0, seed = 4, keep_grads = true}, opts))
end

-- four layers 3 -> 6 -> 5 -> 4 -> 2: 8 parameters, summed 4 + 3 + 1 per node
local deep_names = {}
local function build_deep(opts)
  local g = ck.graph()
  local x, t = g:input("x", {16, 3}), g:input("t", {16, 2})
  local widths, h = {3, 6, 5, 4, 2}, x
  deep_names = {}
  for i = 1, 4 do
    local w = g:param("l" .. i .. ".weight", {widths[i + 1], widths[i]})
    local b = g:param("l" .. i .. ".bias", {widths[i + 1]})
    deep_names[#deep_names + 1], deep_names[#deep_names + 2] = "l" .. i .. ".weight", "l" .. i .. ".bias"
    h = ck.linear(h, w, b)
    if i < 4 then h = ck.silu(h) end
  end
  local c = {loss = ck.mse_loss(h, t), optimizer = "sgd", lr = 0.5, weight_decay = 0, seed = 4, keep_grads = true}
  for k, v in pairs(opts) do c[k] = v end
  return ready(g, c, x, t)
end

local function weights(p, list)
  local w = {}
  for _, n in ipairs(list or names) do w[n] = p:get(n) end
  return w
end

-- one SGD step, against w - lr * g * min(1, c / (||g|| + 1e-6)) on the raw gradients
local function check_formula(c, label, storage, builder)
  local p = (builder or build){max_grad_norm = c, storage = storage}
  local names = builder and deep_names or names
  local before = weights(p, names)
  p:step()
  local sq, grads = 0, {}
  for _, n in ipairs(names) do
    grads[n] = p:grad(n)
    for _, v in ipairs(grads[n]) do sq = sq + v * v end
  end
  local norm = math.sqrt(sq)
  local factor = math.min(1, c / (norm + 1e-6))
  local after, worst = weights(p, names), 0
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
T.ok(check_formula(0.05, "8 parameters (3 nodes of summed squares), max_grad_norm 0.05", nil, build_deep) > 0.05,
  "the deeper MLP's gradient norm is above 0.05 too")
do
  local extra = build_deep{max_grad_norm = 0.05}:plan().ops - build_deep{}:plan().ops
  T.ok(extra == 3 + 1 + 8, string.format("clipping 8 gradients adds 3 summed-squares nodes, the factor and 8 products: "
    .. "%d ops", extra))
end

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
