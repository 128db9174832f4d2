-- expect: 15_group_norm_groups\.lua:7: group_norm
-- group_norm with a group count that does not divide the channels.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {1, 6, 4, 4})
local gamma, beta = g:param("gamma", {6}), g:param("beta", {6})
local y = ck.group_norm(x, 4, gamma, beta)
