-- Byte counts as text: rounded up, so a planned figure printed is never below
-- what it stands for (ck.policy.bytes reads such text back).
local M = {}

local MiB, GiB = 2 ^ 20, 2 ^ 30

-- x rounded up at the given decimals: a planned figure as text is never below
-- what it stands for, so written back as a size (budget:11271.7MiB) it holds
-- the plan it came from. (A byte is far above the tolerance for float noise.)
function M.round_up(x, decimals)
  local f = 10 ^ decimals
  return math.ceil(x * f - 1e-9) / f
end

-- "24.00 GiB", "512.0 MiB", "3.5 KiB", "12 B"
function M.fmt(b)
  if b >= 10 * GiB then return string.format("%.2f GiB", M.round_up(b / GiB, 2)) end
  if b >= MiB then return string.format("%.1f MiB", M.round_up(b / MiB, 1)) end
  if b >= 1024 then return string.format("%.1f KiB", M.round_up(b / 1024, 1)) end
  return string.format("%d B", b)
end

return M
