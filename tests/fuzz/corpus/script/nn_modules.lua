local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {1, 4, 8, 8})
g:push_scope("block")
local y = ck.conv2d(x, g:param("conv.weight", {4, 4, 3, 3}), g:param("conv.bias", {4}), {padding = 1})
y = ck.group_norm(y, 2, g:param("norm.weight", {4}), g:param("norm.bias", {4}))
y = ck.upsample2x(ck.gelu(y))
local q = ck.reshape(y, {1, 4, 256})
local a = ck.attention(q, q, q, 2)
g:pop_scope()
local p = g:compile{outputs = {y, a}}
p:forward()
s = tostring(p:get(y)[1])
