-- expect: 13_get_not_kept\.lua:10: .*13_get_not_kept\.lua:6: tensor from this line was not kept by the last run; list it in compile\{outputs=\.\.\.\}
-- Reading an activation the plan did not keep.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2})
local h = ck.silu(x)
local y = ck.silu(h)
local p = g:compile{outputs = {y}}
p:forward()
p:get(h)
