-- The plan report of `ckrun --plan`: what a compiled program will use, without
-- running it. (Placeholder: one policy, text or JSON.)
local ck = require "ck"
local policy = require "ck.policy"

local M = {}

local function json_value(v)
  if type(v) == "string" then return string.format("%q", v) end
  if math.type(v) == "integer" then return tostring(v) end
  return string.format("%.17g", v)
end

function M.report(o)
  local pl = o.program:plan()
  local info = o.info or {}
  if ck.json then
    local parts = {}
    for _, kv in ipairs(info) do parts[#parts + 1] = string.format('"%s": %s', kv[1], json_value(kv[2])) end
    for _, k in ipairs{"peak", "persistent", "transient", "workspace"} do
      parts[#parts + 1] = string.format('"%s_bytes": %d', k, pl[k])
    end
    parts[#parts + 1] = string.format('"ops": %d', pl.ops)
    print("{" .. table.concat(parts, ", ") .. "}")
  else
    for _, kv in ipairs(info) do print(string.format("%-24s %s", kv[1], tostring(kv[2]))) end
    print(string.format("%-24s %s", "checkpoint", policy.name(o.checkpoint)))
    print(string.format("%-24s %.1f MiB", "peak", pl.peak / 2 ^ 20))
  end
end

return M
