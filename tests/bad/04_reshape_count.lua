-- expect: 04_reshape_count\.lua:6: reshape
-- A reshape to a different number of elements.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2, 3, 4})
local y = ck.reshape(x, {5, 5})
