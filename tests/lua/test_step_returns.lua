-- p:step has one return shape whatever its options: the loss first (a number,
-- as torch's loss.item()), then an info table that always holds plan_peak and
-- holds high_water, the statistics and the guard's verdict when asked for.
-- Two programs stepped alike stay bitwise equal whichever options they take.
package.path = "tests/lua/?.lua;" .. package.path
local T = require "check"

local function build(stats)
  local g, c, x, t = T.mlp(16, {optimizer = "adamw", lr = 1e-2, seed = 3, stats = stats})
  local p = g:compile(c)
  T.set_random(p, 5, {x, t})
  return p
end

local a, b = build(), build{grads = true, acts = true}
local peak = a:plan().peak
local cases = {
  {"no options", function(p) return p:step() end},
  {"lr", function(p) return p:step{lr = 1e-2} end},
  {"measure", function(p) return p:step{measure = true} end, "high_water"},
  {"guard", function(p) return p:step{guard = true} end},
}
for _, case in ipairs(cases) do
  local la, ia = a:step()
  local lb, ib = case[2](b)
  T.ok(math.type(la) == "float" and la == lb, case[1] .. ": the loss first, the same as a plain step's: "
    .. tostring(la) .. " " .. tostring(lb))
  T.ok(type(ia) == "table" and type(ib) == "table", case[1] .. ": the second result is a table")
  T.ok(ia.plan_peak == peak and ib.plan_peak == peak, case[1] .. ": info.plan_peak is the plan's peak")
  if case[3] then T.ok(math.type(ib[case[3]]) == "integer", case[1] .. ": info." .. case[3] .. " is an integer") end
end
local l, info = b:step{stats = "all"}
T.ok(type(l) == "number" and type(info.grad_norm) == "number", "stats: the loss, then info.grad_norm")
T.ok(select("#", a:step()) == 2, "exactly two results")
T.done()
