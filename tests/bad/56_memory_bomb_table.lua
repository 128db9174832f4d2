-- flags: --max-heap 64MiB
-- expect: 56_memory_bomb_table\.lua:[0-9]+: out of memory \(the Lua heap limit of 64 MiB is reached\)
-- A table that grows until memory runs out.
local t = {}
local i = 0
while true do
  i = i + 1
  t[i] = {i, tostring(i)}
end
