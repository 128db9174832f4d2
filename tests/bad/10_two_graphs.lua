-- expect: 10_two_graphs\.lua:7: add: inputs belong to different graphs
-- Mixing tensors of two graphs in one op.
local ck = require "ck"
local g1, g2 = ck.graph(), ck.graph()
local a = g1:input("a", {2})
local b = g2:input("b", {2})
local c = ck.add(a, b)
