-- The budget search against the exact solver (--checkpoint optimal) on one
-- SDXL LoRA training step, plan only: for each budget (a share of none's
-- peak), the recompute FLOPs of each as a share of the forward FLOPs, the
-- solver's lower bound, and the gap. bench/optimal_table.sh runs it.
--
--   ckrun bench/optimal_table.lua --size tiny --budgets 90,80,70 --optimal-seconds 60
local unet = require "ck.unet"
local sdxl = require "ck.sdxl"
local policy = require "ck.policy"
local options = require "ck.options"

local o = options.parse(args, {
  about = "the budget search's recompute against the exact solver's, per budget, on an SDXL LoRA step (plan only)",
  {"size", "choice", "tiny", "the UNet: sdxl-tiny, sdxl-mid or SDXL", choices = {"tiny", "mid", "full"}},
  {"resolution", "integer", function(v) return v.size == "tiny" and 256 or 1024 end, "image side in pixels",
   shown = "256 with --size tiny, else 1024", min = 64},
  {"budgets", "string", "90,80,70,62,55", "budgets in percent of none's peak, comma-separated"},
  {"optimal-seconds", "number", 60, "the solver's time limit per budget, in seconds", min = 1},
  {"gpu", "string", nil, "also the joint search (--offload auto) on this card's figures, beside the optimum's "
   .. "predicted step time", arg = "NAME"},
})
if not o then return end

local config = unet.config(({tiny = "sdxl-tiny", mid = "sdxl-mid", full = "sdxl"})[o.size])
local latent = o.resolution // 8

local function plan(pol, offload)
  local r = sdxl.training_step{config = config, batch = 1, latent = {latent, latent}, lora = {rank = 4, alpha = 4},
                               compile = {checkpoint = pol, plan_only = true, offload = offload, gpu = o.gpu}}
  return r.program:plan()
end

local none = plan(policy.none())
local fwd = none.step_flops -- replaced below by the solver's count of forward FLOPs
print(string.format("# sdxl-%s %d px: none's peak %d bytes, %d ops", o.size, o.resolution, none.peak, none.ops))
print("| budget | budget: recompute (% fwd) | optimal (% fwd) | lower bound (% fwd) | gap (points) | solver |")
print("|---|---|---|---|---|---|")
for b in o.budgets:gmatch("[^,]+") do
  local pct = tonumber(b)
  local s = plan(policy.budget(b .. "%"))
  local opt = plan(policy.optimal(b .. "%", o["optimal-seconds"]))
  local d = opt.decision or ""
  local of, flops = d:match("recomputes ([%d.]+)%% of forward FLOPs %(([%d.e+]+)%)")
  local lb = d:match("lower bound ([%d.]+)%%")
  fwd = tonumber(flops) / (tonumber(of) / 100)
  local sp = 100 * s.recompute_flops / fwd
  local op = 100 * opt.recompute_flops / fwd
  print(string.format("| %d%% | %.2f | %.2f | %s | %.2f | %s |", pct, sp, op, lb or "?", sp - op,
                      d:match("proven") and "proven" or "time limit"))
  io.stderr:write(d, "\n")
end
