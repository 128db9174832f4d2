-- expect: 11_set_wrong_count\.lua:8: 'x' \[2, 3\] has 6 elements, got 4 values
-- Setting an input with the wrong number of values.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2, 3})
local y = ck.silu(x)
local p = g:compile{outputs = {y}}
p:set(x, {1, 2, 3, 4})
