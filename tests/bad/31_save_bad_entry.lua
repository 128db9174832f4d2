-- expect: 31_save_bad_entry\.lua:7: no tensor named 'missing'
-- Saving over an existing file with an entry that names no tensor: the file stays as it was.
local ck = require "ck"
local g = ck.graph()
local w = g:param("w", {2, 3})
local p = g:compile{outputs = {w}}
p:save("out.safetensors", {{"w", w}, {"x", "missing"}})

