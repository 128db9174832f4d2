-- expect: 29_load_missing_key\.lua:8: good\.safetensors: missing tensor 'bias'
-- Loading a key the file does not hold.
local ck = require "ck"
local g = ck.graph()
local b = g:param("b", {3})
local p = g:compile{outputs = {b}}
local f = ck.safetensors("good.safetensors")
p:load(f, {b = "bias"})
