-- Training progress: on a terminal one bar redrawn in place (step, loss, it/s,
-- time left); otherwise plain lines at a steady cadence, one per line.
local ck = require "ck"

local M = {}
local Progress = {}
Progress.__index = Progress

local function hms(s)
  s = math.max(0, math.floor(s + 0.5))
  return string.format("%d:%02d:%02d", s // 3600, s // 60 % 60, s % 60)
end

-- total steps; o.every: plain-line cadence (default total / 20); o.out: a file handle
function M.new(total, o)
  o = o or {}
  local self = setmetatable({}, Progress)
  self.total = total
  self.tty = o.tty
  if self.tty == nil then self.tty = ck.isatty() end
  self.every = o.every or math.max(1, total // 20)
  self.out = o.out or io.stdout
  self.t0 = ck.now()
  return self
end

function Progress:update(step, loss, extra)
  local dt = ck.now() - self.t0
  local rate = step / math.max(dt, 1e-9)
  local left = (self.total - step) / math.max(rate, 1e-9)
  local text = string.format("step %d/%d  loss %.4f  %.2f it/s  left %s%s", step, self.total, loss, rate, hms(left),
    extra and ("  " .. extra) or "")
  if self.tty then
    local width = 24
    local fill = math.floor(width * step / self.total)
    self.out:write(string.format("\r[%s%s] %s\27[K", string.rep("#", fill), string.rep(".", width - fill), text))
    if step == self.total then self.out:write("\n") end
    self.out:flush()
  elseif step % self.every == 0 or step == 1 or step == self.total then
    self.out:write(text, "\n")
    self.out:flush()
  end
end

-- a line that does not break the bar
function Progress:print(line)
  if self.tty then self.out:write("\r\27[K") end
  self.out:write(line, "\n")
  self.out:flush()
end

return M
