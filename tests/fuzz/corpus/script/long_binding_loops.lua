local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {4, 2})
local loss = ck.mse_loss(ck.silu(ck.linear(x, g:param("w", {2, 2}))), g:input("t", {4, 2}))
local p = g:compile{loss = loss}
local row = {}
for i = 1, 1000 do row[i] = i end
local huge = {}
for i = 1, 3000 do huge[i] = row end
print(pcall(p.set, p, x, huge))
print(pcall(g.compile, g, {loss = loss, checkpoint = function() p:set(x, huge) return "save" end}))
print(pcall(p.set, p, x, huge, 2))
