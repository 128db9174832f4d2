local ck = require "ck"
local ok, err = pcall(ck.call_limited, function()
  local n = 0
  while true do n = n + 1 end
end)
print(ok, err)
