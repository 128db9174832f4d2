-- flags: --callback-budget 1000000
-- expect: 53_callback_loop\.lua:7: callback ran past its instruction budget of 1000000 instructions
-- A compile-time callback that never returns.
local ck = require "ck"
ck.call_limited(function()
  local n = 0
  while true do n = n + 1 end
end)
