-- expect: 70_fp8_out_of_range\.lua:11: 'w' holds 1000 at element 5, beyond what fp8 \(e4m3\) stores \(largest 448\): store it in bf16 or fp32
-- A frozen weight stored in fp8 (compile{frozen = "fp8"}, --fp8-base) loaded
-- with a value e4m3 cannot hold: refused, naming the tensor, not made NaN.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {4, 3})
local w = g:param("w", {2, 3}):freeze()
local b = g:param("b", {2})
local p = g:compile{loss = ck.mean(ck.linear(x, w, b)), frozen = "fp8"}
local f <close> = ck.safetensors("big.safetensors")
p:load(f, {w = "w"})
p:step()
