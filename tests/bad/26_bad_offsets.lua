-- expect: 26_bad_offsets\.lua:4: offsets\.safetensors: .*
-- A tensor whose data offsets do not match its shape.
local ck = require "ck"
local f = ck.safetensors("offsets.safetensors")
