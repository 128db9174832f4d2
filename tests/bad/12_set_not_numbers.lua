-- expect: 12_set_not_numbers\.lua:7: values must be numbers
-- Setting an input from a table of strings.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2})
local p = g:compile{outputs = {ck.silu(x)}}
p:set(x, {"a", "b"})
