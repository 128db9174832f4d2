local ck = require "ck"
ck.write_safetensors("a.safetensors", {{"w", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"b", {1}, {0.5}}}, {note = "x"})
local f = ck.safetensors("a.safetensors")
for _, k in ipairs(f:keys()) do x = #f:read(k) + #f:shape(k) .. f:dtype(k) end
s = f:metadata().note
f:close()
assert(ck.listdir("."))
os.remove("a.safetensors")
