-- expect: 01_conv_channels\.lua:8: conv2d in down_blocks\.1\.resnets\.0\.conv1: input has 320 channels, weight expects 640
-- A convolution whose weight does not fit its input's channels.
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {1, 320, 8, 8})
g:push_scope("down_blocks.1.resnets.0.conv1")
local w = g:param("weight", {640, 640, 3, 3})
local y = ck.conv2d(x, w, nil, {padding = 1})
