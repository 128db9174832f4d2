-- expect: 25_huge_header\.lua:4: huge_header\.safetensors: header length 1000000 reaches beyond the end of the file
-- A header length far past the end of the file.
local ck = require "ck"
local f = ck.safetensors("huge_header.safetensors")
