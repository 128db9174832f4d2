-- flags: --callback-budget 1000000
-- expect: 54_callback_pcall\.lua:8: callback ran past its instruction budget
-- An endless callback that hides behind pcall, inside and around the callback.
local ck = require "ck"
for i = 1, 10 do
  pcall(ck.call_limited, function()
    for j = 1, 10 do
      pcall(function() while true do end end)
    end
  end)
end
print("escaped")
