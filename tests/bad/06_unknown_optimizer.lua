-- expect: 06_unknown_optimizer\.lua:7: unknown optimizer 'adamax' \(adamw, adamw8bit, lion, sgd, none\)
-- compile with an optimizer that does not exist.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2, 3})
local w = g:param("w", {1, 3})
local p = g:compile{loss = ck.mean(ck.linear(x, w)), optimizer = "adamax"}
