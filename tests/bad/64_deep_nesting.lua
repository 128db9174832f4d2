-- expect: 64_deep_nesting\.lua:9: .*(nested too deep|stack overflow)
-- Values nested a million tables deep given to p:set are refused, not a crash.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2})
local p = g:compile{outputs = {ck.silu(x)}}
local t, c = {}, nil
c = t for i = 1, 1e6 do c[1] = {} c = c[1] end c[1] = 1
p:set(x, t)
