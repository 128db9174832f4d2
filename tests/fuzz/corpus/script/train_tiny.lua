local ck = require "ck"
local g = ck.graph()
local x, t = g:input("x", {8, 2}), g:input("t", {8, 1})
local h = ck.silu(ck.linear(x, g:param("l1.weight", {4, 2})))
local loss = ck.mse_loss(ck.linear(h, g:param("l2.weight", {1, 4})), t)
local p = g:compile{loss = loss, optimizer = "adamw", lr = 1e-2, seed = 1}
local xs, ts = {}, {}
for i = 1, 16 do xs[i] = i / 16 end
for i = 1, 8 do ts[i] = i / 8 end
p:set(x, xs)
p:set(t, ts)
for i = 1, 3 do x_loss = p:step() end
function f(n) return n * 2, "done" end
