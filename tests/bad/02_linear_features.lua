-- expect: 02_linear_features\.lua:6: linear: input has 7 features, weight expects 8
-- A linear layer with the wrong input width.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2, 7})
local y = ck.linear(x, g:param("w", {3, 8}))
