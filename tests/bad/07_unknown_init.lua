-- expect: 07_unknown_init\.lua:5: unknown init 'xavier'
-- A parameter initializer that does not exist.
local ck = require "ck"
local g = ck.graph()
local w = g:param("w", {3, 3}, {init = "xavier"})
