-- expect: 22_truncated_header\.lua:4: header_cut\.safetensors: header length .* beyond the end of the file
-- A safetensors file cut inside its header.
local ck = require "ck"
local f = ck.safetensors("header_cut.safetensors")
