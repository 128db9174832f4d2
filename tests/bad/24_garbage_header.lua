-- expect: 24_garbage_header\.lua:4: garbage\.safetensors: .*
-- A header that is not JSON.
local ck = require "ck"
local f = ck.safetensors("garbage.safetensors")
