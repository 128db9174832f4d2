-- expect: 30_load_wrong_shape\.lua:8: good\.safetensors: tensor 'w' has shape \[2, 3\], expected \[3, 2\]
-- Loading a tensor of another shape.
local ck = require "ck"
local g = ck.graph()
local w = g:param("w", {3, 2})
local p = g:compile{outputs = {w}}
local f = ck.safetensors("good.safetensors")
p:load(f, {w = "w"})
