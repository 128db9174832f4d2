-- The same cast in every_n's n (found reading the code after the seed
-- finding): n = 1e100 was converted to int before the check. Fixed: checked first.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {4, 3})
local y = ck.silu(ck.linear(x, g:param("w", {5, 3})))
pcall(function() return g:compile{loss = ck.mean(y), checkpoint = {kind = "every_n", n = 1e100}} end)
