-- expect: 21_truncated_data\.lua:4: truncated\.safetensors: .*
-- A safetensors file whose data was cut short.
local ck = require "ck"
local f = ck.safetensors("truncated.safetensors")
