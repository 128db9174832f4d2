-- expect: 52_gc_by_hand\.lua:4: attempt to index a boolean value
-- Freeing a graph by calling its __gc by hand: its metatable is hidden.
local ck = require "ck"
getmetatable(ck.graph()).__gc()
