-- expect: 41_denied_write\.lua:4: writing '\.\./escape\.safetensors' is denied: .*--allow-write
-- Writing weights above the working directory.
local ck = require "ck"
ck.write_safetensors("../escape.safetensors", {{"w", {1}, {1}}})
