-- A tiny MLP and a tiny conv net, written with ck ops, learn toy tasks: after
-- training the loss is below a threshold that the untrained net does not reach.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"

do -- MLP regression of y = sin(3a) * b on a 6x6 grid
  local g = ck.graph()
  local x = g:input("x", {36, 2})
  local t = g:input("t", {36, 1})
  local h = ck.silu(ck.linear(x, g:param("l1.weight", {32, 2}), g:param("l1.bias", {32})))
  h = ck.silu(ck.linear(h, g:param("l2.weight", {32, 32}), g:param("l2.bias", {32})))
  local y = ck.linear(h, g:param("l3.weight", {1, 32}), g:param("l3.bias", {1}))
  local p = g:compile{loss = ck.mse_loss(y, t), optimizer = "adamw", lr = 1e-2, seed = 1}
  local xs, ts = {}, {}
  for i = 0, 5 do for j = 0, 5 do
    local a, b = i / 5, j / 5
    xs[#xs + 1] = {a, b}; ts[#ts + 1] = {math.sin(3 * a) * b}
  end end
  p:set(x, xs); p:set(t, ts)
  local first = p:forward()
  local l
  for _ = 1, 400 do l = p:step() end
  T.ok(first > 0.05, string.format("untrained MLP loss %.4f is above 0.05", first))
  T.ok(l < 0.005, string.format("trained MLP loss %.5f is below 0.005", l))
end

do -- conv net: tell horizontal from vertical stripes (8x8 images, regression to +-1)
  local g = ck.graph()
  local x = g:input("x", {8, 1, 8, 8})
  local t = g:input("t", {8, 1})
  local h = ck.conv2d(x, g:param("c1.weight", {8, 1, 3, 3}), g:param("c1.bias", {8}), {padding = 1})
  h = ck.silu(ck.group_norm(h, 2, g:param("n1.weight", {8}, {init = "ones"}), g:param("n1.bias", {8})))
  h = ck.conv2d(h, g:param("c2.weight", {8, 8, 3, 3}), g:param("c2.bias", {8}), {stride = 2, padding = 1})
  h = ck.silu(h)
  local y = ck.linear(ck.reshape(h, {8, -1}), g:param("fc.weight", {1, 8 * 4 * 4}), g:param("fc.bias", {1}))
  local p = g:compile{loss = ck.mse_loss(y, t), optimizer = "adamw", lr = 3e-3, seed = 2}
  local r = T.rng(5)
  local imgs, labels = {}, {}
  for n = 1, 8 do
    local vertical = n % 2 == 0
    local phase = n % 3
    for i = 0, 7 do for j = 0, 7 do
      local k = vertical and j or i
      imgs[#imgs + 1] = ((k + phase) % 3 == 0 and 1 or 0) + 0.1 * r()
    end end
    labels[n] = vertical and 1 or -1
  end
  p:set(x, imgs); p:set(t, labels)
  local first = p:forward()
  local l
  for _ = 1, 150 do l = p:step() end
  T.ok(first > 0.3, string.format("untrained conv net loss %.4f is above 0.3", first))
  T.ok(l < 0.01, string.format("trained conv net loss %.5f is below 0.01", l))
end

T.done()
