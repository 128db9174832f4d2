-- expect: 65_shape_too_large\.lua:6: 'x' has shape \[2147483648, 2147483648\]: more than 2\^40 elements is too large
-- A shape whose byte count would overflow is refused where it is declared (it
-- once reached the kernels with a wrapped size; found by fuzzing).
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2147483648, 2147483648})
local p = g:compile{outputs = {ck.silu(x)}}
p:forward()
