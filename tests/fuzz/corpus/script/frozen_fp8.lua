local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {4, 3})
local t = g:input("t", {4, 2})
local w1 = g:param("l1.weight", {5, 3}):freeze()
local h = ck.silu(ck.linear(x, w1, g:param("l1.bias", {5})))
local y = ck.linear(h, g:param("l2.weight", {2, 5}), g:param("l2.bias", {2}))
local p = g:compile{loss = ck.mse_loss(y, t), optimizer = "adamw", lr = 1e-2, max_grad_norm = 0.5, frozen = "fp8",
                    storage = "bf16", seed = 3}
p:set(x, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
p:set(t, {1, 0, 0, 1, 1, 1, 0, 0})
p:set("l1.weight", {0.5, -460, 1e-4, 3, 2 ^ -10, 0, -0.0, 7, 8, 9, 10, 11, 12, 13, 14})
for _ = 1, 3 do p:step{guard = true} end
s = p:checksum("l2.weight") .. p:get("l1.weight")[2]
