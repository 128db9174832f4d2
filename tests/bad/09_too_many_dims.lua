-- expect: 09_too_many_dims\.lua:5: .*too many dims
-- A shape with more dimensions than the runtime supports.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {1, 1, 1, 1, 1, 1, 1, 1, 1})
