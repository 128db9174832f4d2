-- SVG for the charts ckrun writes: the memory timeline of `ckrun --plan --svg`
-- (ck.plan) and the Pareto front of scripts/policy_sweep.lua. A document
-- collects elements as text; escaping, round axis ticks and their labels are
-- here once.
local M = {}

function M.escape(s)
  return (tostring(s):gsub("[&<>\"]", {["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;"}))
end

-- about n round tick values (1, 2, 5 times a power of ten) covering [0, hi]
function M.ticks(hi, n)
  if hi <= 0 then return {0}, 1 end
  local raw = hi / (n or 5)
  local p = 10 ^ math.floor(math.log(raw, 10))
  local step = p
  for _, m in ipairs{1, 2, 5, 10} do
    if m * p >= raw then step = m * p; break end
  end
  local t = {}
  for v = 0, hi + step * 1e-9, step do t[#t + 1] = v end
  return t, step
end

-- about n ticks covering [0, hi], one more when the last is below need:
-- the ticks, their step and the axis top
function M.axis(hi, need, n)
  local t, step = M.ticks(hi, n)
  local top = t[#t]
  if top < need then top = top + step; t[#t + 1] = top end
  return t, step, top
end

function M.fmt_tick(v)
  if v == math.floor(v) then return string.format("%d", v) end
  return string.format("%g", v)
end

local Doc = {}
Doc.__index = Doc

-- A document w x h on white, titled in bold at (x, y) when title is given.
function M.document(w, h, title, x, y)
  local d = setmetatable({parts = {}}, Doc)
  d:add('<?xml version="1.0" encoding="UTF-8"?>\n')
  d:add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" ' ..
    'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">\n', w, h, w, h)
  d:add('<rect width="100%%" height="100%%" fill="white"/>\n')
  if title then d:add('<text x="%d" y="%d" font-size="16" font-weight="bold">%s</text>\n', x, y, M.escape(title)) end
  return d
end

-- one element, string.format'ed when arguments follow
function Doc:add(s, ...)
  self.parts[#self.parts + 1] = select("#", ...) > 0 and string.format(s, ...) or s
end

-- the whole document as text, closed
function Doc:finish()
  return table.concat(self.parts) .. '</svg>\n'
end

return M
