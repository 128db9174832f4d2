-- The script's own half of a path race: a directory renamed away and made
-- again, a file replaced by rename and removed, between and during opens of
-- the same names; temp-file names of saves that never finished.
local ck = require "ck"
ck.mkdir("r/a")
for i = 1, 40 do
  local f = io.open("r/a/f", "w"); if f then f:write(i) f:close() end
  os.rename("r/a", "r/b")
  ck.mkdir("r/a")
  pcall(io.open, "r/a/f")
  os.rename("r/b/f", "r/a/f")
  for l in io.lines("r/a/f") do end
  os.remove("r/b")
  local g = io.open("r/s.safetensors.tmp." .. i, "w"); if g then g:close() end
  pcall(ck.write_safetensors, "r/s.safetensors", {{"x", {1}, {i}}})
  pcall(ck.safetensors, "r/s.safetensors")
  os.rename("r/a", "r/a/inside")
  pcall(ck.listdir, "r")
end
