-- --checkpoint optimal (vm/plan/optimal.c): parsed as budget's sizes and
-- shares with a time limit; on a tiny SDXL LoRA step its plan fits the
-- budget and recomputes no more than the budget search's at the same budget,
-- and says what the solver found; what it cannot plan is refused in one line.
package.path = "tests/lua/?.lua;" .. package.path
local ck = require "ck"
local T = require "check"
local policy = require "ck.policy"
local plan = require "ck.plan"
local unet = require "ck.unet"
local sdxl = require "ck.sdxl"

---- parsing

do
  local p = policy.parse("optimal:80%")
  T.ok(p.kind == "optimal" and p.fraction == 0.8 and p.seconds == nil and policy.name(p) == "optimal:80%",
    "optimal:80% is a share of none's peak, with the default time limit")
  p = policy.parse("optimal:6GiB:30s")
  T.ok(p.kind == "optimal" and p.bytes == 6 * 2 ^ 30 and p.seconds == 30 and policy.name(p) == "optimal:6GiB:30s",
    "optimal:6GiB:30s is a size with a time limit of 30 s (" .. policy.name(p) .. ")")
  local list = plan.parse_policies("blocks:mid_block,optimal:62%:10s,budget:62%")
  T.ok(#list == 3 and list[2].kind == "optimal" and list[2].seconds == 10,
    "optimal: ends a blocks: list in --policies")
  for _, bad in ipairs{"optimal", "optimal:80%:0s", "optimal:fast", "optimal:80%:-3s"} do
    local ok, err = pcall(policy.parse, bad)
    T.ok(not ok and not tostring(err):find("\n"), "'" .. bad .. "' is refused in one line (" .. tostring(err) .. ")")
  end
end

---- a tiny SDXL LoRA step

-- sdxl-tiny with one layer per block and one transformer layer per level: a
-- solve of about a second
local config = unet.config("sdxl-tiny")
config.layers_per_block = 1
config.transformer_layers_per_block = {1, 1, 1}
local function step(checkpoint, fused)
  local ok, r = pcall(sdxl.training_step, {config = config, batch = 1, latent = {8, 8}, lora = {rank = 2, alpha = 2},
                                           compile = {checkpoint = checkpoint, plan_only = true,
                                                      fused_backward = fused}})
  if not ok then return nil, tostring(r) end
  return r.program:plan()
end

local none = assert(step(policy.none()))
-- budgets between the smallest peak the budget search plans and none's
local _, floor_err = step(policy.budget(1000))
local floor = tonumber(tostring(floor_err):match("the smallest peak ckrun can plan is [%d.]+ MiB %((%d+) bytes%)"))
T.ok(floor and floor < none.peak, "the budget search names its smallest peak (" .. tostring(floor) .. ")")
for _, share in ipairs{0.2, 0.6} do
  local budget = math.floor(floor + share * (none.peak - floor))
  local b = assert(step(policy.budget(budget)))
  local o, err = step(policy.optimal(budget, 1))
  T.ok(o and o.peak <= budget, string.format(
    "optimal %d%% of the way from the smallest peak to none's: the plan's peak %s fits %d bytes", share * 100, o and o.peak or err, budget))
  T.ok(o and o.recompute_flops <= b.recompute_flops, string.format(
    "optimal at %d%%: recomputes %s FLOPs, the budget search %.0f", share * 100, o and o.recompute_flops or "-",
    b.recompute_flops))
  T.ok(o and (o.decision or ""):match("^optimal: recomputes [%d.]+%% of forward FLOPs .*lower bound [%d.]+%%"),
    "the plan says what the solver found (" .. tostring(o and o.decision) .. ")")
  local lb = o and tonumber((o.decision or ""):match("lower bound ([%d.]+)%%"))
  local pct = o and tonumber(o.decision:match("recomputes ([%d.]+)%%"))
  T.ok(lb and pct and lb > 0 and lb <= pct, "its lower bound is above 0 and at most what it recomputes")
end

do
  local _, err = step(policy.optimal(1000, 1))
  T.ok(err and err:find("optimal: nothing fits in 0.0 MiB; the smallest peak ckrun can plan is", 1, true)
    and not err:find("\n"), "a budget below every plan is refused in one line naming the smallest peak (" ..
    tostring(err) .. ")")
  _, err = step(policy.optimal("90%", 1), true)
  T.ok(err and err:find("optimal: lists whose optimizer entries move", 1, true),
    "a list with fused updates is refused in one line (" .. tostring(err) .. ")")
end

T.done()
