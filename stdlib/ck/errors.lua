-- The stdlib's way of raising errors at the script's line: a module's inner
-- functions fail with a table {msg = ...}, and the functions it exports,
-- wrapped by public, raise the message again at their caller's line.
--
--   local errors = require "ck.errors"
--   local fail, public = errors.fail, errors.public
--   M.open = public(function(path) ... fail("%s: no such file", path) ... end)
local M = {}

function M.fail(fmt, ...)
  error({msg = string.format(fmt, ...)}, 0)
end

function M.public(f)
  return function(...)
    local r = table.pack(pcall(f, ...))
    if r[1] then return table.unpack(r, 2, r.n) end
    local e = r[2]
    if type(e) == "table" and e.msg then error(e.msg, 2) end
    error(e, 0)
  end
end

-- an error raised by compile (or any builder) as a table row wants it: its
-- message without the builder's file:line and "compile: "
function M.strip_where(msg)
  msg = tostring(msg)
  msg = msg:gsub("^[^\n:]+:%d+: ", "")
  return (msg:gsub("^compile: ", ""))
end

-- shapes in messages, and their comparison
function M.shape_str(s) return "[" .. table.concat(s, ", ") .. "]" end

function M.same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

return M
