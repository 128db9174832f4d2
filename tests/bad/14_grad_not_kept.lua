-- expect: 14_grad_not_kept\.lua:10: gradients are not kept; compile with keep_grads = true
-- Reading a gradient of a program compiled without keep_grads.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2, 3})
local w = g:param("w", {1, 3})
local p = g:compile{loss = ck.mean(ck.linear(x, w)), optimizer = "sgd"}
p:set(x, 1)
p:step()
p:grad(w)
