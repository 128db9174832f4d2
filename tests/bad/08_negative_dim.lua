-- expect: 08_negative_dim\.lua:5: shape entry 2 is not a non-negative integer
-- A negative dimension in a shape.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2, -3})
