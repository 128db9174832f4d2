-- expect: 23_empty_file\.lua:4: empty\.safetensors: file is 0 bytes, too short for the 8-byte header length \(truncated\?\)
-- An empty file where weights should be.
local ck = require "ck"
local f = ck.safetensors("empty.safetensors")
