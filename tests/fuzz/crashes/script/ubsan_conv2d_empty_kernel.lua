-- Finding (fuzz_script, clang UBSan pointer-overflow): conv2d with a kernel of
-- height 0. The plan gives the kernel no workspace (ctx->ws == NULL), and
-- ck_cpu_conv2d (ops/cpu/conv2d.c:141) computes col = ws + g.ckk * j0 before
-- its `if (g.ckk == 0) continue`: arithmetic on a null pointer, undefined
-- behaviour even with offset 0 (nothing is read through it);
-- ck_cpu_conv2d_bwd_data (conv2d.c:189) does the same in the backward pass.
-- Fix: the conv2d rule (ops/rules.c, conv_out) refuses a kernel with a zero
-- dim. Reproduce: build-fuzz/fuzz_script THIS_FILE
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {1, 4, 8, 8})
local y = ck.conv2d(x, g:param("w", {4, 4, 0, 3}), g:param("b", {4}), {padding = 2})
local p = g:compile{outputs = {y}}
p:forward()
local h = ck.conv2d(x, g:param("v", {4, 4, 3, 3}), {padding = 1})
local z = ck.conv2d(h, g:param("w0", {4, 4, 0, 3}), g:param("b0", {4}), {padding = 2})
local q = g:compile{loss = ck.mean(ck.mul(z, z)), optimizer = "adamw"}
q:step()
