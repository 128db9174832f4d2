-- Copies a .safetensors file with one tensor added or one metadata field
-- changed, for tests of what ckrun reads from files. args: from, to, then
-- "tensor" NAME VALUE (a [1] F32 tensor; VALUE a number, nan, inf or -inf) or
-- "meta" KEY VALUE.
local ck = require "ck"
local from, to, what, key, value = args[1], args[2], args[3], args[4], args[5]
local f <close> = ck.safetensors(from)
local tensors, meta = {}, f:metadata()
for _, k in ipairs(f:keys()) do tensors[#tensors + 1] = {k, f:shape(k), f:read(k)} end
if what == "tensor" then
  if type(value) == "number" then value = tostring(value) end
  local v = ({nan = 0 / 0, inf = math.huge, ["-inf"] = -math.huge})[value] or assert(tonumber(value))
  tensors[#tensors + 1] = {key, {1}, {v}}
else
  meta[key] = value
end
ck.write_safetensors(to, tensors, meta)
