-- expect: 17_no_such_tensor\.lua:7: no tensor named 'mlp\.weight'
-- Setting a tensor by a name the program does not have.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2})
local p = g:compile{outputs = {ck.silu(x)}}
p:set("mlp.weight", 1)
