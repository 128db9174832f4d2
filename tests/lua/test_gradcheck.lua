-- Finite-difference check of every differentiable op's backward, through the
-- graph: autodiff builds the backward ops, the CPU kernels run them, and each
-- gradient entry is compared with a central difference of the loss.
-- loss = mean(op(inputs) * R) with a fixed random R, so every output entry matters.
-- Tolerance: |analytic - numeric| <= 2e-3 + 3e-2 * max(|analytic|, |numeric|)
-- (fp32 forward, eps = 1e-2 on inputs of order 1; scaled entries keep this honest).
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

local r = T.rng(7)
local EPS, ATOL, RTOL = 1e-2, 2e-3, 3e-2

-- shapes: list of input shapes; build(g, xs) returns the op's output tensor.
-- opts.positive: inputs drawn in [0.5, 1.5]; opts.probe: how many entries per input to probe;
-- opts.set(p): sets the graph inputs build made besides the probed ones (a rope table).
local function gradcheck(name, shapes, build, opts)
  opts = opts or {}
  local g = ck.graph()
  local xs = {}
  for i, s in ipairs(shapes) do xs[i] = g:param("x" .. i, s, {init = "zeros"}) end
  local y = build(g, xs)
  local R = g:input("R", y.shape)
  local loss = ck.mean(y * R)
  local p = g:compile{loss = loss, optimizer = "none", keep_grads = true, seed = 3}
  local vals = {}
  for i, x in ipairs(xs) do
    local lo, hi = -1, 1
    if opts.positive then lo, hi = 0.5, 1.5 end
    vals[i] = T.random_values(r, x.numel, lo, hi)
    p:set(x, vals[i])
  end
  if opts.set then opts.set(p) end
  -- scale R so that the loss is of order 1 whatever the output size
  p:set(R, T.random_values(r, y.numel, -1, 1))
  p:step()
  local grads = {}
  for i, x in ipairs(xs) do grads[i] = p:grad(x) end
  local worst, bad = 0, nil
  for i, x in ipairs(xs) do
    local grad = grads[i]
    local n = x.numel
    local probes = math.min(n, opts.probe or 12)
    for k = 1, probes do
      local e = (probes == n) and k or (1 + math.floor((k - 1) * n / probes + (r(0, 1) * (n / probes))) % n)
      local v = vals[i][e]
      vals[i][e] = v + EPS; p:set(x, vals[i]); local lp = p:forward()
      vals[i][e] = v - EPS; p:set(x, vals[i]); local lm = p:forward()
      vals[i][e] = v; p:set(x, vals[i])
      local num = (lp - lm) / (2 * EPS)
      local ana = grad[e]
      local err = math.abs(ana - num) - (ATOL + RTOL * math.max(math.abs(ana), math.abs(num)))
      if err > worst then worst, bad = err, string.format("input %d entry %d: analytic %.6g numeric %.6g", i, e, ana, num) end
    end
  end
  T.ok(bad == nil, name .. (bad and (": " .. bad) or ""))
end

gradcheck("matmul", {{3, 5}, {5, 4}}, function(g, x) return ck.matmul(x[1], x[2]) end)
gradcheck("matmul trans_b", {{3, 5}, {4, 5}}, function(g, x) return ck.matmul(x[1], x[2], {trans_b = true}) end)
gradcheck("matmul trans_a", {{5, 3}, {5, 4}}, function(g, x) return ck.matmul(x[1], x[2], {trans_a = true}) end)
gradcheck("matmul trans_a trans_b", {{5, 3}, {4, 5}}, function(g, x) return ck.matmul(x[1], x[2], {trans_a = true, trans_b = true}) end)
gradcheck("matmul batched a, shared b", {{2, 3, 5}, {5, 4}}, function(g, x) return ck.matmul(x[1], x[2]) end)
gradcheck("matmul batched a and b", {{2, 3, 5}, {2, 5, 4}}, function(g, x) return ck.matmul(x[1], x[2]) end)
gradcheck("matmul batched trans_b", {{2, 3, 5}, {2, 4, 5}}, function(g, x) return ck.matmul(x[1], x[2], {trans_b = true}) end)
gradcheck("linear with bias", {{2, 3, 7}, {5, 7}, {5}}, function(g, x) return ck.linear(x[1], x[2], x[3]) end)
gradcheck("linear without bias", {{4, 7}, {3, 7}}, function(g, x) return ck.linear(x[1], x[2]) end)
gradcheck("conv2d 3x3 pad 1", {{2, 3, 5, 6}, {4, 3, 3, 3}, {4}}, function(g, x) return ck.conv2d(x[1], x[2], x[3], {padding = 1}) end)
gradcheck("conv2d 3x3 stride 2 pad 1", {{2, 3, 7, 5}, {2, 3, 3, 3}, {2}}, function(g, x) return ck.conv2d(x[1], x[2], x[3], {stride = 2, padding = 1}) end)
gradcheck("conv2d 1x1 no bias", {{1, 5, 3, 3}, {3, 5, 1, 1}}, function(g, x) return ck.conv2d(x[1], x[2]) end)
gradcheck("group_norm", {{2, 6, 3, 5}, {6}, {6}}, function(g, x) return ck.group_norm(x[1], 3, x[2], x[3]) end, {probe = 16})
gradcheck("group_norm one group, 3-D", {{2, 4, 7}, {4}, {4}}, function(g, x) return ck.group_norm(x[1], 1, x[2], x[3], 1e-6) end)
gradcheck("group_norm_silu", {{2, 6, 3, 5}, {6}, {6}}, function(g, x) return ck.group_norm_silu(x[1], 3, x[2], x[3]) end,
  {probe = 16})
gradcheck("group_norm_silu one group, 3-D", {{2, 4, 7}, {4}, {4}},
  function(g, x) return ck.group_norm_silu(x[1], 1, x[2], x[3], 1e-6) end)
gradcheck("layer_norm", {{3, 2, 9}, {9}, {9}}, function(g, x) return ck.layer_norm(x[1], x[2], x[3]) end, {probe = 16})
gradcheck("layer_norm without affine", {{3, 2, 9}}, function(g, x) return ck.layer_norm(x[1], nil, nil, 1e-6) end,
  {probe = 16})
gradcheck("layer_norm weight only", {{4, 9}, {9}}, function(g, x) return ck.layer_norm(x[1], x[2]) end, {probe = 16})
gradcheck("rms_norm", {{3, 2, 9}, {9}}, function(g, x) return ck.rms_norm(x[1], x[2], 1e-6) end, {probe = 16})
gradcheck("rms_norm without weight", {{4, 8}}, function(g, x) return ck.rms_norm(x[1]) end, {probe = 16})

-- rope's table: 3 tokens on 3 axes of 2, 2 and 4 dims (head dim 8), one text token at 0 and two image ones
local nn = require "ck.nn"
local rope_ids = {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}}
local function with_table(build)
  local tab
  return function(g, x)
    tab = g:input("rope_table", {3, 8})
    return build(g, x, tab)
  end, {probe = 16, set = function(p) p:set(tab, nn.rope_table(rope_ids, {2, 2, 4})) end}
end
do
  local build, opts = with_table(function(g, x, tab) return ck.rope(x[1], tab) end)
  gradcheck("rope [2,3,2*8]", {{2, 3, 16}}, build, opts)
  build, opts = with_table(function(g, x, tab) return ck.rope(ck.permute(x[1], {0, 2, 1, 3}), tab) end)
  gradcheck("rope [B,H,L,D]", {{1, 3, 2, 8}}, build, opts)
end
gradcheck("modulate", {{2, 3, 5}, {2, 5}, {2, 5}}, function(g, x) return ck.modulate(x[1], x[2], x[3]) end, {probe = 10})
gradcheck("gate", {{2, 3, 5}, {2, 5}, {2, 3, 5}}, function(g, x) return ck.gate(x[1], x[2], x[3]) end, {probe = 10})

-- Flux's double-stream attention, chained from these ops as DoubleStreamBlock
-- does (BFL layers.py): per stream (text, image) adaLN modulation from vec
-- (shift, scale, gate), LayerNorm without affine, qkv, RMSNorm on each head of
-- q and k, the joint sequence [text; image] rotated by rope and attended, split
-- back, projected and added through the gate. 2 text and 4 image tokens, 2
-- heads of 8, one sample.
do
  local tab
  local C, H, D, LT, LI = 16, 2, 8, 2, 4
  local ids = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1}}
  local shapes = {{1, LT, C}, {1, LI, C}, {1, C}}
  for _ = 1, 2 do -- per stream: mod W, b; qkv W, b; q and k norm weights; proj W, b
    for _, s in ipairs({{3 * C, C}, {3 * C}, {3 * C, C}, {3 * C}, {D}, {D}, {C, C}, {C}}) do shapes[#shapes + 1] = s end
  end
  gradcheck("Flux double-stream attention, chained", shapes, function(g, x)
    tab = g:input("rope_table", {LT + LI, D})
    local vec = ck.silu(x[3])
    local q, k, v, gates, res = {}, {}, {}, {}, {}
    for s = 1, 2 do
      local w = function(i) return x[3 + (s - 1) * 8 + i] end
      local mod = ck.linear(vec, w(1), w(2))
      local shift, scale = ck.slice(mod, 1, 0, C), ck.slice(mod, 1, C, C)
      gates[s], res[s] = ck.slice(mod, 1, 2 * C, C), x[s]
      local L = x[s].shape[2]
      local h = ck.modulate(ck.layer_norm(x[s], nil, nil, 1e-6), shift, scale)
      local qkv = ck.linear(h, w(3), w(4))
      local function head_norm(t, wn) return ck.reshape(ck.rms_norm(ck.reshape(t, {1, L, H, D}), wn, 1e-6), {1, L, C}) end
      q[s] = head_norm(ck.slice(qkv, 2, 0, C), w(5))
      k[s] = head_norm(ck.slice(qkv, 2, C, C), w(6))
      v[s] = ck.slice(qkv, 2, 2 * C, C)
    end
    local jq = ck.rope(ck.concat(q[1], q[2], 1), tab)
    local jk = ck.rope(ck.concat(k[1], k[2], 1), tab)
    local o = ck.attention(jq, jk, ck.concat(v[1], v[2], 1), H)
    local out = {}
    for s = 1, 2 do
      local w = function(i) return x[3 + (s - 1) * 8 + i] end
      local os = ck.slice(o, 1, s == 1 and 0 or LT, s == 1 and LT or LI)
      out[s] = ck.gate(res[s], gates[s], ck.linear(os, w(7), w(8)))
    end
    return ck.concat(out[1], out[2], 1)
  end, {probe = 6, set = function(p) p:set(tab, nn.rope_table(ids, {2, 2, 4})) end})
end

gradcheck("silu", {{3, 7}}, function(g, x) return ck.silu(x[1]) end)
gradcheck("gelu erf", {{3, 7}}, function(g, x) return ck.gelu(x[1]) end)
gradcheck("gelu tanh", {{3, 7}}, function(g, x) return ck.gelu(x[1], "tanh") end)
gradcheck("mish", {{3, 7}}, function(g, x) return ck.mish(x[1]) end)
gradcheck("geglu", {{2, 3, 10}}, function(g, x) return ck.geglu(x[1]) end, {probe = 20})
gradcheck("linear_geglu with bias", {{2, 3, 7}, {10, 7}, {10}}, function(g, x) return ck.linear_geglu(x[1], x[2], x[3]) end,
  {probe = 20})
gradcheck("linear_geglu tanh, no bias", {{4, 5}, {6, 5}}, function(g, x) return ck.linear_geglu(x[1], x[2], "tanh") end)
gradcheck("softmax", {{3, 2, 7}}, function(g, x) return ck.softmax(x[1]) end, {probe = 20})
gradcheck("attention self, 2 heads", {{2, 5, 6}, {2, 5, 6}, {2, 5, 6}}, function(g, x) return ck.attention(x[1], x[2], x[3], 2) end, {probe = 16})
gradcheck("attention cross, 3 heads", {{1, 7, 9}, {1, 4, 9}, {1, 4, 9}}, function(g, x) return ck.attention(x[1], x[2], x[3], 3) end, {probe = 16})
gradcheck("add broadcast", {{2, 3, 4}, {3, 1}}, function(g, x) return x[1] + x[2] end)
gradcheck("sub broadcast", {{4}, {2, 3, 4}}, function(g, x) return x[1] - x[2] end)
gradcheck("mul broadcast", {{2, 3, 4, 5}, {3, 1, 1}}, function(g, x) return x[1] * x[2] end)
gradcheck("mul same shape", {{3, 5}, {3, 5}}, function(g, x) return ck.mul(x[1], x[2]) end)
gradcheck("scale", {{3, 5}}, function(g, x) return x[1] * 2.5 end)
gradcheck("concat channels", {{2, 3, 4}, {2, 2, 4}}, function(g, x) return ck.concat(x[1], x[2], 1) end)
gradcheck("slice", {{2, 7, 3}}, function(g, x) return ck.slice(x[1], 1, 2, 3) end, {probe = 20})
gradcheck("reshape", {{2, 3, 4}}, function(g, x) return ck.reshape(x[1], {6, -1}) end)
gradcheck("permute", {{2, 3, 4}}, function(g, x) return ck.permute(x[1], {2, 0, 1}) end)
gradcheck("upsample2x", {{1, 2, 3, 3}}, function(g, x) return ck.upsample2x(x[1]) end)
gradcheck("mean", {{3, 5}}, function(g, x) return ck.reshape(ck.mean(x[1]), {1}) end)
gradcheck("mse_loss", {{2, 5}, {2, 5}}, function(g, x) return ck.reshape(ck.mse_loss(x[1], x[2]), {1}) end)
gradcheck("dropout", {{4, 9}}, function(g, x) return ck.dropout(x[1], 0.3) end, {probe = 20})
gradcheck("a tensor used twice (accumulation)", {{3, 4}}, function(g, x) return ck.silu(x[1]) * x[1] + x[1] end)

T.done()
