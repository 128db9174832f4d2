-- expect: 28_wrong_dtype\.lua:8: i32\.safetensors: tensor 'w': dtype I32 cannot be read as fp32
-- Loading an integer tensor into a float parameter.
local ck = require "ck"
local g = ck.graph()
local w = g:param("w", {2, 3})
local p = g:compile{outputs = {w}}
local f = ck.safetensors("i32.safetensors")
p:load(f, {w = "w"})
