-- Mish (ck.mish, nn.Mish), an op made from one row of ops/ops.def: a graph
-- computes torch's x * tanh(softplus(x)); an MLP with it learns a toy task;
-- the selective policy recomputes it by default, with gradients bitwise those
-- of no recompute; TimestepEmbedding takes act_fn = "mish".
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local nn = require "ck.nn"
local policy = require "ck.policy"
local T = require "check"

do -- the forward value through a compiled graph, against the formula in double
  local xs = {-30, -5, -1.5, -0.25, 0, 0.3, 1, 2.5, 8, 25}
  local g = ck.graph()
  local x = g:input("x", {#xs})
  local z = g:input("z", {#xs})
  local p = g:compile{loss = ck.mse_loss(ck.mish(x), z)}
  p:set(x, xs)
  p:set(z, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
  local want = 0
  for _, v in ipairs(xs) do
    local sp = v > 20 and v or math.log(1 + math.exp(v))
    local e2 = math.exp(2 * sp)
    local m = v * (e2 - 1) / (e2 + 1)
    want = want + m * m / #xs
  end
  local got = p:forward()
  T.ok(math.abs(got - want) <= 1e-5 * want, string.format("mean(mish(x)^2) = %.7g, the formula gives %.7g", got, want))
end

local function mlp(checkpoint)
  local g = ck.graph()
  local x = g:input("x", {36, 2})
  local t = g:input("t", {36, 1})
  local act = nn.Mish{}
  local h = act:forward(g, ck.linear(x, g:param("l1.weight", {32, 2}), g:param("l1.bias", {32})))
  h = ck.mish(ck.linear(h, g:param("l2.weight", {32, 32}), g:param("l2.bias", {32})))
  local y = ck.linear(h, g:param("l3.weight", {1, 32}), g:param("l3.bias", {1}))
  local p = g:compile{loss = ck.mse_loss(y, t), optimizer = "adamw", lr = 1e-2, seed = 1, keep_grads = true,
                      checkpoint = checkpoint}
  local xs, ts = {}, {}
  for i = 0, 5 do for j = 0, 5 do
    local a, b = i / 5, j / 5
    xs[#xs + 1] = {a, b}; ts[#ts + 1] = {math.sin(3 * a) * b}
  end end
  p:set(x, xs); p:set(t, ts)
  return g, p
end

do -- an MLP of y = sin(3a) * b on a 6x6 grid learns with mish between its layers
  local _, p = mlp(nil)
  local first = p:forward()
  local l
  for _ = 1, 400 do l = p:step() end
  T.ok(first > 0.05, string.format("untrained loss %.4f is above 0.05", first))
  T.ok(l < 0.005, string.format("trained loss %.5f is below 0.005", l))
end

do -- selective recompute counts mish cheap (ops.def) and changes no gradient bit
  local function grads(checkpoint)
    local g, p = mlp(checkpoint)
    for _ = 1, 2 do p:step() end
    local sums = {}
    for _, prm in ipairs(g:params()) do sums[#sums + 1] = prm.name .. "=" .. p:checksum(prm.name, "grad") end
    return table.concat(sums, "\n"), p:plan()
  end
  local base = grads(nil)
  local sel, plan = grads(policy.selective())
  T.ok(plan.recompute_ops == 2, string.format("selective recomputes the two mish nodes (%d ops)", plan.recompute_ops))
  T.ok(sel == base, "gradients under selective recompute are bitwise those without")
end

do -- TimestepEmbedding{act_fn = "mish"} is linear_1, mish, linear_2; other names fail
  local r = T.rng(11)
  local t = T.random_values(r, 2 * 8, -2, 2)
  local function loss(act_fn, by_hand)
    local g = ck.graph()
    local x = g:input("t", {2, 8})
    local y
    if by_hand then
      local h = ck.linear(x, g:param("linear_1.weight", {16, 8}), g:param("linear_1.bias", {16}))
      y = ck.linear(ck.mish(h), g:param("linear_2.weight", {16, 16}), g:param("linear_2.bias", {16}))
    else
      y = nn.TimestepEmbedding{8, 16, act_fn = act_fn}:forward(g, x)
    end
    local z = g:input("z", {2, 16})
    local p = g:compile{loss = ck.mse_loss(y, z), seed = 4}
    for _, prm in ipairs(g:params()) do p:set(prm, T.random_values(r, prm.numel, -1, 1)) end
    p:set(x, t)
    p:set(z, T.random_values(T.rng(12), 2 * 16, -1, 1))
    return p:forward()
  end
  r = T.rng(11); local mish = loss("mish")
  r = T.rng(11); local hand = loss(nil, true)
  r = T.rng(11); local silu = loss("silu")
  T.ok(mish == hand, string.format("act_fn mish gives the loss of linear, ck.mish, linear (%.9g, %.9g)", mish, hand))
  T.ok(mish ~= silu, "and not that of silu")
  local ok, err = pcall(nn.TimestepEmbedding, {8, 16, act_fn = "gelu_fast"})
  T.ok(not ok and tostring(err):find("act_fn 'gelu_fast'", 1, true), "an unknown act_fn is an error: " .. tostring(err))
end

T.done()
