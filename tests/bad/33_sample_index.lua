-- expect: 33_sample_index\.lua:8: .*index out of the batch
-- Loading a sample into a batch entry that does not exist.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2, 3})
local p = g:compile{outputs = {ck.silu(x)}}
local f = ck.safetensors("good.safetensors")
p:load_sample(x, 3, f, "w")
