-- expect: 32_write_wrong_count\.lua:4: 'x': 1 values for 2 elements
-- Writing over an existing file with too few values: the file stays as it was.
local ck = require "ck"
ck.write_safetensors("out.safetensors", {{"w", {1}, {5}},
  {"x", {2}, {1}}})
