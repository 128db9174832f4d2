-- expect: 03_matmul_inner\.lua:7: matmul
-- Matrices whose inner dimensions differ.
local ck = require "ck"
local g = ck.graph()
local a = g:input("a", {4, 5})
local b = g:input("b", {6, 3})
local c = ck.matmul(a, b)
