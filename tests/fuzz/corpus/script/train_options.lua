local ck = require "ck"
local optim = require "ck.optim"
local g = ck.graph()
local x = g:input("x", {4, 3})
local t = g:input("t", {4, 2})
local h = ck.silu(ck.linear(x, g:param("l1.weight", {5, 3}), g:param("l1.bias", {5})))
local y = ck.linear(h, g:param("l2.weight", {2, 5}), g:param("l2.bias", {2}))
local p = g:compile{loss = ck.mse_loss(y, t), optimizer = "adamw", lr = 1e-2, max_grad_norm = 0.5, accumulate = 3,
                    seed = 2, storage = "bf16", checkpoint = function() return "recompute" end}
p:set(x, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
p:set(t, {1, 0, 0, 1, 1, 1, 0, 0})
local lr = optim.schedule{name = "cosine", lr = 1e-2, steps = 4, warmup = 1}
for s = 1, 5 do p:step{lr = lr(p.updates), guard = true} end
p.micro = 0
s = tostring(p.updates) .. p:checksum("l1.weight")
