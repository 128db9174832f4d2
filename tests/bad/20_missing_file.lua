-- expect: 20_missing_file\.lua:4: nope\.safetensors: cannot open: No such file or directory
-- Opening a weights file that does not exist.
local ck = require "ck"
local f = ck.safetensors("nope.safetensors")
