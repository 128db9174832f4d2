local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {4, 3})
local t = g:input("t", {4, 2})
local h = ck.dropout(ck.silu(ck.linear(x, g:param("l1.weight", {5, 3}), g:param("l1.bias", {5}))), 0.2)
local y = ck.linear(h, g:param("l2.weight", {2, 5}, {lr_scale = 16}), g:param("l2.bias", {2}))
local p = g:compile{loss = ck.mse_loss(y, t), optimizer = "adamw8bit", lr = 1e-2, fused_backward = true, seed = 9,
                    checkpoint = function() return "recompute" end}
p:set(x, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
p:set(t, {1, 0, 0, 1, 1, 1, 0, 0})
for _ = 1, 3 do p:step{guard = true} end
p.training = false
s = p:forward() .. p:checksum("adam8_code.l2.weight")
