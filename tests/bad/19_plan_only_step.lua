-- flags: --plan
-- expect: 19_plan_only_step\.lua:9: .*planning only and cannot run
-- A plan-only program (ckrun --plan) asked to run.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2, 3})
local w = g:param("w", {1, 3})
local p = g:compile{loss = ck.mean(ck.linear(x, w)), optimizer = "sgd"}
p:step()
