-- expect: 27_directory_as_file\.lua:4: nan_data: not a regular file
-- A directory where a weights file should be.
local ck = require "ck"
local f = ck.safetensors("nan_data")
