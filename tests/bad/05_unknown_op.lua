-- expect: 05_unknown_op\.lua:6: attempt to call a nil value \(field 'frobnicate'\)
-- An op the runtime does not have.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2, 3})
local y = ck.frobnicate(x)
