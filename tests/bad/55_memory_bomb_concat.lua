-- flags: --max-heap 64MiB
-- expect: 55_memory_bomb_concat\.lua(:[0-9]+)?: out of memory \(the Lua heap limit of 64 MiB is reached\)
-- A string that doubles until memory runs out (the last doubling is one allocation past the limit,
-- which names the script but not the line).
local s = "x"
while true do
  s = s .. s
end
